import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

/// Models are checked when hosted, with errors naming the layer and the field.
@Suite(.serialized) struct HostedModelValidationTests {
    /// Posts `Fixture.host()` as JSON after `edit` changes its model layers (as dictionaries).
    private func host(_ harness: Harness, editLayers edit: (inout [[String: Any]]) -> Void, weights: [TensorRecord] = Fixture.weights) async throws
        -> HTTPResult
    {
        var request = Fixture.host()
        request.initialWeights = Safetensors.encode(weights)
        var json = try #require(try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(request)) as? [String: Any])
        var model = try #require(json["model"] as? [String: Any])
        var layers = try #require(model["layers"] as? [[String: Any]])
        edit(&layers)
        model["layers"] = layers
        json["model"] = model
        return try await harness.http.send("POST", Endpoint.processes, body: Array(try JSONSerialization.data(withJSONObject: json)), token: Harness.adminToken)
    }

    @Test func badArchitecturesAndWeightsAreRefusedNamingTheLayerAndField() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            func expectRefused(_ result: HTTPResult, _ words: [String], _ label: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
                #expect(result.status == 400, "\(label): \(result.status)", sourceLocation: sourceLocation)
                #expect(result.errorCode == "invalid_configuration", "\(label)", sourceLocation: sourceLocation)
                let message = (try? result.decode(ErrorBody.self).error.message) ?? ""
                for word in words {
                    #expect(message.contains(word), "\(label): '\(word)' not in \(message)", sourceLocation: sourceLocation)
                }
            }
            try expectRefused(try await host(harness) { $0[1]["type"] = "densee" }, ["'out'", "densee"], "unknown layer type")
            try expectRefused(try await host(harness) { $0[1]["unit"] = 2 }, ["'out'", "'unit'"], "misspelt key")
            try expectRefused(try await host(harness) { $0[1]["units"] = 3 }, ["layer 'out'", "'units', 3, not 2"], "units against the weights")
            try expectRefused(try await host(harness) { $0[0]["input_size"] = 4 }, ["'embed'", "'input_size'"], "input_size against the input")
            try expectRefused(try await host(harness) { $0[1]["units"] = nil }, ["'out'", "'units'", "required"], "missing units")
            try expectRefused(try await host(harness) { $0[1]["use_bias"] = false }, ["'out.bias'", "use_bias"], "bias given, use_bias false")
            try expectRefused(
                try await host(harness, editLayers: { _ in }, weights: Array(Fixture.weights.dropLast())), ["'out.bias'", "missing"], "missing bias")
            try expectRefused(
                try await host(harness, editLayers: { _ in }, weights: Fixture.weights + [TensorRecord(name: "ghost.weight", shape: [1], values: [0])]),
                ["'ghost.weight'"], "tensor of no layer"
            )
            #expect(try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken).decode(ProcessList.self).processes.isEmpty)
            // The unedited request is still hosted.
            #expect(try await host(harness) { _ in }.status == 201)
        }
    }
}

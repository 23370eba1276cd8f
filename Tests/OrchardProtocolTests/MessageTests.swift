import Foundation
import OrchardFormats
import Testing
import OrchardProtocol

private func json(_ value: some Encodable) throws -> [String: Any] {
    let data = try WireCoding.encoder().encode(value)
    return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
}

private func roundTrip<T: Codable & Equatable>(_ value: T) throws -> T {
    try WireCoding.decoder().decode(T.self, from: WireCoding.encoder().encode(value))
}

@Suite struct MessageTests {
    @Test func rejectionCarriesRetryAfterAsANumber() throws {
        let response = CycleResponse.rejected(CycleRejection(retryAfter: 28_798.5, reason: "cycle_full"))
        let object = try json(response)
        #expect(object["status"] as? String == "rejected")
        #expect(object["retry_after"] as? Double == 28_798.5)
        #expect(try roundTrip(response) == response)
    }

    @Test func acceptedResponseIsFlatAndRoundTrips() throws {
        let assignment = CycleAssignment(
            requestKey: "k1", processID: "p1", cycle: 3, checkpoint: 2, modelID: "p1.2", planID: "p1", reportWithin: 120
        )
        let object = try json(CycleResponse.accepted(assignment))
        #expect(object["status"] as? String == "accepted")
        #expect(object["request_key"] as? String == "k1")
        // The client config travels once, in the plan.
        #expect(object["client_config"] == nil)
        #expect(try roundTrip(CycleResponse.accepted(assignment)) == .accepted(assignment))
    }

    @Test func unknownStatusIsADecodingError() {
        #expect(throws: DecodingError.self) {
            try WireCoding.decoder().decode(CycleResponse.self, from: Data(#"{"status":"maybe"}"#.utf8))
        }
    }

    @Test func clientConfigKeepsFreeFormKeys() throws {
        let text = #"{"batch_size":8,"learning_rate":0.5,"local_epochs":3,"optimizer":"adam","schedule":{"warmup":[1,2]},"flag":true,"none":null}"#
        let config = try WireCoding.decoder().decode(ClientConfig.self, from: Data(text.utf8))
        #expect(config.batchSize == 8)
        #expect(config.maxUpdates == nil)
        #expect(config.extra["optimizer"] == .string("adam"))
        #expect(config.extra["schedule"] == .object(["warmup": .array([.number(1), .number(2)])]))
        #expect(config.extra["flag"] == .bool(true))
        #expect(config.extra["none"] == JSONValue.null)
        #expect(config.localEpochs == 3)
        let object = try json(config)
        #expect(object["optimizer"] as? String == "adam")
        #expect(try roundTrip(config) == config)
    }

    @Test func serverConfigDefaultsMissingFields() throws {
        let config = try WireCoding.decoder().decode(ServerConfig.self, from: Data(#"{"goal_count":10,"aggregator":{"kind":"FedAdam"}}"#.utf8))
        #expect(config.goalCount == 10)
        #expect(config.capacity == 13)
        #expect(config.aggregator.kind == .fedAdam)
        #expect(config.cycleLength == ServerConfig().cycleLength)
        #expect(config.validationFailure() == nil)
        #expect(try roundTrip(config) == config)
    }

    @Test func serverConfigValidationNamesTheField() {
        var config = ServerConfig(goalCount: 5, minimumReports: 6)
        #expect(config.validationFailure()?.contains("minimum_reports") == true)
        config = ServerConfig(authentication: AuthenticationConfig(mode: .hs256))
        #expect(config.validationFailure()?.contains("secret") == true)
        config = ServerConfig(overSelection: 0.5)
        #expect(config.validationFailure()?.contains("over_selection") == true)
    }

    @Test func unknownAggregatorIsRejected() {
        #expect(throws: DecodingError.self) {
            try WireCoding.decoder().decode(AggregatorConfig.self, from: Data(#"{"kind":"fedprox"}"#.utf8))
        }
    }

    @Test func errorBodyShape() throws {
        let object = try json(ErrorBody(code: .deadlinePassed, message: "late"))
        let detail = try #require(object["error"] as? [String: Any])
        #expect(detail["code"] as? String == "deadline_passed")
        #expect(detail["message"] as? String == "late")
    }

    @Test func hostRequestCarriesWeightsAsBase64() throws {
        let weights = Safetensors.encode([TensorRecord(name: "d.weight", shape: [1, 2], values: [1, 2])])
        let model = ModelSpec(
            name: "m", inputs: [InputSpec(name: "x", shape: [2])],
            layers: [
                LayerSpec(name: "d", type: .dense, inputs: ["x"], units: 1, inputSize: 2, useBias: false)
            ])
        let request = HostProcessRequest(name: "m", version: SemanticVersion(1), model: model, initialWeights: weights)
        let object = try json(request)
        #expect(object["initial_weights"] as? String == Data(weights).base64EncodedString())
        #expect(try roundTrip(request) == request)
    }

    @Test func reportEnvelopeRoundTrips() throws {
        let diff = [TensorRecord(name: "a", shape: [2], values: [0.5, -1]), TensorRecord(name: "b", shape: [], values: [3])]
        let metadata = ReportMetadata(workerID: "w", requestKey: "k", sampleCount: 42, metrics: ["loss": 0.25, "bad": .nan])
        let bytes = ReportEnvelope.encode(diff: diff, metadata: metadata)
        let archive = try Safetensors.decode(bytes)
        let decoded = try ReportEnvelope.metadata(of: archive)
        #expect(decoded.sampleCount == 42)
        #expect(decoded.metrics == ["loss": 0.25])
        #expect(archive.byName["a"]?.values == [0.5, -1])
    }

    @Test func reportWithoutMetadataIsAFormatError() throws {
        let archive = try Safetensors.decode(Safetensors.encode([TensorRecord(name: "a", shape: [1], values: [1])]))
        #expect(throws: FormatError.self) { try ReportEnvelope.metadata(of: archive) }
    }

    @Test func endpointPathsAreVersioned() {
        for path in [
            Endpoint.authenticate, Endpoint.cycleRequest, Endpoint.report, Endpoint.processes, Endpoint.model("m"), Endpoint.checkpoint("p", "latest"),
        ] {
            #expect(path.hasPrefix(WireProtocol.pathPrefix + "/"))
        }
    }
}

@Suite struct OpenAPITests {
    @Test func documentIsOpenAPI3WithTheVersionedPaths() throws {
        let object = try #require(try JSONSerialization.jsonObject(with: Data(OpenAPI.document)) as? [String: Any])
        #expect((object["openapi"] as? String)?.hasPrefix("3.") == true)
        let paths = try #require(object["paths"] as? [String: Any])
        for path in [Endpoint.authenticate, Endpoint.cycleRequest, Endpoint.report, Endpoint.processes, Endpoint.health] {
            #expect(paths[path] != nil, "\(path)")
        }
    }
}

@Suite struct UpdateNormConfigTests {
    @Test func theBoundAndPolicyAreSnakeCaseWithClipByDefault() throws {
        let defaults = try WireCoding.decoder().decode(ServerConfig.self, from: Data("{}".utf8))
        #expect(defaults.updateNormBound == nil && defaults.updateNormPolicy == .clip)
        let set = try WireCoding.decoder().decode(ServerConfig.self, from: Data(#"{"update_norm_bound":2.5,"update_norm_policy":"reject"}"#.utf8))
        #expect(set.updateNormBound == 2.5 && set.updateNormPolicy == .reject)
        let object = try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(set)) as? [String: Any]
        #expect(object?["update_norm_bound"] as? Double == 2.5 && object?["update_norm_policy"] as? String == "reject")
        #expect(throws: DecodingError.self) { try WireCoding.decoder().decode(ServerConfig.self, from: Data(#"{"update_norm_policy":"Clip"}"#.utf8)) }
    }

    @Test func theOpenAPIDocumentStatesTheNewFieldsAndCode() throws {
        let object = try #require(try JSONSerialization.jsonObject(with: Data(OpenAPI.document)) as? [String: Any])
        let schemas = try #require((object["components"] as? [String: Any])?["schemas"] as? [String: Any])
        let server = try #require((schemas["ServerConfig"] as? [String: Any])?["properties"] as? [String: Any])
        #expect(server["update_norm_bound"] != nil)
        #expect((server["update_norm_policy"] as? [String: Any])?["enum"] as? [String] == ["clip", "reject"])
        #expect(String(decoding: OpenAPI.document, as: UTF8.self).contains("\"\(WireErrorCode.updateNormExceeded.rawValue)\""))
    }
}

@Suite struct ClientConfigLayersTests {
    @Test func keysLeftOutStayUnsetAndAreNotSent() throws {
        let config = try WireCoding.decoder().decode(ClientConfig.self, from: Data(#"{"learning_rate":0.2}"#.utf8))
        #expect(config == ClientConfig(learningRate: 0.2))
        #expect(config.batchSize == nil && config.localEpochs == nil && config.maxUpdates == nil)
        let encoded = try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(config)) as? [String: Any]
        #expect(encoded?.keys.sorted() == ["learning_rate"])
        #expect(ClientConfig().validationFailure() == nil)
        #expect(ClientConfig(batchSize: 0).validationFailure() != nil)
        #expect(ClientConfig(learningRate: .nan).validationFailure() != nil)
        #expect(ClientConfig(localEpochs: 0).validationFailure() != nil)
    }

    @Test func aReportResponseSaysWhetherItClosedTheCycle() throws {
        let closing = ReportResponse(cycle: 4, reportsReceived: 10, retryAfter: 0, cycleClosed: true)
        let object = try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(closing)) as? [String: Any]
        #expect(object?["cycle_closed"] as? Bool == true)
        #expect(try WireCoding.decoder().decode(ReportResponse.self, from: WireCoding.encoder().encode(closing)) == closing)
        let withoutFlag = try WireCoding.decoder().decode(ReportResponse.self, from: Data(#"{"cycle":2,"reports_received":1,"retry_after":5}"#.utf8))
        #expect(withoutFlag == ReportResponse(cycle: 2, reportsReceived: 1, retryAfter: 5, cycleClosed: false))
    }
}

/// `client_config.proximal_mu` (FedProx): read, written, checked.
@Suite struct ProximalMuConfigTests {
    @Test func proximalMuIsAKnownKey() throws {
        let config = try WireCoding.decoder().decode(ClientConfig.self, from: Data(#"{"proximal_mu":0.01,"local_epochs":2}"#.utf8))
        #expect(config.proximalMu == 0.01 && config.extra.isEmpty)
        let written = String(decoding: try WireCoding.encoder().encode(config), as: UTF8.self)
        #expect(written.contains(#""proximal_mu":0.01"#))
        #expect(ClientConfig(proximalMu: 0).validationFailure() == nil)
        #expect(ClientConfig(proximalMu: -1).validationFailure()?.contains("proximal_mu") == true)
        #expect(ClientConfig(proximalMu: .infinity).validationFailure()?.contains("proximal_mu") == true)
    }
}

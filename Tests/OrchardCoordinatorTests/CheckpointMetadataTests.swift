import Foundation
import OrchardFormats
import OrchardProtocol
import Testing

/// Published checkpoints keep what the host put in the initial weights' metadata (the model's preprocessing), with
/// only the per-checkpoint keys rewritten.
@Suite struct CheckpointMetadataTests {
    @Test func theInitialWeightsMetadataIsCarriedToEveryCheckpoint() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Fixture.host(goal: 1)
            request.initialWeights = Safetensors.encode(
                Fixture.weights,
                metadata: [
                    "orchard.preprocessing": #"{"numeric":["x"]}"#, "format": "pt", "orchard.checkpoint": "41", "orchard.epsilon": "9",
                ])
            let hosted = try await harness.host(request)
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.5), samples: 3).status == 200)
            for number in ["0", "1"] {
                let result = try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, number), token: Harness.adminToken)
                #expect(result.status == 200)
                let metadata = try Safetensors.decode(result.body).metadata
                #expect(metadata["orchard.preprocessing"] == #"{"numeric":["x"]}"#, "checkpoint \(number)")
                #expect(metadata["format"] == "pt")
                #expect(metadata["orchard.checkpoint"] == number && metadata["orchard.process"] == hosted.processID)
                #expect(metadata["orchard.epsilon"] == nil, "a per-checkpoint key of the host's file is not carried")
            }
        }
    }
}

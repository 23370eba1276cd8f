import Foundation
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Arbitrary and mutated JSON through every wire message the coordinator decodes: a message decodes (and then
/// survives an encode–decode round trip and its validation) or fails with a `DecodingError`, never anything else.
@Suite(.shrinking(false)) struct WireDecoderPropertyTests {
    static let authenticate = try! JSONValue.parse(
        WireCoding.encoder().encode(AuthenticateRequest(authToken: "a.b.c", processName: "tiny", processVersion: SemanticVersion(1))))
    static let cycle = try! JSONValue.parse(
        WireCoding.encoder().encode(
            CycleRequest(workerID: "w_0123456789abcdef01234567", processName: "tiny", processVersion: SemanticVersion(1, 2), downloadMbps: 10, uploadMbps: 2)))
    static let host: JSONValue = {
        let model = ModelSpec(
            name: "m", inputs: [InputSpec(name: "x", shape: [2])], layers: [LayerSpec(name: "d", type: .dense, inputs: ["x"], units: 1)],
            training: TrainingSpec(loss: .meanSquaredError))
        let request = HostProcessRequest(
            name: "tiny", version: SemanticVersion(1), model: model,
            initialWeights: Safetensors.encode([
                TensorRecord(name: "d.weight", shape: [1, 2], values: [1, 2]), TensorRecord(name: "d.bias", shape: [1], values: [0]),
            ]),
            clientConfig: ClientConfig(batchSize: 4, learningRate: 0.1, localEpochs: 1, maxUpdates: 3, extra: ["k": .string("v")]),
            serverConfig: ServerConfig(
                minimumDownloadMbps: 1, authentication: .hs256(secret: String(repeating: "s", count: 32), issuer: "i", audience: "a"),
                aggregator: AggregatorConfig(kind: .fedAdam), updateNormBound: 3, updateNormPolicy: .reject)
        )
        return try! JSONValue.parse(WireCoding.encoder().encode(request))
    }()
    static let metadata = try! JSONValue.parse(
        WireCoding.encoder().encode(
            ReportMetadata(workerID: "w_0123456789abcdef01234567", requestKey: "0123456789abcdef0123456789abcdef", sampleCount: 3, metrics: ["loss": 0.5])))

    static func arbitrary() -> Generator<JSONValue, Shrink.None<JSONValue>> { fuzzed { Fuzz.value(depth: 4, using: &$0) } }
    static func mutated(_ valid: JSONValue) -> Generator<JSONValue, Shrink.None<JSONValue>> { fuzzed { Fuzz.mutate(valid, edits: 3, using: &$0) } }

    /// Decodes `json` as `T` with `decoder`: nil for a `DecodingError`; any other error is an issue.
    private func decode<T: Codable & Hashable>(
        _ messageType: T.Type, _ json: JSONValue, _ decoder: JSONDecoder = WireCoding.decoder(), sourceLocation: SourceLocation = #_sourceLocation
    ) -> T? {
        do {
            let value = try decoder.decode(T.self, from: Data(Fuzz.json(json)))
            // What decodes re-encodes to something that decodes to the same value.
            let again = try decoder.decode(T.self, from: WireCoding.encoder().encode(value))
            #expect(again == value, sourceLocation: sourceLocation)
            return value
        } catch is DecodingError {
            return nil
        } catch {
            Issue.record("\(T.self) threw \(type(of: error)): \(error)", sourceLocation: sourceLocation)
            return nil
        }
    }

    @Test func theValidMessagesDecode() {
        #expect(decode(AuthenticateRequest.self, Self.authenticate) != nil)
        #expect(decode(CycleRequest.self, Self.cycle) != nil)
        #expect(decode(HostProcessRequest.self, Self.host, WireCoding.strictDecoder()) != nil)
        #expect(decode(ReportMetadata.self, Self.metadata) != nil)
    }

    @Test func authenticateRequests() async {
        for generator in [Self.arbitrary(), Self.mutated(Self.authenticate)] {
            await propertyCheck(count: 300, input: generator) { json in _ = decode(AuthenticateRequest.self, json) }
        }
    }

    @Test func cycleRequests() async {
        for generator in [Self.arbitrary(), Self.mutated(Self.cycle)] {
            await propertyCheck(count: 300, input: generator) { json in _ = decode(CycleRequest.self, json) }
        }
    }

    @Test func hostProcessRequestsWithTheirModelAndConfigurations() async {
        var decoded = 0
        for generator in [Self.arbitrary(), Self.mutated(Self.host)] {
            await propertyCheck(count: 500, input: generator) { json in
                guard let request = decode(HostProcessRequest.self, json, WireCoding.strictDecoder()) else { return }
                decoded += 1
                // The checks the coordinator runs next never trap, whatever decoded.
                _ = WireLimits.nameFailure(request.name, field: "name")
                _ = request.clientConfig.validationFailure()
                if request.serverConfig.validationFailure() == nil { #expect(request.serverConfig.capacity >= request.serverConfig.goalCount) }
                _ = try? request.model.validateLimits()
                _ = try? request.model.parameters()
                _ = try? Safetensors.index(request.initialWeights)
            }
        }
        #expect(decoded > 0)
    }

    @Test func unknownKeysAreRefusedOnlyByTheStrictDecoder() throws {
        for path in [[String](), ["server_config"], ["server_config", "aggregator"], ["server_config", "authentication"]] {
            var json = Self.host
            func insert(_ value: inout JSONValue, _ path: ArraySlice<String>) {
                guard case .object(var members) = value else { return }
                if let first = path.first {
                    var child = members[first] ?? .object([:])
                    insert(&child, path.dropFirst())
                    members[first] = child
                } else {
                    members["goal_cout"] = .number(3)
                }
                value = .object(members)
            }
            insert(&json, path[...])
            #expect(throws: DecodingError.self, "\(path)") { try WireCoding.strictDecoder().decode(HostProcessRequest.self, from: Data(Fuzz.json(json))) }
            #expect(throws: Never.self, "\(path)") { try WireCoding.decoder().decode(HostProcessRequest.self, from: Data(Fuzz.json(json))) }
        }
        // The client config passes free-form keys through, strict or not.
        let config = try WireCoding.strictDecoder().decode(ClientConfig.self, from: Data(#"{"batch_size":2,"note":"x"}"#.utf8))
        #expect(config.extra["note"] == .string("x"))
    }

    @Test func reportMetadataThroughTheEnvelope() async {
        for generator in [Self.arbitrary(), Self.mutated(Self.metadata)] {
            await propertyCheck(count: 300, input: generator) { json in
                // The envelope reads the metadata from the safetensors pairs; its only error is a FormatError.
                let pairs = [ReportEnvelope.metadataKey: String(decoding: Fuzz.json(json), as: UTF8.self)]
                if let metadata = try? ReportEnvelope.metadata(in: pairs) {
                    #expect(decode(ReportMetadata.self, json) == metadata)
                }
            }
        }
    }

    @Test func arbitraryBytesAreNeverAMessage() async {
        await propertyCheck(count: 300, input: fuzzed { Fuzz.bytes(maximum: 256, using: &$0) }) { bytes in
            for decode in [
                { try WireCoding.decoder().decode(AuthenticateRequest.self, from: Data(bytes)) as Any },
                { try WireCoding.decoder().decode(CycleRequest.self, from: Data(bytes)) as Any },
                { try WireCoding.strictDecoder().decode(HostProcessRequest.self, from: Data(bytes)) as Any },
            ] as [() throws -> Any] {
                #expect(throws: DecodingError.self) { try decode() }
            }
        }
    }
}

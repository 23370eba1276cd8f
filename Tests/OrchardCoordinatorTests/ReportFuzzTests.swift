import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Seeded random reports over loopback HTTP: whatever the bytes, the coordinator answers (no crash), never with a
/// 5xx, and a refused report never changes the model; an accepted one never publishes a non-finite checkpoint.
@Suite(.serialized) struct ReportFuzzTests {
    private enum Mutation: CaseIterable {
        case randomBytes, flipByte, truncate, appendGarbage, hugeHeaderLength, randomFloat, flipHeaderBytes
        // Edits of the parsed header, written back with a consistent length (so the checks behind the parser run).
        case shapeEdit, dtypeEdit, offsetEdit, tensorEdit, metadataEdit
    }

    private static func mutate(_ valid: [UInt8], _ mutation: Mutation, _ random: inout SplitMix64) -> [UInt8] {
        var body = valid
        let headerLength = Int(valid[0]) | Int(valid[1]) << 8 | Int(valid[2]) << 16 | Int(valid[3]) << 24
        let dataStart = 8 + headerLength
        switch mutation {
        case .randomBytes:
            return (0..<Int.random(in: 0...2048, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
        case .flipByte:
            body[Int.random(in: 0..<body.count, using: &random)] ^= UInt8.random(in: 1...255, using: &random)
        case .truncate:
            body.removeLast(Int.random(in: 1...body.count, using: &random))
        case .appendGarbage:
            body += (0..<Int.random(in: 1...64, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
        case .hugeHeaderLength:
            let length = UInt64.random(in: UInt64(headerLength + 1)...UInt64.max, using: &random)
            withUnsafeBytes(of: length.littleEndian) { for i in 0..<8 { body[i] = $0[i] } }
        case .randomFloat:
            let floats = (body.count - dataStart) / 4
            let index = dataStart + 4 * Int.random(in: 0..<floats, using: &random)
            let bits = UInt32.random(in: 0...UInt32.max, using: &random)
            withUnsafeBytes(of: bits.littleEndian) { for i in 0..<4 { body[index + i] = $0[i] } }
        case .flipHeaderBytes:
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                body[Int.random(in: 8..<dataStart, using: &random)] = UInt8.random(in: 0x20...0x7E, using: &random)
            }
        case .shapeEdit: return SafetensorsMutation.shapeEdit.apply(to: valid, using: &random)
        case .dtypeEdit: return SafetensorsMutation.dtypeEdit.apply(to: valid, using: &random)
        case .offsetEdit: return SafetensorsMutation.offsetEdit.apply(to: valid, using: &random)
        case .tensorEdit: return SafetensorsMutation.tensorEdit.apply(to: valid, using: &random)
        case .metadataEdit: return SafetensorsMutation.metadataEdit.apply(to: valid, metadataKey: ReportEnvelope.metadataKey, using: &random)
        }
        return body
    }

    @Test func arbitraryReportBodiesNeverCrashNever5xxAndNeverChangeTheModelWhenRefused() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 1, minimum: 1, overSelection: 1))
            let device = try await harness.device()
            var assignment = try await harness.join(device)
            var latest = 0
            var random = SplitMix64(state: 0x5EED)
            var counts: [String: Int] = [:]
            func valid(_ assignment: CycleAssignment) -> [UInt8] {
                ReportEnvelope.encode(
                    diff: Fixture.diff(0.01), metadata: ReportMetadata(workerID: device.workerID, requestKey: assignment.requestKey, sampleCount: 5))
            }
            for iteration in 0..<400 {
                let mutation = Mutation.allCases[iteration % Mutation.allCases.count]
                let body = Self.mutate(valid(assignment), mutation, &random)
                let result = try await harness.http.send(
                    "POST", Endpoint.report, body: body, token: device.sessionToken, headers: ["Content-Type": MediaType.safetensors])
                #expect(result.status < 500, "\(mutation) #\(iteration): \(result.status) \(String(decoding: result.body, as: UTF8.self))")
                counts["\(result.status) \(result.errorCode ?? "")", default: 0] += 1
                let status = try await harness.status(hosted.processID)
                if result.status == 200 {
                    // An accepted report closes the cycle (goal 1): published, or abandoned when the result is not finite.
                    #expect(status.latestCheckpoint >= latest)
                    latest = status.latestCheckpoint
                    let weights = try await harness.checkpoint(hosted.processID)
                    #expect(weights.values.allSatisfy { $0.allSatisfy(\.isFinite) }, "\(mutation) #\(iteration)")
                    assignment = try await harness.join(device)
                } else {
                    #expect((400..<500).contains(result.status) && result.errorCode != nil, "\(mutation) #\(iteration): \(result.status)")
                    #expect(status.latestCheckpoint == latest, "\(mutation) #\(iteration) changed the model")
                    #expect(status.currentCycle?.reported == 0, "\(mutation) #\(iteration)")
                }
            }
            // No refusal left the assignment stuck: the unmutated report is still accepted.
            #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.01), samples: 5).status == 200, "\(counts)")
            #expect(counts.keys.contains { $0.hasPrefix("4") })
        }
    }

    /// Property-based: 1–3 mutations of every kind composed on a valid report (the seed from `propertyCheck`). A
    /// refused report leaves the checkpoint's bytes and the cycle's counts exactly as they were; every answer is a
    /// 2xx or a 4xx with an error code.
    @Test(.shrinking(false)) func composedMutationsAreRefusedWith4xxAndLeaveTheCheckpointBytesAlone() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 1, minimum: 1, overSelection: 1))
            let device = try await harness.device()
            var assignment = try await harness.join(device)
            func state() async throws -> (checkpoint: [UInt8], status: String) {
                let checkpoint = try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: Harness.adminToken).body
                let status = try await harness.status(hosted.processID)
                return (
                    checkpoint,
                    "\(status.latestCheckpoint) \(status.cyclesCompleted) \(status.cyclesAbandoned) \(status.currentCycle.map { "\($0.number) \($0.assigned) \($0.reported)" } ?? "-")"
                )
            }
            var before = try await state()
            var codes: [String: Int] = [:]
            let plans = fuzzed { rng in
                ((0..<Int.random(in: 1...3, using: &rng)).map { _ in SafetensorsMutation.allCases.randomElement(using: &rng)! }, rng.next())
            }
            func check(_ mutations: [SafetensorsMutation], _ seed: UInt64) async throws {
                var random = SplitMix64(state: seed)
                var body = ReportEnvelope.encode(
                    diff: Fixture.diff(0.01),
                    metadata: ReportMetadata(workerID: device.workerID, requestKey: assignment.requestKey, sampleCount: 5, metrics: ["loss": 0.5]))
                for mutation in mutations { body = mutation.apply(to: body, metadataKey: ReportEnvelope.metadataKey, using: &random) }
                let result = try await harness.http.send(
                    "POST", Endpoint.report, body: body, token: device.sessionToken, headers: ["Content-Type": MediaType.safetensors])
                codes["\(result.status) \(result.errorCode ?? "")", default: 0] += 1
                let after = try await state()
                if result.status == 200 {
                    assignment = try await harness.join(device)
                    before = try await state()
                } else {
                    #expect(
                        (400..<500).contains(result.status) && result.errorCode != nil,
                        "\(mutations): \(result.status) \(String(decoding: result.body, as: UTF8.self))")
                    #expect(after.checkpoint == before.checkpoint, "\(mutations) changed the checkpoint")
                    #expect(after.status == before.status, "\(mutations) changed the cycle")
                }
            }
            await propertyCheck(count: 250, input: plans) { plan in try await check(plan.0, plan.1) }
            // Every mutation alone, with fixed seeds, so that the codes below are reached whatever the random plans were.
            for mutation in SafetensorsMutation.allCases {
                for seed in UInt64(0)..<4 { try await check([mutation], seed) }
            }
            // The refusals come from the checks behind the parser too, not only from it.
            #expect(
                Set(codes.keys).isSuperset(of: [
                    "400 malformed_safetensors", "400 invalid_request", "422 dtype_mismatch", "422 shape_mismatch", "422 tensor_mismatch",
                ]), "\(codes)")
        }
    }
}

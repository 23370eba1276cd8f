import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import Testing

/// Seeded random reports over loopback HTTP: whatever the bytes, the coordinator answers (no crash), never with a
/// 5xx, and a refused report never changes the model; an accepted one never publishes a non-finite checkpoint.
@Suite(.serialized) struct ReportFuzzTests {
    private enum Mutation: CaseIterable {
        case randomBytes, flipByte, truncate, appendGarbage, hugeHeaderLength, randomFloat, flipHeaderBytes
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
        }
        return body
    }

    @Test func arbitraryReportBodiesNeverCrashNever5xxAndNeverChangeTheModelWhenRefused() async throws {
        let harness = try await Harness.start()
        defer { Task { await harness.stop() } }
        let hosted = try await harness.host(Fixture.host(goal: 1, minimum: 1, overSelection: 1))
        let device = try await harness.device()
        var assignment = try await harness.join(device)
        var latest = 0
        var random = SplitMix64(state: 0x5EED)
        var counts: [String: Int] = [:]
        func valid(_ assignment: CycleAssignment) -> [UInt8] {
            ReportEnvelope.encode(diff: Fixture.diff(0.01), metadata: ReportMetadata(workerID: device.workerID, requestKey: assignment.requestKey, sampleCount: 5))
        }
        for iteration in 0..<400 {
            let mutation = Mutation.allCases[iteration % Mutation.allCases.count]
            let body = Self.mutate(valid(assignment), mutation, &random)
            let result = try await harness.http.send("POST", Endpoint.report, body: body, token: device.sessionToken, headers: ["Content-Type": MediaType.safetensors])
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

import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardCoreML
import OrchardFormats
import OrchardProtocol
import Testing

/// Model downloads and report uploads through a background `URLSession` (FoundationNetworking's on Linux) against a
/// real coordinator on loopback, including a download that finishes while nobody waits for it.
@Suite struct BackgroundTransferTests {
    final class Collector: DownloadSink, @unchecked Sendable {
        private let lock = NSLock()
        private var collected: [UInt8] = []
        private(set) var head: DownloadHead?
        func begin(_ head: DownloadHead) throws(OrchardClientError) { lock.withLock { self.head = head } }
        func append(_ bytes: [UInt8]) throws(OrchardClientError) { lock.withLock { collected += bytes } }
        var bytes: [UInt8] { lock.withLock { collected } }
    }

    @Test func modelsAndReportsGoThroughTheBackgroundSession() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host(Fixture.host(goal: 2, minimum: 1))
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-transfers-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: directory) }
            let transport = try BackgroundTransferTransport(
                baseURL: harness.http.base, inner: try HTTPTransport(url: harness.http.base.absoluteString), directory: directory,
                identifier: "dev.orchard.test.\(UUID().uuidString)"
            )
            defer { transport.invalidate() }

            // The weights, and the same model as Core ML.
            let request = ModelRequest(modelID: assignment.modelID, requestKey: assignment.requestKey)
            let weights = Collector()
            try await transport.downloadModel(request, session: device.sessionToken, into: weights)
            #expect(
                try Safetensors.decode(weights.bytes).byName.mapValues(\.values)
                    == Dictionary(uniqueKeysWithValues: Fixture.weights.map { ($0.name, $0.values) }))
            #expect(weights.head?.etag == "\"\(assignment.modelID)\"")
            #expect(weights.head?.sha256?.count == 32, "the coordinator's Repr-Digest travels with the download, so the job can verify it")
            let coreML = Collector()
            try await transport.downloadModel(
                ModelRequest(modelID: assignment.modelID, requestKey: assignment.requestKey, format: .mlmodel), session: device.sessionToken, into: coreML)
            #expect(try CoreMLImporter().importModel(from: coreML.bytes).weights.map(\.values) == Fixture.weights.map(\.values))

            // A prefetch finishes while nobody waits (as while the app is suspended); the next call takes the kept result.
            try transport.prefetchModel(request, session: device.sessionToken)
            var kept: [String] = []
            for _ in 0..<1000 where kept.isEmpty {
                kept = (try FileManager.default.contentsOfDirectory(atPath: directory.path)).filter { $0.hasSuffix(".kept") }
                if kept.isEmpty { try await Task.sleep(for: .milliseconds(10)) }  // waiting for the transfer, not for time
            }
            #expect(kept.count == 1)
            let again = Collector()
            try await transport.downloadModel(request, session: device.sessionToken, into: again)
            #expect(again.bytes == weights.bytes)
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".kept") }.isEmpty, "the kept result was taken")

            // Two calls for the same model at once share one transfer and both get it.
            let first = Collector(), second = Collector()
            async let one: Void = transport.downloadModel(request, session: device.sessionToken, into: first)
            async let two: Void = transport.downloadModel(request, session: device.sessionToken, into: second)
            _ = try await (one, two)
            #expect(first.bytes == weights.bytes && second.bytes == weights.bytes)

            // The report is uploaded from a file; a second one is the coordinator's refusal, with its code.
            let body = ReportEnvelope.encode(
                diff: Fixture.diff(0.1),
                metadata: ReportMetadata(workerID: device.workerID, requestKey: assignment.requestKey, sampleCount: 5, metrics: ["loss": 0.5])
            )
            let answer = try await transport.report(body, session: device.sessionToken)
            #expect(answer.cycle == 1 && answer.reportsReceived == 1)
            do throws(OrchardClientError) {
                _ = try await transport.report(body, session: device.sessionToken)
                Issue.record("a second report was accepted")
            } catch {
                #expect(error.serverCode == .reportAlreadyReceived && error.httpStatus == 409)
            }
            // Another worker's key is refused as over HTTP.
            let other = try await harness.device()
            let collector = Collector()
            do throws(OrchardClientError) {
                try await transport.downloadModel(request, session: other.sessionToken, into: collector)
                Issue.record("another worker's key was accepted")
            } catch {
                #expect(error.serverCode == .invalidRequestKey)
            }
        }
    }
}

import Foundation
@testable import OrchardClient
import OrchardProtocol
import Testing

/// The background transport's edges that an iPhone meets and a coordinator is not needed for: a transfer that cannot
/// start, and the relaunch's completion handler arriving before or after the session's last event.
@Suite(.timeLimit(.minutes(1))) struct BackgroundTransferEventsTests {
    /// A transport whose request URLs cannot be built (`foo:%2F%2F` plus a path is no URL), so every transfer fails
    /// to start; its inner transport is never reached.
    func unbuildable() throws -> (BackgroundTransferTransport, URL) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-transfers-\(UUID().uuidString)")
        let base = try #require(URL(string: "foo:%2F%2F"))
        let transport = try BackgroundTransferTransport(
            baseURL: base, inner: try HTTPTransport(url: "http://127.0.0.1:9"), directory: directory, identifier: "dev.orchard.test.\(UUID().uuidString)"
        )
        return (transport, directory)
    }

    final class Sink: DownloadSink, @unchecked Sendable {
        func begin(_ head: DownloadHead) throws(OrchardClientError) {}
        func append(_ bytes: [UInt8]) throws(OrchardClientError) {}
    }

    @Test func aDownloadThatCannotStartFailsInsteadOfWaitingForever() async throws {
        let (transport, directory) = try unbuildable()
        defer {
            transport.invalidate()
            try? FileManager.default.removeItem(at: directory)
        }
        let request = ModelRequest(modelID: "m1", requestKey: "k1")
        do throws(OrchardClientError) {
            try await transport.downloadModel(request, session: "token", into: Sink())
            Issue.record("a download that could not start succeeded")
        } catch {
            #expect(error.code == .invalidConfiguration, "\(error)")
        }
        // Nothing is left in flight: the next call tries again (and fails the same way) instead of waiting for it.
        await #expect(throws: OrchardClientError.self) { try await transport.downloadModel(request, session: "token", into: Sink()) }
    }

    @Test @MainActor func theHandlerForwardedAfterTheSessionsLastEventIsCalledAtOnce() async throws {
        let (transport, directory) = try unbuildable()
        defer {
            transport.invalidate()
            try? FileManager.default.removeItem(at: directory)
        }
        // The system delivered the relaunch's events before the app delegate forwarded its handler.
        transport.sessionFinishedEvents()
        var calls = 0
        // UIKit's handler is a plain closure, not @Sendable: it must be accepted as it comes.
        let handler: () -> Void = { calls += 1 }
        #expect(transport.handleEventsForBackgroundURLSession(transport.identifier, completionHandler: handler))
        #expect(calls == 1)
        // Another session's identifier is not this transport's.
        #expect(!transport.handleEventsForBackgroundURLSession("someone.else") { calls += 100 })
        #expect(calls == 1)
    }

    @Test @MainActor func theHandlerForwardedFirstIsCalledWhenTheSessionFinishes() async throws {
        let (transport, directory) = try unbuildable()
        defer {
            transport.invalidate()
            try? FileManager.default.removeItem(at: directory)
        }
        var calls = 0
        transport.handleEventsForBackgroundURLSession(transport.identifier) { calls += 1 }
        #expect(calls == 0)
        transport.sessionFinishedEvents()
        #expect(calls == 1)
        // Once: a second delivery has no handler left to call.
        transport.sessionFinishedEvents()
        #expect(calls == 1)
    }
}

import Foundation
import OrchardSupport
import OrchardClient
import OrchardProtocol
import Synchronization
import OrchardTesting
import Testing

@Suite("Retries, errors and transports")
struct RetryAndTransportTests {
    @Test("backoff doubles per retry up to the cap, and jitter stays within its fraction", arguments: [0.0, 0.25, 0.999])
    func backoff(random: Double) {
        let policy = RequestRetryPolicy(maximumAttempts: 10, initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0.5)
        let bases: [Double] = [1, 2, 4, 8, 8, 8]
        for (index, base) in bases.enumerated() {
            let delay = policy.delay(beforeRetry: index + 1, random: random)
            let seconds = delay.inSeconds
            #expect(seconds >= base * 0.5 - 1e-9)
            #expect(seconds <= base + 1e-9)
            #expect(abs(seconds - (base * 0.5 + base * 0.5 * random)) < 1e-6)
        }
    }

    @Test("seeded environments give reproducible jitter")
    func seededJitter() {
        let a = ClientEnvironment.seeded(9)
        let b = ClientEnvironment.seeded(9)
        let c = ClientEnvironment.seeded(10)
        let first = (0..<5).map { _ in a.random() }
        #expect(first == (0..<5).map { _ in b.random() })
        #expect(first != (0..<5).map { _ in c.random() })
        #expect(first.allSatisfy { (0..<1).contains($0) })
    }

    @Test("5xx and network failures are transient; 4xx and authentication failures are not")
    func transience() {
        #expect(OrchardClientError.server(status: 503, body: nil).isTransient)
        #expect(OrchardClientError(.network, "down").isTransient)
        #expect(!OrchardClientError.server(status: 409, body: ErrorBody(code: .deadlinePassed, message: "closed")).isTransient)
        let auth = OrchardClientError.server(status: 401, body: ErrorBody(code: .unauthorized, message: "bad token"))
        #expect(auth.code == .authenticationFailed)
        #expect(!auth.isTransient)
        let server = OrchardClientError.server(status: 422, body: ErrorBody(code: .shapeMismatch, message: "shape"))
        #expect(server.code == .serverError)
        #expect(server.serverCode == .shapeMismatch)
        #expect(server.message == "shape")
        #expect(server.description.contains("shape_mismatch"))
    }

    @Test("Retry-After is read as delta-seconds or an HTTP-date in any of its three forms; anything else is ignored")
    func retryAfterParsing() {
        let date = Date(timeIntervalSince1970: 784_111_777)  // Sun, 06 Nov 1994 08:49:37 GMT
        let now = date.addingTimeInterval(-90)
        #expect(RetryAfter.seconds("120", now: now) == 120)
        #expect(RetryAfter.seconds(" 0 ", now: now) == 0)
        #expect(RetryAfter.seconds("Sun, 06 Nov 1994 08:49:37 GMT", now: now) == 90)
        #expect(RetryAfter.seconds("Sunday, 06-Nov-94 08:49:37 GMT", now: now) == 90)
        #expect(RetryAfter.seconds("Sun Nov  6 08:49:37 1994", now: now) == 90)
        // A date already past asks for no wait.
        #expect(RetryAfter.seconds("Sun, 06 Nov 1994 08:49:37 GMT", now: date.addingTimeInterval(5)) == 0)
        for bad in ["", "-1", "1.5", "soon", "0x10", "Sun, 06 Nov 1994 08:49:37 PST", "Sun, 32 Nov 1994 08:49:37 GMT"] {
            #expect(RetryAfter.seconds(bad, now: now) == nil, "\(bad)")
        }
        #expect(OrchardClientError.server(status: 429, body: nil).isTransient)
        #expect(OrchardClientError.server(status: 429, body: nil, retryAfter: 4).retryAfter == 4)
    }

    @Test("invalid coordinator URLs are a clear configuration error", arguments: ["", "not a url", "ftp://example.com", "http://", "/relative/path"])
    func invalidURL(url: String) {
        let error = #expect(throws: OrchardClientError.self) { try CoordinatorConnection(url: url) }
        #expect(error?.code == .invalidConfiguration)
        #expect(error?.message.contains("coordinator URL") == true)
    }

    @Test("malformed versions and empty names are refused when a job is created")
    func invalidJob() throws {
        let client = try CoordinatorConnection(url: "http://127.0.0.1:9")
        #expect(throws: OrchardClientError.self) { try client.newJob(processName: "m", version: "1.x") }
        #expect(throws: OrchardClientError.self) { try client.newJob(processName: "", version: "1.0") }
        let job = try client.newJob(processName: "m/../x", version: "1.0")
        #expect(job.version == SemanticVersion(1, 0, 0))
        #expect(!job.directory.lastPathComponent.contains("/"))
        #expect(job.directory.lastPathComponent == "m_.._x@1.0.0")
    }

    @Test("an unreachable coordinator is a network error after the configured attempts, with jittered waits")
    func unreachable() async throws {
        let sleeps = Mutex<[Duration]>([])
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-unreachable-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let configuration = DeviceConfiguration(
            storageDirectory: directory, requestTimeout: .seconds(5),
            retry: RequestRetryPolicy(maximumAttempts: 4, initialDelay: .seconds(1), maximumDelay: .seconds(60), jitter: 0.5),
            environment: .seeded(1, clock: RecordingClock { duration in sleeps.withLock { $0.append(duration) } })
        )
        // Port 9 (discard) on loopback is closed: connections are refused at once.
        let client = try CoordinatorConnection(url: "http://127.0.0.1:9", configuration: configuration)
        let job = try client.newJob(processName: "m", version: "1")
        let error = await #expect(throws: OrchardClientError.self) { try await job.run { _ in LocalUpdate(diff: [], sampleCount: 1) } }
        #expect(error?.code == .network)
        let waits = sleeps.withLock { $0 }
        #expect(waits.count == 3)
        for (index, wait) in waits.enumerated() {
            let base = Double(1 << index)
            let seconds = wait.inSeconds
            #expect(seconds >= base * 0.5 && seconds <= base)
        }
    }
}

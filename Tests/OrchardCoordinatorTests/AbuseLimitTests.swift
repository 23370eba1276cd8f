import Foundation
import Logging
import OrchardCoordinator
import OrchardProtocol
import OrchardSupport
import Synchronization
import Testing

/// Records every log message, for tests that check what the coordinator warns about.
struct CapturingLogHandler: LogHandler {
    let sink: @Sendable (Logger.Level, String) -> Void
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        sink(event.level, event.message.description)
    }
}

/// A host request for the tiny model with speed-test gating and the given speed-test sizes.
func gatedHost(name: String = "tiny", download: Int = 2000, upload: Int = 3000) -> HostProcessRequest {
    var request = Fixture.host(name: name)
    request.serverConfig.minimumDownloadMbps = 1
    request.serverConfig.speedTestDownloadBytes = download
    request.serverConfig.speedTestUploadBytes = upload
    return request
}

@Suite("Open-mode limits: per-address authentication rate and worker cap, over loopback HTTP", .serialized)
struct OpenModeLimitTests {
    static func configuration(burst: Int = 3, perSecond: Double = 0.1, cap: Int? = nil) -> CoordinatorConfiguration {
        CoordinatorConfiguration(adminToken: Harness.adminToken, openAuthenticationRate: RateLimit(burst: burst, perSecond: perSecond), maximumOpenWorkers: cap)
    }

    func authenticate(_ harness: Harness, name: String = "tiny", token: String? = nil) async throws -> HTTPResult {
        try await harness.http.json("POST", Endpoint.authenticate, AuthenticateRequest(authToken: token, processName: name, processVersion: SemanticVersion(1)))
    }

    @Test func anAddressThatAuthenticatesTooOftenGets429WithRetryAfterUntilItsBucketRefills() async throws {
        let harness = try await Harness.start(configuration: Self.configuration(burst: 3, perSecond: 0.1))
        try await harness.stopping {
            _ = try await harness.host()
            for _ in 0..<3 { #expect(try await authenticate(harness).status == 200) }
            let limited = try await authenticate(harness)
            #expect(limited.status == 429)
            #expect(limited.errorCode == "rate_limited")
            #expect(limited.header("Retry-After") == "10")
            #expect(String(decoding: limited.body, as: UTF8.self).contains("127.0.0.1"))
            // Nine seconds refill 0.9 of a token: still refused, now asked to wait one more second.
            harness.clock.advance(bySeconds: 9)
            let still = try await authenticate(harness)
            #expect(still.status == 429 && still.header("Retry-After") == "1")
            harness.clock.advance(bySeconds: 1)
            #expect(try await authenticate(harness).status == 200)
            #expect(try await authenticate(harness).status == 429)
            // Refused calls registered no worker: three, plus the one after the refill.
            #expect(try await harness.coordinator.store.workerCount(processID: try await harness.coordinator.processList().processes[0].processID) == 4)
            // Bad bodies are refused for what they are, before the limit.
            #expect(try await harness.http.send("POST", Endpoint.authenticate, body: Array("{not json".utf8)).status == 400)
            let oversized = try await harness.http.send("POST", Endpoint.authenticate, body: [UInt8](repeating: 0x20, count: (64 << 10) + 1))
            #expect(oversized.status == 413)
            let metrics = try await harness.http.send("GET", Endpoint.metrics)
            #expect(String(decoding: metrics.body, as: UTF8.self).contains(#"orchard_rate_limited_total{endpoint="authenticate"} 3"#))
        }
    }

    /// Wrong admin tokens are counted per address: after ten, the address's attempts are refused unchecked (even the
    /// right token) until its allowance refills, so the admin token cannot be guessed online (the dashboard's sign-in
    /// form checks through the same `checkAdmin`).
    @Test func wrongAdminTokensFromOneAddressAreLimited() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            for attempt in 0..<10 {
                let wrong = try await harness.http.send("GET", Endpoint.processes, token: "guess-\(attempt)")
                #expect(wrong.status == 401)
            }
            let limited = try await harness.http.send("GET", Endpoint.processes, token: "guess-10")
            #expect(limited.status == 429 && limited.errorCode == "rate_limited")
            #expect(limited.header("Retry-After") == "10")
            let right = try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken)
            #expect(right.status == 429, "the right token is not checked while the address is out of attempts")
            harness.clock.advance(bySeconds: 10)
            #expect(try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken).status == 200)
            // A right token never spends the allowance.
            for _ in 0..<20 { #expect(try await harness.http.send("GET", Endpoint.processes, token: Harness.adminToken).status == 200) }
        }
    }

    @Test func processesWithDeviceTokensAreNotLimitedPerAddress() async throws {
        let harness = try await Harness.start(configuration: Self.configuration(burst: 1, perSecond: 0.01))
        try await harness.stopping {
            var request = Fixture.host(name: "signed")
            request.serverConfig.authentication = .hs256(secret: "device-secret-of-at-least-32-bytes!!")
            _ = try await harness.host(request)
            // Without a token, the call is refused for that (401), never rate-limited: no worker is registered.
            for _ in 0..<3 { #expect(try await authenticate(harness, name: "signed").status == 401) }
        }
    }

    @Test func anOpenProcessRegistersAtMostTheCapOfWorkersAcrossRestarts() async throws {
        let harness = try await Harness.start(configuration: Self.configuration(burst: 100, perSecond: 1, cap: 2))
        try await harness.stopping {
            _ = try await harness.host()
            _ = try await harness.host(Fixture.host(name: "other"))
            #expect(try await authenticate(harness).status == 200)
            #expect(try await authenticate(harness).status == 200)
            let full = try await authenticate(harness)
            #expect(full.status == 403)
            #expect(full.errorCode == "worker_limit_reached")
            #expect(String(decoding: full.body, as: UTF8.self).contains("2 workers"))
            // The cap is per process, and it holds after a restart (counted from the store).
            #expect(try await authenticate(harness, name: "other").status == 200)
            try await harness.restart()
            #expect(try await authenticate(harness).status == 403)
            #expect(try await authenticate(harness, name: "other").status == 200)
            #expect(try await authenticate(harness, name: "other").errorCode == "worker_limit_reached")
        }
    }

    @Test func openAuthenticationIsWarnedAboutWhenHostedAndAtStartUp() async throws {
        let lines = Mutex<[String]>([])
        let logger = Logger(label: "test") { _ in CapturingLogHandler { level, message in if level == .warning { lines.withLock { $0.append(message) } } } }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-open-warning-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("c.sqlite").path
        let first = try await CoordinatorInstance.open(database: path, clock: ManualClock(), logger: logger)
        _ = try await first.coordinator.host(Fixture.host())
        var signed = Fixture.host(name: "signed")
        signed.serverConfig.authentication = .hs256(secret: "device-secret-of-at-least-32-bytes!!")
        _ = try await first.coordinator.host(signed)
        first.close()
        let hosted = lines.withLock { $0 }
        #expect(hosted.count == 1)
        #expect(hosted.first?.contains("'tiny'") == true && hosted.first?.contains("open authentication") == true)
        #expect(hosted.first?.contains("development only") == true)
        _ = try await CoordinatorInstance.open(database: path, clock: ManualClock(), logger: logger)
        let restarted = lines.withLock { $0 }
        #expect(restarted.count == 2)
        #expect(restarted.last?.contains("'tiny'") == true && restarted.last?.contains("10000 workers") == true)
    }

    @Test func unusableLimitsAreRefusedAtStart() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-limits-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        for configuration in [
            CoordinatorConfiguration(openAuthenticationRate: RateLimit(burst: 0, perSecond: 1)),
            CoordinatorConfiguration(openAuthenticationRate: RateLimit(burst: 1, perSecond: .nan)),
            CoordinatorConfiguration(maximumOpenWorkers: 0),
            CoordinatorConfiguration(speedTestInterval: .seconds(-1)),
        ] {
            let error = await #expect(throws: CoordinatorError.self) {
                _ = try await CoordinatorInstance.open(
                    database: directory.appendingPathComponent("\(UUID().uuidString).sqlite").path, configuration: configuration)
            }
            #expect(error?.code == .invalidConfiguration)
        }
    }
}

@Suite("Speed test: sized and rate-limited by the session's process, over loopback HTTP", .serialized)
struct SpeedTestEndpointTests {
    @Test func theDownloadNeedsAValidSessionOfAGatedProcessAndIsLimitedPerWorker() async throws {
        let harness = try await Harness.start(
            configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, sessionLifetime: .seconds(600), speedTestInterval: .seconds(20)))
        try await harness.stopping {
            _ = try await harness.host(gatedHost(download: 2000))
            let device = try await harness.device()
            #expect(device.requiresSpeedTest && device.speedTestDownloadBytes == 2000 && device.speedTestUploadBytes == 3000)

            #expect(try await harness.http.send("GET", Endpoint.speedTest + "?bytes=10").status == 401)
            let forged = try await harness.http.send("GET", Endpoint.speedTest + "?bytes=10", token: device.sessionToken + "x")
            #expect(forged.status == 401 && forged.errorCode == "unauthorized")
            for bad in ["0", "-5", "abc", "2001", "\(SpeedTest.maximumBytes + 1)", "99999999999999999999"] {
                let refused = try await harness.http.send("GET", Endpoint.speedTest + "?bytes=\(bad)", token: device.sessionToken)
                #expect(refused.status == 400, "bytes=\(bad)")
                #expect(refused.errorCode == "invalid_request", "bytes=\(bad)")
            }
            // Without `bytes`, the process's size; refused requests above took no turn.
            let whole = try await harness.http.send("GET", Endpoint.speedTest, token: device.sessionToken)
            #expect(whole.status == 200 && whole.body.count == 2000)
            let again = try await harness.http.send("GET", Endpoint.speedTest + "?bytes=10", token: device.sessionToken)
            #expect(again.status == 429 && again.errorCode == "rate_limited" && again.header("Retry-After") == "20")
            // Another worker has its own turn; the first gets another after the interval.
            let other = try await harness.device()
            #expect(try await harness.http.send("GET", Endpoint.speedTest + "?bytes=10", token: other.sessionToken).body.count == 10)
            harness.clock.advance(bySeconds: 20)
            #expect(try await harness.http.send("GET", Endpoint.speedTest + "?bytes=1500", token: device.sessionToken).body.count == 1500)
            // An expired session is refused.
            harness.clock.advance(bySeconds: 600)
            let expired = try await harness.http.send("GET", Endpoint.speedTest, token: device.sessionToken)
            #expect(expired.status == 401 && String(decoding: expired.body, as: UTF8.self).contains("expired"))
        }
    }

    @Test func theUploadIsBoundedByTheProcessAndLimitedPerWorker() async throws {
        let harness = try await Harness.start(configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, speedTestInterval: .seconds(20)))
        try await harness.stopping {
            _ = try await harness.host(gatedHost(upload: 3000))
            let device = try await harness.device()
            #expect(try await harness.http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 10)).status == 401)
            let tooBig = try await harness.http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 3001), token: device.sessionToken)
            #expect(tooBig.status == 413 && tooBig.errorCode == "payload_too_large")
            let upload = try await harness.http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 3000), token: device.sessionToken)
            #expect(try upload.decode(SpeedTestUploadResponse.self).bytes == 3000)
            let again = try await harness.http.send("POST", Endpoint.speedTest, body: [UInt8](repeating: 1, count: 10), token: device.sessionToken)
            #expect(again.status == 429 && again.header("Retry-After") == "20")
            // The download has its own turn.
            #expect(try await harness.http.send("GET", Endpoint.speedTest + "?bytes=10", token: device.sessionToken).status == 200)
            let metrics = try await harness.http.send("GET", Endpoint.metrics)
            #expect(String(decoding: metrics.body, as: UTF8.self).contains(#"orchard_rate_limited_total{endpoint="speed_test"} 1"#))
        }
    }

    @Test func aProcessThatDoesNotGateOnSpeedRunsNoSpeedTestAndAnnouncesNoSizes() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host()
            let device = try await harness.device()
            #expect(!device.requiresSpeedTest && device.speedTestDownloadBytes == nil && device.speedTestUploadBytes == nil)
            let download = try await harness.http.send("GET", Endpoint.speedTest + "?bytes=10", token: device.sessionToken)
            #expect(download.status == 403 && download.errorCode == "forbidden")
            let upload = try await harness.http.send("POST", Endpoint.speedTest, body: [1, 2, 3], token: device.sessionToken)
            #expect(upload.status == 403)
        }
    }

    @Test func speedTestSizesAreValidatedWhenAProcessIsHosted() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            for (download, upload) in [(0, 10), (10, -1), (SpeedTest.maximumBytes + 1, 10)] {
                let result = try await harness.http.json("POST", Endpoint.processes, gatedHost(download: download, upload: upload), token: Harness.adminToken)
                #expect(result.status == 400)
                #expect(result.errorCode == "invalid_configuration")
                #expect(String(decoding: result.body, as: UTF8.self).contains("speed_test_"))
            }
            let wrongType = Array(#"{"speed_test_download_bytes":"lots"}"#.utf8)
            #expect(throws: DecodingError.self) { try WireCoding.decoder().decode(ServerConfig.self, from: Data(wrongType)) }
            let defaults = try WireCoding.decoder().decode(ServerConfig.self, from: Data("{}".utf8))
            #expect(defaults.speedTestDownloadBytes == SpeedTest.defaultBytes && defaults.speedTestUploadBytes == SpeedTest.defaultBytes)
        }
    }
}

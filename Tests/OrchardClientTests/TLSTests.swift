import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardCoordinatorTesting
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// A coordinator serving HTTPS on loopback with a server certificate for 127.0.0.1 signed by a CA made for the test.
struct TLSCoordinator {
    let loopback: LoopbackCoordinator
    let certificates: TestCertificates

    var directory: URL { loopback.directory }
    var instance: CoordinatorInstance { loopback.instance }
    var server: RunningServer { loopback.server }
    var httpsURL: String { loopback.url }

    /// Runs `body` against a fresh coordinator and stops it afterwards (awaited), whether `body` returns or throws.
    static func with(_ body: (TLSCoordinator) async throws -> Void) async throws {
        let certificates = try TestCertificates.make()
        let tls = try CoordinatorTLS(
            certificateChainPEM: Array(certificates.serverCertificatePEM.utf8), privateKeyPEM: Array(certificates.serverPrivateKeyPEM.utf8))
        try await LoopbackCoordinator.with(configuration: CoordinatorConfiguration(), clock: ManualClock(), seed: 4, tls: tls) { loopback in
            try await body(TLSCoordinator(loopback: loopback, certificates: certificates))
        }
    }
}

@Suite("HTTPS with a private CA, on loopback", .serialized, .timeLimit(.minutes(2)))
struct TLSTests {
    @Test("a client that trusts the CA authenticates, gets a cycle and completes one over https")
    func trustedClientCompletesACycle() async throws {
        try await TLSCoordinator.with { coordinator in
            #expect(coordinator.server.baseURL.absoluteString == coordinator.httpsURL)
            // Room for two devices: the bare transport's and the job's.
            _ = try await coordinator.instance.coordinator.host(try Fixture.host(goal: 2, overSelection: 1, clientConfig: ClientIntegrationTests.config))
            let transport = try HTTPTransport(
                url: coordinator.httpsURL, timeout: .seconds(10), trustRoots: .certificates(pem: coordinator.certificates.caCertificatePEM))
            let session = try await transport.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1)))
            let answer = try await transport.requestCycle(
                CycleRequest(workerID: session.workerID, processName: "regressor", processVersion: SemanticVersion(1)), session: session.sessionToken)
            guard case .accepted(let assignment) = answer else {
                Issue.record("expected an assignment, got \(answer)")
                return
            }
            #expect(assignment.cycle == 1)

            // The whole job through `OrchardClient(url:)` with the CA in its configuration: plan, model and report too.
            let caFile = coordinator.directory.appendingPathComponent("ca.pem")
            try Data(coordinator.certificates.caCertificatePEM.utf8).write(to: caFile)
            var configuration = DeviceConfiguration(storageDirectory: coordinator.directory.appendingPathComponent("device"), trainingSeed: 42)
            configuration.trustRoots = try TrustRoots.certificateFile(caFile.path)
            let client = try CoordinatorConnection(url: coordinator.httpsURL, configuration: configuration)
            let outcome = try await client.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
            guard case .reported(let receipt) = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(receipt.cycle == 1)
        }
    }

    @Test("a client without the CA, or trusting another CA, is refused at once with a TLS error that is not retried")
    func untrustedClientGetsATLSError() async throws {
        try await TLSCoordinator.with { coordinator in
            _ = try await coordinator.instance.coordinator.host(try Fixture.host(clientConfig: ClientIntegrationTests.config))
            let other = try TestCertificates.make(commonName: "Another CA")
            for roots in [TrustRoots.system, .certificates(pem: other.caCertificatePEM)] {
                let transport = try HTTPTransport(url: coordinator.httpsURL, timeout: .seconds(10), trustRoots: roots)
                let error = await #expect(throws: OrchardClientError.self) {
                    try await transport.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1)))
                }
                #expect(error?.code == .tls, "\(String(describing: error))")
                #expect(error?.message.contains("not trusted") == true, "\(String(describing: error))")
                #expect(error?.isTransient == false)
            }
            // A job fails with it without backing off.
            let sleeps = Mutex<[Duration]>([])
            let configuration = DeviceConfiguration(
                storageDirectory: coordinator.directory.appendingPathComponent("device"),
                environment: .seeded(1, clock: RecordingClock { duration in sleeps.withLock { $0.append(duration) } })
            )
            let client = try CoordinatorConnection(url: coordinator.httpsURL, configuration: configuration)
            let error = await #expect(throws: OrchardClientError.self) {
                try await client.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset())
            }
            #expect(error?.code == .tls)
            #expect(sleeps.withLock { $0.isEmpty })
        }
    }

    @Test("plain http to the TLS port fails as a network error instead of hanging")
    func plainHTTPToTheTLSPortFails() async throws {
        try await TLSCoordinator.with { coordinator in
            let transport = try HTTPTransport(url: "http://127.0.0.1:\(coordinator.server.port)", timeout: .seconds(10))
            let error = await #expect(throws: OrchardClientError.self) {
                try await transport.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1)))
            }
            #expect(error?.code == .network, "\(String(describing: error))")
        }
    }

    @Test("trust roots that are missing, a directory, or not PEM certificates are configuration errors")
    func badTrustRoots() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-ca-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        for path in [directory.appendingPathComponent("missing.pem").path, directory.path] {
            let error = #expect(throws: ConnectionError.self) { try TrustRoots.certificateFile(path) }
            #expect(error?.code == .invalidConfiguration && error?.message.contains(path) == true)
        }
        let key = try TestCertificates.make().serverPrivateKeyPEM
        for pem in ["not a certificate", "", key] {
            let error = #expect(throws: OrchardClientError.self) { try HTTPTransport(url: "https://127.0.0.1:1", trustRoots: .certificates(pem: pem)) }
            #expect(error?.code == .invalidConfiguration, "\(pem.prefix(20))")
        }
    }
}

/// `orchard` as a child process: standard output through a pipe (read line by line), standard error in a file.
private final class OrchardChild: @unchecked Sendable {
    let process = ChildProcess()
    let errURL: URL
    private let pipe = Pipe()
    private let exited: AsyncStream<Int32>
    private var buffered = [UInt8]()

    init(_ arguments: [String], in directory: URL) throws {
        errURL = directory.appendingPathComponent("err-\(UUID().uuidString)")
        _ = FileManager.default.createFile(atPath: errURL.path, contents: nil)
        process.executableURL = try OrchardExecutable.url()
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment["ORCHARD_ADMIN_TOKEN"] = nil
        process.environment = environment
        process.standardOutput = pipe
        process.standardError = try FileHandle(forWritingTo: errURL)
        let (exited, continuation) = AsyncStream<Int32>.makeStream()
        self.exited = exited
        process.terminationHandler = { process in
            continuation.yield(process.terminationStatus)
            continuation.finish()
        }
        try process.run()
    }

    var error: String { (try? String(contentsOf: errURL, encoding: .utf8)) ?? "" }

    /// Everything written to standard output until the process ended, and its status (at most `seconds`).
    func finish(within seconds: Double) async throws -> (status: Int32, output: String) {
        let exited = self.exited
        let status = try await withDeadline(seconds, "orchard \(process.arguments?.first ?? "") to end") { () async -> Int32 in
            for await status in exited { return status }
            return -1
        }
        let rest = await pipe.fileHandleForReading.readToEndOfFile()
        return (status, String(decoding: buffered + rest, as: UTF8.self))
    }

    /// The JSON object of the first line of standard output (a blocking read until it arrives or the process ends).
    func firstLine() async -> [String: Any]? {
        await OrchardExecutable.firstJSONLine(pipe.fileHandleForReading, buffered: &buffered)
    }

    /// Sends SIGTERM while it runs (its reaper thread collects it).
    func stop() {
        if process.isRunning { process.terminate() }
    }
}

@Suite("orchard serve --tls-cert/--tls-key and orchard client --ca-cert, as child processes", .serialized, .timeLimit(.minutes(5)))
struct TLSCommandLineTests {
    @Test("a client with --ca-cert reports over https; without it the TLS error is shown and the run fails")
    func serveAndClientOverHTTPS() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-cli-tls-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let files = try TestCertificates.make().write(to: directory.appendingPathComponent("pki"))
        let database = directory.appendingPathComponent("coordinator.sqlite").path
        let data = directory.appendingPathComponent("data.safetensors")
        try Data(Fixture.dataFile()).write(to: data)
        do {
            let instance = try await CoordinatorInstance.open(database: database)
            _ = try await instance.coordinator.host(try Fixture.host(goal: 1, overSelection: 1, clientConfig: ClientIntegrationTests.config))
            instance.close()
        }

        let serve = try OrchardChild(["serve", "--port", "0", "--database", database, "--tls-cert", files.certificate, "--tls-key", files.key], in: directory)
        defer { serve.stop() }
        let listening = try #require(await serve.firstLine(), "orchard serve ended: \(serve.error)")
        #expect(listening["scheme"] as? String == "https")
        let port = try #require((listening["port"] as? NSNumber)?.intValue)
        let device = ["--server", "https://127.0.0.1:\(port)", "--process", "regressor", "--version", "1.0", "--data", data.path, "--timeout", "10"]

        let untrusted = try OrchardChild(["client"] + device + ["--state-directory", directory.appendingPathComponent("untrusted").path], in: directory)
        #expect(try await untrusted.finish(within: 120).status != 0)
        #expect(untrusted.error.contains("TLS connection to https://127.0.0.1:\(port)"), "\(untrusted.error)")
        #expect(untrusted.error.contains("--ca-cert"), "\(untrusted.error)")

        let trusted = try OrchardChild(
            ["client"] + device + ["--ca-cert", files.ca, "--state-directory", directory.appendingPathComponent("trusted").path], in: directory)
        let run = try await trusted.finish(within: 120)
        #expect(run.status == 0, "\(trusted.error)")
        #expect(run.output.contains("reported to cycle 1"), "\(run.output)")

        let missingCA = try OrchardChild(["client"] + device + ["--ca-cert", directory.appendingPathComponent("nope.pem").path], in: directory)
        #expect(try await missingCA.finish(within: 60).status == 64)
        #expect(missingCA.error.contains("'\(directory.appendingPathComponent("nope.pem").path)': no such file"), "\(missingCA.error)")
    }

    @Test("--tls-cert and --tls-key are both or neither, and a bad file is named with its option")
    func serveRefusesBadTLSOptions() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-cli-tls-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let files = try TestCertificates.make().write(to: directory.appendingPathComponent("pki"))
        let database = ["--port", "0", "--database", directory.appendingPathComponent("c.sqlite").path]
        let cases: [([String], String)] = [
            (["--tls-cert", files.certificate], "--tls-cert needs --tls-key"),
            (["--tls-key", files.key], "--tls-key needs --tls-cert"),
            (["--tls-cert", files.certificate, "--tls-key", files.certificate], "--tls-key '\(files.certificate)' is not an unencrypted PEM private key"),
            (["--tls-cert", files.key, "--tls-key", files.key], "--tls-cert '\(files.key)' holds no PEM certificate"),
        ]
        for (arguments, message) in cases {
            let serve = try OrchardChild(["serve"] + database + arguments, in: directory)
            let run = try await serve.finish(within: 60)
            #expect(run.status == 64, "\(arguments)")
            #expect(serve.error.contains(message), "\(serve.error)")
            #expect(run.output.isEmpty)
        }
    }
}

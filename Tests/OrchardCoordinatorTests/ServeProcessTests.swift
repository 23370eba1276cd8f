import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OrchardCoordinator
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Testing

/// `orchard serve` as a child process: standard output through a pipe (its first line announces the port),
/// standard error in a file.
private final class ServeChild: @unchecked Sendable {
    let process = ChildProcess()
    let errURL: URL
    private let output = Pipe()
    private var head = [UInt8]()

    init(_ arguments: [String], environment: [String: String] = [:], in directory: URL) throws {
        errURL = directory.appendingPathComponent("stderr-\(UUID().uuidString)")
        _ = FileManager.default.createFile(atPath: errURL.path, contents: nil)
        process.executableURL = try OrchardExecutable.url()
        process.arguments = ["serve", "--port", "0"] + arguments
        var inherited = ProcessInfo.processInfo.environment
        inherited[AdminToken.variable] = nil
        process.environment = inherited.merging(environment) { $1 }
        process.standardOutput = output
        process.standardError = try FileHandle(forWritingTo: errURL)
        try process.run()
    }

    /// The listening line's JSON object, or nil if the process ended first.
    func listening() async -> [String: Any]? {
        await OrchardExecutable.firstJSONLine(output.fileHandleForReading, buffered: &head)
    }

    /// Stops the process (SIGTERM, or SIGKILL when `crash`) and returns everything it wrote.
    func stop(crash: Bool = false) async -> (status: Int32, output: String, error: String) {
        if process.isRunning {
            if crash { kill(process.processIdentifier, SIGKILL) } else { process.terminate() }
        }
        await process.exited()
        let rest = await output.fileHandleForReading.readToEndOfFile()
        let error = (try? String(contentsOf: errURL, encoding: .utf8)) ?? ""
        return (process.terminationStatus, String(decoding: head + rest, as: UTF8.self), error)
    }
}

private enum AdminToken {
    static let variable = "ORCHARD_ADMIN_TOKEN"
}

/// `orchard serve`'s admin token sources and its database lock, tested on the built executable.
@Suite(.serialized) final class ServeProcessTests {
    let directory: URL
    var database: String { directory.appendingPathComponent("coordinator.sqlite").path }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-serve-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: directory) }

    private func write(_ name: String, _ bytes: [UInt8], permissions: Int = 0o600) throws -> String {
        let path = directory.appendingPathComponent(name).path
        #expect(FileManager.default.createFile(atPath: path, contents: Data(bytes), attributes: [.posixPermissions: permissions]))
        return path
    }

    /// Starts `orchard serve` and checks the admin API accepts `token` (and nothing else) without the listening line naming it.
    private func expectServes(_ arguments: [String], environment: [String: String] = [:], token: String) async throws -> (
        status: Int32, output: String, error: String
    ) {
        let child = try ServeChild(["--database", database] + arguments, environment: environment, in: directory)
        guard let line = await child.listening(), let port = (line["port"] as? NSNumber)?.intValue else {
            let ended = await child.stop()
            Issue.record("orchard serve did not listen: \(ended.output) \(ended.error)")
            return ended
        }
        #expect(line["admin_token"] == nil)
        let login = line["dashboard_url"] as? String ?? ""
        #expect(login.hasPrefix("http://127.0.0.1:\(port)/dashboard/login?token="), "\(line)")
        let http = HTTP(base: URL(string: "http://127.0.0.1:\(port)")!)
        #expect(try await http.send("GET", Endpoint.processes, token: token).status == 200)
        #expect(try await http.send("GET", Endpoint.processes, token: token + "x").status == 401)
        #expect(try await http.send("GET", Endpoint.processes).status == 401)
        let ended = await child.stop()
        #expect(!ended.output.contains(token), "the token appears on standard output")
        #expect(!ended.error.contains(token), "the token appears on standard error")
        #expect(!login.isEmpty && !ended.error.contains(String(login.split(separator: "=").last ?? "")), "the login token appears on standard error")
        return ended
    }

    /// Runs `orchard serve` expecting it to refuse to start; returns its standard error.
    private func expectRefusal(_ arguments: [String], environment: [String: String] = [:], sourceLocation: SourceLocation = #_sourceLocation) async -> String {
        let child: ServeChild
        do { child = try ServeChild(["--database", database] + arguments, environment: environment, in: directory) } catch {
            Issue.record("cannot start orchard: \(error)", sourceLocation: sourceLocation)
            return ""
        }
        let line = await child.listening()
        let ended = await child.stop()
        #expect(line == nil, "orchard serve started: \(ended.output)", sourceLocation: sourceLocation)
        #expect(ended.status != 0, sourceLocation: sourceLocation)
        return ended.error
    }

    @Test func theAdminTokenFileWorksAndTheTokenIsNeverPrinted() async throws {
        let token = "file-token-\(UUID().uuidString)"
        let file = try write("admin-token", Array("  \(token)\n\n".utf8))
        let ended = try await expectServes(["--admin-token-file", file], token: token)
        #expect(!ended.error.contains("deprecated"))
        #expect(!ended.error.contains("can be read by other users"))
    }

    @Test func theEnvironmentVariableWorksAndTheTokenIsNeverPrinted() async throws {
        let token = "env-token-\(UUID().uuidString)"
        _ = try await expectServes([], environment: [AdminToken.variable: token], token: token)
    }

    @Test func theArgvTokenStillWorksWithADeprecationWarning() async throws {
        let token = "argv-token-\(UUID().uuidString)"
        let ended = try await expectServes(["--admin-token", token], token: token)
        #expect(ended.error.contains("--admin-token is deprecated"))
    }

    @Test func aTokenFileOthersCanReadIsAcceptedWithAWarning() async throws {
        let token = "shared-token-\(UUID().uuidString)"
        let file = try write("shared-token", Array(token.utf8), permissions: 0o644)
        let ended = try await expectServes(["--admin-token-file", file], token: token)
        #expect(ended.error.contains("can be read by other users"))
    }

    @Test func badTokenSourcesAreClearErrors() async throws {
        let missing = directory.appendingPathComponent("no-such-token").path
        #expect(await expectRefusal(["--admin-token-file", missing]).contains("--admin-token-file '\(missing)': no such file"))

        let empty = try write("empty-token", Array(" \n\t\n".utf8))
        #expect(await expectRefusal(["--admin-token-file", empty]).contains("empty_token: --admin-token-file '\(empty)' holds an empty admin token"))
        #expect(await expectRefusal([], environment: [AdminToken.variable: ""]).contains("ORCHARD_ADMIN_TOKEN holds an empty admin token"))

        #expect(await expectRefusal(["--admin-token-file", directory.path]).contains("is a directory"))

        let binary = try write("binary-token", [0xFF, 0xFE, 0x00, 0x41])
        #expect(await expectRefusal(["--admin-token-file", binary]).contains("': not UTF-8 text"))

        let spaced = try write("spaced-token", Array("two words\n".utf8))
        let spacedError = await expectRefusal(["--admin-token-file", spaced])
        #expect(spacedError.contains("malformed_token"))
        #expect(!spacedError.contains("two words"))

        let file = try write("token", Array("from-file".utf8))
        let both = await expectRefusal(["--admin-token-file", file], environment: [AdminToken.variable: "from-env"])
        #expect(both.contains("conflicting_sources"))
        #expect(both.contains("--admin-token-file, ORCHARD_ADMIN_TOKEN"))
        #expect(!both.contains("from-env"))
        // None of the refusals got as far as the database.
        #expect(!FileManager.default.fileExists(atPath: database))
    }

    @Test(.enabled(if: getuid() != 0, "root reads any file")) func anUnreadableTokenFileIsAClearError() async throws {
        let locked = try write("locked-token", Array("secret".utf8), permissions: 0o000)
        #expect(await expectRefusal(["--admin-token-file", locked]).contains("': permission denied"))
    }

    @Test func aSecondServeOnTheSameDatabaseIsRefusedAndACrashedOneDoesNotBlock() async throws {
        let environment = [AdminToken.variable: Harness.adminToken]
        let first = try ServeChild(["--database", database], environment: environment, in: directory)
        #expect(await first.listening() != nil)
        let refusal = await expectRefusal([], environment: environment)
        #expect(
            refusal.contains(
                "locked: database '\(database)' is in use by another coordinator (process \(first.process.processIdentifier)) holding '\(database).lock'"))
        // The first coordinator is unaffected.
        _ = await first.stop(crash: true)

        // The kernel released the crashed holder's lock: the next coordinator starts at once.
        let next = try ServeChild(["--database", database], environment: environment, in: directory)
        let line = try #require(await next.listening())
        let port = try #require((line["port"] as? NSNumber)?.intValue)
        #expect(try await HTTP(base: URL(string: "http://127.0.0.1:\(port)")!).send("GET", Endpoint.processes, token: Harness.adminToken).status == 200)
        #expect(await next.stop().status == 0)
    }

    @Test func aSecondInProcessCoordinatorOnTheSameDatabaseIsRefused() async throws {
        let first = try await CoordinatorInstance.open(database: database, clock: ManualClock())
        do {
            _ = try await CoordinatorInstance.open(database: database, clock: ManualClock())
            Issue.record("a second coordinator opened the database")
        } catch let error as StoreError {
            #expect(error.code == .locked)
            #expect(error.message.contains("in use by another coordinator (process \(getpid()))"))
        }
        // Another database is not affected.
        let other = try await CoordinatorInstance.open(database: directory.appendingPathComponent("other.sqlite").path, clock: ManualClock())
        other.close()
        // Once the first one is closed the database opens again.
        first.close()
        let reopened = try await CoordinatorInstance.open(database: database, clock: ManualClock())
        reopened.close()
    }
}

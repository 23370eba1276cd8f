import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import OrchardTesting
import Testing

/// flwr 1.41.0 in a virtual environment (`ORCHARD_FLOWER_VENV`, `/opt/flwr-venv` by default; `.ci/run` makes it):
/// tests that need a SuperLink are skipped without it, unless `ORCHARD_REQUIRE_FLOWER=1` (CI) makes that a failure.
enum FlowerInstallation {
    static let requireVariable = "ORCHARD_REQUIRE_FLOWER"

    /// The venv's `bin` directory.
    static var bin: URL {
        let venv = ProcessInfo.processInfo.environment["ORCHARD_FLOWER_VENV"] ?? "/opt/flwr-venv"
        return URL(fileURLWithPath: venv).appendingPathComponent("bin")
    }

    static var isInstalled: Bool { FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("flower-superlink").path) }

    /// Enabled when flwr is installed or required.
    static var requirement: ConditionTrait {
        .enabled(
            if: isInstalled || ProcessInfo.processInfo.environment[requireVariable] == "1",
            Comment(
                rawValue:
                    "needs flwr 1.41.0 in \(bin.deletingLastPathComponent().path) (python3 -m venv /opt/flwr-venv && /opt/flwr-venv/bin/pip install flwr==1.41.0), or set ORCHARD_FLOWER_VENV; \(requireVariable)=1 makes its absence a failure"
            )
        )
    }

    struct Missing: Error, CustomStringConvertible {
        var description: String {
            "flwr is not installed in \(FlowerInstallation.bin.deletingLastPathComponent().path): python3 -m venv /opt/flwr-venv && /opt/flwr-venv/bin/pip install flwr==1.41.0"
        }
    }

    static func require() throws {
        guard isInstalled else { throw Missing() }
    }

    /// The Flower app of the tests (a ServerApp with FedAvg over the MLP of `mlp.py`, and a NumPy ClientApp).
    static var app: URL { URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("FlowerApp") }
}

/// A free TCP port on loopback (bound, then released for the child to take).
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.EMFILE) }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw POSIXError(.EADDRINUSE) }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// A Flower process (SuperLink, Python SuperNode) in its own process group, so that stopping it stops the children
/// it starts there (`flower-superexec` starts its own session and exits when its parent does).
final class FlowerProcess: @unchecked Sendable {
    let process = ChildProcess()
    let log: URL

    /// Starts `command` from the venv with Flower's offline environment and `FLWR_HOME=home`.
    init(_ command: String, _ arguments: [String], home: URL, log: URL) throws {
        self.log = log
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        // Foundation starts the child as the leader of its own process group; stopping signals that group.
        process.executableURL = FlowerInstallation.bin.appendingPathComponent(command)
        process.arguments = arguments
        process.environment = Self.environment(home: home)
        let handle = try FileHandle(forWritingTo: log)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
    }

    static func environment(home: URL) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["FLWR_TELEMETRY_ENABLED"] = "0"
        environment["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        environment["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        environment["FLWR_HOME"] = home.path
        environment["PATH"] = FlowerInstallation.bin.path + ":" + (environment["PATH"] ?? "/usr/bin:/bin")
        return environment
    }

    /// The process's output so far.
    var output: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

    /// Stops the process and its process group: SIGTERM, then SIGKILL after 5 s. It waits without blocking a
    /// thread of Swift's cooperative pool (which other tests share).
    func stop() async {
        let pid = process.processIdentifier
        defer { Self.killChildrenOutsideTheGroup(of: pid) }
        guard process.isRunning else { return }
        kill(-pid, SIGTERM)
        for _ in 0..<50 where process.isRunning { try? await Task.sleep(for: .milliseconds(100)) }
        if process.isRunning { kill(-pid, SIGKILL) }
        while process.isRunning { try? await Task.sleep(for: .milliseconds(20)) }
    }

    /// `flower-superexec` runs in a session of its own (so the group signal misses it) and outlives its parent; it
    /// names the parent with `--parent-pid`. Kills every such process of `parent`, and the processes it started
    /// (the `flwr-serverapp` of a run, which would otherwise be left to init), children first.
    static func killChildrenOutsideTheGroup(of parent: Int32) {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return }
        let marker = Array("--parent-pid\u{0}\(parent)\u{0}".utf8)
        var children: [Int32: [Int32]] = [:]
        var marked: [Int32] = []
        for entry in entries {
            guard let pid = Int32(entry) else { continue }
            // /proc/<pid>/stat: "pid (comm) state ppid …"; comm may hold spaces, so read after the last ')'.
            if let stat = FileManager.default.contents(atPath: "/proc/\(entry)/stat").map({ String(decoding: $0, as: UTF8.self) }),
                let close = stat.lastIndex(of: ")")
            {
                let fields = stat[stat.index(after: close)...].split(separator: " ")
                if fields.count > 1, let ppid = Int32(fields[1]) { children[ppid, default: []].append(pid) }
            }
            guard let cmdline = FileManager.default.contents(atPath: "/proc/\(entry)/cmdline") else { continue }
            let bytes = [UInt8](cmdline)
            if bytes.count >= marker.count, (0...(bytes.count - marker.count)).contains(where: { bytes[$0..<($0 + marker.count)].elementsEqual(marker) }) {
                marked.append(pid)
            }
        }
        func killTree(_ pid: Int32) {
            for child in children[pid] ?? [] { killTree(child) }
            kill(pid, SIGKILL)
        }
        for pid in marked { killTree(pid) }
    }

    /// A fixture dropped without ``stop()`` (a failed test) kills its processes at once.
    deinit {
        if process.isRunning { kill(-process.processIdentifier, SIGKILL) }
        Self.killChildrenOutsideTheGroup(of: process.processIdentifier)
    }
}

/// A SuperLink on loopback (`--insecure`) with its own `FLWR_HOME` holding the `local-deploy` connection that
/// `flwr run` uses.
final class SuperLinkFixture: @unchecked Sendable {
    let port: Int
    let home: URL
    let superlink: FlowerProcess
    var nodes: [FlowerProcess] = []
    /// The CA certificate (PEM file) the SuperLink's HTTPS certificate chains to; nil for `--insecure`.
    let caCertificate: URL?

    /// Starts a SuperLink; with `tls` it serves HTTPS with a certificate for 127.0.0.1 from a throwaway private CA;
    /// `nodeAuthentication` (needs `tls`) starts it with `--enable-supernode-auth`: only keys registered with
    /// ``register(publicKey:)`` may activate.
    init(directory: URL, tls: Bool = false, nodeAuthentication: Bool = false) async throws {
        try FlowerInstallation.require()
        home = directory.appendingPathComponent("flwr-home")
        try FileManager.default.createDirectory(at: home, withIntermediateDirectories: true)
        var security = ["--insecure"]
        var connection = "insecure = true"
        if tls {
            let files = try TestCertificates.make().write(to: directory)
            security = ["--ssl-certfile", files.certificate, "--ssl-keyfile", files.key, "--ssl-ca-certfile", files.ca]
            connection = "root-certificates = \"\(files.ca)\""
            caCertificate = URL(fileURLWithPath: files.ca)
        } else {
            caCertificate = nil
        }
        if nodeAuthentication { security.append("--enable-supernode-auth") }
        (port, superlink) = try await Self.launch(security: security, connection: connection, home: home, directory: directory, https: tls)
    }

    /// The Fleet API address, `127.0.0.1:PORT`.
    var address: String { "127.0.0.1:\(port)" }

    /// Starts `flower-superlink` on a free port and waits until it serves there. The port is free when chosen but may
    /// be taken by another test's server before the SuperLink binds it; the SuperLink then logs "address already in
    /// use" and exits, and a new port is tried (a foreign server on the port must never pass for this SuperLink).
    private static func launch(security: [String], connection: String, home: URL, directory: URL, https: Bool) async throws -> (Int, FlowerProcess) {
        var taken: [Int] = []
        for _ in 0..<5 {
            let port = try freePort()
            try """
            [superlink]
            default = "local-deploy"

            [superlink.local-deploy]
            address = "127.0.0.1:\(port)"
            \(connection)

            """.write(to: home.appendingPathComponent("config.toml"), atomically: true, encoding: .utf8)
            let superlink = try FlowerProcess(
                "flower-superlink", security + ["--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", String(port)],
                home: home, log: directory.appendingPathComponent("superlink.log")
            )
            if try await serves(superlink, port: port, https: https) { return (port, superlink) }
            await superlink.stop()
            taken.append(port)
        }
        throw FlowerRunError("flower-superlink found ports \(taken) taken by other servers before it could bind them")
    }

    /// Whether `superlink` serves on `port` (its own log says so and `/health` answers), or false when the port was
    /// taken before it could bind it.
    private static func serves(_ superlink: FlowerProcess, port: Int, https: Bool) async throws -> Bool {
        // Over HTTPS the test's URLSession does not trust the private CA: once the SuperLink's own log says it runs on
        // the port, any answer (or a TLS failure after the connection is accepted) means it is up.
        let running = "running on \(https ? "https" : "http")://127.0.0.1:\(port)"
        let url = URL(string: "\(https ? "https" : "http")://127.0.0.1:\(port)/health")!
        for _ in 0..<600 {
            let output = superlink.output
            if output.contains("address already in use") { return false }
            guard superlink.process.isRunning else { throw FlowerRunError("flower-superlink exited: \(output.suffix(2000))") }
            if output.contains(running) {
                do {
                    let (_, response) = try await URLSession.shared.data(from: url)
                    if (response as? HTTPURLResponse)?.statusCode == 200 { return true }
                } catch let error as URLError where error.code != .cannotConnectToHost && error.code != .networkConnectionLost && error.code != .timedOut {
                    if https { return true }
                } catch {}
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw FlowerRunError("flower-superlink did not serve on port \(port) within 60 s: \(superlink.output.suffix(2000))")
    }

    /// Registers a SuperNode's public key (an OpenSSH line in a file) with `flwr supernode register`, as the
    /// SuperLink's operator does.
    func register(publicKey: URL) async throws {
        let log = publicKey.deletingPathExtension().appendingPathExtension("register.log")
        let (status, output) = try await flwr(["supernode", "register", publicKey.path, "local-deploy"], log: log, timeout: .seconds(60))
        guard status == 0, output.contains("registered successfully") else {
            throw FlowerRunError("flwr supernode register failed (exit \(status)): \(output.suffix(2000))")
        }
    }

    /// Runs the `flwr` CLI with this SuperLink's `FLWR_HOME` to its end (terminated after `timeout`); its exit status
    /// and output (also in `log`). Waits without blocking a thread of Swift's cooperative pool.
    private func flwr(_ arguments: [String], log: URL, timeout: Duration) async throws -> (status: Int32, output: String) {
        let process = ChildProcess()
        process.executableURL = FlowerInstallation.bin.appendingPathComponent("flwr")
        process.arguments = arguments
        process.environment = FlowerProcess.environment(home: home)
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        let handle = try FileHandle(forWritingTo: log)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        while process.isRunning {
            if clock.now > deadline {
                process.terminate()
                throw FlowerRunError(
                    "flwr \(arguments.first ?? "") did not finish within \(timeout): \((try? String(contentsOf: log, encoding: .utf8))?.suffix(3000) ?? "")")
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        return (process.terminationStatus, (try? String(contentsOf: log, encoding: .utf8)) ?? "")
    }

    /// Starts a Python SuperNode of the test app on partition `partition`.
    func startPythonNode(partition: Int, directory: URL) throws {
        let node = try FlowerProcess(
            "flower-supernode",
            ["--insecure", "--superlink", address, "--port", String(try freePort()), "--node-config", "partition-id=\(partition) num-partitions=2"],
            home: home, log: directory.appendingPathComponent("supernode-\(partition).log")
        )
        nodes.append(node)
    }

    /// Runs the test app with `flwr run … --stream` to its end; the JSON the ServerApp wrote to `output`.
    func run(config: [String: String], output: URL, timeout: Duration = .seconds(300)) async throws -> [String: Any] {
        let settings = (config.merging(["output": "'\(output.path)'"]) { $1 }).map { "\($0)=\($1)" }.sorted().joined(separator: " ")
        let (status, text) = try await flwr(
            ["run", FlowerInstallation.app.path, "local-deploy", "--stream", "--run-config", settings],
            log: output.deletingPathExtension().appendingPathExtension("log"), timeout: timeout
        )
        guard let data = try? Data(contentsOf: output), let json = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw FlowerRunError("the ServerApp wrote no result (flwr run exited \(status)): \(text.suffix(3000))")
        }
        return json
    }

    func stop() async {
        for node in nodes { await node.stop() }
        await superlink.stop()
    }
}

struct FlowerRunError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

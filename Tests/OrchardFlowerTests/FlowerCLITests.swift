import Foundation
import OrchardData
import OrchardTesting
import Testing

/// `orchard flower join` and `orchard agent --flower-superlink` refuse bad input with one line naming the option.
@Suite(.serialized) struct FlowerCLITests {
    /// Runs the executable to its end; its exit status and standard error.
    func run(_ arguments: [String]) async throws -> (status: Int32, errors: String) {
        let process = ChildProcess()
        process.executableURL = try OrchardExecutable.url()
        process.arguments = arguments
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-flower-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let errors = directory.appendingPathComponent("stderr")
        _ = FileManager.default.createFile(atPath: errors.path, contents: nil)
        process.standardOutput = FileHandle.nullDevice
        process.standardError = try FileHandle(forWritingTo: errors)
        try process.run()
        while process.isRunning { try await Task.sleep(for: .milliseconds(20)) }
        return (process.terminationStatus, try String(contentsOf: errors, encoding: .utf8))
    }

    /// A model and data file that fit each other, in a new directory (the caller removes it).
    func files() throws -> (directory: URL, model: String, data: String) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-flower-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let model = directory.appendingPathComponent("model.json")
        try FlowerFederationTests.modelJSON.write(to: model, atomically: true, encoding: .utf8)
        let data = directory.appendingPathComponent("data.safetensors")
        try Data(DeviceDataFile.encode(try FlowerFederationTests.dataset(seed: 1, samples: 8))).write(to: data)
        return (directory, model.path, data.path)
    }

    @Test(arguments: [
        (["--superlink", "127.0.0.1:9092"], "--insecure (plain HTTP) or --ca-cert FILE"),
        (["--superlink", "127.0.0.1:9092", "--insecure", "--ca-cert", "/nonexistent.pem"], "--insecure and --ca-cert exclude each other"),
        (["--superlink", "no-port", "--insecure"], "is not a SuperLink address HOST:PORT"),
        (["--superlink", "127.0.0.1:70000", "--insecure"], "is not a SuperLink address HOST:PORT"),
        (["--superlink", "127.0.0.1:9092", "--ca-cert", "/nonexistent.pem"], "/nonexistent.pem"),
        (["--superlink", "127.0.0.1:9092", "--insecure", "--node-config", "partition-id"], "--node-config 'partition-id' is not key=value"),
        (["--superlink", "127.0.0.1:9092", "--insecure", "--node-config", "seed=-1"], "the seed is a non-negative integer"),
        (["--superlink", "127.0.0.1:9092", "--insecure", "--heartbeat-interval", "0"], "--heartbeat-interval must be 10…1800 seconds"),
        (["--superlink", "127.0.0.1:9092", "--insecure", "--heartbeat-interval", "3600"], "--heartbeat-interval must be 10…1800 seconds"),
        (["--superlink", "127.0.0.1:9092", "--insecure", "--heartbeat-interval", "nan"], "--heartbeat-interval must be 10…1800 seconds"),
        (["--superlink", "127.0.0.1:9092", "--insecure", "--auth-key", "/nonexistent/key"], "--auth-key: the node key '/nonexistent/key': no such file"),
    ])
    func joinRefusesBadOptions(arguments: [String], expected: String) async throws {
        let (inputs, model, data) = try files()
        defer { try? FileManager.default.removeItem(at: inputs) }
        let result = try await run(["flower", "join", "--model", model, "--data", data] + arguments)
        #expect(result.status != 0)
        #expect(result.errors.contains(expected), "\(result.errors)")
    }

    @Test func joinNamesAMissingModelOrDataFile() async throws {
        let (inputs, model, data) = try files()
        defer { try? FileManager.default.removeItem(at: inputs) }
        let missingModel = try await run([
            "flower", "join", "--superlink", "127.0.0.1:9092", "--insecure", "--model", "/nonexistent/model.json", "--data", data,
        ])
        #expect(missingModel.status != 0)
        #expect(missingModel.errors.contains("--model") && missingModel.errors.contains("/nonexistent/model.json"), "\(missingModel.errors)")
        let missingData = try await run([
            "flower", "join", "--superlink", "127.0.0.1:9092", "--insecure", "--model", model, "--data", "/nonexistent/data.safetensors",
        ])
        #expect(missingData.status != 0)
        #expect(missingData.errors.contains("--data /nonexistent/data.safetensors"), "\(missingData.errors)")
        let badMap = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-map-\(UUID().uuidString).json")
        try #"["fc1.weight", "nope"]"#.write(to: badMap, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: badMap) }
        let unknown = try await run([
            "flower", "join", "--superlink", "127.0.0.1:9092", "--insecure", "--model", model, "--data", data, "--array-map", badMap.path,
        ])
        #expect(unknown.status != 0)
        #expect(unknown.errors.contains("'nope'"), "\(unknown.errors)")
    }

    @Test func keygenWritesAKeyPairOnceAndJoinReadsIt() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-keygen-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let key = directory.appendingPathComponent("node").path
        let made = try await run(["flower", "keygen", "--output", key, "--comment", "phone-1"])
        #expect(made.status == 0, "\(made.errors)")
        let permissions = { (path: String) in (try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? NSNumber)?.intValue }
        #expect(try permissions(key) == 0o600)
        let line = try String(contentsOfFile: key + ".pub", encoding: .utf8)
        #expect(line.hasPrefix("ecdsa-sha2-nistp384 ") && line.hasSuffix(" phone-1\n"))
        let again = try await run(["flower", "keygen", "--output", key])
        #expect(again.status != 0)
        #expect(again.errors.contains("\(key) exists"), "\(again.errors)")
        #expect(try String(contentsOfFile: key + ".pub", encoding: .utf8) == line, "the key pair is not replaced")
        let nowhere = try await run(["flower", "keygen", "--output", "/nonexistent/dir/node"])
        #expect(nowhere.status != 0)
        #expect(nowhere.errors.contains("--output /nonexistent/dir/node: no such directory"), "\(nowhere.errors)")

        // A key readable by others is refused before anything is sent.
        let (inputs, model, data) = try files()
        defer { try? FileManager.default.removeItem(at: inputs) }
        try FileManager.default.setAttributes([.posixPermissions: 0o640], ofItemAtPath: key)
        let open = try await run(["flower", "join", "--superlink", "127.0.0.1:9", "--insecure", "--model", model, "--data", data, "--auth-key", key])
        #expect(open.status != 0)
        #expect(open.errors.contains("--auth-key: the node key '\(key)' is readable by others (mode 640)"), "\(open.errors)")
        let agent = try await run([
            "agent", "--flower-superlink", "127.0.0.1:9", "--flower-insecure", "--model", model, "--data", data, "--flower-auth-key", key,
        ])
        #expect(agent.status != 0)
        #expect(agent.errors.contains("--flower-auth-key: the node key"), "\(agent.errors)")
        let wrongKind = directory.appendingPathComponent("ed25519")
        try NodeKeyFixtures.sshEd25519.write(to: wrongKind, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: wrongKind.path)
        let ed = try await run(["flower", "join", "--superlink", "127.0.0.1:9", "--insecure", "--model", model, "--data", data, "--auth-key", wrongKind.path])
        #expect(ed.status != 0)
        #expect(ed.errors.contains("holds a key of type ssh-ed25519"), "\(ed.errors)")
    }

    @Test func theAgentTakesEitherACoordinatorOrASuperLink() async throws {
        let (inputs, model, data) = try files()
        defer { try? FileManager.default.removeItem(at: inputs) }
        let both = try await run([
            "agent", "--flower-superlink", "127.0.0.1:9092", "--flower-insecure", "--model", model, "--data", data, "--server", "http://127.0.0.1:8080",
        ])
        #expect(both.status != 0)
        #expect(both.errors.contains("--server is for an Orchard coordinator"), "\(both.errors)")
        let noModel = try await run(["agent", "--flower-superlink", "127.0.0.1:9092", "--flower-insecure", "--data", data])
        #expect(noModel.status != 0)
        #expect(noModel.errors.contains("--model is required with --flower-superlink"), "\(noModel.errors)")
        let neither = try await run(["agent", "--data", data])
        #expect(neither.status != 0)
        #expect(neither.errors.contains("--server is required"), "\(neither.errors)")
        let flowerOptionsAlone = try await run([
            "agent", "--server", "http://127.0.0.1:8080", "--process", "p", "--version", "1", "--data", data, "--model", model,
        ])
        #expect(flowerOptionsAlone.status != 0)
        #expect(flowerOptionsAlone.errors.contains("are for --flower-superlink"), "\(flowerOptionsAlone.errors)")
    }
}

import Foundation
import OrchardCoordinator
import OrchardCoordinatorTesting
import OrchardFormats
import OrchardOperator
import OrchardProtocol
import OrchardTesting
import Testing

/// `orchard process`'s library calls against a real coordinator on loopback.
@Suite struct AdminClientTests {
    /// The request `orchard process create` builds from the files.
    static func request(_ files: TemporaryDirectory, name: String = "small", goal: Int = 5) throws -> HostProcessRequest {
        let spec = try ProcessFiles.model(at: try files.write("model.json", SmallModel.json()))
        let weights = try ProcessFiles.weights(at: try files.write("weights.safetensors", bytes: SmallModel.weights()), for: spec)
        return HostProcessRequest(
            name: name, version: SemanticVersion(1, 0), model: spec, initialWeights: weights, clientConfig: ClientConfig(batchSize: 8),
            serverConfig: ServerConfig(cycleLength: 600, goalCount: goal)
        )
    }

    @Test func createListStatusCheckpointDelete() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let client = try AdminClient(server: coordinator.url, adminToken: LoopbackCoordinator.adminToken, timeout: .seconds(120))

        let hosted = try await client.host(try Self.request(files))
        let id = hosted.value.processID
        #expect(id.hasPrefix("p_") && id.count == 18)
        #expect(hosted.value.currentCycle?.number == 1)
        #expect(try JSONDecoder().decode(ProcessStatus.self, from: Data(hosted.json)) == hosted.value)

        let list = try await client.processes()
        #expect(list.value.processes.map(\.processID) == [id])
        let table = OperatorFormat.processList(list.value, now: Date())
        #expect(table.count == 2)
        #expect(table[0].hasPrefix("ID") && table[0].contains("REPORTED") && table[0].contains("DEADLINE"))
        #expect(table[1].hasPrefix(id) && table[1].contains("small") && table[1].contains("running") && table[1].contains("0/5"))
        #expect(table[1].contains("in 9m") || table[1].contains("in 10m"))

        let status = try await client.status(id)
        let lines = OperatorFormat.status(status.value, now: Date())
        #expect(lines.contains { $0.hasPrefix("process ") && $0.hasSuffix(id) })
        #expect(lines.contains { $0.hasPrefix("reported ") && $0.hasSuffix("0 of 5 (goal)") })
        #expect(lines.contains { $0.hasPrefix("assigned ") && $0.hasSuffix("0 of 7") })
        #expect(lines.contains { $0.hasPrefix("client ") && $0.hasSuffix("batch_size 8") })
        #expect(String(decoding: status.json, as: UTF8.self).contains("\"process_id\":\"\(id)\""))

        let latest = try await client.checkpoint(id, .latest)
        #expect(latest.number == 0)
        let sent = try Safetensors.decode(try SmallModel.weights()).byName
        let received = try Safetensors.decode(latest.bytes).byName
        #expect(received.mapValues(\.values) == sent.mapValues(\.values))
        let error = await #expect(throws: OperatorError.self) { try await client.checkpoint(id, .number(7)) }
        #expect(error?.description.hasPrefix("unknown_checkpoint: ") == true, "\(String(describing: error))")

        try await client.delete(id)
        let gone = await #expect(throws: OperatorError.self) { try await client.status(id) }
        #expect(gone?.description == "unknown_process: no process '\(id)'")
        #expect(try await client.processes().value.processes.isEmpty)
        #expect(OperatorFormat.processList(ProcessList(processes: []), now: Date()) == ["no processes"])
        await client.shutdown()
        await coordinator.stop()
    }

    @Test func theCoordinatorsErrorIsOneLineWithItsCode() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let client = try AdminClient(server: coordinator.url, adminToken: LoopbackCoordinator.adminToken, timeout: .seconds(120))
        _ = try await client.host(try Self.request(files))
        let error = await #expect(throws: OperatorError.self) { try await client.host(try Self.request(files)) }
        #expect(error?.code == .server(.processExists))
        #expect(error?.description.hasPrefix("process_exists: ") == true)
        #expect(error?.description.contains("\n") == false)
        let badID = await #expect(throws: OperatorError.self) { try await client.status("../health") }
        #expect(badID?.description == "invalid_argument: '../health' is not a process id (ids look like p_0123456789abcdef; `orchard process list` shows them)")
        await client.shutdown()
        await coordinator.stop()
    }

    @Test func aWrongTokenIsRefusedInOneLine() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let client = try AdminClient(server: coordinator.url, adminToken: "not-the-token")
        let error = await #expect(throws: OperatorError.self) { try await client.processes() }
        #expect(
            error?.description
                == "unauthorized: the admin token was refused by \(coordinator.url) (admin token required); check ORCHARD_ADMIN_TOKEN or --admin-token-file"
        )
        await client.shutdown()
        await coordinator.stop()
    }

    @Test func anUnreachableServerIsNamed() async throws {
        let client = try AdminClient(server: "http://127.0.0.1:1", adminToken: "t", timeout: .seconds(5))
        let error = await #expect(throws: OperatorError.self) { try await client.processes() }
        #expect(
            error?.description
                == "unreachable: cannot reach the coordinator at http://127.0.0.1:1 (connection refused); check that `orchard serve` is running there and --server is right"
        )
        await client.shutdown()
        let bad = #expect(throws: OperatorError.self) { try AdminClient(server: "127.0.0.1:8080", adminToken: "t") }
        #expect(bad?.code == .invalidArgument)
    }
}

/// `--ca-cert`: an https coordinator whose certificate comes from a private CA.
@Suite struct AdminClientTLSTests {
    @Test func aPrivateCAIsTrustedWithCACertAndRefusedWithoutIt() async throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let certificates = try TestCertificates.make()
        let tls = try CoordinatorTLS(
            certificateChainPEM: Array(certificates.serverCertificatePEM.utf8), privateKeyPEM: Array(certificates.serverPrivateKeyPEM.utf8))
        let coordinator = try await LoopbackCoordinator.start(configuration: CoordinatorConfiguration(adminToken: "t"), tls: tls)
        let url = coordinator.url
        let ca = try files.write("ca.pem", certificates.caCertificatePEM)

        let trusting = try AdminClient(server: url, adminToken: "t", caCertificateFile: ca, timeout: .seconds(10))
        #expect(try await trusting.processes().value.processes.isEmpty)
        await trusting.shutdown()

        let system = try AdminClient(server: url, adminToken: "t", timeout: .seconds(10))
        let error = await #expect(throws: OperatorError.self) { try await system.processes() }
        #expect(error?.code == .tls)
        #expect(error?.description.hasPrefix("tls: TLS connection to \(url) failed: ") == true, "\(String(describing: error))")
        #expect(error?.description.hasSuffix("; for a coordinator whose certificate comes from a private CA, give --ca-cert FILE") == true)
        await system.shutdown()

        let notPEM = try files.write("not.pem", "hello")
        let bad = #expect(throws: OperatorError.self) { try AdminClient(server: url, adminToken: "t", caCertificateFile: notPEM) }
        #expect(bad?.description.hasPrefix("invalid_argument: --ca-cert '\(notPEM)'") == true, "\(String(describing: bad))")
        await coordinator.stop()
    }
}

/// Local bad input: one line naming the file and what to fix, before anything is sent.
@Suite struct ProcessFilesTests {
    @Test func aMissingFileIsNamed() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let missing = files.path("nope.json")
        let error = #expect(throws: OperatorError.self) { try ProcessFiles.model(at: missing) }
        #expect(error?.description == "missing_file: --model '\(missing)': no such file")
        let spec = SmallModel.spec()
        let weights = #expect(throws: OperatorError.self) { try ProcessFiles.weights(at: files.path("w.safetensors"), for: spec) }
        #expect(weights?.description == "missing_file: --weights '\(files.path("w.safetensors"))': no such file")
    }

    @Test func aJSONSyntaxErrorHasItsLineAndColumn() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let path = try files.write("model.json", "{\n  \"format_version\": 2,\n  \"name\": small\n}\n")
        let error = #expect(throws: OperatorError.self) { try ProcessFiles.model(at: path) }
        #expect(error?.description.hasPrefix("invalid_model: --model '\(path)' is not valid JSON: line 3, column 11: ") == true, "\(String(describing: error))")
        let config = try files.write("server.json", "{\"goal_count\": 3 \"cycles\": 2}")
        let configError = #expect(throws: OperatorError.self) { try ProcessFiles.serverConfig(at: config) }
        #expect(
            configError?.description.hasPrefix("invalid_configuration: --server-config '\(config)' is not valid JSON: line 1, column ") == true,
            "\(String(describing: configError))")
    }

    @Test func anUnknownLayerTypeIsNamed() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let path = try files.write("model.json", SmallModel.json(SmallModel.spec(hiddenType: LayerType(rawValue: "dence"))))
        let error = #expect(throws: OperatorError.self) { try ProcessFiles.model(at: path) }
        let known = LayerType.known.map(\.rawValue).sorted().joined(separator: ", ")
        #expect(error?.description == "invalid_model: --model '\(path)' is not a valid model: layer 'dense1' has unknown type 'dence' (known: \(known))")
    }

    @Test func weightsThatDoNotMatchTheModelAreNamed() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let path = try files.write("w.safetensors", bytes: SmallModel.weights(hidden: 5))
        let error = #expect(throws: OperatorError.self) { try ProcessFiles.weights(at: path, for: SmallModel.spec(hidden: 4)) }
        #expect(
            error?.description
                == "invalid_weights: --weights '\(path)' does not match the model 'small': weight 'dense1.bias' has shape [5]; layer 'dense1' (dense) implies [4]: dimension 0 is the layer's 'units', 4, not 5"
        )
        let text = try files.write("text.safetensors", "not safetensors")
        let notSafetensors = #expect(throws: OperatorError.self) { try ProcessFiles.weights(at: text, for: SmallModel.spec()) }
        #expect(notSafetensors?.description.hasPrefix("invalid_weights: --weights '\(text)' is not a safetensors file of F32 tensors: ") == true)
    }

    @Test func aServerConfigWithAMisspeltKeyIsRefused() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let path = try files.write("server.json", #"{"goal_cout": 3}"#)
        let error = #expect(throws: OperatorError.self) { try ProcessFiles.serverConfig(at: path) }
        #expect(error?.description.hasPrefix("invalid_configuration: --server-config '\(path)': ") == true)
        #expect(error?.description.contains("goal_cout") == true, "\(String(describing: error))")
    }

    @Test func theAdminTokenComesOneWay() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let file = try files.write("token", "  secret\n")
        #expect(try AdminToken.resolve(file: file, environment: nil) == "secret")
        #expect(try AdminToken.resolve(file: nil, environment: "secret2") == "secret2")
        let both = #expect(throws: OperatorError.self) { try AdminToken.resolve(file: file, environment: "x") }
        #expect(both?.description == "unauthorized: the admin token is given 2 ways (--admin-token-file, ORCHARD_ADMIN_TOKEN); give it one way")
        let none = #expect(throws: OperatorError.self) { try AdminToken.resolve(file: nil, environment: nil) }
        #expect(none?.description == "unauthorized: no admin token: set ORCHARD_ADMIN_TOKEN or give --admin-token-file FILE")
        let spaced = #expect(throws: OperatorError.self) { try AdminToken.resolve(file: nil, environment: "a b") }
        #expect(spaced?.code == .unauthorized)
        // A token file other users can read is warned about, as `orchard serve` does; a private one is not.
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: file)
        var warnings: [String] = []
        _ = try AdminToken.resolve(file: file, environment: nil) { warnings.append($0) }
        #expect(warnings.count == 1 && warnings[0].contains("chmod 600") && !warnings[0].contains("secret"), "\(warnings)")
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: file)
        warnings = []
        _ = try AdminToken.resolve(file: file, environment: nil) { warnings.append($0) }
        #expect(warnings.isEmpty)
    }
}

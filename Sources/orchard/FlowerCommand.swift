import OrchardBenchmarks
import ArgumentParser
import Foundation
import Logging
import OrchardHTTPClient
import OrchardClient
import OrchardData
import OrchardFlower
import OrchardFormats
import OrchardML
import OrchardOperator
import OrchardSupport
import ServiceLifecycle
import UnixSignals

/// `orchard flower …`: taking part in a Flower federation.
struct FlowerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "flower",
        abstract: "Take part in a Flower federation (flwr 1.41's Fleet API) as a SuperNode.",
        subcommands: [FlowerJoinCommand.self, FlowerKeygenCommand.self]
    )
}

/// The options that describe a device taking part in a Flower federation (shared by `flower join` and `agent`).
struct FlowerNodeOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The SuperLink's Fleet API, HOST:PORT.", valueName: "host:port"))
    var superlink: String

    @Flag(help: "Plain HTTP, for a SuperLink started with --insecure.")
    var insecure = false

    @Option(help: ArgumentHelp("The CA certificate (PEM) the SuperLink's HTTPS certificate chains to.", valueName: "file"))
    var caCert: String?

    @Option(help: ArgumentHelp("The model architecture (JSON, with a training section) the Flower arrays are loaded into.", valueName: "file"))
    var model: String

    @Option(
        help: ArgumentHelp(
            "The local training data (safetensors: one tensor per model input, plus 'target'), as `orchard data prepare` writes it.", valueName: "file"))
    var data: String

    @Option(
        help: ArgumentHelp(
            "How Flower's arrays map to the model's parameters: a JSON array of parameter names in the arrays' order, or an object {\"flower name\": \"parameter\"} (default: positional, in layer order, weights before biases).",
            valueName: "file"))
    var arrayMap: String?

    @Option(
        help: ArgumentHelp("Node configuration as Flower writes it, \"key=value key=value\" (repeatable); `seed` seeds the local shuffling.", valueName: "k=v"))
    var nodeConfig: [String] = []

    @Option(
        help: ArgumentHelp(
            "The node's private key (OpenSSH or PEM, P-384, owner-only), registered by the SuperLink's operator with `flwr supernode register KEY.pub`: for a SuperLink started with --enable-supernode-auth. Without it the node makes its own key and registers itself.",
            valueName: "file"))
    var authKey: String?

    @Option(
        name: .customLong("state-directory"),
        help: ArgumentHelp("Where the node keeps its key, a message being handled and a reply not yet pushed.", valueName: "dir"))
    var state = ".orchard-flower"

    @Option(parsing: .unconditional, help: "The heartbeat interval announced to the SuperLink, in seconds.")
    var heartbeatInterval: Double = FlowerNodeConfiguration.defaultHeartbeatInterval.inSeconds

    @Option(parsing: .unconditional, help: "Seconds between pulls when the SuperLink has no message.")
    var pollInterval: Double = FlowerNodeConfiguration.defaultPollInterval.inSeconds

    func validate() throws { try setup.validate() }

    /// The node these options describe.
    var setup: FlowerNodeSetup {
        FlowerNodeSetup(
            superlink: superlink, insecure: insecure, caCert: caCert, model: model, data: data, arrayMap: arrayMap, nodeConfig: nodeConfig,
            authKey: authKey, state: state, heartbeatInterval: heartbeatInterval, pollInterval: pollInterval, options: FlowerNodeSetup.Options()
        )
    }
}

/// A Flower node as options describe it, for `flower join` and `agent --flower-superlink`.
struct FlowerNodeSetup {
    /// The spelling of each option in the command that gives it (`agent` prefixes some with `flower-`).
    struct Options {
        var superlink = "--superlink"
        var insecure = "--insecure"
        var model = "--model"
        var arrayMap = "--array-map"
        var nodeConfig = "--node-config"
        var authKey = "--auth-key"
    }

    var superlink: String
    var insecure: Bool
    var caCert: String?
    var model: String
    var data: String
    var arrayMap: String?
    var nodeConfig: [String]
    var authKey: String?
    var state: String
    var heartbeatInterval: Double
    var pollInterval: Double
    var options: Options

    /// Checks what can be checked without reading files.
    func validate() throws {
        if insecure, caCert != nil { throw ValidationError("\(options.insecure) and --ca-cert exclude each other: \(options.insecure) is plain HTTP") }
        if !insecure, caCert == nil {
            throw ValidationError("say how to reach the SuperLink: \(options.insecure) (plain HTTP) or --ca-cert FILE (HTTPS with a private CA)")
        }
        guard (10...1800).contains(heartbeatInterval) else {
            throw ValidationError("--heartbeat-interval must be 10…1800 seconds (the bounds a SuperLink accepts), not \(heartbeatInterval)")
        }
        guard pollInterval > 0, pollInterval.isFinite else {
            throw ValidationError("--poll-interval must be a positive number of seconds, not \(pollInterval)")
        }
        _ = try parsedNodeConfig()
    }

    /// The node configuration as key → value.
    func parsedNodeConfig() throws -> [String: String] {
        var config: [String: String] = [:]
        for pair in nodeConfig.flatMap({ $0.split(separator: " ", omittingEmptySubsequences: true) }) {
            let parts = pair.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, !parts[0].isEmpty else { throw ValidationError("\(options.nodeConfig) '\(pair)' is not key=value") }
            config[String(parts[0])] = String(parts[1])
        }
        if let seed = config["seed"], UInt64(seed) == nil { throw ValidationError("\(options.nodeConfig) seed=\(seed): the seed is a non-negative integer") }
        return config
    }

    /// The node: its address, app (model, mapping, data) and configuration.
    func makeNode(logger: Logger, onEvent: @escaping @Sendable (FlowerNodeEvent) -> Void) throws -> FlowerNode {
        let trust: TrustRoots?
        if let caCert {
            do throws(ConnectionError) { trust = try TrustRoots.certificateFile(caCert) } catch { throw ValidationError("--ca-cert: \(error.message)") }
        } else {
            trust = nil
        }
        let address: SuperLinkAddress
        do throws(FlowerError) { address = try SuperLinkAddress(superlink, trustRoots: trust) } catch {
            throw ValidationError("\(options.superlink): \(error.message)")
        }
        let spec: ModelSpec
        do throws(OperatorError) { spec = try ProcessFiles.model(at: model, option: options.model) } catch { throw ValidationError(error.message) }
        let dataset: TensorDataset
        do throws(DataError) { dataset = try DeviceDataFile.read(contentsOf: URL(fileURLWithPath: data)) } catch {
            throw ValidationError("--data \(data): \(error.message)")
        }
        var mapping = ArrayMapping.positional
        if let arrayMap {
            guard let bytes = FileManager.default.contents(atPath: arrayMap) else { throw ValidationError("\(options.arrayMap) \(arrayMap): no such file") }
            do throws(FlowerError) { mapping = try ArrayMapping.decode(json: [UInt8](bytes)) } catch {
                throw ValidationError("\(options.arrayMap) \(arrayMap): \(error.message)")
            }
        }
        let seed = try parsedNodeConfig()["seed"].flatMap(UInt64.init) ?? 0
        let app: FlowerLocalApp
        do throws(FlowerError) { app = try FlowerLocalApp(model: spec, mapping: mapping, dataset: dataset, seed: seed) } catch {
            throw ValidationError(error.message)
        }
        var key: NodeIdentity?
        if let authKey {
            do throws(FlowerError) { key = try NodeKeyFile.readPrivateKey(at: URL(fileURLWithPath: authKey)) } catch {
                throw ValidationError("\(options.authKey): \(error.message)")
            }
        }
        let configuration = FlowerNodeConfiguration(
            superlink: address, stateDirectory: URL(fileURLWithPath: state, isDirectory: true), heartbeatInterval: .seconds(heartbeatInterval),
            pollInterval: .seconds(pollInterval), authenticationKey: key, logger: logger
        )
        do throws(FlowerError) { return try FlowerNode(configuration: configuration, app: app, onEvent: onEvent) } catch {
            throw ValidationError("--state-directory \(state): \(error.message)")
        }
    }
}

/// `orchard flower join`: run as a Flower SuperNode until SIGINT or SIGTERM.
struct FlowerJoinCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "join",
        abstract: "Join a Flower federation as a SuperNode that trains with the Orchard engine.",
        discussion: """
            Registers and activates the node with the SuperLink (a P-384 key kept in --state-directory names it; \
            with --auth-key, a key the SuperLink's operator registered, and the node only activates), \
            pulls messages, answers `train` with the arrays trained on --data and `evaluate` with the loss (and \
            accuracy) on it, and pushes the replies; a message that does not fit the model (array count, name, \
            shape, dtype) or of another type gets an error reply. Stops on SIGINT or SIGTERM: a training in progress \
            stops at a batch boundary, its message is kept and handled when the node runs again, and a reply that \
            could not be pushed is pushed then.

            Status goes to standard output as JSON lines: {"event":"started"}, {"event":"activated","node_id":…}, \
            {"event":"received",…}, {"event":"answered",…,"metrics":{…}}, {"event":"pushed",…}, \
            {"event":"error",…}, {"event":"stopped"}. Logs go to standard error.
            """
    )

    @OptionGroup var node: FlowerNodeOptions

    @Option(help: "The lowest level logged (to standard error).")
    var logLevel: Logger.Level = .info

    func run() async throws {
        bootstrapStandardErrorLogging(level: logLevel)
        let logger = Logger(label: "orchard.flower")
        let flower = try node.setup.makeNode(logger: logger) { FlowerStatus($0).print() }
        FlowerStatus(event: "started", superlink: node.superlink).print()
        let window = Task { try await flower.runWindow() }
        let signals = await UnixSignalsSequence(trapping: .sigint, .sigterm)
        let watcher = Task {
            for await _ in signals {
                window.cancel()
                return
            }
        }
        defer { watcher.cancel() }
        do {
            try await window.value
        } catch let error as FlowerError {
            FlowerStatus(event: "error", code: "\(error.code)", message: error.message).print()
            throw ExitCode(1)
        }
        FlowerStatus(event: "stopped").print()
    }
}

/// `orchard flower keygen`: a SuperNode key pair for a SuperLink that admits only registered nodes.
struct FlowerKeygenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Make a SuperNode key pair: FILE (private, owner-only) and FILE.pub for `flwr supernode register`.",
        discussion: """
            For a SuperLink started with --enable-supernode-auth: its operator registers FILE.pub with \
            `flwr supernode register FILE.pub`, and the node runs with `orchard flower join --auth-key FILE` (or \
            `orchard agent --flower-auth-key FILE`). The files are ECDSA P-384 in OpenSSH's formats, the same \
            `ssh-keygen -t ecdsa -b 384` writes, so Flower's own SuperNode reads them too. Existing files are never \
            overwritten.
            """
    )

    @Option(name: .shortAndLong, help: ArgumentHelp("The private key file to write; the public key goes to FILE.pub.", valueName: "file"))
    var output: String

    @Option(help: "A comment stored with the key (e.g. the device's name).")
    var comment = ""

    func validate() throws {
        for path in [output, output + ".pub"] where FileManager.default.fileExists(atPath: path) {
            throw ValidationError("\(path) exists; remove it or choose another --output (a node's key is never overwritten)")
        }
        guard !comment.contains("\n") else { throw ValidationError("--comment is one line") }
    }

    func run() throws {
        let identity = NodeIdentity()
        do throws(FileAccessError) {
            try LocalFile.createNew(Data(NodeKeyFile.openSSHPrivateKey(identity, comment: comment).utf8), at: output, permissions: 0o600)
        } catch {
            throw ValidationError("--output \(output): \(error.message)")
        }
        do throws(FileAccessError) {
            try LocalFile.createNew(Data(NodeKeyFile.openSSHPublicKey(identity, comment: comment).utf8), at: output + ".pub", permissions: 0o644)
        } catch {
            throw ValidationError("--output \(output).pub: \(error.message)")
        }
        print("wrote \(output) (private, owner-only) and \(output).pub; register it with: flwr supernode register \(output).pub")
    }
}

/// One JSON line of a Flower node's status on standard output.
struct FlowerStatus: Encodable {
    var event: String
    var superlink: String?
    var nodeID: UInt64?
    var runID: UInt64?
    var messageID: String?
    var messageType: String?
    var metrics: [String: Double]?
    var code: String?
    var message: String?

    init(event: String, superlink: String? = nil, code: String? = nil, message: String? = nil) {
        self.event = event
        self.superlink = superlink
        self.code = code
        self.message = message
    }

    init(_ event: FlowerNodeEvent) {
        switch event {
        case .registered: self.init(event: "registered")
        case .activated(let id):
            self.init(event: "activated")
            nodeID = id
        case .received(let run, let id, let type):
            self.init(event: "received")
            (runID, messageID, messageType) = (run, id, type)
        case .answered(let id, let type, _, let metrics):
            self.init(event: "answered")
            (messageID, messageType, self.metrics) = (id, type, metrics)
        case .answeredWithError(let id, let error):
            self.init(event: "answered_with_error", code: "\(error.code)", message: error.message)
            messageID = id
        case .pushed(let id):
            self.init(event: "pushed")
            messageID = id
        case .discarded(let id, let error):
            self.init(event: "discarded", code: "\(error.code)", message: error.message)
            messageID = id
        case .retrying(let error): self.init(event: "retrying", code: "\(error.code)", message: error.message)
        case .deactivated: self.init(event: "deactivated")
        }
    }

    enum CodingKeys: String, CodingKey {
        case event, superlink, nodeID = "node_id", runID = "run_id", messageID = "message_id", messageType = "message_type", metrics, code, message
    }

    func print() {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        // A diverged round's NaN loss is written as "NaN": the line is never dropped.
        encoder.nonConformingFloatEncodingStrategy = JSONLine.nonFinite
        guard let data = try? encoder.encode(self) else { return }
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }
}

import ArgumentParser
import Foundation
import OrchardFormats
import OrchardOperator
import OrchardProtocol
import OrchardSupport
import UnixSignals

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `orchard process …`: hosting and following FL processes on a running `orchard serve`, through its admin API.
struct ProcessCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "process",
        abstract: "Host, list, follow and delete FL processes on a running coordinator (its admin API).",
        discussion: """
            The admin token comes from the ORCHARD_ADMIN_TOKEN environment variable or --admin-token-file FILE (one \
            of them, never both; never on the command line). --ca-cert FILE trusts a private CA for an https server. \
            A failure is one line on standard error, `error: <code>: <message>` (the coordinator's own code for a \
            refused call), with exit status 1.
            """,
        subcommands: [
            ProcessCreateCommand.self, ProcessListCommand.self, ProcessStatusCommand.self, ProcessWatchCommand.self,
            ProcessCheckpointCommand.self, ProcessEvaluationCommand.self, ProcessDeleteCommand.self,
        ]
    )
}

/// The options every `orchard process` command takes to reach the coordinator.
struct CoordinatorOptions: ParsableArguments {
    @Option(help: "The coordinator's base URL (`orchard serve` listens on http://127.0.0.1:8080 by default).")
    var server = "http://127.0.0.1:8080"

    @Option(help: ArgumentHelp("A file holding the admin token (else the ORCHARD_ADMIN_TOKEN environment variable).", valueName: "file"))
    var adminTokenFile: String?

    @Option(help: ArgumentHelp("Trust only the CA certificates in this PEM file for an https --server (a private CA).", valueName: "pem"))
    var caCert: String?

    @Option(parsing: .unconditional, help: "Seconds to wait to connect, and for each piece of an answer.")
    var timeout: Double = 30

    /// The admin client, with the token from the environment or the file.
    func client() throws(OperatorError) -> AdminClient {
        let token = try AdminToken.resolve(file: adminTokenFile, environment: ProcessInfo.processInfo.environment[AdminToken.environmentVariable]) {
            FileHandle.standardError.write(Data("warning: \($0)\n".utf8))
        }
        guard timeout > 0, timeout.isFinite else {
            throw OperatorError(.invalidArgument, "--timeout must be a positive number of seconds, not \(timeout)")
        }
        // Checked above: a NaN or infinite number of seconds cannot become a duration.
        return try AdminClient(server: server, adminToken: token, caCertificateFile: caCert, timeout: .seconds(timeout))
    }
}

/// Runs an operator action: an ``OperatorError`` becomes the line `error: <code>: <message>` on standard error and
/// exit status 1.
func reportingOperatorErrors(_ body: () async throws(OperatorError) -> Void) async throws {
    do throws(OperatorError) {
        try await body()
    } catch {
        FileHandle.standardError.write(Data("error: \(error)\n".utf8))
        throw ExitCode(1)
    }
}

/// Writes lines to standard output.
func printLines(_ lines: [String]) {
    print(lines.joined(separator: "\n"))
}

/// Writes the coordinator's JSON as it was sent, with a final newline.
func printJSON(_ bytes: [UInt8]) {
    FileHandle.standardOutput.write(Data(bytes + [0x0A]))
}

/// `orchard process create`.
struct ProcessCreateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Host a process: a model architecture and its initial weights, with client and server configurations.",
        discussion: """
            The model and weights are checked here before anything is sent, as the coordinator checks them: JSON \
            syntax (line and column), layer types and attributes, and that the weights hold exactly the tensors the \
            architecture implies. --client-config and --server-config are JSON files holding the API's client_config \
            and server_config objects; the options after them set single keys and take precedence over the files.
            """
    )

    @OptionGroup var coordinator: CoordinatorOptions

    @Option(help: "The process's name, as devices ask for it.")
    var name: String

    @Option(help: "The process's version, e.g. 1.0.")
    var version: String

    @Option(help: ArgumentHelp("The model architecture (JSON, as `orchard train housing --output` writes it).", valueName: "file"))
    var model: String

    @Option(help: ArgumentHelp("The initial weights (safetensors).", valueName: "file"))
    var weights: String

    @Option(
        help: ArgumentHelp("A JSON file with the client_config object (batch_size, learning_rate, local_epochs, max_updates, free keys).", valueName: "file"))
    var clientConfig: String?

    @Option(
        name: .customLong("eval-data"),
        help: ArgumentHelp(
            "Held-out data (as `orchard data prepare` writes it) the coordinator evaluates every published checkpoint on (server-side evaluation).",
            valueName: "file"))
    var evalData: String?

    @Option(parsing: .unconditional, help: "client_config.batch_size: samples per local update.")
    var batchSize: Int?

    @Option(parsing: .unconditional, help: "client_config.learning_rate: the devices' learning rate.")
    var learningRate: Double?

    @Option(parsing: .unconditional, help: "client_config.local_epochs: passes over the local data per cycle.")
    var localEpochs: Int?

    @Option(parsing: .unconditional, help: "client_config.max_updates: local updates per cycle at most.")
    var maxUpdates: Int?

    @Option(help: ArgumentHelp("A JSON file with the server_config object (see the README's Configuration).", valueName: "file"))
    var serverConfig: String?

    @Option(parsing: .unconditional, help: "server_config.goal_count: reports that close a cycle.")
    var goal: Int?

    @Option(parsing: .unconditional, help: "server_config.cycle_length: seconds from a cycle's opening to its deadline.")
    var cycleLength: Double?

    @Option(parsing: .unconditional, help: "server_config.cycles: cycles to complete (0: without end).")
    var cycles: Int?

    @Option(parsing: .unconditional, help: "server_config.minimum_reports: reports needed at the deadline to aggregate.")
    var minimumReports: Int?

    @Option(help: "server_config.aggregator.kind: the server optimizer.")
    var aggregator: AggregatorConfig.Kind?

    @Flag(help: "Print the coordinator's answer (the new process's status) as JSON.")
    var json = false

    /// The request, from the files and options, checked locally.
    func request() throws(OperatorError) -> HostProcessRequest {
        if let failure = WireLimits.nameFailure(name, field: "--name") { throw OperatorError(.invalidArgument, failure) }
        guard let semantic = SemanticVersion(version) else {
            throw OperatorError(.invalidArgument, "--version '\(version)' is not a version such as 1.0 (1 to 4 numbers separated by dots)")
        }
        let spec = try ProcessFiles.model(at: model)
        let bytes = try ProcessFiles.weights(at: weights, for: spec)
        var client = try clientConfig.map { path throws(OperatorError) in try ProcessFiles.clientConfig(at: path) } ?? ClientConfig()
        if let batchSize { client.batchSize = batchSize }
        if let learningRate { client.learningRate = learningRate }
        if let localEpochs { client.localEpochs = localEpochs }
        if let maxUpdates { client.maxUpdates = maxUpdates }
        if let failure = client.validationFailure() {
            throw OperatorError(
                .invalidConfiguration,
                namingOption(
                    failure,
                    [
                        "client_config.batch_size": "--batch-size", "client_config.learning_rate": "--learning-rate",
                        "client_config.local_epochs": "--local-epochs", "client_config.max_updates": "--max-updates",
                    ]))
        }
        var server = try serverConfig.map { path throws(OperatorError) in try ProcessFiles.serverConfig(at: path) } ?? ServerConfig()
        if let goal { server.goalCount = goal }
        if let cycleLength { server.cycleLength = cycleLength }
        if let cycles { server.cycles = cycles }
        if let minimumReports { server.minimumReports = minimumReports }
        if let aggregator { server.aggregator.kind = aggregator }
        if let failure = server.validationFailure() {
            throw OperatorError(
                .invalidConfiguration,
                namingOption(
                    failure,
                    [
                        "server_config.goal_count": "--goal", "server_config.cycle_length": "--cycle-length", "server_config.cycles": "--cycles",
                        "server_config.minimum_reports": "--minimum-reports",
                    ]))
        }
        return HostProcessRequest(name: name, version: semantic, model: spec, initialWeights: bytes, clientConfig: client, serverConfig: server)
    }

    func run() async throws {
        try await reportingOperatorErrors { () async throws(OperatorError) in
            let request = try request()
            // Read before hosting: a missing file leaves nothing half done.
            let evaluationData = try evalData.map { path throws(OperatorError) in [UInt8](try ProcessFiles.read(path, option: "--eval-data")) }
            let client = try coordinator.client()
            let answer = try await client.host(request)
            var evaluated: AdminAnswer<ProcessEvaluations>?
            if let evaluationData {
                do throws(OperatorError) {
                    evaluated = try await client.attachEvaluationData(answer.value.processID, data: evaluationData)
                } catch {
                    await client.shutdown()
                    throw OperatorError(
                        error.code,
                        "process \(answer.value.processID) was hosted, but --eval-data was refused: \(error.message) (attach other data with `orchard process evaluation \(answer.value.processID) --data FILE`)",
                        httpStatus: error.httpStatus)
                }
            }
            await client.shutdown()
            if json { return printJSON(answer.json) }
            var lines =
                ["hosted process \(answer.value.processID) (\(answer.value.name) \(answer.value.version))"] + OperatorFormat.status(answer.value, now: Date())
            if let first = evaluated?.value.evaluations.last { lines.append("evaluation  " + OperatorFormat.evaluation(first)) }
            printLines(lines)
        }
    }
}

/// `orchard process list`.
struct ProcessListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "List the hosted processes.")

    @OptionGroup var coordinator: CoordinatorOptions

    @Flag(help: "Print the coordinator's answer as JSON.")
    var json = false

    func run() async throws {
        try await reportingOperatorErrors { () async throws(OperatorError) in
            let client = try coordinator.client()
            let answer = try await client.processes()
            await client.shutdown()
            if json { return printJSON(answer.json) }
            printLines(OperatorFormat.processList(answer.value, now: Date()))
        }
    }
}

/// `orchard process status`.
struct ProcessStatusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "status", abstract: "Show a process: its state, checkpoints, open cycle and configuration.")

    @OptionGroup var coordinator: CoordinatorOptions

    @Argument(help: "The process id (p_…, from `orchard process list`).")
    var id: String

    @Flag(help: "Print the coordinator's answer as JSON.")
    var json = false

    func run() async throws {
        try await reportingOperatorErrors { () async throws(OperatorError) in
            let client = try coordinator.client()
            let answer = try await client.status(id)
            await client.shutdown()
            if json { return printJSON(answer.json) }
            printLines(OperatorFormat.status(answer.value, now: Date()))
        }
    }
}

/// `orchard process watch`.
struct ProcessWatchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Follow a process: cycle, devices assigned and reported against the goal, the deadline, a progress bar.",
        discussion: """
            Polls the status every --interval seconds. On a terminal the frame is redrawn in place; otherwise each \
            poll prints one line starting with the time. Stops when the process completes, or on Ctrl-C.
            """
    )

    @OptionGroup var coordinator: CoordinatorOptions

    @Argument(help: "The process id (p_…, from `orchard process list`).")
    var id: String

    @Option(parsing: .unconditional, help: "Seconds between two polls.")
    var interval: Double = 2

    @Flag(help: "Show one frame and stop.")
    var once = false

    func validate() throws {
        guard interval > 0, interval.isFinite, interval <= 86_400 else {
            throw ValidationError("--interval must be a positive number of seconds, at most 86400")
        }
    }

    func run() async throws {
        let style: WatchFrame.Style = isatty(STDOUT_FILENO) == 1 ? .terminal(width: Terminal.width(of: STDOUT_FILENO)) : .plain
        let interval = Duration.nanoseconds(Int64(self.interval * 1e9))
        let once = self.once
        let id = self.id
        try await reportingOperatorErrors { () async throws(OperatorError) in
            let client = try coordinator.client()
            let signals = await UnixSignalsSequence(trapping: .sigint, .sigterm)
            let watch = Task { () throws(OperatorError) -> ProcessWatcher.Ending in
                var previous = 0
                return try await ProcessWatcher.run(interval: interval, once: once, clock: SystemClock()) { () async throws(OperatorError) in
                    try await client.status(id).value
                } show: { status, now in
                    let lines = WatchFrame.lines(status, now: now, style: style)
                    let text =
                        switch style {
                        case .plain: lines.joined(separator: "\n") + "\n"
                        case .terminal: WatchFrame.redraw(previous: previous, lines: lines)
                        }
                    FileHandle.standardOutput.write(Data(text.utf8))
                    previous = lines.count
                }
            }
            let interrupt = Task {
                for await _ in signals {
                    watch.cancel()
                    return
                }
            }
            let result = await watch.result
            interrupt.cancel()
            await client.shutdown()
            if case .failure(let error) = result {
                throw error as? OperatorError ?? OperatorError(.unexpectedAnswer, "\(error)")
            }
        }
    }
}

/// `orchard process evaluation`.
struct ProcessEvaluationCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "evaluation",
        abstract: "Show a process's server-side evaluations; attach or detach the held-out data they use.",
        discussion: """
            The coordinator evaluates every checkpoint it publishes on the held-out data attached to the process (a file \
            as `orchard data prepare` writes it, at most 64 MiB by default), off the request path: loss, and accuracy for \
            a classifier or RMSE and MAE for a regressor. --data attaches (or replaces) the data and evaluates the latest \
            checkpoint at once; --remove detaches it (the evaluations made stay listed).
            """
    )

    @OptionGroup var coordinator: CoordinatorOptions

    @Argument(help: "The process id (p_…, from `orchard process list`).")
    var id: String

    @Option(help: ArgumentHelp("Attach this held-out data file (as `orchard data prepare` writes it).", valueName: "file"))
    var data: String?

    @Flag(help: "Detach the held-out data.")
    var remove = false

    @Flag(help: "Print the coordinator's answer as JSON.")
    var json = false

    func validate() throws {
        if data != nil && remove { throw ValidationError("--data and --remove cannot both be given") }
    }

    func run() async throws {
        try await reportingOperatorErrors { () async throws(OperatorError) in
            let bytes = try data.map { path throws(OperatorError) in [UInt8](try ProcessFiles.read(path, option: "--data")) }
            let client = try coordinator.client()
            let answer: AdminAnswer<ProcessEvaluations>
            do throws(OperatorError) {
                if let bytes {
                    answer = try await client.attachEvaluationData(id, data: bytes)
                } else {
                    if remove { try await client.removeEvaluationData(id) }
                    answer = try await client.evaluations(id)
                }
            } catch {
                await client.shutdown()
                throw error
            }
            await client.shutdown()
            if json { return printJSON(answer.json) }
            printLines(OperatorFormat.evaluations(answer.value))
        }
    }
}

/// `orchard process checkpoint`.
struct ProcessCheckpointCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "checkpoint", abstract: "Download a stored checkpoint (safetensors).")

    @OptionGroup var coordinator: CoordinatorOptions

    @Argument(help: "The process id (p_…, from `orchard process list`).")
    var id: String

    @Argument(help: "The checkpoint: a number (0 is the initial weights) or `latest`.")
    var checkpoint = "latest"

    @Option(name: [.customShort("o"), .customLong("output")], help: ArgumentHelp("The file to write.", valueName: "file"))
    var output: String

    func run() async throws {
        try await reportingOperatorErrors { () async throws(OperatorError) in
            guard let which = CheckpointSelector(checkpoint) else {
                throw OperatorError(.invalidArgument, "checkpoint '\(checkpoint)' is neither a number (0, 1, …) nor 'latest'")
            }
            let client = try coordinator.client()
            let fetched = try await client.checkpoint(id, which)
            await client.shutdown()
            do {
                try Data(fetched.bytes).write(to: URL(fileURLWithPath: output), options: .atomic)
            } catch {
                throw OperatorError(.writeFailed, "cannot write -o '\(output)': \(FileAccessError(error, writing: true).message)")
            }
            let number = fetched.number.map { "checkpoint \($0)" } ?? "checkpoint \(which)"
            print("wrote \(number) of \(id) to \(output) (\(fetched.bytes.count) bytes)")
        }
    }
}

/// `orchard process delete`.
struct ProcessDeleteCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "delete", abstract: "Delete a process, its cycles and its checkpoints.")

    @OptionGroup var coordinator: CoordinatorOptions

    @Argument(help: "The process id (p_…, from `orchard process list`).")
    var id: String

    func run() async throws {
        try await reportingOperatorErrors { () async throws(OperatorError) in
            let client = try coordinator.client()
            try await client.delete(id)
            await client.shutdown()
            print("deleted \(id)")
        }
    }
}

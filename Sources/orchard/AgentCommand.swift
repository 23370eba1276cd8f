import ArgumentParser
import Foundation
import OrchardSupport
import Logging
import OrchardBenchmarks
import OrchardClient
import OrchardFlower
import OrchardScheduler
import ServiceLifecycle
import UnixSignals

/// `orchard agent`: the device daemon — the background scheduler trains whenever the device's conditions hold.
struct AgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "agent",
        abstract: "Run as a device daemon: train a cycle whenever power and network conditions allow.",
        discussion: """
            Conditions are read from sysfs and procfs (power supplies, network interfaces, CPU idleness, thermal \
            zones); --sysfs-root and --procfs-root point at other copies (a container that mounts the host's /sys \
            and /proc elsewhere). A window that closes mid-training (conditions lost, time limit, SIGTERM) saves a \
            checkpoint that the next window resumes. Stops gracefully on SIGINT or SIGTERM.

            The scheduler's queue is kept in --state-directory (agent-scheduler-<process>.sqlite, next to the job's \
            state): after a restart a pending request keeps its earliest begin (the coordinator's retry_after), so \
            the agent waits for it instead of asking the coordinator again at once.

            Status goes to standard output as JSON lines: {"event":"started"}, one {"event":"conditions",...} per \
            check (with "met" and the "unmet" constraints), {"event":"scheduled",...} once the request is queued (with \
            "restored" when it came from the store and "earliest_begin" in seconds since 1970 when it waits for a \
            date), {"event":"phase","phase":...} as a cycle advances, \
            {"event":"resumed_training"} when training continues from a checkpoint, {"event":"cycle",...} per \
            finished cycle, {"event":"error",...} per failed one and {"event":"stopped"} at the end. Logs go to \
            standard error.

            With --flower-superlink HOST:PORT the agent is a Flower SuperNode instead (see `orchard flower join`): in each \
            window it activates, answers the SuperLink's train and evaluate messages with --model on --data, and \
            deactivates when the window ends (a message in training is kept for the next window); --interval is the \
            wait between windows. Its status lines are flower join's, plus {"event":"window_ended"}.
            """
    )

    @OptionGroup var device: DeviceOptions

    @OptionGroup(title: "Flower (instead of --server)") var flower: AgentFlowerOptions

    @Flag(inversion: .prefixedNo, help: "Train only on external power.")
    var requiresPower = true

    @Flag(help: "Train only on an unmetered network.")
    var requiresUnmetered = false

    @Option(help: "Interfaces to count as metered (repeatable).")
    var meteredInterface: [String] = []

    @Option(parsing: .unconditional, help: "Seconds one background window may last.")
    var window: Int = 600

    @Option(parsing: .unconditional, help: "Seconds between cycles when the coordinator gives no retry-after.")
    var interval: Int = 3600

    @Option(parsing: .unconditional, help: "Seconds between checks of the device's conditions while waiting for them.")
    var pollInterval: Double = 60

    @Option(help: "Where sysfs is mounted (power supplies, network interfaces, thermal zones).")
    var sysfsRoot = "/sys"

    @Option(help: "Where procfs is mounted (routes, CPU counters).")
    var procfsRoot = "/proc"

    @Option(
        parsing: .unconditional,
        help: "Seconds a cycle whose window expired, or that is in flight at shutdown, may take to stop at a batch boundary and save its checkpoint.")
    var shutdownGrace: Double = 30

    @Option(help: "The lowest level logged (to standard error).")
    var logLevel: Logger.Level = .info

    func validate() throws {
        if let superlink = flower.flowerSuperlink {
            for (option, value) in [
                ("--server", device.server), ("--process", device.process), ("--version", device.version), ("--token", device.token),
                ("--token-file", device.tokenFile),
            ]
            where value != nil {
                throw ValidationError("\(option) is for an Orchard coordinator; with --flower-superlink \(superlink) the SuperLink sends the work")
            }
            guard flower.model != nil else {
                throw ValidationError("--model is required with --flower-superlink: the architecture Flower's arrays are loaded into")
            }
            try flowerSetup(superlink: superlink).validate()
        } else {
            _ = try device.coordinator()
            if flower.model != nil || flower.flowerInsecure || flower.arrayMap != nil || !flower.nodeConfig.isEmpty || flower.flowerAuthKey != nil
                || flower.heartbeatInterval != nil
            {
                throw ValidationError(
                    "--model, --flower-insecure, --flower-auth-key, --array-map, --node-config and --heartbeat-interval are for --flower-superlink")
            }
        }
        guard window > 0 else { throw ValidationError("--window must be positive") }
        guard interval > 0 else { throw ValidationError("--interval must be positive") }
        // A poll under 10 ms would spin (0.0001 truncated to 0 ms); over a day, or a grace over an hour, is no daemon setting.
        guard pollInterval >= 0.01, pollInterval <= 86_400 else { throw ValidationError("--poll-interval must be in 0.01...86400 seconds") }
        guard shutdownGrace >= 0, shutdownGrace <= 3600 else { throw ValidationError("--shutdown-grace must be in 0...3600 seconds") }
        for (option, path) in [("--sysfs-root", sysfsRoot), ("--procfs-root", procfsRoot)] {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue else {
                throw ValidationError("\(option) \(path) is not a directory")
            }
        }
    }

    /// The scheduler's store in the state directory (created if needed), one file per process so agents of several
    /// models may share a state directory. An unreadable file is moved aside (and logged) and a fresh one used.
    private func openSchedulerStore(name: String) throws -> SQLiteSchedulerStore {
        let directory = URL(fileURLWithPath: device.state, isDirectory: true)
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            throw ValidationError("cannot create --state-directory \(device.state): \(FileAccessError(error, writing: true).message)")
        }
        let safeName = String(name.map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." ? $0 : "_" })
        let path = directory.appendingPathComponent("agent-scheduler-\(safeName).sqlite").path
        do throws(SchedulerError) {
            let store = try SQLiteSchedulerStore(path: path)
            if let recovery = store.recovery {
                AgentStatus(event: "error", code: "scheduler_store_recovered", message: recovery.description).print()
            }
            return store
        } catch {
            throw ValidationError("cannot open the scheduler store \(path): \(error.message)")
        }
    }

    func run() async throws {
        bootstrapStandardErrorLogging(level: logLevel)
        let logger = Logger(label: "orchard.agent")
        let constraints = TaskConstraints(requiresExternalPower: requiresPower, requiresNetworkConnectivity: true, requiresUnmeteredNetwork: requiresUnmetered)
        let linux = LinuxConditionsProvider(configuration: .init(sysfsRoot: sysfsRoot, procfsRoot: procfsRoot, meteredInterfaces: Set(meteredInterface)))
        let conditions = ReportedConditions(inner: linux, constraints: constraints)
        if let superlink = flower.flowerSuperlink {
            try await runFlower(superlink: superlink, constraints: constraints, conditions: conditions, logger: logger)
            return
        }
        let job = try device.makeJob(logger: logger, conditions: conditions)
        let (server, process, version) = try device.coordinator()
        let identifier = "dev.orchard.train.\(process)"
        let store = try openSchedulerStore(name: process)
        let scheduler = try BackgroundScheduler(
            configuration: SchedulerConfiguration(
                permittedIdentifiers: [identifier], processingBudget: .seconds(window),
                overrunGrace: .seconds(shutdownGrace), idlePollInterval: .seconds(pollInterval)
            ),
            conditions: conditions, store: store, logger: logger
        )
        let restored = await scheduler.pendingRequests().contains { $0.identifier == identifier }
        let options = BackgroundTrainingOptions(identifier: identifier, constraints: constraints, defaultInterval: .seconds(interval))
        let device = self.device
        let events = Task {
            for await event in job.events() {
                switch event {
                case .phase(let phase) where phase != .finished: AgentStatus(event: "phase", phase: "\(phase)").print()
                case .resumedTraining: AgentStatus(event: "resumed_training").print()
                default: break
                }
            }
        }
        defer { events.cancel() }
        try await job.scheduleBackgroundTraining(on: scheduler, options: options, data: { try device.loadDataset() }) { result in
            switch result {
            case .success(let outcome):
                logger.info("cycle finished", metadata: ["outcome": "\(ClientCommand.describe(outcome))"])
                AgentStatus.cycle(outcome).print()
            case .failure(let error):
                logger.warning("cycle failed", metadata: ["error": "\(error)"])
                AgentStatus.error(error).print()
            }
        }
        logger.info("agent started", metadata: ["server": "\(server)", "process": "\(process)", "version": "\(version)", "scheduler_store": "\(store.path)"])
        AgentStatus.started.print()
        let begin = await scheduler.effectiveBeginDate(of: identifier)
        AgentStatus(event: "scheduled", restored: restored, earliestBegin: begin.flatMap { $0 > Date() ? $0.timeIntervalSince1970 : nil }).print()
        let group = ServiceGroup(services: [scheduler], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        do {
            // On SIGTERM the scheduler expires the window in flight and returns once its cycle has stopped at a
            // batch boundary and saved its checkpoint (or `--shutdown-grace` passed).
            try await group.run()
        } catch is CancellationError {
            // The scheduler ends its loop by cancellation when asked to shut down gracefully.
        }
        // The event lines of the last window are written before the stop line, never after it or not at all.
        events.cancel()
        await events.value
        logger.info("agent stopped")
        AgentStatus.stopped.print()
    }

    /// The Flower node `--flower-*`, `--model`, `--data`, `--ca-cert` and `--state-directory` describe.
    private func flowerSetup(superlink: String) -> FlowerNodeSetup {
        FlowerNodeSetup(
            superlink: superlink, insecure: flower.flowerInsecure, caCert: device.caCert, model: flower.model ?? "", data: device.data,
            arrayMap: flower.arrayMap, nodeConfig: flower.nodeConfig, authKey: flower.flowerAuthKey, state: device.state,
            heartbeatInterval: flower.heartbeatInterval ?? 30, pollInterval: 1,
            options: FlowerNodeSetup.Options(superlink: "--flower-superlink", insecure: "--flower-insecure", authKey: "--flower-auth-key")
        )
    }

    /// The agent as a Flower SuperNode: the scheduler grants windows, the node is active in each.
    private func runFlower(superlink: String, constraints: TaskConstraints, conditions: some DeviceConditionsProvider, logger: Logger) async throws {
        let node = try flowerSetup(superlink: superlink).makeNode(logger: logger) { FlowerStatus($0).print() }
        let identifier = "dev.orchard.flower.\(superlink)"
        let store = try openSchedulerStore(name: "flower-\(superlink)")
        let scheduler = try BackgroundScheduler(
            configuration: SchedulerConfiguration(
                permittedIdentifiers: [identifier], processingBudget: .seconds(window),
                overrunGrace: .seconds(shutdownGrace), idlePollInterval: .seconds(pollInterval)
            ),
            conditions: conditions, store: store, logger: logger
        )
        let options = BackgroundTrainingOptions(identifier: identifier, constraints: constraints, defaultInterval: .seconds(interval))
        do throws(FlowerError) {
            try await node.scheduleBackgroundWindows(on: scheduler, options: options) { error in
                if let error {
                    FlowerStatus(event: "error", code: "\(error.code)", message: error.message).print()
                } else {
                    FlowerStatus(event: "window_ended").print()
                }
            }
        } catch {
            throw ValidationError(error.message)
        }
        logger.info("agent started", metadata: ["superlink": "\(superlink)", "scheduler_store": "\(store.path)"])
        FlowerStatus(event: "started", superlink: superlink).print()
        let group = ServiceGroup(services: [scheduler], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        do {
            try await group.run()
        } catch is CancellationError {
            // The scheduler ends its loop by cancellation when asked to shut down gracefully.
        }
        FlowerStatus(event: "stopped").print()
    }
}

/// The conditions provider the agent's scheduler reads, reporting each reading as a status line.
private struct ReportedConditions: DeviceConditionsProvider {
    let inner: LinuxConditionsProvider
    let constraints: TaskConstraints
    let rules = ConditionRules()

    func currentConditions() async -> DeviceConditions {
        let conditions = await inner.currentConditions()
        AgentStatus.conditions(unmet: rules.unmet(constraints, kind: .processing, in: conditions).map(\.description)).print()
        return conditions
    }
}

/// One JSON line of the agent's status on standard output.
private struct AgentStatus: Encodable {
    var event: String
    var phase: String?
    var met: Bool?
    var unmet: [String]?
    var outcome: String?
    var cycle: Int?
    var retryAfter: Double?
    var code: String?
    var message: String?
    var restored: Bool?
    var earliestBegin: Double?

    static let started = AgentStatus(event: "started")
    static let stopped = AgentStatus(event: "stopped")

    static func conditions(unmet: [String]) -> AgentStatus {
        AgentStatus(event: "conditions", met: unmet.isEmpty, unmet: unmet)
    }

    static func cycle(_ outcome: CycleOutcome) -> AgentStatus {
        switch outcome {
        case .reported(let receipt):
            AgentStatus(event: "cycle", outcome: "reported", cycle: receipt.cycle, retryAfter: receipt.retryAfter)
        case .rejected(let retryAfter, let reason):
            AgentStatus(event: "cycle", outcome: "rejected", retryAfter: retryAfter, message: reason)
        case .conditionsNotMet(let unmet):
            AgentStatus(event: "cycle", met: false, unmet: unmet, outcome: "conditions_not_met")
        case .evaluated(let receipt):
            AgentStatus(event: "cycle", outcome: "evaluated", message: "checkpoint \(receipt.checkpoint), \(receipt.samples) held-out samples")
        }
    }

    static func error(_ error: OrchardClientError) -> AgentStatus {
        AgentStatus(event: "error", code: "\(error.code)", message: error.message)
    }

    func print() {
        try? JSONLine.write(self)
    }
}

/// `orchard agent`'s options for taking part in a Flower federation instead of an Orchard coordinator's process.
struct AgentFlowerOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Be a Flower SuperNode of this SuperLink's Fleet API instead of a device of --server.", valueName: "host:port"))
    var flowerSuperlink: String?

    @Flag(help: "Plain HTTP to the SuperLink (one started with --insecure); otherwise HTTPS with --ca-cert.")
    var flowerInsecure = false

    @Option(help: ArgumentHelp("The model architecture (JSON) Flower's arrays are loaded into (with --flower-superlink).", valueName: "file"))
    var model: String?

    @Option(help: ArgumentHelp("How Flower's arrays map to the model's parameters (see `orchard flower join --help`).", valueName: "file"))
    var arrayMap: String?

    @Option(help: ArgumentHelp("Flower node configuration, \"key=value …\" (repeatable).", valueName: "k=v"))
    var nodeConfig: [String] = []

    @Option(parsing: .unconditional, help: "The heartbeat interval announced to the SuperLink, in seconds (default: 30).")
    var heartbeatInterval: Double?

    @Option(help: ArgumentHelp("The node's private key, registered with `flwr supernode register` (see `orchard flower join --help`).", valueName: "file"))
    var flowerAuthKey: String?
}

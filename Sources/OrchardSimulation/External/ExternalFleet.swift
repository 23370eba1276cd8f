import Foundation
public import OrchardSupport
import OrchardClient
import OrchardHTTPClient
import OrchardOperator
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import Logging
import Synchronization

/// Runs a shard of the fleet against a coordinator that runs elsewhere (`orchard simulate --coordinator URL
/// --shard i/n`), in real time: an external coordinator's deadlines run on its own wall clock, so the simulation's
/// virtual time cannot drive it.
///
/// Shard 1 hosts the process through the admin API — the same `HostProcessRequest` the
/// in-process mode hosts, with `cycles` = the rounds — unless a process of that name and version exists, which it
/// then uses; the other shards wait for it to appear. Each device of the shard is the real device SDK over HTTP: its
/// own `FederatedJob` with its state in its own directory, its data slice from the seed's partition,
/// cycles run back to back as the coordinator's `retry_after` says (sleeps on the injected clock). An admitted device
/// goes away with the fleet's dropout probability (a seeded draw per device and cycle) after its download and stays
/// away until the cycle's deadline. At most ``ExternalCoordinator/concurrency`` trainings run at once. The shard
/// reads the process's status every ``ExternalCoordinator/pollInterval`` seconds, writes a row per closed cycle,
/// and stops its devices once the process has aggregated `rounds` cycles (or completed); shard 1 also evaluates the
/// latest checkpoint on the test set. Availability traces and background windows are virtual time and do not apply:
/// every device is available.
public enum ExternalFleet {
    /// The environment variable holding the coordinator's admin token (never a command-line option).
    public static let adminTokenVariable = "ORCHARD_ADMIN_TOKEN"

    /// Runs shard `coordinator.shard` of `configuration`'s fleet against `coordinator.url`.
    /// - Parameters:
    ///   - configuration: The scenario (every shard takes the same one); `availability` must be `always`, and the
    ///     transport, window and seconds-per-update settings are not used.
    ///   - options: Where the coordinator is and which shard this is.
    ///   - environment: Where ``adminTokenVariable`` is read (the CLI passes the process environment).
    ///   - progress: Where progress goes.
    ///   - clock: Real time: the devices' waits, the polls, the wall-seconds figures (injected; tests shorten it).
    ///   - stop: Asks the shard to stop before the rounds are aggregated (Ctrl-C): its devices stop, its scratch files
    ///     are removed, and the summary says how many rounds were planned.
    public static func run(
        _ configuration: SimulationConfiguration, coordinator options: ExternalCoordinator, environment: [String: String],
        progress: ProgressDisplay, clock: any WallClock, stop: SimulationStop? = nil
    ) async throws(SimulationError) -> ShardResult {
        try validate(configuration, options)
        let token = try adminToken(environment)
        // Admin calls wait as long as device calls: hosting a process (its model checked and stored) can take seconds on a
        // busy coordinator; an unreachable one still fails at once (the connection is refused).
        let admin = try CoordinatorAdmin(url: options.url, token: token, trustRoots: options.trustRoots, timeout: options.requestTimeout, clock: clock)
        let setupStart = clock.now
        // Reach the coordinator (and check the token) before preparing the data, so a wrong URL or token fails at once.
        _ = try await admin.processes()
        let shard = options.shard
        let directory =
            configuration.output
            ?? FileManager.default.temporaryDirectory
            .appendingPathComponent("orchard-simulation-\(configuration.seed)-shard-\(shard.index)-of-\(shard.count)-\(UUID().uuidString.prefix(8))")
        let writer = try ReportWriter(directory: directory, truncating: false)
        let prepared: (model: Model, workload: any FleetWorkload, centralRMSE: Double?)
        let request: HostProcessRequest
        let process: ProcessStatus
        let hosted: Bool
        do throws(SimulationError) {
            prepared = try SimulationRunner.prepare(configuration, progress: progress)
            request = try SimulationRunner.hostedProcess(
                configuration, model: prepared.model, workload: prepared.workload, name: options.processName, cycles: configuration.rounds
            )
            if shard.index == 1 {
                (process, hosted) = try await admin.hostOnce(request)
                progress.note(
                    hosted
                        ? "hosted process \(process.processID) ('\(request.name)' \(request.version)) on \(admin.url)"
                        : "using the existing process \(process.processID) ('\(request.name)' \(request.version)) on \(admin.url): \(process.cyclesCompleted) cycles aggregated so far"
                )
            } else {
                progress.note("waiting for shard 1 to host '\(request.name)' \(request.version) on \(admin.url)")
                process = try await admin.waitForProcess(name: request.name, version: request.version, timeout: options.hostTimeout)
                hosted = false
                progress.note("found process \(process.processID) on \(admin.url)")
            }
            // A run that resumes a process with aggregated cycles (a shard run again after it was killed) keeps the rows
            // the earlier run wrote; a new process starts the file afresh.
            if process.cyclesCompleted + process.cyclesAbandoned == 0 || !FileManager.default.fileExists(atPath: writer.metricsURL.path) {
                try writer.begin()
            }
        } catch {
            writer.discardIfCreated()
            throw error
        }
        progress.note("writing metrics.jsonl and summary.json into \(directory.path)")
        let run = ShardRun(
            configuration: configuration, options: options, admin: admin, workload: prepared.workload, processID: process.processID,
            processName: request.name, writer: writer, progress: progress, clock: clock, stop: stop
        )
        let outcome = try await run.run(from: process)
        let end = outcome.final
        let counts = run.counters.snapshot()
        let evaluations = outcome.rows.compactMap { row in row.testLoss.map { Evaluation(loss: $0, accuracy: row.testAccuracy, rmse: row.testRMSE) } }
        var settings = configuration.settings
        for key in ["transport", "window_seconds", "seconds_per_update"] { settings[key] = nil }
        settings["availability"] = "always"
        settings["coordinator"] = options.urls.joined(separator: ",")
        settings["shard"] = shard.description
        settings["process"] = request.name
        settings["concurrency"] = String(options.concurrency)
        let summary = ShardSummary(
            settings: settings, shard: shard.description, devices: run.devices.count, processID: process.processID, hosted: hosted,
            rounds: outcome.rows.count, aggregatedRounds: end.cyclesCompleted, abandonedRounds: end.cyclesAbandoned,
            wallSeconds: outcome.wallSeconds, setupSeconds: setupStart.duration(to: outcome.started).inSeconds,
            checkIns: counts.checkIns, admitted: counts.admitted, rejected: counts.rejected, reported: counts.reported, dropped: counts.dropped,
            late: counts.late, failed: counts.failed, rejections: counts.rejections, lastError: counts.lastError,
            initial: outcome.initial, final: evaluations.last ?? outcome.initial,
            bestAccuracy: outcome.rows.compactMap(\.testAccuracy).max(), bestRMSE: outcome.rows.compactMap(\.testRMSE).min(),
            epsilon: end.privacy?.epsilon,
            plannedRounds: end.cyclesCompleted < configuration.rounds && end.state != .completed ? configuration.rounds : nil
        )
        try writer.finish(summary: summary)
        let devices = run.devices.map { ShardDevice(device: $0, workerID: counts.workers[$0], reported: counts.reportsByDevice[$0] ?? 0) }
        return ShardResult(directory: writer.directory, summary: summary, rounds: outcome.rows, devices: devices)
    }

    /// Checks what an external run needs beyond ``SimulationConfiguration/validate()``.
    public static func validate(_ configuration: SimulationConfiguration, _ options: ExternalCoordinator) throws(SimulationError) {
        try configuration.validate()
        try options.validate()
        if configuration.availability != .always {
            throw SimulationError(
                .invalidOption,
                "availability must be always against an external coordinator, not \(configuration.availability): availability windows are played on virtual time, and an external coordinator runs on its own wall clock"
            )
        }
        if configuration.clients < options.shard.count {
            throw SimulationError(
                .invalidOption,
                "clients (\(configuration.clients)) must be at least the number of shards (\(options.shard.count)), or some shard has no devices")
        }
    }

    /// The admin token from `environment`.
    static func adminToken(_ environment: [String: String]) throws(SimulationError) -> String {
        let token = environment[adminTokenVariable]?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
        guard !token.isEmpty else {
            throw SimulationError(
                .invalidOption,
                "\(adminTokenVariable) must hold the coordinator's admin token: against an external coordinator every shard reads the process's status through the admin API (and shard 1 hosts it)"
            )
        }
        return token
    }
}

/// A value set at most once by concurrent code.
final class Note<T: Sendable>: Sendable {
    private let state = Mutex<T?>(nil)
    var value: T? { state.withLock { $0 } }
    func set(_ value: T) { state.withLock { $0 = $0 ?? value } }
}

/// One shard's devices and its watch over the process.
struct ShardRun: Sendable {
    let configuration: SimulationConfiguration
    let options: ExternalCoordinator
    let admin: CoordinatorAdmin
    let workload: any FleetWorkload
    let processID: String
    let processName: String
    let writer: ReportWriter
    let progress: ProgressDisplay
    let clock: any WallClock
    let stop: SimulationStop?
    let counters = ShardCounters()
    let devices: [Int]

    init(
        configuration: SimulationConfiguration, options: ExternalCoordinator, admin: CoordinatorAdmin, workload: any FleetWorkload, processID: String,
        processName: String, writer: ReportWriter, progress: ProgressDisplay, clock: any WallClock, stop: SimulationStop? = nil
    ) {
        self.configuration = configuration
        self.options = options
        self.admin = admin
        self.workload = workload
        self.processID = processID
        self.processName = processName
        self.writer = writer
        self.progress = progress
        self.clock = clock
        self.stop = stop
        devices = options.shard.devices(of: configuration.clients)
    }

    struct Outcome {
        var rows: [ShardCycleMetrics]
        var initial: Evaluation?
        var final: ProcessStatus
        var started: WallInstant
        var wallSeconds: Double
    }

    var evaluates: Bool { options.shard.index == 1 }

    /// Runs the devices until the process has aggregated the rounds, watching it; returns what was observed.
    func run(from process: ProcessStatus) async throws(SimulationError) -> Outcome {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-shard-\(UUID().uuidString)", isDirectory: true)
        stop?.register(scratch: directory)
        defer {
            try? FileManager.default.removeItem(at: directory)
            stop?.unregister(scratch: directory)
        }
        // One transport per coordinator instance; each device keeps to its own instance.
        var transports: [String: HTTPTransport] = [:]
        for url in options.urls {
            do { transports[url] = try HTTPTransport(url: url, timeout: options.requestTimeout, trustRoots: options.trustRoots, clock: clock) } catch {
                throw SimulationError(.invalidOption, error.message)
            }
        }
        var jobs: [(device: Int, job: FederatedJob)] = []
        let silent = Logger(label: "orchard.simulation.device") { _ in SwiftLogNoOpLogHandler() }
        for device in devices {
            // The same seeds as the device's virtual counterpart.
            var random = OrchardRandom.derived(seed: configuration.seed ^ 0x7EA1_7123, stream: UInt64(device))
            var clientConfiguration = DeviceConfiguration(
                storageDirectory: directory.appendingPathComponent("device-\(device)", isDirectory: true), requestTimeout: options.requestTimeout,
                environment: ClientEnvironment.seeded(configuration.seed ^ 0xC11E_57 &+ UInt64(device), clock: clock, seedNoise: true),
                trainingSeed: random.next(), logger: silent, durability: .unsynced
            )
            if configuration.secureAggregation?.parameters.consistencyCheck == true {
                (clientConfiguration.secureAggregationIdentity, clientConfiguration.secureAggregationAuthorities) =
                    try SimulatedAttestation.credentials(seed: configuration.seed, device: device)
            }
            let url = options.url(forDevice: device)
            guard let transport = transports[url] else { throw SimulationError(.invalidOption, "no transport for \(url)") }
            let client = CoordinatorConnection(
                transport: CountingTransport(inner: transport, device: device, counters: counters), server: url, configuration: clientConfiguration)
            do { jobs.append((device, try client.newJob(processName: processName, version: SimulationRunner.processVersion.description))) } catch {
                throw SimulationError(.training, "device \(device) cannot be set up: \(error.message)")
            }
        }
        let initial: Evaluation? = evaluates ? try await evaluate(checkpoint: process.latestCheckpoint) : nil
        if let initial { progress.note("checkpoint \(process.latestCheckpoint): \(describe(initial))") }
        let slots = AsyncSemaphore(permits: options.concurrency)
        stop?.markRunning()
        let started = clock.now
        progress.note(
            "shard \(options.shard): \(devices.count) devices of \(configuration.clients) against \(options.urls.joined(separator: ", ")), until \(configuration.rounds) cycles are aggregated"
        )
        let watched: Result<(rows: [ShardCycleMetrics], final: ProcessStatus), SimulationError> = await withTaskGroup(of: Void.self) { group in
            for (device, job) in jobs {
                group.addTask { await live(device: device, job: job, slots: slots) }
            }
            let result: Result<(rows: [ShardCycleMetrics], final: ProcessStatus), SimulationError>
            do throws(SimulationError) { result = .success(try await watch(from: process, started: started)) } catch { result = .failure(error) }
            group.cancelAll()
            await group.waitForAll()
            return result
        }
        let wallSeconds = started.duration(to: clock.now).inSeconds
        switch watched {
        case .success(let watched): return Outcome(rows: watched.rows, initial: initial, final: watched.final, started: started, wallSeconds: wallSeconds)
        case .failure(let error): throw error
        }
    }

    /// One device: cycle after cycle, waiting what the coordinator says in between, until cancelled.
    func live(device: Int, job: FederatedJob, slots: AsyncSemaphore) async {
        let seed = configuration.seed, dropout = configuration.dropout, workload = self.workload
        // First check-ins spread over a few seconds, so the shard does not arrive as one burst.
        let spread = min(FleetConditions().checkInSpread, configuration.cycleSeconds)
        do { try await clock.sleep(for: .seconds(OrchardRandomAccess.uniform(seed: seed, a: UInt64(device), b: 0, salt: 0x5747_A27) * spread)) } catch {
            return
        }
        var failures = 0
        while !Task.isCancelled {
            let away = Note<Double>()
            var wait: Double
            do {
                let tasks: [DeviceTask] = configuration.federatedEvaluation == nil ? [.training] : [.evaluation, .training]
                let outcome = try await job.run(
                    tasks: tasks,
                    evaluate: { context in
                        let holdout = context.holdoutSplit(count: workload.sampleCount(device: device)).holdout
                        guard !holdout.isEmpty else { return nil }
                        let model = context.model
                        return try await slots.runTraining { () throws -> EvaluationMetrics in
                            try workload.evaluate(device: device, model: model, on: holdout)
                        }
                    }
                ) { context in
                    // The device goes away (app killed, network gone) after its download, with the fleet's dropout
                    // probability: a draw of its own per device and cycle.
                    let draw = OrchardRandomAccess.uniform(seed: seed, a: UInt64(device), b: UInt64(context.assignment.cycle), salt: 0xD0_0D1E)
                    if draw < dropout {
                        away.set(context.assignment.reportWithin)
                        throw CancellationError()
                    }
                    let task = LocalTrainingTask(model: context.model, training: context.training)
                    let checkpoint = context.savedCheckpoint
                    let indices = context.holdoutSplit(count: workload.sampleCount(device: device))?.training
                    let result = try await slots.runTraining { () throws -> LocalTrainingOutcome in
                        try workload.train(device: device, task, on: indices, resumingFrom: checkpoint)
                    }
                    guard case .completed(let update) = result else { throw CancellationError() }
                    return update
                }
                failures = 0
                switch outcome {
                case .reported(let receipt):
                    counters.update {
                        $0.reported += 1
                        $0.reportsByDevice[device, default: 0] += 1
                        $0.broken.remove(device)
                    }
                    wait = receipt.retryAfter ?? 1
                case .rejected(let retryAfter, let reason):
                    counters.update {
                        $0.rejected += 1
                        $0.rejections[reason, default: 0] += 1
                        $0.broken.remove(device)
                    }
                    wait = retryAfter
                case .conditionsNotMet:
                    wait = 60
                case .evaluated:
                    // `run` takes training only.
                    wait = 1
                }
            } catch {
                if Task.isCancelled { return }
                if let seconds = away.value {
                    // Gone until the cycle's deadline (it would otherwise come back, resume and report).
                    counters.update { $0.dropped += 1 }
                    wait = seconds
                } else if error.serverCode == .deadlinePassed || error.serverCode == .invalidRequestKey {
                    counters.update { $0.late += 1 }
                    wait = 1
                } else if error.code == .diverged {
                    // Local training from this global model gave NaN or infinity: nothing was sent; the device sits the
                    // cycle out, as in process (counted as dropped).
                    counters.update { $0.dropped += 1 }
                    wait = 1
                } else {
                    failures += 1
                    let permanent = [OrchardClientError.Code.authenticationFailed, .tls, .incompatibleModel, .invalidConfiguration, .storage].contains(
                        error.code)
                    counters.update {
                        $0.failed += 1
                        $0.lastError = "device \(device): \(error)"
                        if permanent { $0.broken.insert(device) }
                    }
                    wait = min(60, Double(1 << min(failures, 6)))
                }
            }
            do { try await clock.sleep(for: .seconds(max(wait, 1))) } catch { return }
        }
    }

    /// Reads the process's status until it has aggregated the rounds (or completed), writing a row per closed cycle.
    func watch(from process: ProcessStatus, started: WallInstant) async throws(SimulationError) -> (rows: [ShardCycleMetrics], final: ProcessStatus) {
        var last = process
        var rows: [ShardCycleMetrics] = []
        var answered = clock.now
        if last.cyclesCompleted >= configuration.rounds || last.state == .completed {
            progress.note(
                "process \(processID) has already aggregated \(last.cyclesCompleted) cycles (\(last.state)): nothing to run; name another process for a new run"
            )
        }
        while last.cyclesCompleted < configuration.rounds && last.state != .completed {
            do { try await clock.sleep(for: options.pollInterval) } catch { throw SimulationError(.coordinator, "stopped") }
            // Asked to stop (Ctrl-C): one last read of the status, so the rows and the summary hold what the coordinator
            // aggregated up to now; then the caller writes the summary.
            let stopping = stop?.isRequested == true
            let counts = counters.snapshot()
            if counts.broken.count == devices.count {
                throw SimulationError(.coordinator, "every device of shard \(options.shard) failed; the last: \(counts.lastError ?? "?")")
            }
            let status: ProcessStatus
            do throws(SimulationError) { status = try await admin.status(processID) } catch {
                if error.message.contains("unknown_process") { throw SimulationError(.coordinator, "process \(processID) was deleted from \(admin.url)") }
                let silence = answered.duration(to: clock.now).inSeconds
                if silence >= options.hostTimeout.inSeconds {
                    throw SimulationError(.coordinator, "no answer from the coordinator for \(Int(silence)) s: \(error.message)")
                }
                if stopping { break }
                continue
            }
            answered = clock.now
            for row in try await observe(from: last, to: status, started: started) {
                rows.append(row)
                try writer.append(row)
                progress.note(describe(row))
            }
            last = status
            if stopping { break }
        }
        return (rows, last)
    }

    /// The rows of the cycles that closed between two statuses. When several closed between two reads, the
    /// abandoned ones are put first (the status says how many, not which).
    func observe(from previous: ProcessStatus, to status: ProcessStatus, started: WallInstant) async throws(SimulationError) -> [ShardCycleMetrics] {
        let before = previous.cyclesCompleted + previous.cyclesAbandoned
        let now = status.cyclesCompleted + status.cyclesAbandoned
        guard now > before else { return [] }
        let abandoned = max(0, status.cyclesAbandoned - previous.cyclesAbandoned)
        let counts = counters.snapshot()
        let wall = started.duration(to: clock.now).inSeconds
        var rows: [ShardCycleMetrics] = []
        var completed = previous.cyclesCompleted, dropped = previous.cyclesAbandoned
        for (offset, cycle) in ((before + 1)...now).enumerated() {
            let aggregated = offset >= abandoned
            if aggregated { completed += 1 } else { dropped += 1 }
            rows.append(
                ShardCycleMetrics(
                    cycle: cycle, aggregated: aggregated, checkpoint: status.latestCheckpoint, cyclesCompleted: completed, cyclesAbandoned: dropped,
                    wallSeconds: wall, checkIns: counts.checkIns, admitted: counts.admitted, rejected: counts.rejected, reported: counts.reported,
                    dropped: counts.dropped, late: counts.late, failed: counts.failed, testLoss: nil, testAccuracy: nil, testRMSE: nil,
                    epsilon: status.privacy?.epsilon, clippingNorm: status.privacy?.clippingNorm
                ))
        }
        let aggregatedNow = status.cyclesCompleted > previous.cyclesCompleted
        let due = status.cyclesCompleted % configuration.evaluateEvery == 0 || status.cyclesCompleted >= configuration.rounds
        if evaluates, aggregatedNow, due, let index = rows.indices.last {
            let evaluation = try await evaluate(checkpoint: status.latestCheckpoint)
            rows[index].testLoss = evaluation.loss
            rows[index].testAccuracy = evaluation.accuracy
            rows[index].testRMSE = evaluation.rmse
        }
        return rows
    }

    /// The test-set evaluation of a checkpoint, downloaded through the admin API.
    func evaluate(checkpoint number: Int) async throws(SimulationError) -> Evaluation {
        try await workload.evaluate(model: try await admin.checkpoint(processID, number))
    }

    func describe(_ evaluation: Evaluation) -> String {
        if let accuracy = evaluation.accuracy { return String(format: "test accuracy %.4f", accuracy) }
        if let rmse = evaluation.rmse { return String(format: "test RMSE %.4f", rmse) }
        return String(format: "test loss %.4f", evaluation.loss)
    }

    func describe(_ row: ShardCycleMetrics) -> String {
        var line =
            "cycle \(row.cycle) \(row.aggregated ? "aggregated" : "abandoned") (\(row.cyclesCompleted)/\(configuration.rounds)); shard \(options.shard): "
            + "\(row.checkIns) check-ins, \(row.admitted) admitted, \(row.reported) reported, \(row.late) late, \(row.dropped) dropped, \(row.failed) failed"
        if let loss = row.testLoss { line += "; " + describe(Evaluation(loss: loss, accuracy: row.testAccuracy, rmse: row.testRMSE)) }
        return line
    }
}

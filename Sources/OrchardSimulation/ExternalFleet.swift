public import Foundation
public import OrchardSupport
import OrchardClient
public import OrchardHTTPClient
import OrchardOperator
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import Logging
import Synchronization

/// One slice of a fleet: shard `index` of `count` (1-based, as in `--shard 2/3`) holds the devices whose global
/// index d has d % count == index − 1. Every shard deals the data with the same seed, so device d has the same
/// slice whichever machine runs it.
public struct FleetShard: Sendable, Hashable, CustomStringConvertible {
    /// The shard's number, 1…``count``.
    public let index: Int
    /// How many shards the fleet is cut into.
    public let count: Int

    /// The whole fleet (shard 1 of 1).
    public static let whole = FleetShard(checked: 1, count: 1)

    private init(checked index: Int, count: Int) {
        self.index = index
        self.count = count
    }

    /// Shard `index` of `count`.
    /// - Throws: ``SimulationError/Code/invalidOption`` unless 1 ≤ index ≤ count.
    public init(index: Int, count: Int) throws(SimulationError) {
        guard count >= 1 else { throw SimulationError(.invalidOption, "shard \(index)/\(count): the number of shards must be at least 1") }
        guard (1...count).contains(index) else {
            throw SimulationError(.invalidOption, "shard \(index)/\(count): the shard number must be in 1…\(count) (shards are numbered from 1)")
        }
        self.init(checked: index, count: count)
    }

    /// Parses `i/n`, e.g. `2/3` (the second of three shards).
    public init(parsing text: String) throws(SimulationError) {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, let index = Int(parts[0]), let count = Int(parts[1]) else {
            throw SimulationError(.invalidOption, "shard must be i/n with whole numbers 1 ≤ i ≤ n, such as 2/3, not '\(text)'")
        }
        try self.init(index: index, count: count)
    }

    /// Whether global device `device` belongs to this shard.
    public func contains(device: Int) -> Bool { device % count == index - 1 }

    /// This shard's devices in a fleet of `fleet`, ascending.
    public func devices(of fleet: Int) -> [Int] { Array(stride(from: index - 1, to: fleet, by: count)) }

    /// `i/n`.
    public var description: String { "\(index)/\(count)" }
}

/// How a shard of the fleet reaches a coordinator that runs elsewhere (`orchard simulate --coordinator URL`).
public struct ExternalCoordinator: Sendable {
    /// The coordinator's base URL, `http` or `https`.
    public var url: String
    /// The slice of the fleet this process runs.
    public var shard: FleetShard
    /// The certificate authorities trusted for `https` (a private CA's with `TrustRoots.certificateFile(_:)`).
    public var trustRoots: TrustRoots
    /// Most local trainings at the same time (devices wait for a slot after their download).
    public var concurrency: Int
    /// Seconds to wait for shard 1 to host the process, and the longest gap in the coordinator's answers tolerated
    /// while the shard runs.
    public var hostTimeout: Double
    /// Seconds between two reads of the process's status.
    public var pollInterval: Double
    /// The hosted process's name (default `simulation-<model>`); its version is 1.0.0.
    public var processName: String?
    /// Seconds a device's HTTP request, or a call of the shard's to the admin API, may wait to connect and for each piece of data.
    public var requestTimeout: Double

    /// Creates settings; every field but the URL has a default.
    public init(
        url: String, shard: FleetShard = .whole, trustRoots: TrustRoots = .system,
        concurrency: Int = 2 * ProcessInfo.processInfo.activeProcessorCount, hostTimeout: Double = 300, pollInterval: Double = 1,
        processName: String? = nil, requestTimeout: Double = 30
    ) {
        self.url = url
        self.shard = shard
        self.trustRoots = trustRoots
        self.concurrency = concurrency
        self.hostTimeout = hostTimeout
        self.pollInterval = pollInterval
        self.processName = processName
        self.requestTimeout = requestTimeout
    }

    /// Throws an error whose message starts with the first invalid field's name.
    public func validate() throws(SimulationError) {
        guard let parsed = URL(string: url), let scheme = parsed.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = parsed.host, !host.isEmpty
        else {
            throw SimulationError(
                .invalidOption, "coordinator must be an http or https URL with a host, such as http://127.0.0.1:8080 or https://fl.example.com, not '\(url)'")
        }
        if concurrency < 1 { throw SimulationError(.invalidOption, "concurrency must be at least 1, not \(concurrency)") }
        if !(hostTimeout > 0) || !hostTimeout.isFinite {
            throw SimulationError(.invalidOption, "hostTimeout must be a positive number of seconds, not \(hostTimeout)")
        }
        if !(pollInterval > 0) || !pollInterval.isFinite {
            throw SimulationError(.invalidOption, "pollInterval must be a positive number of seconds, not \(pollInterval)")
        }
        if !(requestTimeout > 0) || !requestTimeout.isFinite {
            throw SimulationError(.invalidOption, "requestTimeout must be a positive number of seconds, not \(requestTimeout)")
        }
    }
}

/// What a shard observed when a cycle of the process closed: one line of its `metrics.jsonl` (snake_case keys). The
/// device counters are this shard's, cumulative since it started; the test metrics are shard 1's evaluation of the
/// latest checkpoint (nil on other shards and on rounds not evaluated).
public struct ShardCycleMetrics: Sendable, Hashable, Codable {
    /// The cycle's number on the coordinator (cycles are numbered 1, 2, … whether aggregated or abandoned).
    public var cycle: Int
    /// The former name of ``cycle``.
    @available(*, deprecated, renamed: "cycle")
    public var round: Int {
        get { cycle }
        set { cycle = newValue }
    }
    /// Whether it produced a checkpoint (false: abandoned for too few reports).
    public var aggregated: Bool
    /// The latest checkpoint when it was observed.
    public var checkpoint: Int
    /// Aggregated cycles of the process so far.
    public var cyclesCompleted: Int
    /// Abandoned cycles of the process so far.
    public var cyclesAbandoned: Int
    /// Real seconds since this shard's devices started.
    public var wallSeconds: Double
    /// This shard's counters so far.
    public var checkIns, admitted, rejected, reported, dropped, late, failed: Int
    /// Test loss of the latest checkpoint (shard 1).
    public var testLoss: Double?
    /// Test accuracy, for classifiers (shard 1).
    public var testAccuracy: Double?
    /// Test RMSE, for regressors (shard 1).
    public var testRMSE: Double?
    /// ε spent under differential privacy, nil without it.
    public var epsilon: Double?
    /// The privacy clipping bound of the next cycle, nil without privacy.
    public var clippingNorm: Double?

    /// Creates a row.
    public init(
        cycle: Int, aggregated: Bool, checkpoint: Int, cyclesCompleted: Int, cyclesAbandoned: Int, wallSeconds: Double, checkIns: Int,
        admitted: Int, rejected: Int, reported: Int, dropped: Int, late: Int, failed: Int, testLoss: Double? = nil,
        testAccuracy: Double? = nil, testRMSE: Double? = nil, epsilon: Double? = nil, clippingNorm: Double? = nil
    ) {
        self.cycle = cycle
        self.aggregated = aggregated
        self.checkpoint = checkpoint
        self.cyclesCompleted = cyclesCompleted
        self.cyclesAbandoned = cyclesAbandoned
        self.wallSeconds = wallSeconds
        (self.checkIns, self.admitted, self.rejected, self.reported) = (checkIns, admitted, rejected, reported)
        (self.dropped, self.late, self.failed) = (dropped, late, failed)
        (self.testLoss, self.testAccuracy, self.testRMSE) = (testLoss, testAccuracy, testRMSE)
        (self.epsilon, self.clippingNorm) = (epsilon, clippingNorm)
    }

    // `cycle` is written under both `cycle` and its former key `round`, which scripts reading `metrics.jsonl` know;
    // either is read.
    private enum CodingKeys: String, CodingKey {
        case cycle, round, aggregated, checkpoint, admitted, rejected, reported, dropped, late, failed, epsilon
        case cyclesCompleted = "cycles_completed", cyclesAbandoned = "cycles_abandoned", wallSeconds = "wall_seconds", checkIns = "check_ins"
        case testLoss = "test_loss", testAccuracy = "test_accuracy", testRMSE = "test_rmse", clippingNorm = "clipping_norm"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        if let cycle = try c.decodeIfPresent(Int.self, forKey: .cycle) {
            self.cycle = cycle
        } else {
            self.cycle = try c.decode(Int.self, forKey: .round)
        }
        aggregated = try c.decode(Bool.self, forKey: .aggregated)
        checkpoint = try c.decode(Int.self, forKey: .checkpoint)
        cyclesCompleted = try c.decode(Int.self, forKey: .cyclesCompleted)
        cyclesAbandoned = try c.decode(Int.self, forKey: .cyclesAbandoned)
        wallSeconds = try c.decode(Double.self, forKey: .wallSeconds)
        checkIns = try c.decode(Int.self, forKey: .checkIns)
        admitted = try c.decode(Int.self, forKey: .admitted)
        rejected = try c.decode(Int.self, forKey: .rejected)
        reported = try c.decode(Int.self, forKey: .reported)
        dropped = try c.decode(Int.self, forKey: .dropped)
        late = try c.decode(Int.self, forKey: .late)
        failed = try c.decode(Int.self, forKey: .failed)
        testLoss = try c.decodeIfPresent(Double.self, forKey: .testLoss)
        testAccuracy = try c.decodeIfPresent(Double.self, forKey: .testAccuracy)
        testRMSE = try c.decodeIfPresent(Double.self, forKey: .testRMSE)
        epsilon = try c.decodeIfPresent(Double.self, forKey: .epsilon)
        clippingNorm = try c.decodeIfPresent(Double.self, forKey: .clippingNorm)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(cycle, forKey: .cycle)
        try c.encode(cycle, forKey: .round)
        try c.encode(aggregated, forKey: .aggregated)
        try c.encode(checkpoint, forKey: .checkpoint)
        try c.encode(cyclesCompleted, forKey: .cyclesCompleted)
        try c.encode(cyclesAbandoned, forKey: .cyclesAbandoned)
        try c.encode(wallSeconds, forKey: .wallSeconds)
        try c.encode(checkIns, forKey: .checkIns)
        try c.encode(admitted, forKey: .admitted)
        try c.encode(rejected, forKey: .rejected)
        try c.encode(reported, forKey: .reported)
        try c.encode(dropped, forKey: .dropped)
        try c.encode(late, forKey: .late)
        try c.encode(failed, forKey: .failed)
        try c.encodeIfPresent(testLoss, forKey: .testLoss)
        try c.encodeIfPresent(testAccuracy, forKey: .testAccuracy)
        try c.encodeIfPresent(testRMSE, forKey: .testRMSE)
        try c.encodeIfPresent(epsilon, forKey: .epsilon)
        try c.encodeIfPresent(clippingNorm, forKey: .clippingNorm)
    }
}

/// A shard's whole run, as written to its `summary.json` (snake_case keys).
public struct ShardSummary: Sendable, Hashable, Codable {
    /// The scenario's settings as strings, with the coordinator, shard, process and concurrency.
    public var settings: SimulationSettings
    /// `i/n`.
    public var shard: String
    /// Devices this shard ran.
    public var devices: Int
    /// The process the fleet trained.
    public var processID: String
    /// Whether this shard hosted it (false: it existed already, or another shard hosted it).
    public var hosted: Bool
    /// Closed cycles this shard observed (the rows of `metrics.jsonl`).
    public var rounds: Int
    /// Aggregated cycles of the process when the shard stopped.
    public var aggregatedRounds: Int
    /// Abandoned cycles of the process when the shard stopped.
    public var abandonedRounds: Int
    /// Real seconds from the devices' start to their stop.
    public var wallSeconds: Double
    /// Real seconds before (reaching the coordinator, data, pretraining, hosting or waiting for it).
    public var setupSeconds: Double
    /// Cycle requests this shard's devices sent.
    public var checkIns: Int
    /// Requests the coordinator admitted.
    public var admitted: Int
    /// Cycles that ended turned away (the coordinator's rejection, or a long `Retry-After`).
    public var rejected: Int
    /// Reports the coordinator accepted.
    public var reported: Int
    /// Admitted devices that went away (the fleet's dropout).
    public var dropped: Int
    /// Reports refused because their cycle had closed.
    public var late: Int
    /// Cycles that failed otherwise.
    public var failed: Int
    /// Rejections by the coordinator's reason (`cycle_full`, `rate_limited`, …).
    public var rejections: [String: Int]
    /// The last failure, if any.
    public var lastError: String?
    /// Shard 1: the evaluation of the checkpoint the shard started from.
    public var initial: Evaluation?
    /// Shard 1: the last evaluation.
    public var final: Evaluation?
    /// Shard 1: the best test accuracy, for classifiers.
    public var bestAccuracy: Double?
    /// Shard 1: the best test RMSE, for regressors.
    public var bestRMSE: Double?
    /// ε spent under differential privacy when the shard stopped, nil without it.
    public var epsilon: Double?

    private enum CodingKeys: String, CodingKey {
        case settings, shard, devices, hosted, rounds, admitted, rejected, reported, dropped, late, failed, rejections, initial, `final`, epsilon
        case processID = "process_id", aggregatedRounds = "aggregated_rounds", abandonedRounds = "abandoned_rounds"
        case wallSeconds = "wall_seconds", setupSeconds = "setup_seconds", checkIns = "check_ins", lastError = "last_error"
        case bestAccuracy = "best_accuracy", bestRMSE = "best_rmse"
    }
}

/// One device of a shard after the run.
public struct ShardDevice: Sendable, Hashable {
    /// Its global index in the fleet.
    public var device: Int
    /// The worker id the coordinator gave it, once it authenticated.
    public var workerID: String?
    /// Its reports the coordinator accepted.
    public var reported: Int
}

/// What a shard's run produced.
public struct ShardResult: Sendable {
    /// The directory holding `metrics.jsonl` and `summary.json`.
    public var directory: URL
    /// The summary.
    public var summary: ShardSummary
    /// One record per closed cycle observed.
    public var rounds: [ShardCycleMetrics]
    /// This shard's devices.
    public var devices: [ShardDevice]
}

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
    public static func run(
        _ configuration: SimulationConfiguration, coordinator options: ExternalCoordinator, environment: [String: String],
        progress: ProgressDisplay, clock: any WallClock
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
        let writer = try ReportWriter(directory: directory)
        let prepared = try SimulationRunner.prepare(configuration, progress: progress)
        let request = try SimulationRunner.hostedProcess(
            configuration, model: prepared.model, workload: prepared.workload, name: options.processName, cycles: configuration.rounds
        )
        let process: ProcessStatus
        let hosted: Bool
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
        let run = ShardRun(
            configuration: configuration, options: options, admin: admin, workload: prepared.workload, processID: process.processID,
            processName: request.name, writer: writer, progress: progress, clock: clock
        )
        let outcome = try await run.run(from: process)
        let end = outcome.final
        let counts = run.counters.snapshot()
        let evaluations = outcome.rows.compactMap { row in row.testLoss.map { Evaluation(loss: $0, accuracy: row.testAccuracy, rmse: row.testRMSE) } }
        var settings = configuration.settings
        for key in ["transport", "window_seconds", "seconds_per_update"] { settings[key] = nil }
        settings["availability"] = "always"
        settings["coordinator"] = admin.url
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
            epsilon: end.privacy?.epsilon
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

/// The coordinator's admin API as a shard uses it (list, host, status, checkpoint), over the operator's admin client,
/// with its failures in the simulator's words.
struct CoordinatorAdmin: Sendable {
    let client: AdminClient
    let clock: any WallClock

    var url: String { client.baseURL.absoluteString }

    init(url: String, token: String, trustRoots: TrustRoots, timeout: Double, clock: any WallClock) throws(SimulationError) {
        do { client = try AdminClient(server: url, adminToken: token, trustRoots: trustRoots, timeout: timeout) } catch {
            throw SimulationError(.invalidOption, error.message.replacingOccurrences(of: "--server ", with: ""))
        }
        self.clock = clock
    }

    /// The simulator's error for a failed call `what`.
    func failure(_ error: OperatorError, _ what: String) -> SimulationError {
        switch error.code {
        case .unauthorized:
            return SimulationError(
                .coordinator, "the coordinator at \(url) refused the admin token from \(ExternalFleet.adminTokenVariable) (\(error.message))")
        case .unreachable, .tls:
            return SimulationError(.coordinator, error.message)
        default:
            let status = error.httpStatus.map { "HTTP \($0) " } ?? ""
            return SimulationError(.coordinator, "the coordinator at \(url) refused to \(what): \(status)\(error.code): \(error.message)")
        }
    }

    func processes() async throws(SimulationError) -> [ProcessStatus] {
        do { return try await client.processes().value.processes } catch { throw failure(error, "list the processes") }
    }

    func find(name: String, version: SemanticVersion) async throws(SimulationError) -> ProcessStatus? {
        try await processes().first { $0.name == name && $0.version == version }
    }

    func status(_ processID: String) async throws(SimulationError) -> ProcessStatus {
        do { return try await client.status(processID).value } catch { throw failure(error, "read the status of process \(processID)") }
    }

    /// Checkpoint `number`'s safetensors bytes; the latest when `number` was pruned meanwhile.
    func checkpoint(_ processID: String, _ number: Int) async throws(SimulationError) -> [UInt8] {
        do {
            do {
                return try await client.checkpoint(processID, .number(number)).bytes
            } catch  where error.httpStatus == 404 {
                return try await client.checkpoint(processID, .latest).bytes
            }
        } catch {
            throw failure(error, "send checkpoint \(number) of process \(processID)")
        }
    }

    /// Hosts `request` unless a process of its name and version exists; true when this call hosted it.
    func hostOnce(_ request: HostProcessRequest) async throws(SimulationError) -> (ProcessStatus, Bool) {
        if let existing = try await find(name: request.name, version: request.version) { return (existing, false) }
        do {
            return (try await client.host(request).value, true)
        } catch  where error.httpStatus == 409 {
            // Hosted by someone else between the list and the call.
            if let existing = try await find(name: request.name, version: request.version) { return (existing, false) }
            throw failure(error, "host process '\(request.name)' \(request.version)")
        } catch {
            throw failure(error, "host process '\(request.name)' \(request.version)")
        }
    }

    /// Polls, with backoff, until a process of `name` and `version` exists, for at most `timeout` seconds.
    func waitForProcess(name: String, version: SemanticVersion, timeout: Double) async throws(SimulationError) -> ProcessStatus {
        let start = clock.now
        var delay = 0.25
        while true {
            if let found = try await find(name: name, version: version) { return found }
            let waited = start.duration(to: clock.now).inSeconds
            if waited >= timeout {
                throw SimulationError(
                    .coordinator,
                    "process '\(name)' \(version) did not appear on \(url) within \(timeout) s: shard 1 hosts it, so start shard 1 against the same coordinator with the same options, or wait longer (--host-timeout)"
                )
            }
            do { try await clock.sleep(for: .seconds(min(delay, timeout - waited))) } catch { throw SimulationError(.coordinator, "stopped") }
            delay = min(delay * 2, 5)
        }
    }
}

/// A shard's device counters, shared by its devices.
final class ShardCounters: Sendable {
    struct Counts: Sendable {
        var checkIns = 0, admitted = 0, rejected = 0, reported = 0, dropped = 0, late = 0, failed = 0
        var rejections: [String: Int] = [:]
        var lastError: String?
        var workers: [Int: String] = [:]
        var reportsByDevice: [Int: Int] = [:]
        /// Devices whose last cycle failed in a way that retrying will not fix (credentials, TLS, the model).
        var broken: Set<Int> = []
    }

    private let state = Mutex(Counts())

    func snapshot() -> Counts { state.withLock { $0 } }
    func update(_ body: (inout Counts) -> Void) { state.withLock { body(&$0) } }
}

/// A device's transport: the shard's shared HTTP transport, counting check-ins and admissions and noting the
/// device's worker id.
struct CountingTransport: ClientTransport {
    let inner: any ClientTransport
    let device: Int
    let counters: ShardCounters

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        let response = try await inner.authenticate(request)
        counters.update { $0.workers[device] = response.workerID }
        return response
    }

    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        counters.update { $0.checkIns += 1 }
        let response = try await inner.requestCycle(request, session: session)
        if case .accepted = response { counters.update { $0.admitted += 1 } }
        return response
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try await inner.downloadModel(request, session: session, into: sink)
    }

    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await inner.report(body, session: session)
    }

    func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        try await inner.speedTest(direction, bytes: bytes, session: session)
    }

    func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        try await inner.secureAggregation(request, session: session)
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
    let counters = ShardCounters()
    let devices: [Int]

    init(
        configuration: SimulationConfiguration, options: ExternalCoordinator, admin: CoordinatorAdmin, workload: any FleetWorkload, processID: String,
        processName: String, writer: ReportWriter, progress: ProgressDisplay, clock: any WallClock
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
        defer { try? FileManager.default.removeItem(at: directory) }
        let transport: HTTPTransport
        do { transport = try HTTPTransport(url: options.url, timeout: options.requestTimeout, trustRoots: options.trustRoots, clock: clock) } catch {
            throw SimulationError(.invalidOption, error.message)
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
            let client = CoordinatorConnection(
                transport: CountingTransport(inner: transport, device: device, counters: counters), server: admin.url, configuration: clientConfiguration)
            do { jobs.append((device, try client.newJob(processName: processName, version: SimulationRunner.processVersion.description))) } catch {
                throw SimulationError(.training, "device \(device) cannot be set up: \(error.message)")
            }
        }
        let initial: Evaluation? = evaluates ? try await evaluate(checkpoint: process.latestCheckpoint) : nil
        if let initial { progress.note("checkpoint \(process.latestCheckpoint): \(describe(initial))") }
        let slots = AsyncSemaphore(permits: options.concurrency)
        let started = clock.now
        progress.note(
            "shard \(options.shard): \(devices.count) devices of \(configuration.clients) against \(admin.url), until \(configuration.rounds) cycles are aggregated"
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
                let outcome = try await job.run { context in
                    // The device goes away (app killed, network gone) after its download, with the fleet's dropout
                    // probability: a draw of its own per device and cycle.
                    let draw = OrchardRandomAccess.uniform(seed: seed, a: UInt64(device), b: UInt64(context.assignment.cycle), salt: 0xD0_0D1E)
                    if draw < dropout {
                        away.set(context.assignment.reportWithin)
                        throw CancellationError()
                    }
                    let task = LocalTrainingTask(model: context.model, training: context.training)
                    let checkpoint = context.savedCheckpoint
                    let result = try await slots.runTraining { () throws -> LocalTrainingOutcome in
                        try workload.train(device: device, task, resumingFrom: checkpoint)
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
            do { try await clock.sleep(for: .seconds(options.pollInterval)) } catch { throw SimulationError(.coordinator, "stopped") }
            let counts = counters.snapshot()
            if counts.broken.count == devices.count {
                throw SimulationError(.coordinator, "every device of shard \(options.shard) failed; the last: \(counts.lastError ?? "?")")
            }
            let status: ProcessStatus
            do throws(SimulationError) { status = try await admin.status(processID) } catch {
                if error.message.contains("unknown_process") { throw SimulationError(.coordinator, "process \(processID) was deleted from \(admin.url)") }
                let silence = answered.duration(to: clock.now).inSeconds
                if silence >= options.hostTimeout {
                    throw SimulationError(.coordinator, "no answer from the coordinator for \(Int(silence)) s: \(error.message)")
                }
                continue
            }
            answered = clock.now
            for row in try await observe(from: last, to: status, started: started) {
                rows.append(row)
                try writer.append(row)
                progress.note(describe(row))
            }
            last = status
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

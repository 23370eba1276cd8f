public import Foundation
public import OrchardProtocol
public import OrchardSupport
import Synchronization

/// The recently closed cycles of each process (a ring buffer of ``capacity`` per process, in memory), with the mean of
/// the metrics devices reported in each: what the dashboard charts. Fed by ``CycleRecordingStore``, which sees every
/// report and cycle closure this coordinator commits; cycles closed by another instance over a shared store, or
/// before this process started, are not in it.
public final class CycleHistory: Sendable {
    /// Cycles kept per process.
    public let capacity: Int
    /// Distinct metric names averaged per cycle (further names are ignored).
    public static let maximumMetrics = 16

    private struct Running {
        var sums: [String: (total: Double, count: Int)] = [:]
    }

    private struct State {
        var closed: [String: [CycleRecord]] = [:]
        /// Metrics of open cycles, by process and cycle.
        var open: [String: [Int: Running]] = [:]
    }

    private let state = Mutex(State())

    /// Creates an empty history keeping `capacity` cycles per process.
    public init(capacity: Int = 200) {
        self.capacity = max(1, capacity)
    }

    /// The process's recorded cycles, oldest first.
    public func cycles(processID: String) -> [CycleRecord] {
        state.withLock { $0.closed[processID] ?? [] }
    }

    /// Adds a report's metrics (a JSON object of numbers; anything else is ignored) to its cycle's means.
    func recordReport(processID: String, cycle: Int, metricsJSON: String) {
        // The coordinator stores the report's metrics as a JSON object of numbers (`ReportMetadata.metrics`).
        guard metricsJSON.utf8.count > 2, let object = try? JSONDecoder().decode([String: Double].self, from: Data(metricsJSON.utf8)) else { return }
        let values = object.filter { $0.value.isFinite }.sorted { $0.key < $1.key }
        guard !values.isEmpty else { return }
        state.withLock { state in
            var running = state.open[processID, default: [:]][cycle, default: Running()]
            for (name, value) in values where running.sums[name] != nil || running.sums.count < Self.maximumMetrics {
                let old = running.sums[name] ?? (0, 0)
                running.sums[name] = (old.total + value, old.count + 1)
            }
            state.open[processID, default: [:]][cycle] = running
        }
    }

    /// Records a closed cycle (the metrics gathered for it are attached and forgotten).
    func recordClosure(processID: String, cycle: Int, aggregated: Bool, checkpoint: Int?, assigned: Int, reported: Int, openedAt: Date?, closedAt: Date) {
        state.withLock { state in
            let running = state.open[processID]?[cycle]
            state.open[processID] = state.open[processID]?.filter { $0.key > cycle }
            if state.open[processID]?.isEmpty ?? false { state.open[processID] = nil }
            let metrics = (running?.sums ?? [:]).mapValues { $0.total / Double($0.count) }
            let record = CycleRecord(
                cycle: cycle, outcome: aggregated ? .aggregated : .abandoned, assigned: assigned, reported: reported, checkpoint: checkpoint,
                openedAt: openedAt?.timeIntervalSince1970, closedAt: closedAt.timeIntervalSince1970, metrics: metrics
            )
            var list = state.closed[processID, default: []]
            list.append(record)
            if list.count > capacity { list.removeFirst(list.count - capacity) }
            state.closed[processID] = list
        }
    }

    /// Forgets a deleted process.
    func forget(processID: String) {
        state.withLock { state in
            state.closed[processID] = nil
            state.open[processID] = nil
        }
    }
}

/// A store that passes everything to `base` and tells a ``CycleHistory`` about the reports and cycle closures it
/// commits (the dashboard's per-cycle history), without the coordinator knowing.
public struct CycleRecordingStore: CoordinatorStore {
    /// The store doing the work.
    public let base: any CoordinatorStore
    /// Where closures go.
    public let history: CycleHistory
    private let clock: any WallClock

    /// Wraps `base`, recording into `history` with closing times from `clock`.
    public init(base: any CoordinatorStore, history: CycleHistory, clock: any WallClock) {
        self.base = base
        self.history = history
        self.clock = clock
    }

    public var isShared: Bool { base.isShared }
    public func createProcess(_ process: StoredProcess, initialWeights: [UInt8], firstCycle: StoredCycle) async throws {
        try await base.createProcess(process, initialWeights: initialWeights, firstCycle: firstCycle)
    }
    public func processes() async throws -> [StoredProcess] { try await base.processes() }
    public func deleteProcess(id: String) async throws {
        try await base.deleteProcess(id: id)
        history.forget(processID: id)
    }
    public func checkpoint(processID: String, number: Int) async throws -> [UInt8]? { try await base.checkpoint(processID: processID, number: number) }
    public func checkpointNumbers(processID: String) async throws -> [Int] { try await base.checkpointNumbers(processID: processID) }
    public func optimizerState(processID: String) async throws -> [UInt8]? { try await base.optimizerState(processID: processID) }
    public func privacyState(processID: String) async throws -> [UInt8]? { try await base.privacyState(processID: processID) }
    public func openCycle(processID: String) async throws -> RecoveredCycle? { try await base.openCycle(processID: processID) }
    public func cycleProgress(processID: String) async throws -> StoredCycleProgress? { try await base.cycleProgress(processID: processID) }
    public func forEachPendingDiff(processID: String, cycle: Int, _ body: @Sendable (PendingDiff) throws -> Void) async throws {
        try await base.forEachPendingDiff(processID: processID, cycle: cycle, body)
    }
    public func registerWorker(id: String, processID: String, issuer: String?, subject: String?, at date: Date) async throws {
        try await base.registerWorker(id: id, processID: processID, issuer: issuer, subject: subject, at: date)
    }
    public func workerID(processID: String, issuer: String, subject: String) async throws -> String? {
        try await base.workerID(processID: processID, issuer: issuer, subject: subject)
    }
    public func workerExists(id: String) async throws -> Bool { try await base.workerExists(id: id) }
    public func workerCount(processID: String) async throws -> Int { try await base.workerCount(processID: processID) }
    public func secret(named name: String, make: @Sendable () -> [UInt8]) async throws -> [UInt8] { try await base.secret(named: name, make: make) }
    public func recordAssignment(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date) async throws {
        try await base.recordAssignment(processID: processID, cycle: cycle, workerID: workerID, requestKey: requestKey, at: date)
    }
    public func admit(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date, limit: Int) async throws -> StoredAdmission {
        try await base.admit(processID: processID, cycle: cycle, workerID: workerID, requestKey: requestKey, at: date, limit: limit)
    }
    public func assignment(requestKey: String) async throws -> StoredKeyedAssignment? { try await base.assignment(requestKey: requestKey) }
    public func stageDiff(processID: String, cycle: Int, requestKey: String) throws(StoreError) -> any StagedDiff {
        try base.stageDiff(processID: processID, cycle: cycle, requestKey: requestKey)
    }
    public func recordReport(_ report: ReportRecord, diff: any StagedDiff) async throws {
        try await base.recordReport(report, diff: diff)
        history.recordReport(processID: report.processID, cycle: report.cycle, metricsJSON: report.metricsJSON)
    }
    public func foldReports(processID: String, cycle: Int, instance: String, sum: StoredPartialSum, workers: [String]) async throws {
        try await base.foldReports(processID: processID, cycle: cycle, instance: instance, sum: sum, workers: workers)
    }
    public func sealCycle(processID: String, cycle: Int, at date: Date) async throws -> Bool {
        try await base.sealCycle(processID: processID, cycle: cycle, at: date)
    }
    public func closeCycle(_ closure: CycleClosure) async throws {
        // The counts are final once the coordinator closes the cycle (nothing more is admitted or accepted).
        let progress = try? await base.cycleProgress(processID: closure.processID)
        try await base.closeCycle(closure)
        let counted = progress?.number == closure.closedCycle ? progress : nil
        history.recordClosure(
            processID: closure.processID, cycle: closure.closedCycle, aggregated: closure.checkpoint != nil, checkpoint: closure.checkpoint?.number,
            assigned: counted?.assigned ?? 0, reported: counted?.reported ?? 0, openedAt: counted?.openedAt, closedAt: clock.now.date
        )
    }
    public func appendSecureAggregationEvent(_ event: StoredSecureAggregationEvent, processID: String, cycle: Int, reportedWorker: String?) async throws {
        try await base.appendSecureAggregationEvent(event, processID: processID, cycle: cycle, reportedWorker: reportedWorker)
    }
    public func secureAggregationEvents(processID: String, cycle: Int) async throws -> [StoredSecureAggregationEvent] {
        try await base.secureAggregationEvents(processID: processID, cycle: cycle)
    }
}

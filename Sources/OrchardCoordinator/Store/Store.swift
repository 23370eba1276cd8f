public import OrchardSupport
public import Foundation
public import OrchardFormats
public import OrchardProtocol

/// An error from a ``CoordinatorStore``.
public struct StoreError: OrchardError, Hashable {
    /// The kind of store failure.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind { case duplicate, cycleClosed, notFound, corrupt, io, locked }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        /// A row with that identity already exists (a process, an accepted report).
        public static let duplicate = Code(.duplicate)
        /// The cycle is no longer open.
        public static let cycleClosed = Code(.cycleClosed)
        /// The row does not exist.
        public static let notFound = Code(.notFound)
        /// Stored data cannot be read back.
        public static let corrupt = Code(.corrupt)
        /// The storage medium failed: a file could not be written, synced or read.
        public static let io = Code(.io)
        /// Another coordinator holds the database's lock.
        public static let locked = Code(.locked)
        /// The code in snake case, e.g. `cycle_closed`.
        public var description: String { kind.snakeCased }
    }

    /// The kind.
    public var code: Code
    /// What happened.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
}

/// A hosted FL process as stored.
public struct StoredProcess: Sendable, Hashable {
    /// The process id.
    public var id: String
    /// Its name.
    public var name: String
    /// Its version.
    public var version: SemanticVersion
    /// The architecture.
    public var model: ModelSpec
    /// How devices train.
    public var clientConfig: ClientConfig
    /// How cycles run.
    public var serverConfig: ServerConfig
    /// When it was hosted.
    public var createdAt: Date
    /// Whether all its cycles completed.
    public var completed: Bool
    /// The latest published checkpoint.
    public var latestCheckpoint: Int
    /// Cycles aggregated.
    public var cyclesCompleted: Int
    /// Cycles abandoned.
    public var cyclesAbandoned: Int

    /// Creates a record.
    public init(
        id: String, name: String, version: SemanticVersion, model: ModelSpec, clientConfig: ClientConfig, serverConfig: ServerConfig, createdAt: Date,
        completed: Bool = false, latestCheckpoint: Int = 0, cyclesCompleted: Int = 0, cyclesAbandoned: Int = 0
    ) {
        self.id = id
        self.name = name
        self.version = version
        self.model = model
        self.clientConfig = clientConfig
        self.serverConfig = serverConfig
        self.createdAt = createdAt
        self.completed = completed
        self.latestCheckpoint = latestCheckpoint
        self.cyclesCompleted = cyclesCompleted
        self.cyclesAbandoned = cyclesAbandoned
    }
}

/// An open cycle as stored.
public struct StoredCycle: Sendable, Hashable {
    /// Its number.
    public var number: Int
    /// The checkpoint it trains from.
    public var checkpoint: Int
    /// When it opened.
    public var openedAt: Date

    /// Creates a record.
    public init(number: Int, checkpoint: Int, openedAt: Date) {
        self.number = number
        self.checkpoint = checkpoint
        self.openedAt = openedAt
    }
}

/// A device's assignment as stored.
public struct StoredAssignment: Sendable, Hashable {
    /// The worker.
    public var workerID: String
    /// Its request key.
    public var requestKey: String
    /// Whether its report was committed.
    public var reported: Bool
    /// The coordinator instance that accepted its report (nil while unreported, and for secure aggregation).
    public var instance: String?
    /// When it was admitted (buffered processes expire it `cycle_length` seconds later); nil when not read.
    public var assignedAt: Date?
    /// Buffered processes: its report's staleness, once reported (read by ``CoordinatorStore/openCycle(processID:)``).
    public var staleness: Int?

    /// Creates a record.
    public init(workerID: String, requestKey: String, reported: Bool, instance: String? = nil, assignedAt: Date? = nil, staleness: Int? = nil) {
        self.staleness = staleness
        self.assignedAt = assignedAt
        self.workerID = workerID
        self.requestKey = requestKey
        self.reported = reported
        self.instance = instance
    }
}

/// An assignment found by its request key (``CoordinatorStore/assignment(requestKey:)``).
public struct StoredKeyedAssignment: Sendable, Hashable {
    /// The process.
    public var processID: String
    /// The cycle.
    public var cycle: Int
    /// The assignment.
    public var assignment: StoredAssignment

    /// Creates a record.
    public init(processID: String, cycle: Int, assignment: StoredAssignment) {
        self.processID = processID
        self.cycle = cycle
        self.assignment = assignment
    }
}

/// What ``CoordinatorStore/admit(processID:cycle:workerID:requestKey:at:limit:)`` did.
public enum StoredAdmission: Sendable, Hashable {
    /// The assignment was recorded.
    case admitted
    /// The worker already holds this assignment in the cycle (recorded by any instance); nothing was written.
    case existing(StoredAssignment)
    /// The cycle already holds `limit` assignments; nothing was written.
    case full
}

/// The state of a cycle that has not closed.
public enum StoredCycleStatus: String, Sendable, Hashable {
    /// Admitting devices and accepting reports.
    case open
    /// Sealed for closing (``CoordinatorStore/sealCycle(processID:cycle:at:)``): nothing more is admitted, accepted or
    /// folded; the instance that sealed it is combining the partial sums.
    case closing
}

/// A process's current cycle as every instance sees it.
public struct StoredCycleProgress: Sendable, Hashable {
    /// Its number.
    public var number: Int
    /// The checkpoint it trains from.
    public var checkpoint: Int
    /// When it opened.
    public var openedAt: Date
    /// Open or sealed.
    public var status: StoredCycleStatus
    /// When it was sealed, while closing.
    public var sealedAt: Date?
    /// Assignments recorded (all instances).
    public var assigned: Int
    /// Reports committed (all instances).
    public var reported: Int

    /// Creates a record.
    public init(number: Int, checkpoint: Int, openedAt: Date, status: StoredCycleStatus, sealedAt: Date?, assigned: Int, reported: Int) {
        self.number = number
        self.checkpoint = checkpoint
        self.openedAt = openedAt
        self.status = status
        self.sealedAt = sealedAt
        self.assigned = assigned
        self.reported = reported
    }
}

/// One instance's running sum of a cycle, as stored.
public struct StoredPartialSum: Sendable, Hashable {
    /// The sum as little-endian Float64 values.
    public var bytes: [UInt8]
    /// Its weight (sum of fold weights).
    public var weight: Double
    /// Reports folded into it.
    public var reports: Int
    /// Of those, reports within the privacy clipping bound.
    public var unclipped: Int

    /// Creates a record.
    public init(bytes: [UInt8], weight: Double, reports: Int, unclipped: Int) {
        self.bytes = bytes
        self.weight = weight
        self.reports = reports
        self.unclipped = unclipped
    }
}

/// A committed report whose diff is not yet folded into the stored running sum.
public struct PendingDiff: Sendable {
    /// The worker.
    public var workerID: String
    /// Its sample count.
    public var sampleCount: Int
    /// Whether its norm was within the privacy clipping bound (adaptive clipping counts these).
    public var unclipped: Bool
    /// The flat diff as little-endian Float32 bytes.
    public var diff: [UInt8]
    /// The instance that accepted the report.
    public var instance: String
    /// Buffered processes: checkpoints published between the one the device trained from and the report.
    public var staleness: Int?

    /// Creates a record.
    public init(
        workerID: String, sampleCount: Int, unclipped: Bool = false, diff: [UInt8], instance: String = CoordinatorConfiguration.defaultInstanceID,
        staleness: Int? = nil
    ) {
        self.staleness = staleness
        self.workerID = workerID
        self.sampleCount = sampleCount
        self.unclipped = unclipped
        self.diff = diff
        self.instance = instance
    }
}

/// An open cycle, read back after a restart.
public struct RecoveredCycle: Sendable {
    /// The cycle.
    public var cycle: StoredCycle
    /// Open or sealed.
    public var status: StoredCycleStatus
    /// When it was sealed, while closing.
    public var sealedAt: Date?
    /// Its assignments.
    public var assignments: [StoredAssignment]
    /// The stored running sums by instance (each instance folds the reports it accepted into its own).
    public var partialSums: [String: StoredPartialSum]

    /// Creates a record.
    public init(
        cycle: StoredCycle, status: StoredCycleStatus = .open, sealedAt: Date? = nil, assignments: [StoredAssignment], partialSums: [String: StoredPartialSum]
    ) {
        self.cycle = cycle
        self.status = status
        self.sealedAt = sealedAt
        self.assignments = assignments
        self.partialSums = partialSums
    }
}

/// An accepted report to persist.
public struct ReportRecord: Sendable {
    /// The process.
    public var processID: String
    /// The cycle.
    public var cycle: Int
    /// The worker.
    public var workerID: String
    /// The request key.
    public var requestKey: String
    /// Samples behind the diff.
    public var sampleCount: Int
    /// The device's metrics as JSON.
    public var metricsJSON: String
    /// Whether the diff's norm was within the privacy clipping bound (adaptive clipping counts these).
    public var unclipped: Bool
    /// The instance that accepted it (and folds it into its partial sum).
    public var instance: String
    /// Buffered processes: checkpoints published between the one the device trained from and the report (its fold
    /// weight's staleness factor, applied again on recovery).
    public var staleness: Int?
    /// Buffered processes: the most reports the buffer releases (`buffer_size`). The store commits a report only while
    /// fewer are committed in the cycle, checked in the report's own transaction, so instances that each admitted a
    /// report against their own count never make a release larger; past it the report is refused `cycle_closed`.
    public var releaseLimit: Int?

    /// Creates a record.
    public init(
        processID: String, cycle: Int, workerID: String, requestKey: String, sampleCount: Int, metricsJSON: String, unclipped: Bool = false,
        instance: String = CoordinatorConfiguration.defaultInstanceID, staleness: Int? = nil, releaseLimit: Int? = nil
    ) {
        self.releaseLimit = releaseLimit
        self.staleness = staleness
        self.instance = instance
        self.processID = processID
        self.cycle = cycle
        self.workerID = workerID
        self.requestKey = requestKey
        self.sampleCount = sampleCount
        self.metricsJSON = metricsJSON
        self.unclipped = unclipped
    }
}

/// A report's diff written while the report arrives — the flat diff as little-endian Float32 bytes in the
/// model's layout order — before the report is recorded (``CoordinatorStore/recordReport(_:diff:)``) or refused
/// (``discard()``).
public protocol StagedDiff: AnyObject, Sendable {
    /// Writes `bytes` at byte `offset` of the flat diff.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError)
    /// Fills `buffer` with the bytes at byte `offset` of the flat diff.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError)
    /// Deletes the staged diff (a refused or abandoned report); calling it again does nothing.
    func discard()
}

/// A cycle transition to persist in one transaction.
public struct CycleClosure: Sendable {
    /// The process.
    public var processID: String
    /// The cycle being closed.
    public var closedCycle: Int
    /// The published checkpoint (number and safetensors bytes) when the cycle was aggregated.
    public var checkpoint: (number: Int, weights: [UInt8])?
    /// The server optimizer's state after the step, when aggregated.
    public var optimizerState: [UInt8]?
    /// The privacy ledger after the step (JSON), when aggregated under differential privacy.
    public var privacyState: [UInt8]?
    /// The next cycle to open, or nil when the process completes.
    public var nextCycle: StoredCycle?
    /// Checkpoints to keep.
    public var retention: Int
    /// When the coordinator closed the cycle (kept in the cycle's history record).
    public var closedAt: Date?
    /// Buffered processes: the unreported assignments admitted after this time move into ``nextCycle`` with their keys
    /// (the devices still training); nil moves none.
    public var carryOverAfter: Date?
    /// The checkpoint whose weights ``checkpoint`` was built on: the store refuses to publish it (`corrupt`, nothing
    /// written) unless that is still the process's latest. Nil skips the check.
    public var baseCheckpoint: Int?

    /// Creates a closure.
    public init(
        processID: String, closedCycle: Int, checkpoint: (number: Int, weights: [UInt8])?, optimizerState: [UInt8]?, privacyState: [UInt8]? = nil,
        nextCycle: StoredCycle?, retention: Int, closedAt: Date? = nil, carryOverAfter: Date? = nil, baseCheckpoint: Int? = nil
    ) {
        self.baseCheckpoint = baseCheckpoint
        self.carryOverAfter = carryOverAfter
        self.closedAt = closedAt
        self.processID = processID
        self.closedCycle = closedCycle
        self.checkpoint = checkpoint
        self.optimizerState = optimizerState
        self.privacyState = privacyState
        self.nextCycle = nextCycle
        self.retention = retention
    }
}

extension CycleClosure {
    /// The refusal of a closure whose checkpoint was built on another than `latest`, the process's latest checkpoint;
    /// nil when it may be published.
    public func staleBase(latest: Int) -> StoreError? {
        guard checkpoint != nil, let base = baseCheckpoint, base != latest else { return nil }
        return StoreError(
            .corrupt,
            "cycle \(closedCycle) of process '\(processID)' would publish a checkpoint built on checkpoint \(base), but the latest is \(latest)")
    }
}

/// Durable storage behind the coordinator. Every method is one transaction; a cycle transition
/// (``closeCycle(_:)``) publishes the checkpoint, prunes old ones and opens the next cycle atomically, so a
/// store shared by several coordinator instances (e.g. PostgreSQL) can implement the same contract.
public protocol CoordinatorStore: Sendable {
    /// Whether several coordinator instances may use this store at once. Their coordinators then admit through
    /// ``admit(processID:cycle:workerID:requestKey:at:limit:)``, look request keys up here, and close a cycle by
    /// sealing it and combining every instance's partial sum and pending diffs.
    var isShared: Bool { get }
    /// Hosts a process with its checkpoint 0 and first open cycle. Throws ``StoreError/Code/duplicate`` when
    /// the name and version exist.
    func createProcess(_ process: StoredProcess, initialWeights: [UInt8], firstCycle: StoredCycle) async throws
    /// Every hosted process.
    func processes() async throws -> [StoredProcess]
    /// Deletes a process and everything stored for it.
    func deleteProcess(id: String) async throws
    /// A checkpoint's safetensors bytes, or nil when absent or pruned.
    func checkpoint(processID: String, number: Int) async throws -> [UInt8]?
    /// The stored checkpoint numbers, ascending.
    func checkpointNumbers(processID: String) async throws -> [Int]
    /// The server optimizer's stored state, if any.
    func optimizerState(processID: String) async throws -> [UInt8]?
    /// The stored privacy ledger (JSON) of the latest aggregated cycle, if any.
    func privacyState(processID: String) async throws -> [UInt8]?
    /// The cycle of a process that has not closed (open or sealed) with its assignments and stored partial sums.
    func openCycle(processID: String) async throws -> RecoveredCycle?
    /// The cycle of a process that has not closed, with its counts over every instance; nil when the process completed.
    func cycleProgress(processID: String) async throws -> StoredCycleProgress?
    /// Calls `body` for every committed report of a cycle whose diff is not folded into a stored partial sum.
    func forEachPendingDiff(processID: String, cycle: Int, _ body: @Sendable (PendingDiff) throws -> Void) async throws
    /// Registers a worker of a process; `issuer` and `subject` tie it to a device identity (unique per process and issuer
    /// when present). Registering an identity that already has a worker is not an error: the first worker stays, and
    /// ``workerID(processID:issuer:subject:)`` names it.
    func registerWorker(id: String, processID: String, issuer: String?, subject: String?, at date: Date) async throws
    /// The worker id registered in a process for an issuer's subject.
    func workerID(processID: String, issuer: String, subject: String) async throws -> String?
    /// Whether a worker id is registered.
    func workerExists(id: String) async throws -> Bool
    /// How many workers a process has registered.
    func workerCount(processID: String) async throws -> Int
    /// The coordinator's signing secret, created with `make` on first use.
    func secret(named name: String, make: @Sendable () -> [UInt8]) async throws -> [UInt8]
    /// Records an admission to a cycle whose admissions one instance decides (no limit is checked). Throws
    /// ``StoreError/Code/duplicate`` when the worker or key already has one.
    func recordAssignment(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date) async throws
    /// Admits a worker to a cycle that several instances admit to, exactly: records the assignment only if the worker
    /// holds none in the cycle and the cycle holds fewer than `limit`, however concurrent calls race; with
    /// `inFlightAfter` (buffered processes) only unreported assignments admitted after that time count against
    /// `limit`. Throws ``StoreError/Code/cycleClosed`` when the cycle is not open.
    func admit(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date, limit: Int, inFlightAfter: Date?) async throws
        -> StoredAdmission
    /// The assignment of an open or sealed cycle that a request key was issued for, whichever instance issued it.
    func assignment(requestKey: String) async throws -> StoredKeyedAssignment?
    /// Starts the diff of a report that is arriving; nothing refers to it until ``recordReport(_:diff:)``.
    func stageDiff(processID: String, cycle: Int, requestKey: String) throws(StoreError) -> any StagedDiff
    /// Records an accepted report with its staged diff (made durable first); throws ``StoreError/Code/duplicate``
    /// if one was already recorded for the key and ``StoreError/Code/cycleClosed`` if the cycle is not open. On
    /// failure the staged diff is discarded.
    func recordReport(_ report: ReportRecord, diff: any StagedDiff) async throws
    /// Stores an instance's partial sum of an open cycle (with its count of reports within the privacy clipping bound)
    /// and forgets the diffs of `workers` that it now includes. Throws ``StoreError/Code/cycleClosed`` once the cycle is
    /// sealed or closed (its diffs then stay pending).
    func foldReports(processID: String, cycle: Int, instance: String, sum: StoredPartialSum, workers: [String]) async throws
    /// Seals an open cycle for closing: from its commit on, nothing more is admitted, reported or folded, so the
    /// partial sums and pending diffs read afterwards are final. Returns true when this call sealed it, false when it
    /// was already sealed; throws ``StoreError/Code/cycleClosed`` when it is closed.
    func sealCycle(processID: String, cycle: Int, at date: Date) async throws -> Bool
    /// Closes a cycle (open or sealed; aggregated or abandoned) and opens the next, in one transaction, exactly once:
    /// throws ``StoreError/Code/cycleClosed`` when it was closed already. The cycle's assignments, partial sums and
    /// secure-aggregation events are deleted with it.
    func closeCycle(_ closure: CycleClosure) async throws
    /// The process's closed cycles, the newest `limit` of them, oldest first: each one's outcome, devices assigned and
    /// reports accepted, checkpoint and times, and the mean of each metric its reports carried. ``closeCycle(_:)``
    /// records them in its transaction, so the history is durable and the same from every instance (cycles closed
    /// by a version before the history was kept are not listed).
    func cycleRecords(processID: String, limit: Int) async throws -> [CycleRecord]
    /// Appends a step of an open cycle's secure aggregation (made durable before it returns); with `reportedWorker`,
    /// marks that worker's assignment as reported in the same transaction (an advertisement counts toward the goal).
    /// Throws ``StoreError/Code/cycleClosed`` if the cycle is not open and ``StoreError/Code/duplicate`` for a sequence
    /// number already used.
    func appendSecureAggregationEvent(_ event: StoredSecureAggregationEvent, processID: String, cycle: Int, reportedWorker: String?) async throws
    /// A cycle's secure-aggregation events from sequence number `first` on, ascending.
    func secureAggregationEvents(processID: String, cycle: Int, from first: Int) async throws -> [StoredSecureAggregationEvent]
    /// Runs `body` holding the process's secure-aggregation lock. Over a store several instances share, the lock is
    /// theirs together: one instance at a time reads the events others appended and appends its own, so the log's
    /// order is the order every instance applies (PostgreSQL: a session advisory lock, released when its holder
    /// dies). A coordinator serialises its own steps per process, so a store of its own needs no more than that.
    func withSecureAggregationLock<T: Sendable>(processID: String, _ body: @Sendable () async throws -> T) async throws -> T
    /// ``withSecureAggregationLock(processID:_:)`` if the lock is free now, else nil at once without running `body`
    /// (the timer's steps: a lock another instance holds, even one whose host went away, never stalls the ticks).
    func withSecureAggregationLockIfFree<T: Sendable>(processID: String, _ body: @Sendable () async throws -> T) async throws -> T?
    /// Claims `instanceID` for as long as the store stays open, over a store several instances share: a second running
    /// instance with the same id is refused (``StoreError/Code/locked``), since two instances folding into one partial
    /// sum lose each other's reports. A store of its own (the default) claims nothing.
    func claimInstance(_ instanceID: String) async throws
    /// Marks committed reports whose diffs cannot be read back (a spool file a power loss left missing or short) as not
    /// reported, their diffs forgotten, so the cycle can go on without them; only the reports of `workers` that are
    /// still reported in that cycle are changed; throws ``StoreError/Code/cycleClosed`` unless the cycle is open.
    func discardReports(processID: String, cycle: Int, workers: [String]) async throws
    /// Attaches (replaces) a process's held-out evaluation data with its sample count, or removes it (nil); throws
    /// ``StoreError/Code/notFound`` for an unknown process. Deleted with the process.
    func setEvaluationData(processID: String, data: (bytes: [UInt8], samples: Int)?) async throws
    /// A process's held-out evaluation data and its sample count, if any.
    func evaluationData(processID: String) async throws -> (bytes: [UInt8], samples: Int)?
    /// The size in bytes and the sample count of a process's held-out evaluation data, without reading it; nil when none.
    func evaluationDataSize(processID: String) async throws -> (bytes: Int, samples: Int)?
    /// Records a checkpoint's evaluation (replacing an earlier one of the same checkpoint); nothing for a process that
    /// no longer exists.
    func recordEvaluation(_ evaluation: CheckpointEvaluation, processID: String) async throws
    /// A process's checkpoint evaluations, the newest `limit` of them, oldest first.
    func evaluations(processID: String, limit: Int) async throws -> [CheckpointEvaluation]
    /// Stores a device's result of a federated evaluation task and returns how many results its checkpoint holds.
    /// Throws ``StoreError/Code/duplicate`` when the worker already sent one for the checkpoint,
    /// ``StoreError/Code/cycleClosed`` when the checkpoint's federated evaluation is finalized, and
    /// ``StoreError/Code/notFound`` for an unknown process.
    func recordEvaluationResult(_ result: StoredEvaluationResult, processID: String) async throws -> Int
    /// The stored results of a checkpoint whose federated evaluation is not finalized, by worker id.
    func evaluationResults(processID: String, checkpoint: Int) async throws -> [StoredEvaluationResult]
    /// The checkpoints with stored results not yet finalized, ascending.
    func pendingEvaluationCheckpoints(processID: String) async throws -> [Int]
    /// Finalizes a checkpoint's federated evaluation in one transaction, exactly once over every instance: reads the
    /// checkpoint's stored results and how many federated evaluations the process has recorded, records what `aggregate`
    /// makes of them, and deletes those results — so a result stored is either in the aggregate or refused
    /// (``StoreError/Code/cycleClosed``), never acknowledged and dropped. Returns the recorded evaluation; nil when one was
    /// recorded already (any results left are deleted), when there are no results, or when the process is gone.
    func finalizeFederatedEvaluation(
        processID: String, checkpoint: Int, aggregate: @Sendable (_ results: [StoredEvaluationResult], _ recorded: Int) -> CheckpointEvaluation
    ) async throws -> CheckpointEvaluation?
    /// A process's federated evaluations, the newest `limit` of them, oldest first.
    func federatedEvaluations(processID: String, limit: Int) async throws -> [CheckpointEvaluation]
}

/// A shared store that takes reports folded into their instance's partial sum as they commit, instead of one stored
/// diff each: a batch of reports costs one write of the sum (PostgreSQL writes every stored byte through its WAL, so
/// this is what lets it ingest at a fraction of the bytes). A report so committed is durable in the sum; nothing of
/// its diff is kept.
public protocol FoldingStore: CoordinatorStore {
    /// Records `reports` (one process, cycle and instance) in one transaction with the instance's partial sum:
    /// marks each accepted report's assignment reported, replaces the partial sum with `fold(accepted)` (the indices
    /// of the accepted reports, in order) provided the stored one still holds `base` reports (0 when there is none),
    /// and forgets the pending diffs of `forgetting` (reports the new sum already holds). Returns each report's
    /// outcome (``StoreError/Code/duplicate`` when its assignment is unknown or reported, ``StoreError/Code/cycleClosed``
    /// past a buffer's release limit) and, when anything was written, the reports of the cycle the store then holds at
    /// every instance. Throws (nothing committed) when the cycle is not open, with ``StoreError/Code/corrupt`` when the
    /// stored partial sum does not hold `base` reports, or whatever `fold` throws.
    func recordFoldedReports(
        _ reports: [ReportRecord], base: Int, forgetting: [String], fold: @Sendable ([Int]) throws -> StoredPartialSum
    ) async throws -> (outcomes: [Result<Void, StoreError>], reported: Int?)
}

/// A device's result of a federated evaluation task, as stored until its checkpoint's evaluation is finalized.
public struct StoredEvaluationResult: Sendable, Hashable {
    /// The checkpoint evaluated.
    public var checkpoint: Int
    /// The worker.
    public var workerID: String
    /// Held-out samples evaluated.
    public var samples: Int
    /// Mean metrics by name.
    public var metrics: [String: Double]
    /// When it arrived, in seconds since 1970.
    public var receivedAt: Double
    /// Positions scored, for a model with a sequence output.
    public var positions: Int?

    /// Creates a record.
    public init(checkpoint: Int, workerID: String, samples: Int, metrics: [String: Double], receivedAt: Double, positions: Int? = nil) {
        self.checkpoint = checkpoint
        self.workerID = workerID
        self.samples = samples
        self.metrics = metrics
        self.receivedAt = receivedAt
        self.positions = positions
    }
}

/// One persisted step of a cycle's secure aggregation.
public struct StoredSecureAggregationEvent: Sendable, Hashable {
    /// Its place in the cycle's order (0, 1, 2, …).
    public var sequence: Int
    /// The event (JSON).
    public var body: [UInt8]
    /// A masked input's words, little-endian.
    public var words: [UInt8]?

    /// Creates an event.
    public init(sequence: Int, body: [UInt8], words: [UInt8]? = nil) {
        self.sequence = sequence
        self.body = body
        self.words = words
    }
}

extension CoordinatorStore {
    /// A store of its own claims nothing: one coordinator uses it (a SQLite file is locked by its instance).
    public func claimInstance(_ instanceID: String) async throws {}

    /// ``admit(processID:cycle:workerID:requestKey:at:limit:inFlightAfter:)`` counting every assignment of the cycle.
    public func admit(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date, limit: Int) async throws -> StoredAdmission {
        try await admit(processID: processID, cycle: cycle, workerID: workerID, requestKey: requestKey, at: date, limit: limit, inFlightAfter: nil)
    }

    /// A cycle's secure-aggregation events, by ascending sequence number.
    public func secureAggregationEvents(processID: String, cycle: Int) async throws -> [StoredSecureAggregationEvent] {
        try await secureAggregationEvents(processID: processID, cycle: cycle, from: 0)
    }

    /// ``foldReports(processID:cycle:instance:sum:workers:)`` for the default instance of a process without adaptive clipping.
    public func foldReports(processID: String, cycle: Int, sum: [UInt8], weight: Double, reports: Int, workers: [String]) async throws {
        try await foldReports(
            processID: processID, cycle: cycle, instance: CoordinatorConfiguration.defaultInstanceID,
            sum: StoredPartialSum(bytes: sum, weight: weight, reports: reports, unclipped: 0), workers: workers
        )
    }

    /// Records a report whose whole flat diff (little-endian Float32 bytes) is in memory: stages it, then
    /// ``recordReport(_:diff:)``.
    public func recordReport(_ report: ReportRecord, bytes: [UInt8]) async throws {
        let staged = try stageDiff(processID: report.processID, cycle: report.cycle, requestKey: report.requestKey)
        do {
            try bytes.withUnsafeBytes { raw in try staged.write(raw, at: 0) }
        } catch {
            staged.discard()
            throw error
        }
        try await recordReport(report, diff: staged)
    }
}

/// The history record of a cycle being closed, from its assignment rows (before they are deleted): the devices
/// assigned, the reports accepted, and the mean of each metric the reports carried. Shared by the stores.
package enum CycleRecordSummary {
    /// Distinct metric names from devices averaged per cycle (further names are ignored).
    package static let maximumMetrics = 16
    /// The names the coordinator itself adds to a report's metrics (a buffered report's staleness): always averaged,
    /// beyond the devices' sixteen, so that a device's own names cannot crowd them out.
    package static let coordinatorMetrics: Set<String> = ["staleness"]

    /// The mean of each finite metric in `metricsJSON` (one JSON object of numbers per report; anything else is
    /// skipped), at most ``maximumMetrics`` names, the first met in name order.
    package static func means(_ metricsJSON: [String]) -> [String: Double] {
        var sums: [String: (total: Double, count: Int)] = [:]
        let decoder = JSONDecoder()
        for text in metricsJSON {
            guard text.utf8.count > 2, let object = try? decoder.decode([String: Double].self, from: Data(text.utf8)) else { continue }
            for (name, value) in object.sorted(by: { $0.key < $1.key }) where value.isFinite {
                let devices = sums.keys.count { !coordinatorMetrics.contains($0) }
                guard sums[name] != nil || coordinatorMetrics.contains(name) || devices < maximumMetrics else { continue }
                let old = sums[name] ?? (0, 0)
                sums[name] = (old.total + value, old.count + 1)
            }
        }
        return sums.mapValues { $0.total / Double($0.count) }
    }

    /// The means as the JSON object stored with the cycle.
    package static func json(_ means: [String: Double]) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return (try? encoder.encode(means)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// Decodes stored means (`nil` or damaged: none).
    package static func decode(_ json: String?) -> [String: Double] {
        guard let json, let means = try? JSONDecoder().decode([String: Double].self, from: Data(json.utf8)) else { return [:] }
        return means
    }
}

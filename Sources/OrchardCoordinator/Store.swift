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
    public init(id: String, name: String, version: SemanticVersion, model: ModelSpec, clientConfig: ClientConfig, serverConfig: ServerConfig, createdAt: Date, completed: Bool = false, latestCheckpoint: Int = 0, cyclesCompleted: Int = 0, cyclesAbandoned: Int = 0) {
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

    /// Creates a record.
    public init(workerID: String, requestKey: String, reported: Bool) {
        self.workerID = workerID
        self.requestKey = requestKey
        self.reported = reported
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

    /// Creates a record.
    public init(workerID: String, sampleCount: Int, unclipped: Bool = false, diff: [UInt8]) {
        self.workerID = workerID
        self.sampleCount = sampleCount
        self.unclipped = unclipped
        self.diff = diff
    }
}

/// An open cycle, read back after a restart.
public struct RecoveredCycle: Sendable {
    /// The cycle.
    public var cycle: StoredCycle
    /// Its assignments.
    public var assignments: [StoredAssignment]
    /// The stored running sum (little-endian Float64), its weight, report count and count of reports within the
    /// privacy clipping bound; nil when nothing was folded.
    public var sum: (bytes: [UInt8], weight: Double, reports: Int, unclipped: Int)?
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

    /// Creates a record.
    public init(processID: String, cycle: Int, workerID: String, requestKey: String, sampleCount: Int, metricsJSON: String, unclipped: Bool = false) {
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

    /// Creates a closure.
    public init(
        processID: String, closedCycle: Int, checkpoint: (number: Int, weights: [UInt8])?, optimizerState: [UInt8]?, privacyState: [UInt8]? = nil,
        nextCycle: StoredCycle?, retention: Int
    ) {
        self.processID = processID
        self.closedCycle = closedCycle
        self.checkpoint = checkpoint
        self.optimizerState = optimizerState
        self.privacyState = privacyState
        self.nextCycle = nextCycle
        self.retention = retention
    }
}

/// Durable storage behind the coordinator. Every method is one transaction; a cycle transition
/// (``closeCycle(_:)``) publishes the checkpoint, prunes old ones and opens the next cycle atomically, so a
/// store shared by several coordinator instances (e.g. PostgreSQL) can implement the same contract.
public protocol CoordinatorStore: Sendable {
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
    /// The open cycle of a process with its assignments and stored running sum.
    func openCycle(processID: String) async throws -> RecoveredCycle?
    /// Calls `body` for every committed report of a cycle whose diff is not folded into the stored sum.
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
    /// Records an admission to a cycle.
    func recordAssignment(processID: String, cycle: Int, workerID: String, requestKey: String, at date: Date) async throws
    /// Starts the diff of a report that is arriving; nothing refers to it until ``recordReport(_:diff:)``.
    func stageDiff(processID: String, cycle: Int, requestKey: String) throws(StoreError) -> any StagedDiff
    /// Records an accepted report with its staged diff (made durable first); throws ``StoreError/Code/duplicate``
    /// if one was already recorded for the key and ``StoreError/Code/cycleClosed`` if the cycle is not open. On
    /// failure the staged diff is discarded.
    func recordReport(_ report: ReportRecord, diff: any StagedDiff) async throws
    /// Stores the running sum (with its count of reports within the privacy clipping bound) and forgets the diffs
    /// of `workers` that it now includes.
    func foldReports(processID: String, cycle: Int, sum: [UInt8], weight: Double, reports: Int, unclipped: Int, workers: [String]) async throws
    /// Closes a cycle (aggregated or abandoned) and opens the next, in one transaction; the cycle's secure-aggregation
    /// events are deleted with it.
    func closeCycle(_ closure: CycleClosure) async throws
    /// Appends a step of an open cycle's secure aggregation (made durable before it returns); with `reportedWorker`,
    /// marks that worker's assignment as reported in the same transaction (an advertisement counts toward the goal).
    /// Throws ``StoreError/Code/cycleClosed`` if the cycle is not open and ``StoreError/Code/duplicate`` for a sequence
    /// number already used.
    func appendSecureAggregationEvent(_ event: StoredSecureAggregationEvent, processID: String, cycle: Int, reportedWorker: String?) async throws
    /// A cycle's secure-aggregation events, by ascending sequence number.
    func secureAggregationEvents(processID: String, cycle: Int) async throws -> [StoredSecureAggregationEvent]
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
    /// ``foldReports(processID:cycle:sum:weight:reports:unclipped:workers:)`` for a process without adaptive clipping.
    public func foldReports(processID: String, cycle: Int, sum: [UInt8], weight: Double, reports: Int, workers: [String]) async throws {
        try await foldReports(processID: processID, cycle: cycle, sum: sum, weight: weight, reports: reports, unclipped: 0, workers: workers)
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

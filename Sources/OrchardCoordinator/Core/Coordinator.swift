public import OrchardSupport
import CoreMetrics
import Foundation
public import Logging
import OrchardFormats
public import OrchardProtocol
import Synchronization

/// The coordinator's core: every device and admin operation as an async method, independent of HTTP.
///
/// The HTTP routes (``CoordinatorServer``) are thin wrappers around these methods, and an in-process transport
/// (client SDK tests, the simulator) can call them directly. Cycle logic lives in ``CycleStateMachine``; this
/// actor owns one per process, performs the I/O its decisions call for, and keeps the running sums.
public actor Coordinator {
    /// A process's live state, owned by the actor. A class so that folding a report or admitting a device
    /// mutates it in place: as a value in `runtimes`, every mutation would copy the running sum and the
    /// assignment table.
    final class Runtime {
        /// Which load of the process this is (``Coordinator/loadsDone`` when it was made): a report begun on an earlier
        /// one finds the process reloaded from the store when it commits.
        var generation = 0
        var process: StoredProcess
        var machine: CycleStateMachine
        var layout: ModelLayout
        var sum: RunningSum
        var unfolded: [String]
        /// The workers whose committed diffs the last load (or shared-store merge) summed in; never pruned by a fold, so a
        /// report whose count comes after that load is known to be in the sum already.
        var summedAtLoad: Set<String>
        /// A committed report could be read neither into the running sum nor through a reload: the sum lacks it, so the
        /// cycle is reloaded (every committed diff summed again) before it closes.
        var sumLacksReports = false
        var checkpointBytes: [UInt8]
        /// The current checkpoint as an updatable Core ML model, made on the first request for it; or why it cannot be
        /// made (kept too, so repeated requests for a model Core ML cannot express do not decode the checkpoint again).
        var coreMLModel: (checkpoint: Int, model: Result<[UInt8], CoordinatorError>)?
        var optimizer: ServerOptimizerState
        var authenticator: DeviceAuthenticator
        var currentKeys: Set<String>
        var previousKeys: Set<String>
        /// Workers registered (and being registered) in an open-mode process, for its cap; 0 in other modes.
        var openWorkers = 0
        /// Whether a write of the running sum is in flight (one at a time, so they commit in order).
        var folding = false
        /// Differential privacy, when the process asks for it: the mechanism and what has been spent.
        var privacy: (mechanism: PrivacyMechanism, ledger: PrivacyLedger)?
        /// The open cycle's secure aggregation, when the process uses it.
        var secure: SecureCycle?
        var evaluationTasks = EvaluationTasks()
        /// Buffered: the staleness of the open buffer's reports counted here (sum, count, largest).
        var bufferStaleness = (sum: 0, count: 0, max: 0)

        /// The robust rule the process aggregates by, if any: its reports stay in the store until the cycle closes,
        /// nothing is folded into a running sum.
        var robust: RobustAggregationConfig? { process.serverConfig.robustAggregation }

        /// What a report adds to the running sum's weight: its sample count, or 1 under privacy (equal weights keep
        /// one device's influence within the clipping bound).
        func foldWeight(sampleCount: Int) -> Double { Self.foldWeight(sampleCount: sampleCount, private: privacy != nil) }

        /// ``foldWeight(sampleCount:)`` before a runtime exists (recovery).
        static func foldWeight(sampleCount: Int, private isPrivate: Bool) -> Double { isPrivate ? 1 : Double(sampleCount) }

        /// What a report's diff is scaled by in the running sum: a buffered report's staleness factor, else 1.
        static func foldScale(staleness: Int?, server: ServerConfig) -> Double {
            guard let buffer = server.bufferedAggregation, let staleness else { return 1 }
            return buffer.stalenessWeight(staleness)
        }

        init(
            process: StoredProcess, machine: CycleStateMachine, layout: ModelLayout, sum: RunningSum, unfolded: [String],
            checkpointBytes: [UInt8], optimizer: ServerOptimizerState, authenticator: DeviceAuthenticator, currentKeys: Set<String>,
            previousKeys: Set<String>
        ) {
            self.process = process
            self.machine = machine
            self.layout = layout
            self.sum = sum
            self.unfolded = unfolded
            self.summedAtLoad = Set(unfolded)
            self.checkpointBytes = checkpointBytes
            self.optimizer = optimizer
            self.authenticator = authenticator
            self.currentKeys = currentKeys
            self.previousKeys = previousKeys
        }
    }

    struct NameVersion: Hashable {
        var name: String
        var version: SemanticVersion
    }

    /// What a report needs between its checks in the actor and its commit.
    struct ReportTicket: Sendable {
        var processID: String
        var cycle: Int
        var layout: ModelLayout
        var maximumSampleCount: Int
        var updateNormBound: Double?
        var updateNormPolicy: UpdateNormPolicy
        /// The privacy clipping bound the report is clipped to (central differential privacy), if any.
        var privacyClippingNorm: Double?
        /// The largest norm a locally noised report may have (local differential privacy), if any.
        var localNormCeiling: Double?
        /// The request key, and the generation of the runtime the report began on.
        var requestKey = ""
        var generation = 0
        /// Buffered processes: the report's staleness (checkpoints published since the one it trained from).
        var staleness: Int?
        /// Buffered processes: the most reports a release holds, which the store enforces across instances.
        var releaseLimit: Int?
        /// What the diff is scaled by when folded (the staleness factor; 1 for cycles).
        var foldScale: Double = 1
        /// When the upload must be complete: its time to report plus ``CoordinatorConfiguration/reportUploadGrace``.
        var finishBy: Date = .distantFuture
    }

    /// A model download.
    public struct ModelDownload: Sendable {
        /// The bytes: safetensors weights, or a Core ML model.
        public var bytes: [UInt8]
        /// A strong entity tag naming the checkpoint (and the format, for Core ML).
        public var etag: String
        /// The representation.
        public var format: ModelFormat = .safetensors
    }

    /// The store.
    public nonisolated let store: any CoordinatorStore
    /// The instance settings.
    public nonisolated let configuration: CoordinatorConfiguration
    let clock: any WallClock
    var random: ErasedRandom
    let metrics: CoordinatorMetrics
    let logger: Logger
    var runtimes: [String: Runtime] = [:]
    var processByName: [NameVersion: String] = [:]
    var processForKey: [String: String] = [:]
    var knownWorkers: Set<String> = []
    /// One secure-aggregation step at a time per process (check, persist, apply), so the event log's order is the
    /// order the steps were applied in.
    var secureLocks: [String: AsyncSemaphore] = [:]
    /// Over a shared store, processes whose cycle transition was asked for outside their secure-aggregation lock and
    /// left to the next step that holds it (``perform(_:processID:combined:)``).
    var deferredSecure: Set<String> = []
    /// Processes loaded from the store so far (each runtime's ``Runtime/generation``).
    var loadsDone = 0
    /// Core ML exports attempted (one per checkpoint, whether it succeeds or not).
    var coreMLExportAttempts = 0
    /// Runs between a report's commit in the store and its count here (tests: something that happens to the process in
    /// that moment, such as a reload).
    var reportRecordedHook: (@Sendable (String) async -> Void)?
    /// Runs in a load between reading the process (its checkpoint and optimizer state) and reading its open cycle (tests:
    /// a cycle closed by another instance in that moment).
    var loadReadHook: (@Sendable (String) async -> Void)?
    /// The process whose secure-aggregation lock the current task holds over a shared store, if any.
    @TaskLocal static var secureLockHolder: String?
    /// Processes whose cycle transition is being carried out (``perform(_:processID:combined:)``): over a shared store
    /// nothing reloads them meanwhile.
    var transitioning: Set<String> = []
    /// The refresh of the process list from a shared store under way, if any.
    var refreshing: (generation: Int, task: Task<Bool, Never>)?
    /// Refreshes of the process list started so far (each one's generation).
    var refreshesStarted = 0
    /// When the timer last refreshed the process list from a shared store.
    var lastProcessRefresh: Date?
    /// Which unknown process names this instance may look up in a shared store (negative caching and a budget).
    var processLookup = ProcessLookup()
    /// How the lookups of unknown processes ended.
    var lookupCounts = ProcessLookupCounts()
    /// Lookups of unknown processes under way, by name (concurrent callers share one).
    var lookupsInFlight: [ProcessLookup.Name: Task<ProcessLookupOutcome, Never>] = [:]
    /// Cycles this instance sealed in a shared store and has not closed (a failed transition is retried at once).
    var sealedHere: Set<SealKey> = []
    /// Reloads of a process from the store under way, by process.
    var reloading: [String: Task<Bool, Never>] = [:]
    /// Reports waiting to be committed folded into this instance's partial sum, by process (a ``FoldingStore``).
    var foldQueues: [String: FoldQueue] = [:]
    /// Each process's latest queued server-side evaluation (each waits for the one before it).
    var evaluationQueue: [String: Task<Void, Never>] = [:]
    /// Over a shared store, each process's latest checkpoint known to be evaluated, or to need none (no data attached).
    var evaluationsCaughtUp: [String: Int] = [:]
    /// Open-mode authentications per client address (nil: unlimited).
    var authenticationLimiter: RateLimiter<ClientAddress>?
    /// Wrong admin tokens, per client address (``adminGuessLimit``).
    nonisolated let adminGuesses = Mutex(RateLimiter<ClientAddress>(adminGuessLimit))
    /// Wrong admin tokens an address may send: ten back to back, then one every ten seconds.
    public static let adminGuessLimit = RateLimit(burst: 10, perSecond: 0.1)
    /// Speed tests per worker and direction (nil: unlimited).
    var speedTestLimiter: RateLimiter<SpeedTestKey>?
    /// Session tokens are checked outside the actor (every device request carries one).
    nonisolated let sessionIssuer = Mutex<SessionIssuer?>(nil)
    nonisolated let evaluationKeys = Mutex<EvaluationKeys?>(nil)
    /// Report uploads being received (``beginUpload(session:)``).
    /// Places taken now, and places given back since start (by uploads committed, refused or abandoned; an abandoned
    /// one's admission is undone before its place is given back).
    nonisolated let uploadPlaces = Mutex((taken: 0, givenBack: 0, byWorker: [String: Int]()))
    /// Report uploads being received now.
    public nonisolated var uploadsInFlight: Int { uploadPlaces.withLock { $0.taken } }
    /// Upload places given back since start (committed, refused or abandoned uploads).
    public nonisolated var uploadsEnded: Int { uploadPlaces.withLock { $0.givenBack } }

    /// Creates a coordinator; call ``start()`` before use.
    /// - Parameters:
    ///   - store: Durable storage.
    ///   - configuration: Instance settings.
    ///   - clock: Wall-clock time (injected so tests and simulations control deadlines).
    ///   - random: Randomness for ids, request keys and pace-steering jitter.
    ///   - metrics: Where metrics go.
    ///   - logger: Structured logs.
    public init(
        store: any CoordinatorStore, configuration: CoordinatorConfiguration = CoordinatorConfiguration(),
        clock: any WallClock = SystemClock(), random: any RandomNumberGenerator & Sendable = SystemRandomNumberGenerator(),
        metrics: CoordinatorMetrics = .discarding, logger: Logger = Logger(label: "orchard.coordinator")
    ) {
        self.store = store
        self.configuration = configuration
        self.clock = clock
        self.random = ErasedRandom(base: random)
        self.metrics = metrics
        self.logger = logger
        authenticationLimiter = configuration.openAuthenticationRate.map { RateLimiter($0) }
        speedTestLimiter = configuration.speedTestInterval > .zero ? RateLimiter(.once(per: configuration.speedTestInterval.inSeconds)) : nil
    }
}

/// One worker's speed tests in one direction, for the per-worker rate limit.
struct SpeedTestKey: Hashable, Sendable {
    var workerID: String
    var direction: SpeedTestLeg
}

/// A type-erased generator, so the actor can pass it `inout` to the standard library's generic `random` calls.
struct ErasedRandom: RandomNumberGenerator, Sendable {
    var base: any RandomNumberGenerator & Sendable
    mutating func next() -> UInt64 { base.next() }
}

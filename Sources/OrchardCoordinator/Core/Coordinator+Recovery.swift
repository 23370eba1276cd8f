import OrchardSupport
import CoreMetrics
import Foundation
import Logging
import OrchardFormats
import OrchardProtocol
import Synchronization

// Start-up: every stored process is loaded and its open cycle resumed.
extension Coordinator {
    // MARK: Start-up and recovery

    /// Loads every process and resumes its open cycle: assignments, the stored running sum, and the diffs
    /// committed since it was last written.
    public func start() async throws {
        if let failure = configuration.validationFailure() { throw CoordinatorError(.invalidConfiguration, failure) }
        var candidate: [UInt8] = []
        for _ in 0..<32 { candidate.append(UInt8.random(in: .min ... .max, using: &random)) }
        let fresh = candidate
        let secret = try await store.secret(named: "session", make: { fresh })
        let issuer = await SessionIssuer(secret: secret)
        sessionIssuer.withLock { $0 = issuer }
        evaluationKeys.withLock { $0 = EvaluationKeys(secret: secret) }
        runtimes = [:]
        processByName = [:]
        processForKey = [:]
        for process in try await store.processes() {
            // Only at start-up may a report whose diff a power loss damaged be discarded; a reload while running never does.
            try await load(process, discarding: true)
        }
        logger.info("coordinator started", metadata: ["processes": "\(runtimes.count)"])
        await scheduleMissingEvaluations()
        for runtime in runtimes.values.sorted(by: { $0.process.id < $1.process.id }) where runtime.process.serverConfig.authentication.mode == .open {
            warnOpenAuthentication(runtime.process)
        }
    }

    /// Logs that `process` lets any client register workers: open authentication is for development.
    func warnOpenAuthentication(_ process: StoredProcess) {
        let cap = configuration.maximumOpenWorkers.map { "at most \($0) workers" } ?? "no cap on workers"
        let rate = configuration.openAuthenticationRate.map { "authentications per client address limited to \($0)" } ?? "no rate limit"
        logger.warning(
            "process '\(process.name)' version \(process.version) uses open authentication: any client can register workers and report updates; use it for development only and hs256 or rs256 device tokens in production (\(cap), \(rate))",
            metadata: ["process": "\(process.id)"]
        )
    }

    /// Loads `process` and resumes its open cycle. Over a shared store another instance may close the cycle while this
    /// one reads: the process row (its checkpoint, optimizer state and ledger) and the open cycle are read apart, and a
    /// runtime built from both would aggregate the next cycle onto a checkpoint before the last. So the open cycle must
    /// be the one the process row leads to; when it is not, the process is read again and loaded anew. A process
    /// deleted meanwhile is forgotten.
    /// - Parameter discarding: Whether reports whose diffs cannot be read back may be discarded (once: the load that
    ///   discarded them loads again without).
    func load(_ process: StoredProcess, discarding: Bool = false) async throws {
        var process = process
        for _ in 0..<Self.loadAttempts {
            if try await loadSnapshot(process, discarding: discarding) { return }
            guard let fresh = try await store.processes().first(where: { $0.id == process.id }) else {
                forget(processID: process.id)
                return
            }
            // The row did not move, so no close came between the reads: its open cycle simply does not follow from it.
            if (fresh.latestCheckpoint, fresh.cyclesCompleted, fresh.cyclesAbandoned, fresh.completed)
                == (process.latestCheckpoint, process.cyclesCompleted, process.cyclesAbandoned, process.completed)
            {
                throw StoreError(
                    .corrupt,
                    "process \(process.id) has no open cycle \(process.cyclesCompleted + process.cyclesAbandoned + 1) on checkpoint \(process.latestCheckpoint), which its \(process.cyclesCompleted) aggregated and \(process.cyclesAbandoned) abandoned cycles lead to"
                )
            }
            process = fresh
        }
        throw StoreError(
            .locked,
            "process \(process.id) moved to another cycle each of the \(Self.loadAttempts) times it was loaded (other instances closing cycles meanwhile); try again"
        )
    }

    /// How many times ``load(_:discarding:)`` reads a process whose cycle closes while it is read.
    static let loadAttempts = 8

    /// Sets ``loadReadHook`` (tests).
    func setLoadReadHook(_ hook: (@Sendable (String) async -> Void)?) { loadReadHook = hook }

    /// One try of ``load(_:discarding:)``: false, with nothing changed, when the open cycle read is not the one
    /// `process` leads to (closed, or the process completed, since `process` was read).
    private func loadSnapshot(_ process: StoredProcess, discarding: Bool) async throws -> Bool {
        guard let weights = try await store.checkpoint(processID: process.id, number: process.latestCheckpoint) else {
            throw StoreError(.corrupt, "process \(process.id) has no checkpoint \(process.latestCheckpoint)")
        }
        let archive = try Safetensors.decode(weights)
        let layout = try ModelLayout(weights: archive.tensors, model: process.model)
        let optimizer = try await store.optimizerState(processID: process.id).map { try ServerOptimizerState(bytes: $0) } ?? ServerOptimizerState()
        let config = CycleStateMachine.Configuration(process.serverConfig)
        var privacy: (mechanism: PrivacyMechanism, ledger: PrivacyLedger)?
        if let privacyConfig = process.serverConfig.privacy {
            let mechanism = PrivacyMechanism(config: privacyConfig, server: process.serverConfig)
            var ledger = mechanism.initialLedger
            if let stored = try await store.privacyState(processID: process.id) {
                do {
                    ledger = try WireCoding.decoder().decode(PrivacyLedger.self, from: Data(stored))
                } catch {
                    throw StoreError(.corrupt, "process \(process.id) has an unreadable privacy ledger: \(error)")
                }
            }
            privacy = (mechanism, ledger)
        }
        let isPrivate = privacy != nil
        var machine: CycleStateMachine
        var sum = RunningSum(count: layout.totalCount)
        var unfolded: [String] = []
        var keys: Set<String> = []
        var staleness = (sum: 0, count: 0, max: 0)
        // Reports the loaded sum holds: this instance's share of those reported, folded into its partial sum or summed
        // from their pending diffs.
        var summed: Set<String> = []
        if let hook = loadReadHook { await hook(process.id) }
        let open = process.completed ? nil : try await store.openCycle(processID: process.id)
        if !process.completed {
            // Every close moves the latest checkpoint (aggregated) or the abandoned count, and opens the next cycle on the
            // latest checkpoint, in one transaction.
            guard let open, open.cycle.checkpoint == process.latestCheckpoint,
                open.cycle.number == process.cyclesCompleted + process.cyclesAbandoned + 1
            else { return false }
        }
        if let open {
            // A buffer's staleness figures, from the reports it holds (they were counted as they came before the restart).
            for stale in open.assignments.filter(\.reported).compactMap(\.staleness) {
                staleness = (staleness.sum + stale, staleness.count + 1, max(staleness.max, stale))
            }
            let assignments = open.assignments.map(Self.machineAssignment)
            machine = CycleStateMachine(
                configuration: config, cycle: open.cycle.number, checkpoint: open.cycle.checkpoint, openedAt: open.cycle.openedAt,
                completedCycles: process.cyclesCompleted, abandonedCycles: process.cyclesAbandoned, assignments: assignments
            )
            // This instance's share: over a shared store its own partial sum and the diffs it accepted but has not folded
            // (the others' are combined when the cycle closes); alone, everything stored.
            let shared = store.isShared
            let instance = foldInstance
            for (name, stored) in open.partialSums.sorted(by: { $0.key < $1.key }) where !shared || name == instance {
                sum.add(
                    try RunningSum(bytes: stored.bytes, weight: stored.weight, reports: stored.reports, unclipped: stored.unclipped, count: layout.totalCount))
            }
            let accumulator = RecoveryAccumulator(sum: sum)
            let count = layout.totalCount
            let damaged = Mutex<[(worker: String, bytes: Int)]>([])
            // A robust rule keeps every report in the store until the cycle closes and reads them then.
            let robust = process.serverConfig.robustAggregation != nil
            let server = process.serverConfig
            try await store.forEachPendingDiff(processID: process.id, cycle: open.cycle.number) { pending in
                if shared && pending.instance != instance { return }
                guard pending.diff.count == count * 4 else {
                    damaged.withLock { $0.append((pending.workerID, pending.diff.count)) }
                    return
                }
                if robust { return }
                accumulator.add(
                    pending.diff, weight: Runtime.foldWeight(sampleCount: pending.sampleCount, private: isPrivate),
                    scale: Runtime.foldScale(staleness: pending.staleness, server: server), unclipped: pending.unclipped, worker: pending.workerID
                )
            }
            // A diff that cannot be read back whole (its spool file missing or short after a power loss under `normal`
            // durability, which does not sync them) cannot be summed: its report is discarded, loudly, rather than the
            // coordinator refusing to start. The device was told it counted; this is the durability setting's loss.
            let lost = damaged.withLock { $0 }
            if !lost.isEmpty {
                guard discarding else {
                    throw StoreError(.corrupt, "stored diff of worker \(lost[0].worker) has \(lost[0].bytes) bytes, not \(count * 4)")
                }
                for (worker, bytes) in lost {
                    logger.error(
                        "discarding an acknowledged report whose stored diff cannot be read back",
                        metadata: [
                            "process": "\(process.id)", "cycle": "\(open.cycle.number)", "worker": "\(worker)", "bytes": "\(bytes)", "expected": "\(count * 4)",
                        ])
                }
                try await store.discardReports(processID: process.id, cycle: open.cycle.number, workers: lost.map(\.worker))
                try await load(process, discarding: false)
                return true
            }
            (sum, unfolded) = accumulator.result
            if !robust {
                let mine = open.assignments.filter { $0.reported && (!shared || ($0.instance ?? CoordinatorConfiguration.defaultInstanceID) == instance) }
                summed = Set(mine.map(\.workerID)).union(unfolded)
            }
            keys = Set(open.assignments.map(\.requestKey))
            for key in keys { processForKey[key] = process.id }
        } else {
            machine = CycleStateMachine(
                configuration: config, cycle: process.cyclesCompleted + process.cyclesAbandoned, checkpoint: process.latestCheckpoint,
                openedAt: process.createdAt, completedCycles: process.cyclesCompleted, abandonedCycles: process.cyclesAbandoned, completed: true
            )
        }
        let authenticator = try await DeviceAuthenticator(process.serverConfig.authentication)
        runtimes[process.id] = Runtime(
            process: process, machine: machine, layout: layout, sum: sum, unfolded: unfolded, checkpointBytes: weights,
            optimizer: optimizer, authenticator: authenticator, currentKeys: keys, previousKeys: []
        )
        runtimes[process.id]?.privacy = privacy
        runtimes[process.id]?.summedAtLoad = summed
        runtimes[process.id]?.bufferStaleness = staleness
        loadsDone += 1
        runtimes[process.id]?.generation = loadsDone
        if let ledger = privacy?.ledger { metrics.recordPrivacy(process: process, ledger: ledger) }
        if process.serverConfig.authentication.mode == .open {
            runtimes[process.id]?.openWorkers = try await store.workerCount(processID: process.id)
        }
        processByName[NameVersion(name: process.name, version: process.version)] = process.id
        processLookup.forget(.id(process.id))
        processLookup.forget(.nameVersion(process.name, process.version))
        try await recoverSecureCycle(processID: process.id)
        if !unfolded.isEmpty {
            logger.info(
                "resumed cycle with unfolded reports", metadata: ["process": "\(process.id)", "cycle": "\(machine.cycle)", "reports": "\(unfolded.count)"])
        }
        return true
    }

    func randomHex(_ bytes: Int) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes * 2)
        var word: UInt64 = 0
        for index in 0..<bytes {
            if index % 8 == 0 { word = random.next() }
            let byte = UInt8(truncatingIfNeeded: word >> (8 * UInt64(index % 8)))
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    func storeFailure(_ error: any Error, _ what: String) -> CoordinatorError {
        logger.error("store failure", metadata: ["operation": "\(what)", "error": "\(error)"])
        return .internalError("the coordinator could not \(what); try again")
    }
}

/// Folds stored diffs during recovery (called serially by the store's cursor).
final class RecoveryAccumulator: Sendable {
    private let state: Mutex<(sum: RunningSum, workers: [String])>

    init(sum: RunningSum) { state = Mutex((sum, [])) }

    func add(_ diff: [UInt8], weight: Double, scale: Double = 1, unclipped: Bool, worker: String) {
        state.withLock { state in
            state.sum.add(bytes: diff, weight: weight, scale: scale, unclipped: unclipped)
            state.workers.append(worker)
        }
    }

    var result: (RunningSum, [String]) { state.withLock { ($0.sum, $0.workers) } }
}

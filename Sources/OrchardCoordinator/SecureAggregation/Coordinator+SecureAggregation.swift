import CoreMetrics
import Foundation
import Logging
import OrchardPrivacy
public import OrchardProtocol
import OrchardSupport

// The secure-aggregation exchanges of devices in a process's cycle, its stage timers, and its recovery.
//
// Every step (a device's message, a stage closing) is checked on a copy of the cycle's state, persisted as an event,
// then kept — one step at a time per process (`secureLocks`), so the event log's order is the order of application
// and replaying it after a crash rebuilds exactly what was acknowledged.
//
// Over a store several instances share, any instance serves any stage: a step also holds the store's lock on the
// process (``CoordinatorStore/withSecureAggregationLock(processID:_:)``, an advisory lock in PostgreSQL) and first
// takes up what the others did (``catchUpSecure(processID:)``): a cycle they closed, the events they appended, the
// advertisements they counted. The instance whose step ends the protocol publishes, under the lock; if it dies
// first, the next instance to take the lock finds the protocol ended and the cycle open, and publishes.
extension Coordinator {
    /// A device's step in its cycle's secure aggregation: absorbs the stage message the request carries (if any) and
    /// answers what the device does next.
    /// - Throws: `forbidden` for another worker's session or another device's index; `aggregation_mode_mismatch` for
    ///   a process without secure aggregation; `stage_closed` for a stage that is not open; `dropped_device`;
    ///   `duplicate_message`; `invalid_secure_aggregation_message`; the request-key and session errors of reports.
    public func secureAggregation(_ request: SecureAggregationRequest, session: DeviceSession) async throws(CoordinatorError) -> SecureAggregationReply {
        guard request.workerID == session.workerID else {
            throw CoordinatorError(.forbidden, "the session token belongs to another worker")
        }
        guard request.messageCount <= 1 else {
            throw CoordinatorError(.invalidRequest, "a secure-aggregation request carries at most one stage message, not \(request.messageCount)")
        }
        try await requireKnownWorker(request.workerID)
        // A request key another instance issued.
        try await adoptSharedKey(request.requestKey)
        let (processID, runtime) = try keyedRuntime(requestKey: request.requestKey, session: session)
        guard runtime.process.serverConfig.secureAggregation != nil else {
            throw CoordinatorError(
                .aggregationModeMismatch,
                "process '\(runtime.process.name)' version \(runtime.process.version) does not use secure aggregation; send a report to \(Endpoint.report)"
            )
        }
        return try await withSecureLock(processID: processID) { coordinator throws(CoordinatorError) in
            try await coordinator.secureStep(request, processID: processID)
        }
    }

    /// The largest secure-aggregation body the session's process can need, known before any of it is read: its masked
    /// input (the model's words and the sample count, 4 bytes each, a third more as base64 in JSON), 4 KiB for each
    /// device a cycle admits (the roster-sized messages), and a message's worth of the rest. A session of a process hosted elsewhere and not yet loaded here gets the coordinator's limit.
    /// - Throws: `aggregation_mode_mismatch` for a process without secure aggregation (its body is never read).
    public func secureAggregationBodyLimit(session: DeviceSession) throws(CoordinatorError) -> (safetensors: Int, json: Int) {
        let message = configuration.maximumMessageBytes
        guard let runtime = runtimes[session.processID] else {
            return (configuration.maximumReportBytes + message, configuration.maximumReportBytes / 3 * 4 + message)
        }
        guard runtime.process.serverConfig.secureAggregation != nil else {
            throw CoordinatorError(
                .aggregationModeMismatch,
                "process '\(runtime.process.name)' version \(runtime.process.version) does not use secure aggregation; send a report to \(Endpoint.report)"
            )
        }
        // The other stage messages grow with the roster (share_keys carries a sealed share for each neighbour, unmask a
        // share for each): 4 KiB a device admitted to a cycle is far more than either needs.
        let bytes = (runtime.layout.totalCount + 1) * 4 + runtime.machine.configuration.capacity * 4096
        return (bytes + message, (bytes + 2) / 3 * 4 + message)
    }

    /// Runs `body` with the process's secure-aggregation steps serialised: by this instance's lock, and over a shared
    /// store also by the store's lock, after taking up what the other instances did (``catchUpSecure(processID:)``).
    func withSecureLock<T: Sendable>(
        processID: String, _ body: @escaping @Sendable (isolated Coordinator) async throws(CoordinatorError) -> T
    ) async throws(CoordinatorError) -> T {
        let lock = secureLock(processID)
        await lock.wait()
        defer { lock.signal() }
        guard store.isShared else { return try await body(self) }
        do {
            return try await store.withSecureAggregationLock(processID: processID) {
                try await Coordinator.$secureLockHolder.withValue(processID) {
                    try await self.catchUpSecure(processID: processID)
                    return try await body(self)
                }
            }
        } catch let error as CoordinatorError {
            throw error
        } catch {
            throw storeFailure(error, "take the secure-aggregation lock of the process")
        }
    }

    /// Over a shared store, with the process's locks held: takes up a cycle another instance closed (reloaded), the
    /// secure-aggregation events the others appended since this instance last stepped (replayed in order), and the
    /// assignments and advertisements they recorded (merged, so the goal and the minimum count every instance's);
    /// then carries out a transition left for the lock holder and publishes a protocol that ended unpublished (its
    /// last step's instance died first).
    func catchUpSecure(processID: String) async throws(CoordinatorError) {
        guard let runtime = runtimes[processID] else { return }
        let progress: StoredCycleProgress?
        do {
            progress = try await store.cycleProgress(processID: processID)
        } catch {
            throw storeFailure(error, "read the cycle from the shared store")
        }
        guard let progress, runtime.machine.phase != .completed else {
            if runtime.machine.phase != .completed { _ = await reload(processID: processID) }
            return
        }
        if progress.number != runtime.machine.cycle {
            // Reloading replays the new cycle's events (and takes a deferred transition up).
            deferredSecure.remove(processID)
            _ = await reload(processID: processID)
            return
        }
        guard var secure = runtime.secure else { return }
        let cycle = runtime.machine.cycle
        let wasAdvertising = secure.stage == .advertiseKeys
        let stored: [StoredSecureAggregationEvent]
        do {
            stored = try await store.secureAggregationEvents(processID: processID, cycle: cycle, from: secure.sequence)
        } catch {
            throw storeFailure(error, "read the secure-aggregation steps of other instances")
        }
        if !stored.isEmpty {
            do {
                try Self.replay(stored, into: &secure, cycle: cycle)
            } catch {
                throw storeFailure(error, "replay the secure-aggregation steps of other instances")
            }
            guard let current = runtimes[processID], current === runtime, current.machine.cycle == cycle else { return }
            current.secure = secure
            if wasAdvertising && secure.stage != .advertiseKeys {
                // Another instance closed advertise_keys (with at least the minimum): admission is over here too; the
                // protocol, not this instance's counts, decides what follows.
                _ = current.machine.closeAdmission()
            }
        }
        if progress.assigned != runtime.machine.assignments.count || progress.reported != runtime.machine.reported,
            let action = await synchronizeShared(processID: processID)
        {
            await perform(action, processID: processID)
        }
        if deferredSecure.remove(processID) != nil, let current = runtimes[processID], current.machine.cycle == cycle,
            current.secure?.stage == .advertiseKeys, current.machine.phase == .transitioning
        {
            // Admission closed outside the lock (its transition was deferred): decide it again with the merged counts.
            current.machine.transitionFailed()
            if let action = current.machine.closeAdmission() { await perform(action, processID: processID) }
        }
        await finishSecureIfEnded(processID: processID)
    }

    /// Applies stored events to `secure` in sequence order.
    /// - Throws: ``StoreError/Code/corrupt`` for a gap in the sequence or an event that does not decode or apply.
    static func replay(_ events: [StoredSecureAggregationEvent], into secure: inout SecureCycle, cycle: Int) throws(StoreError) {
        for stored in events {
            guard stored.sequence == secure.sequence else {
                throw StoreError(.corrupt, "secure-aggregation events of cycle \(cycle) skip from \(secure.sequence) to \(stored.sequence)")
            }
            do {
                let event = try WireCoding.decoder().decode(SecureCycleEvent.self, from: Data(stored.body))
                _ = try secure.apply(event, words: stored.words.map { SecureAggregationMaskedInput.words(fromLittleEndian: Data($0)) })
            } catch {
                throw StoreError(.corrupt, "secure-aggregation event \(stored.sequence) of cycle \(cycle) cannot be replayed: \(error)")
            }
        }
    }

    /// The lock that serialises a process's secure-aggregation steps.
    func secureLock(_ processID: String) -> AsyncSemaphore {
        if let lock = secureLocks[processID] { return lock }
        let lock = AsyncSemaphore(permits: 1)
        secureLocks[processID] = lock
        return lock
    }

    /// Seconds a device is told to wait at first: a sixth of the stage timeout, within 1…10 s
    /// (``SecureCycle/pollDelay(device:now:pollInterval:cycleDeadline:)`` spaces later polls out).
    static func securePollInterval(_ settings: SecureAggregationConfig) -> Double {
        min(10, max(1, (settings.stageTimeout / 6).rounded(.up)))
    }

    /// The step itself, with the process's lock held.
    private func secureStep(_ request: SecureAggregationRequest, processID: String) async throws(CoordinatorError) -> SecureAggregationReply {
        let now = clock.date
        await advanceSecure(processID: processID, now: now)
        guard let runtime = runtimes[processID], let secure = runtime.secure else {
            throw CoordinatorError(.stageClosed, "process \(processID) has no open cycle")
        }
        let cycle = runtime.machine.cycle
        let completedBefore = runtime.machine.completedCycles
        let worker = request.workerID
        guard runtime.machine.owner(ofRequestKey: request.requestKey) == worker else {
            throw CoordinatorError(.stageClosed, "the request key's cycle has closed; the process is at cycle \(cycle)")
        }
        var device = secure.indexOf[worker]
        if let keys = request.advertiseKeys {
            device = try await secureAdvertise(keys, worker: worker, requestKey: request.requestKey, processID: processID, now: now)
        } else if request.messageCount == 1 {
            guard let index = device else {
                throw CoordinatorError(.stageClosed, "worker \(worker) has not advertised its keys in cycle \(cycle)")
            }
            let event: SecureCycleEvent
            var words: [UInt32]?
            let sender: Int
            if let message = request.shareKeys {
                (event, sender) = (.shareKeys(message), message.device)
            } else if let message = request.maskedInput {
                (event, sender, words) = (.maskedInput(device: message.device), message.device, message.words)
            } else if let message = request.consistencyCheck {
                (event, sender) = (.consistencySignature(message), message.device)
            } else if let message = request.unmask {
                (event, sender) = (.unmask(message), message.device)
            } else {
                throw CoordinatorError(.invalidRequest, "the request carries no known stage message")
            }
            guard sender == index else {
                throw CoordinatorError(.forbidden, "worker \(worker) is device \(index) in cycle \(cycle), not device \(sender)")
            }
            _ = try await commitSecure(event, words: words, processID: processID)
            if runtimes[processID]?.secure?.stageComplete == true {
                await closeSecureStage(processID: processID, at: clock.date)
            }
        }
        guard let index = device else {
            throw CoordinatorError(.stageClosed, "worker \(worker) has not advertised its keys in cycle \(cycle)")
        }
        guard let current = runtimes[processID], current.machine.cycle == cycle, current.machine.phase != .completed, let state = current.secure else {
            // This step closed the cycle: its aggregate was published, or it was abandoned.
            let aggregated = (runtimes[processID]?.machine.completedCycles ?? completedBefore) > completedBefore
            return SecureAggregationReply(cycle: cycle, device: index, stage: aggregated ? .done : .abandoned, next: .done, cycleClosed: true)
        }
        let delay = state.pollDelay(device: index, now: now, pollInterval: Self.securePollInterval(state.settings), cycleDeadline: current.machine.deadline)
        return try state.reply(device: index, cycle: cycle, pollInterval: delay)
    }

    /// advertise_keys: records the worker's keys (replacing them when it advertised before in this stage) and counts
    /// a first advertisement toward the cycle's goal; returns the worker's index.
    private func secureAdvertise(_ keys: SecureAggregationPublicKeys, worker: String, requestKey: String, processID: String, now: Date)
        async throws(CoordinatorError) -> Int
    {
        guard let runtime = runtimes[processID], let secure = runtime.secure else {
            throw CoordinatorError(.stageClosed, "process \(processID) has no open cycle")
        }
        guard secure.stage == .advertiseKeys else {
            throw CoordinatorError(.stageClosed, "advertise_keys of cycle \(runtime.machine.cycle) has closed; the cycle is at \(secure.stage.rawValue)")
        }
        let event = secure.advertisement(worker: worker, keys: keys, at: now)
        guard case .advertise(_, let index, _, _) = event else { preconditionFailure("an advertisement event") }
        let isNew = secure.indexOf[worker] == nil
        if isNew {
            switch runtime.machine.beginReport(workerID: worker, requestKey: requestKey, now: now) {
            case .refused(let code, let message):
                throw CoordinatorError(code == .deadlinePassed ? .stageClosed : code, message)
            case .retry(_, let message):
                throw CoordinatorError(.stageClosed, message)
            case .proceed:
                break
            }
        }
        do {
            _ = try await commitSecure(event, processID: processID, reportedWorker: isNew ? worker : nil)
        } catch {
            if isNew, let action = runtimes[processID]?.machine.abortReport(workerID: worker) { await perform(action, processID: processID) }
            throw error
        }
        if isNew, let current = runtimes[processID] {
            let action = current.machine.commitReport(workerID: worker)
            metrics.openCycleReported.record(current.machine.reported)
            if let action { await perform(action, processID: processID) }
        }
        return index
    }

    /// Checks `event` on a copy of the cycle's state, persists it, then keeps the copy; returns the protocol's
    /// actions. The caller holds the process's lock.
    @discardableResult
    func commitSecure(_ event: SecureCycleEvent, words: [UInt32]? = nil, processID: String, reportedWorker: String? = nil) async throws(CoordinatorError)
        -> [SecureAggregationServerAction]
    {
        guard let runtime = runtimes[processID], var trial = runtime.secure else {
            throw CoordinatorError(.stageClosed, "process \(processID) has no open cycle")
        }
        let cycle = runtime.machine.cycle
        let sequence = trial.sequence
        let actions: [SecureAggregationServerAction]
        do throws(SecureAggregationError) {
            actions = try trial.apply(event, words: words)
        } catch {
            throw CoordinatorError(error)
        }
        let body: Data
        do {
            body = try WireCoding.encoder().encode(event)
        } catch {
            throw .internalError("could not encode a secure-aggregation step: \(error)")
        }
        let stored = StoredSecureAggregationEvent(
            sequence: sequence, body: [UInt8](body), words: words.map { [UInt8](SecureAggregationMaskedInput.littleEndianBytes($0)) })
        do {
            try await store.appendSecureAggregationEvent(stored, processID: processID, cycle: cycle, reportedWorker: reportedWorker)
        } catch {
            throw storeFailure(error, "record the secure-aggregation step")
        }
        guard let current = runtimes[processID], current.machine.cycle == cycle else { return actions }
        current.secure = trial
        for case .dropped(let devices, let stage) in actions {
            logger.info(
                "devices dropped from secure aggregation",
                metadata: ["process": "\(processID)", "cycle": "\(cycle)", "stage": "\(stage.rawValue)", "devices": "\(devices.count)"])
        }
        return actions
    }

    /// Closes advertise_keys with a fresh public seed for the neighbour ring, as of its deadline when that has passed
    /// (now otherwise); the caller holds the process's lock. On a store failure the cycle's transition is retried at
    /// the next tick.
    func closeSecureAdvertisements(processID: String) async {
        let seed = SecureAggregationServer.drawGraphSeed(using: &random)
        let now = clock.date
        let date = min(now, runtimes[processID]?.secure?.stageDeadline ?? now)
        do {
            try await commitSecure(.closeAdvertisements(graphSeed: seed, at: date), processID: processID)
        } catch {
            logger.error("could not close advertise_keys; retrying on the next tick", metadata: ["process": "\(processID)", "error": "\(error)"])
            runtimes[processID]?.machine.transitionFailed()
            return
        }
        await finishSecureIfEnded(processID: processID)
    }

    /// Closes the current later stage as of `date`; the caller holds the process's lock.
    func closeSecureStage(processID: String, at date: Date) async {
        do {
            try await commitSecure(.closeStage(at: date), processID: processID)
        } catch {
            logger.error("could not close a secure-aggregation stage; retrying on the next tick", metadata: ["process": "\(processID)", "error": "\(error)"])
            return
        }
        await finishSecureIfEnded(processID: processID)
    }

    /// Publishes the aggregate (or abandons the cycle) once the protocol has ended; again after a publication that
    /// could not be stored.
    func finishSecureIfEnded(processID: String) async {
        guard let runtime = runtimes[processID], let secure = runtime.secure, [.done, .abandoned].contains(secure.stage),
            runtime.machine.phase != .completed
        else { return }
        // A failed transition left the machine closing: it transitions again.
        if runtime.machine.phase != .transitioning { _ = runtime.machine.closeAdmission() }
        guard runtime.machine.phase == .transitioning else { return }
        await perform(.aggregate(cycle: runtime.machine.cycle, reports: runtime.machine.reported), processID: processID)
    }

    /// Closes every later stage whose deadline has passed by `now`, each at its own deadline (so a stage opened by a
    /// late close gets its whole timeout); the caller holds the process's lock.
    func advanceSecure(processID: String, now: Date) async {
        if let runtime = runtimes[processID], let secure = runtime.secure, secure.stage == .advertiseKeys {
            // Admission's own deadline, and advertise_keys' once the minimum has advertised.
            if let action = runtime.machine.timerFired(now: now) {
                await perform(action, processID: processID)
            } else if let deadline = secure.stageDeadline, now >= deadline, let action = runtime.machine.closeAdmission() {
                await perform(action, processID: processID)
            }
        }
        while let secure = runtimes[processID]?.secure, secure.stage != .advertiseKeys, let deadline = secure.stageDeadline, now >= deadline {
            let before = secure.sequence
            await closeSecureStage(processID: processID, at: deadline)
            guard let after = runtimes[processID]?.secure, after.sequence != before || after.stageDeadline != deadline else { break }
        }
    }

    /// The timer's work for a process under secure aggregation, with its locks held: stages past their deadline
    /// close, and a protocol that ended but could not be published is published.
    /// Takes the locks only if they are free: a step in progress here, or a lock another instance holds (its host gone
    /// away, say), skips this process until the next tick instead of stalling every process's ticks.
    func tickSecure(processID: String, now: Date) async {
        let lock = secureLock(processID)
        guard lock.tryWait() else { return }
        defer { lock.signal() }
        do {
            guard store.isShared else {
                await advanceSecure(processID: processID, now: now)
                await finishSecureIfEnded(processID: processID)
                return
            }
            let ran = try await store.withSecureAggregationLockIfFree(processID: processID) {
                try await Coordinator.$secureLockHolder.withValue(processID) {
                    try await self.catchUpSecure(processID: processID)
                    await self.advanceSecure(processID: processID, now: now)
                    await self.finishSecureIfEnded(processID: processID)
                }
            }
            if ran == nil { logger.debug("secure aggregation lock busy; the tick skips the process", metadata: ["process": "\(processID)"]) }
        } catch {
            logger.warning("could not step the secure aggregation; retrying on the next tick", metadata: ["process": "\(processID)", "error": "\(error)"])
        }
    }

    /// A fresh secure aggregation for the runtime's open cycle, or nil when the process does not use it or has
    /// completed.
    func freshSecureCycle(_ runtime: Runtime) -> SecureCycle? {
        guard let settings = runtime.process.serverConfig.secureAggregation, runtime.machine.phase != .completed else { return nil }
        do {
            return try SecureCycle(
                settings: settings, context: SecureAggregationPlan.context(processID: runtime.process.id, cycle: runtime.machine.cycle),
                goalCount: runtime.machine.configuration.goalCount, minimumAdvertisements: runtime.machine.configuration.minimumReports,
                maximumSampleCount: runtime.process.serverConfig.maximumSampleCount,
                modelLength: runtime.layout.totalCount
            )
        } catch {
            logger.error("secure aggregation cannot run for the process", metadata: ["process": "\(runtime.process.id)", "error": "\(error)"])
            return nil
        }
    }

    /// Rebuilds the open cycle's secure aggregation from its stored events (recovery); when advertise_keys had
    /// closed, admission stays closed and the stages go on.
    func recoverSecureCycle(processID: String) async throws {
        guard let runtime = runtimes[processID], var secure = freshSecureCycle(runtime) else { return }
        let cycle = runtime.machine.cycle
        try Self.replay(try await store.secureAggregationEvents(processID: processID, cycle: cycle), into: &secure, cycle: cycle)
        runtime.secure = secure
        if secure.sequence > 0 {
            logger.info(
                "resumed secure aggregation",
                metadata: ["process": "\(processID)", "cycle": "\(cycle)", "stage": "\(secure.stage.rawValue)", "steps": "\(secure.sequence)"])
        }
        if secure.stage != .advertiseKeys, let action = runtime.machine.closeAdmission() {
            await perform(action, processID: processID)
        }
    }
}

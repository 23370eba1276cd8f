import CoreMetrics
import Foundation
import OrchardSupport
import Logging
import OrchardFormats
import OrchardProtocol

// Several coordinator instances over one shared store (PostgreSQL): any instance serves any device.
//
// - Admission is decided by the store (``CoordinatorStore/admit(processID:cycle:workerID:requestKey:at:limit:)``), so
//   the instances together never admit more than a cycle's capacity.
// - A request key issued by another instance is looked up in the store the first time this instance sees it.
// - Each instance folds the reports it accepts into its own partial sum, written back under its instance name; a
//   report's diff is committed before it is acknowledged and stays in the store until a partial sum includes it.
// - A cycle closes once: the instance that notices the goal or the deadline first seals it in the store (nothing more
//   is admitted, accepted or folded), combines every instance's partial sum and pending diffs, and publishes with
//   ``CoordinatorStore/closeCycle(_:)``, which succeeds for one caller only. The others take the new cycle up on
//   their next tick; a cycle sealed by an instance that died is closed by another after
//   ``CoordinatorConfiguration/sealLease``.
extension Coordinator {
    /// The instance name reports are folded under: the configured one over a shared store; with a store of its own
    /// the coordinator is the only instance and uses the default name.
    nonisolated var foldInstance: String { store.isShared ? configuration.instanceID : CoordinatorConfiguration.defaultInstanceID }

    /// Loads processes other instances hosted and forgets those they deleted; a call while one runs waits for it.
    /// Returns whether the store could be read.
    @discardableResult
    func refreshProcesses() async -> Bool {
        if let running = refreshing { return await running.task.value }
        return await startRefresh()
    }

    /// A refresh that lists the store after this call began: one already running may have listed it before a process
    /// the caller is looking for was hosted, so it is waited out, and one that started after this call is joined or
    /// started. Returns whether that refresh could read the store.
    func refreshProcessesFromNow() async -> Bool {
        let needed = refreshesStarted + 1
        while true {
            if let running = refreshing {
                let succeeded = await running.task.value
                if running.generation >= needed { return succeeded }
            } else {
                return await startRefresh()
            }
        }
    }

    /// Runs refresh number `refreshesStarted + 1`; `refreshing` is cleared by the refresh itself, before any caller
    /// resumes, so a caller never mistakes a finished refresh for a running one.
    private func startRefresh() async -> Bool {
        refreshesStarted += 1
        let generation = refreshesStarted
        let task = Task {
            let succeeded = await self.refreshProcessesNow()
            self.refreshEnded(generation)
            return succeeded
        }
        refreshing = (generation, task)
        return await task.value
    }

    private func refreshEnded(_ generation: Int) {
        if refreshing?.generation == generation { refreshing = nil }
    }

    @discardableResult
    private func refreshProcessesNow() async -> Bool {
        // Only processes known before the listing can be missing from it because they were deleted.
        let known = Set(runtimes.keys)
        let stored: [StoredProcess]
        do {
            stored = try await store.processes()
        } catch {
            logger.warning("could not list processes from the shared store", metadata: ["error": "\(error)"])
            return false
        }
        let ids = Set(stored.map(\.id))
        for id in known.sorted() where !ids.contains(id) && !transitioning.contains(id) { forget(processID: id) }
        for process in stored where runtimes[process.id] == nil {
            do {
                try await load(process)
                logger.info("process hosted by another instance loaded", metadata: ["process": "\(process.id)"])
            } catch {
                logger.error("could not load a process hosted by another instance", metadata: ["process": "\(process.id)", "error": "\(error)"])
            }
        }
        return true
    }

    // MARK: Processes this instance does not know

    /// The one place an instance resolves a process by id: its own, or, over a shared store, one another instance
    /// hosted since the last refresh (looked up in the store within ``ProcessLookup``'s bounds). Every device and admin
    /// operation that names a process by id goes through here.
    /// - Throws: `rate_limited` with a wait when the budget for unknown names is spent, `internal_error` when the
    ///   store cannot be read (never `unknown_process` for a process that may exist).
    func knownRuntime(processID: String) async throws(CoordinatorError) -> Runtime? {
        if let runtime = runtimes[processID] { return runtime }
        guard store.isShared, try await lookUp(.id(processID)) else { return nil }
        return runtimes[processID]
    }

    /// ``knownRuntime(processID:)`` for a process named by name and version (authentication, cycle requests).
    func knownProcessID(name: String, version: SemanticVersion) async throws(CoordinatorError) -> String? {
        let key = NameVersion(name: name, version: version)
        if let id = processByName[key], runtimes[id] != nil { return id }
        guard store.isShared, try await lookUp(.nameVersion(name, version)) else { return nil }
        return processByName[key].flatMap { runtimes[$0] == nil ? nil : $0 }
    }

    /// Over a shared store, whether a process this instance holds still exists there (one read of its cycle row); one
    /// deleted through another instance is forgotten here. With a store of its own, whether it is held.
    func confirmShared(processID: String) async -> Bool {
        guard store.isShared else { return runtimes[processID] != nil }
        guard runtimes[processID] != nil else { return false }
        do {
            if try await store.cycleProgress(processID: processID) != nil { return true }
        } catch {
            // The store cannot say: keep serving from memory (the next tick looks again).
            logger.warning("could not read the cycle from the shared store", metadata: ["process": "\(processID)", "error": "\(error)"])
            return true
        }
        // No cycle row: completed, or deleted through another instance (reload tells which and forgets a deleted one).
        if runtimes[processID]?.machine.phase == .completed { return true }
        _ = await reload(processID: processID)
        return runtimes[processID] != nil
    }

    /// How the lookups of unknown processes ended so far (the counts behind `orchard_process_lookups_total`).
    public var processLookupCounts: ProcessLookupCounts { lookupCounts }

    /// Refreshes the process list from the store when ``processLookup`` allows a lookup of `name`; returns whether
    /// `name` is known afterwards (a miss is remembered). Concurrent calls for one name share one lookup (a burst of
    /// devices naming a process another instance just hosted costs one refresh and no budget beyond it).
    private func lookUp(_ name: ProcessLookup.Name) async throws(CoordinatorError) -> Bool {
        var outcome: ProcessLookupOutcome
        if let running = lookupsInFlight[name] {
            outcome = await running.value
            if outcome == .missing {
                // The shared lookup may have listed the store before this request arrived: one listing that began
                // after it settles it (joined by the other callers in the same position, so a burst costs one).
                if await refreshProcessesFromNow() { outcome = isKnown(name) ? .found : .missing }
            }
        } else {
            let task = Task { await self.lookUpNow(name) }
            lookupsInFlight[name] = task
            outcome = await task.value
            lookupsInFlight[name] = nil
        }
        switch outcome {
        case .found: return true
        case .missing: return false
        case .limited(let wait):
            throw .rateLimited("too many unknown process names looked up at this instance; try again shortly", retryAfter: max(1, wait.rounded(.up)))
        case .failed:
            throw .internalError("the coordinator could not read the shared store to look the process up; try again")
        }
    }

    private func isKnown(_ name: ProcessLookup.Name) -> Bool {
        switch name {
        case .id(let id): runtimes[id] != nil
        case .nameVersion(let processName, let version): processByName[NameVersion(name: processName, version: version)] != nil
        }
    }

    private func lookUpNow(_ name: ProcessLookup.Name) async -> ProcessLookupOutcome {
        switch processLookup.decide(name, now: clock.date) {
        case .knownMissing:
            lookupCounts.cached += 1
            metrics.processLookupsCached.increment()
            return .missing
        case .overBudget(let wait):
            lookupCounts.limited += 1
            metrics.processLookupsLimited.increment()
            logger.debug("unknown process not looked up: the lookup budget is spent", metadata: ["name": "\(name)"])
            return .limited(retryAfter: wait)
        case .lookUp:
            // A store that cannot be read says nothing about the name: it is not remembered as missing.
            guard await refreshProcessesFromNow() else { return .failed }
            let found = isKnown(name)
            if found {
                lookupCounts.found += 1
                metrics.processLookupsFound.increment()
            } else {
                lookupCounts.missing += 1
                metrics.processLookupsMissing.increment()
                processLookup.recordMissing(name, at: clock.date)
            }
            return found ? .found : .missing
        }
    }

    /// Drops a process's in-memory state (deleted here or by another instance).
    func forget(processID: String) {
        guard let runtime = runtimes[processID] else { return }
        // Deleted: its id and name are unknown from now on (answered without a lookup for a moment).
        processLookup.recordMissing(.id(processID), at: clock.date)
        for key in runtime.currentKeys.union(runtime.previousKeys) { processForKey[key] = nil }
        runtimes[processID] = nil
        secureLocks[processID] = nil
        evaluationQueue[processID] = nil
        evaluationsCaughtUp[processID] = nil
        // The name may already belong to a process hosted again under it (deleted elsewhere, then hosted here before
        // this instance noticed): that one keeps it.
        let name = NameVersion(name: runtime.process.name, version: runtime.process.version)
        if processByName[name] == processID {
            processByName[name] = nil
            processLookup.recordMissing(.nameVersion(runtime.process.name, runtime.process.version), at: clock.date)
        }
    }

    /// Over a shared store, brings this instance's view of a process up to date (what other instances hosted, closed,
    /// admitted and accepted) without closing anything; does nothing with a store of its own.
    /// Returns whether the cycle is being closed now (here, or sealed by another instance): the next opens shortly.
    @discardableResult
    func catchUpShared(processID: String) async -> Bool {
        guard store.isShared else { return false }
        if transitioning.contains(processID) { return true }
        guard let runtime = try? await knownRuntime(processID: processID) else { return false }
        let progress: StoredCycleProgress?
        do {
            progress = try await store.cycleProgress(processID: processID)
        } catch {
            logger.warning("could not read the cycle from the shared store", metadata: ["process": "\(processID)", "error": "\(error)"])
            return false
        }
        guard let progress else {
            if runtime.machine.phase != .completed { _ = await reload(processID: processID) }
            return false
        }
        if progress.number != runtime.machine.cycle || runtime.machine.phase == .completed {
            _ = await reload(processID: processID)
        } else if progress.assigned != runtime.machine.assignments.count || progress.reported != runtime.machine.reported {
            if let action = await synchronizeShared(processID: processID) { await perform(action, processID: processID) }
        }
        // Sealed by another instance, or the merged counts reached the goal here (the close is under way or was lost to
        // another instance's seal).
        let phase = runtimes[processID]?.machine.phase
        return progress.status == .closing || phase == .closing || phase == .transitioning
    }

    /// One timer step of a process over a shared store: takes up a cycle another instance closed, takes over a cycle
    /// whose closing instance died, merges other instances' assignments and reports, and closes at the deadline.
    func tickShared(processID: String, now: Date) async {
        guard let runtime = runtimes[processID], !transitioning.contains(processID) else { return }
        let progress: StoredCycleProgress?
        do {
            progress = try await store.cycleProgress(processID: processID)
        } catch {
            logger.warning("could not read the cycle from the shared store", metadata: ["process": "\(processID)", "error": "\(error)"])
            return
        }
        guard let progress else {
            if runtime.machine.phase != .completed { _ = await reload(processID: processID) }
            return
        }
        guard progress.number == runtime.machine.cycle, runtime.machine.phase != .completed else {
            _ = await reload(processID: processID)
            return
        }
        if progress.status == .closing {
            // Sealed here and the transition failed (a store error): retry now. Sealed by another instance, which is
            // combining the partial sums: if it has not finished within the lease, it is presumed dead.
            let mine = sealedHere.contains(SealKey(processID: processID, cycle: progress.number))
            if !mine {
                guard let sealedAt = progress.sealedAt, now.timeIntervalSince(sealedAt) >= configuration.sealLease.inSeconds else { return }
                logger.warning(
                    "taking over the closing of a cycle sealed by another instance",
                    metadata: [
                        "process": "\(processID)", "cycle": "\(progress.number)", "sealed_at": "\(sealedAt)",
                    ])
            }
            if let action = await combineShared(processID: processID, takeover: true) {
                await perform(action, processID: processID, combined: true)
            }
            return
        }
        if progress.assigned != runtime.machine.assignments.count || progress.reported != runtime.machine.reported {
            if let action = await synchronizeShared(processID: processID) {
                await perform(action, processID: processID)
                return
            }
        }
        if let action = runtimes[processID]?.machine.timerFired(now: now) { await perform(action, processID: processID) }
    }

    /// Merges the assignments every instance recorded into this instance's view of the open cycle; returns the action
    /// the merged counts call for.
    func synchronizeShared(processID: String) async -> CycleStateMachine.CycleAction? {
        guard let runtime = runtimes[processID] else { return nil }
        let cycle = runtime.machine.cycle
        let open: RecoveredCycle?
        do {
            open = try await store.openCycle(processID: processID)
        } catch {
            logger.warning("could not read the cycle's assignments from the shared store", metadata: ["process": "\(processID)", "error": "\(error)"])
            return nil
        }
        guard let open, open.cycle.number == cycle, let current = runtimes[processID], current.machine.cycle == cycle else { return nil }
        for stored in open.assignments where processForKey[stored.requestKey] == nil {
            processForKey[stored.requestKey] = processID
            current.currentKeys.insert(stored.requestKey)
        }
        return current.machine.synchronize(with: open.assignments.map(Self.machineAssignment))
    }

    static func machineAssignment(_ stored: StoredAssignment) -> CycleStateMachine.Assignment {
        CycleStateMachine.Assignment(
            workerID: stored.workerID, requestKey: stored.requestKey, state: stored.reported ? .reported : .assigned,
            assignedAt: stored.assignedAt ?? Date(timeIntervalSince1970: 0))
    }

    /// Seals the open cycle in the shared store and takes every instance's contribution into this runtime: the running
    /// sum becomes the sum of all partial sums and pending diffs, the state machine every stored assignment. Returns
    /// the action the combined counts call for, or nil when another instance is closing (or closed) the cycle.
    func combineShared(processID: String, takeover: Bool) async -> CycleStateMachine.CycleAction? {
        guard let runtime = runtimes[processID] else { return nil }
        let cycle = runtime.machine.cycle
        let isPrivate = runtime.privacy != nil
        do {
            let sealed = try await store.sealCycle(processID: processID, cycle: cycle, at: clock.date)
            if sealed { sealedHere.insert(SealKey(processID: processID, cycle: cycle)) }
            // Sealed by another instance, which is closing it: the tick takes the next cycle up, or takes over after the lease.
            guard sealed || takeover else { return nil }
            guard let open = try await store.openCycle(processID: processID), open.cycle.number == cycle else {
                _ = await reload(processID: processID)
                return nil
            }
            let count = runtime.layout.totalCount
            var sum = RunningSum(count: count)
            for (_, partial) in open.partialSums.sorted(by: { $0.key < $1.key }) {
                sum.add(try RunningSum(bytes: partial.bytes, weight: partial.weight, reports: partial.reports, unclipped: partial.unclipped, count: count))
            }
            let accumulator = RecoveryAccumulator(sum: sum)
            // A robust rule reads every instance's reports when it aggregates (``Coordinator/robustDelta(processID:cycle:rule:layout:)``).
            if runtime.robust == nil {
                let server = runtime.process.serverConfig
                try await store.forEachPendingDiff(processID: processID, cycle: cycle) { pending in
                    guard pending.diff.count == count * 4 else {
                        throw StoreError(.corrupt, "stored diff of worker \(pending.workerID) has \(pending.diff.count) bytes")
                    }
                    accumulator.add(
                        pending.diff, weight: Runtime.foldWeight(sampleCount: pending.sampleCount, private: isPrivate),
                        scale: Runtime.foldScale(staleness: pending.staleness, server: server), unclipped: pending.unclipped, worker: pending.workerID
                    )
                }
            }
            guard let current = runtimes[processID], current.machine.cycle == cycle else { return nil }
            let old = current.machine
            var machine = CycleStateMachine(
                configuration: old.configuration, cycle: cycle, checkpoint: old.checkpoint, openedAt: old.openedAt,
                completedCycles: old.completedCycles, abandonedCycles: old.abandonedCycles, assignments: open.assignments.map(Self.machineAssignment)
            )
            let action = machine.closeAdmission()
            current.machine = machine
            current.sum = accumulator.result.0
            // Rebuilt from the store: it holds every committed diff, a report this instance could not read back included.
            current.sumLacksReports = false
            // The combined sum holds every report committed before the seal: one whose count here is still to come
            // (``commitReport(_:workerID:sampleCount:unclipped:diff:)``) finds it summed.
            loadsDone += 1
            current.generation = loadsDone
            current.unfolded = open.assignments.filter(\.reported).map(\.workerID)
            current.summedAtLoad = Set(current.unfolded)
            for stored in open.assignments where processForKey[stored.requestKey] == nil {
                processForKey[stored.requestKey] = processID
                current.currentKeys.insert(stored.requestKey)
            }
            return action
        } catch let error as StoreError where error.code == .cycleClosed {
            _ = await reload(processID: processID)
            return nil
        } catch {
            logger.error(
                "could not combine the instances' partial sums; retrying on the next tick", metadata: ["process": "\(processID)", "error": "\(error)"])
            runtimes[processID]?.machine.transitionFailed()
            return nil
        }
    }

    /// With a shared store, learns a request key another instance issued: a device may check in at one instance and
    /// send its report (or download its model) at another. With `confirm`, a key this instance knows is checked in the
    /// store too, so a cycle closed or a process deleted through another instance is noticed at once (plan and model
    /// downloads, once per device and cycle); reports skip that read, as the store refuses a report for a closed cycle
    /// anyway.
    func adoptSharedKey(_ requestKey: String, confirm: Bool = false) async throws(CoordinatorError) {
        guard store.isShared else { return }
        if !confirm, let processID = processForKey[requestKey], runtimes[processID]?.machine.owner(ofRequestKey: requestKey) != nil { return }
        let found: StoredKeyedAssignment?
        do {
            found = try await store.assignment(requestKey: requestKey)
        } catch {
            throw storeFailure(error, "look up the request key")
        }
        guard let found else {
            if let processID = processForKey[requestKey], runtimes[processID] != nil {
                // Closed or deleted through another instance since: take the store's view up.
                await catchUpShared(processID: processID)
                guard let runtime = runtimes[processID] else {
                    throw CoordinatorError(.unknownProcess, "the process of this request key is no longer hosted")
                }
                // Issued here for a cycle that another instance has closed since.
                throw CoordinatorError(.deadlinePassed, "request key belongs to a cycle before cycle \(runtime.machine.cycle), which has closed")
            }
            return
        }
        _ = try await knownRuntime(processID: found.processID)
        if let runtime = runtimes[found.processID], runtime.machine.cycle < found.cycle, !transitioning.contains(found.processID) {
            _ = await reload(processID: found.processID)
        }
        guard let runtime = runtimes[found.processID], runtime.machine.cycle == found.cycle else { return }
        processForKey[requestKey] = found.processID
        runtime.currentKeys.insert(requestKey)
        if let action = runtime.machine.synchronize(with: [Self.machineAssignment(found.assignment)]) {
            await perform(action, processID: found.processID)
        }
    }

    /// Records a new assignment in a shared store, which admits exactly across instances. Returns the assignment to
    /// hand out, or a rejection when the store refused it (the cycle is full or no longer open).
    func admitShared(
        processID: String, cycle: Int, workerID: String, assignment: CycleStateMachine.Assignment, now: Date, jitter: Double
    ) async throws(CoordinatorError) -> SharedAdmission {
        guard let runtime = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "process '\(processID)' is no longer hosted") }
        let window = runtime.process.serverConfig.paceSteeringWindow
        let outcome: StoredAdmission
        do {
            // Buffered: the devices still training count against max_concurrency, across buffers.
            outcome = try await store.admit(
                processID: processID, cycle: cycle, workerID: workerID, requestKey: assignment.requestKey, at: now,
                limit: runtime.machine.configuration.capacity, inFlightAfter: runtime.machine.carryOverCutoff(at: now)
            )
        } catch let error as StoreError where error.code == .cycleClosed {
            revoke(processID: processID, cycle: cycle, workerID: workerID, requestKey: assignment.requestKey)
            return .rejected(CycleRejection(retryAfter: (window * (1 + jitter)).rounded(.up), reason: "cycle_closing"))
        } catch {
            revoke(processID: processID, cycle: cycle, workerID: workerID, requestKey: assignment.requestKey)
            throw storeFailure(error, "record the assignment")
        }
        switch outcome {
        case .admitted:
            return .assigned(assignment)
        case .existing(let stored):
            // Admitted earlier by another instance: hand out that assignment again.
            revoke(processID: processID, cycle: cycle, workerID: workerID, requestKey: assignment.requestKey)
            guard let current = runtimes[processID], current.machine.cycle == cycle else {
                return .rejected(CycleRejection(retryAfter: (window * (1 + jitter)).rounded(.up), reason: "cycle_closing"))
            }
            processForKey[stored.requestKey] = processID
            current.currentKeys.insert(stored.requestKey)
            if let action = current.machine.synchronize(with: [Self.machineAssignment(stored)]) { await perform(action, processID: processID) }
            if stored.reported {
                return .rejected(
                    CycleRejection(
                        retryAfter: current.machine.nextCycleExpected(now: now, jitter: Double.random(in: 0...1, using: &random)), reason: "already_reported"))
            }
            return .assigned(Self.machineAssignment(stored))
        case .full:
            revoke(processID: processID, cycle: cycle, workerID: workerID, requestKey: assignment.requestKey)
            if let action = await synchronizeShared(processID: processID) { await perform(action, processID: processID) }
            let deadline = runtimes[processID]?.machine.deadline ?? now
            return .rejected(CycleRejection(retryAfter: (max(0, deadline.timeIntervalSince(now)) + jitter * window).rounded(.up), reason: "cycle_full"))
        }
    }

    /// A cycle this instance sealed and has not yet closed.
    struct SealKey: Hashable {
        var processID: String
        var cycle: Int
    }

    /// What ``admitShared(processID:cycle:workerID:assignment:now:jitter:)`` decided.
    enum SharedAdmission {
        /// Hand out this assignment.
        case assigned(CycleStateMachine.Assignment)
        /// Turn the device away.
        case rejected(CycleRejection)
    }

    /// Withdraws an assignment this instance made but the store did not record.
    private func revoke(processID: String, cycle: Int, workerID: String, requestKey: String) {
        processForKey[requestKey] = nil
        guard let runtime = runtimes[processID], runtime.machine.cycle == cycle else { return }
        runtime.machine.revokeAssignment(workerID: workerID)
        runtime.currentKeys.remove(requestKey)
    }

    /// After a report committed here, whether the instances together reached the goal: merges their assignments when
    /// the store counts enough reports (`known`: the count its commit returned; else read now), and returns the action
    /// that calls for.
    func goalReachedShared(processID: String, cycle: Int, reported known: Int? = nil) async -> CycleStateMachine.CycleAction? {
        guard let runtime = runtimes[processID] else { return nil }
        if let known {
            return known >= runtime.machine.configuration.goalCount ? await synchronizeShared(processID: processID) : nil
        }
        do {
            guard let progress = try await store.cycleProgress(processID: processID), progress.number == cycle,
                progress.reported >= runtime.machine.configuration.goalCount
            else { return nil }
        } catch {
            logger.warning("could not count the cycle's reports in the shared store", metadata: ["process": "\(processID)", "error": "\(error)"])
            return nil
        }
        return await synchronizeShared(processID: processID)
    }
}

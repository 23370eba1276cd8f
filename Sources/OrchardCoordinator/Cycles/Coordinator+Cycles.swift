import OrchardSupport
import CoreMetrics
import Foundation
import Logging
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import Synchronization

// The cycle timer and the transitions the cycle state machine asks for (close, aggregate, publish, open).
extension Coordinator {
    // MARK: Timer and transitions

    /// Advances every process's cycle to the current time: closes cycles whose deadline passed.
    public func tick() async {
        let now = clock.date
        if store.isShared && !(lastProcessRefresh.map { now.timeIntervalSince($0) < 1 } ?? false) {
            // Processes hosted or deleted through other instances, at most once a second (device and admin calls naming
            // an unknown process look sooner).
            lastProcessRefresh = now
            await refreshProcesses()
            await catchUpEvaluations(now: now)
        }
        for processID in runtimes.keys.sorted() {
            guard let runtime = runtimes[processID] else { continue }
            if store.isShared && runtime.secure == nil {
                await tickShared(processID: processID, now: now)
                continue
            }
            if runtime.secure != nil {
                await tickSecure(processID: processID, now: now)
                continue
            }
            let action = runtime.machine.timerFired(now: now)
            if let action { await perform(action, processID: processID) }
        }
    }

    /// Carries out a cycle transition; over a shared store the cycle is first sealed and every instance's contribution
    /// combined (``combineShared(processID:takeover:)``), unless `combined` says that was done.
    func perform(_ action: CycleStateMachine.CycleAction, processID: String, combined: Bool = false) async {
        if store.isShared, runtimes[processID]?.secure != nil, Self.secureLockHolder != processID {
            // Over a shared store only the holder of the process's secure-aggregation lock steps its protocol or
            // publishes (after taking up what the other instances did); the next step that holds it carries this out.
            deferredSecure.insert(processID)
            return
        }
        var action = action
        transitioning.insert(processID)
        defer { transitioning.remove(processID) }
        if store.isShared && !combined && runtimes[processID]?.secure == nil {
            guard let resolved = await combineShared(processID: processID, takeover: false) else { return }
            action = resolved
        }
        guard let runtime = runtimes[processID] else { return }
        if runtime.sumLacksReports {
            // A committed report is missing from the running sum: reload, which sums every committed diff again; the
            // reloaded cycle, its goal met or its deadline passed, closes on the next tick. Until a reload succeeds,
            // nothing closes without it.
            if await !reload(processID: processID) {
                // Still closing: the next tick tries again.
                runtimes[processID]?.machine.transitionFailed()
                logger.error("the cycle waits for a reload to close", metadata: ["process": "\(processID)"])
            }
            return
        }
        let closing = runtime.machine.cycle
        defer {
            // Closed, or reloaded past it: nothing left to retry.
            if runtimes[processID].map({ $0.machine.cycle != closing || $0.machine.phase == .completed }) ?? true {
                sealedHere.remove(SealKey(processID: processID, cycle: closing))
            }
        }
        var secureMean: [Float]?
        if let secure = runtime.secure, case .aggregate(let cycle, let reports) = action {
            // Under secure aggregation the cycle's end of admission opens the protocol's later stages; the transition
            // comes when the protocol has ended (with the process's lock held by the caller).
            switch secure.stage {
            case .advertiseKeys:
                await closeSecureAdvertisements(processID: processID)
                return
            case .shareKeys, .maskedInput, .consistencyCheck, .unmask:
                return
            case .done:
                guard let result = secure.server.result else { return }
                let minimum = runtime.process.serverConfig.minimumReports
                if runtime.privacy != nil && result.totalSampleCount < minimum {
                    // Distributed DP: fewer noise shares than the guarantee counts on; nothing is published.
                    logger.notice(
                        "secure aggregation abandoned",
                        metadata: [
                            "process": "\(processID)", "cycle": "\(cycle)",
                            "reason": "\(result.totalSampleCount) masked updates carry less noise than minimum_reports \(minimum) of them",
                        ])
                    action = .abandon(cycle: cycle, reports: reports)
                } else {
                    secureMean = result.mean
                    action = .aggregate(cycle: cycle, reports: result.survivors.count)
                }
            case .abandoned:
                logger.notice(
                    "secure aggregation abandoned",
                    metadata: ["process": "\(processID)", "cycle": "\(cycle)", "reason": "\(secure.server.abandonReason ?? "")"])
                action = .abandon(cycle: cycle, reports: reports)
            }
        }
        let now = clock.date
        var transition = runtime.machine.plan(action, now: now)
        let started = ContinuousClock.now
        var robust: RobustAggregate?
        var robustFailure: String?
        if transition.aggregated, let rule = runtime.robust {
            do {
                robust = try await robustDelta(processID: processID, cycle: transition.closedCycle, rule: rule, layout: runtime.layout)
            } catch let error as CoordinatorError where error.code == .invalidConfiguration {
                // The rule is not defined on this cycle's reports (too few for Multi-Krum): abandoned, like a non-finite aggregate.
                robustFailure = error.message
            } catch {
                logger.error(
                    "could not read the cycle's reports for robust aggregation; retrying on the next tick",
                    metadata: ["process": "\(processID)", "error": "\(error)"])
                runtimes[processID]?.machine.transitionFailed()
                return
            }
        }
        var newWeights: [UInt8]?
        var newOptimizer = runtime.optimizer
        var nonFinite = false
        var newLedger: PrivacyLedger?
        if let robustFailure {
            logger.error(
                "robust aggregation is not defined on the cycle's reports; cycle abandoned, the previous checkpoint stays published",
                metadata: ["process": "\(processID)", "cycle": "\(transition.closedCycle)", "reason": "\(robustFailure)"])
            action = .abandon(cycle: transition.closedCycle, reports: runtime.machine.reported)
            transition = runtime.machine.plan(action, now: now)
        }
        if transition.aggregated {
            do {
                let previous = try Safetensors.decode(runtime.checkpointBytes)
                var weights = try runtime.layout.flatten(previous.tensors)
                let delta: [Float]
                var metadata = ModelLayout.carriedMetadata(previous.metadata)
                metadata["orchard.process"] = processID
                metadata["orchard.checkpoint"] = "\(transition.checkpoint)"
                // Under secure aggregation: the unmasked weighted mean (each device weighs 1 under privacy), with frozen
                // tensors reset to zero (their quantised zeros would move them by the rounding noise).
                let secure = secureMean.map { mean -> (mean: [Float], survivors: Int) in
                    (runtime.layout.zeroingFrozen(mean), runtime.secure?.server.result?.totalSampleCount ?? 0)
                }
                if secure != nil { metadata["orchard.secure_aggregation_survivors"] = "\(runtime.secure?.server.result?.survivors.count ?? 0)" }
                if let privacy = runtime.privacy {
                    // DP-FedAvg: the sum of clipped reports (central mode: noised here; distributed mode: already carrying
                    // the devices' noise shares) divided by goal_count; the ledger records the release, and the process
                    // completes when one more would pass target_epsilon.
                    let released = try privacy.mechanism.release(
                        sum: secure.map { s in s.mean.map { Double($0) * Double(s.survivors) } } ?? runtime.sum.sum,
                        reports: secure?.survivors ?? runtime.sum.reports, unclipped: secure == nil ? runtime.sum.unclipped : 0,
                        ledger: privacy.ledger, using: &random
                    )
                    delta = released.mean
                    newLedger = released.ledger
                    metadata["orchard.epsilon"] = "\(released.ledger.epsilon)"
                    metadata["orchard.delta"] = "\(privacy.mechanism.config.delta)"
                    if transition.nextCycle != nil, try !privacy.mechanism.allowsRelease(after: released.ledger) {
                        transition.nextCycle = nil
                        logger.notice(
                            "privacy budget reached: the process completes",
                            metadata: [
                                "process": "\(processID)", "epsilon": "\(released.ledger.epsilon)",
                                "target_epsilon": "\(privacy.mechanism.config.targetEpsilon ?? .infinity)",
                            ])
                    }
                } else if let secure {
                    delta = secure.mean
                } else if let robust, let rule = runtime.robust {
                    delta = robust.delta
                    metadata["orchard.robust_aggregation"] = "\(rule.summary): \(robust.selected.count) of \(robust.reports) reports"
                } else {
                    delta = runtime.sum.mean()
                }
                ServerOptimizer.step(
                    weights: &weights, delta: delta, state: &newOptimizer, config: runtime.process.serverConfig.aggregator, layout: runtime.layout)
                if let entry = runtime.layout.entries.first(where: { entry in weights[entry.offset..<(entry.offset + entry.count)].contains { !$0.isFinite } })
                {
                    nonFinite = true
                    logger.error(
                        "aggregate is not finite; cycle abandoned, the previous checkpoint stays published",
                        metadata: [
                            "process": "\(processID)", "cycle": "\(transition.closedCycle)", "tensor": "\(entry.name)",
                            "aggregator": "\(runtime.process.serverConfig.aggregator.kind)",
                        ])
                } else if !newOptimizer.isFinite {
                    nonFinite = true
                    logger.error(
                        "server optimizer state is not finite; cycle abandoned, the previous checkpoint and state are kept",
                        metadata: [
                            "process": "\(processID)", "cycle": "\(transition.closedCycle)", "aggregator": "\(runtime.process.serverConfig.aggregator.kind)",
                        ])
                } else {
                    newWeights = Safetensors.encode(runtime.layout.records(weights), metadata: metadata)
                }
            } catch {
                logger.error("aggregation failed", metadata: ["process": "\(processID)", "error": "\(error)"])
                runtime.machine.transitionFailed()
                return
            }
        }
        if nonFinite {
            // Nothing non-finite is published: the cycle is abandoned and the next one opens from the same checkpoint.
            transition = runtime.machine.plan(.abandon(cycle: transition.closedCycle, reports: runtime.machine.reported), now: now)
            newOptimizer = runtime.optimizer
            newLedger = nil
        }
        var closure = CycleClosure(
            processID: processID, closedCycle: transition.closedCycle, checkpoint: nil, optimizerState: nil,
            nextCycle: transition.nextCycle.map { StoredCycle(number: $0, checkpoint: transition.checkpoint, openedAt: transition.openedAt) },
            retention: runtime.process.serverConfig.checkpointRetention, closedAt: now,
            carryOverAfter: runtime.machine.carryOverCutoff(at: transition.openedAt)
        )
        if let newWeights {
            closure.checkpoint = (transition.checkpoint, newWeights)
            closure.baseCheckpoint = runtime.process.latestCheckpoint
            closure.optimizerState = newOptimizer.bytes
            if let newLedger {
                do {
                    closure.privacyState = [UInt8](try WireCoding.encoder().encode(newLedger))
                } catch {
                    logger.error("could not encode the privacy ledger", metadata: ["process": "\(processID)", "error": "\(error)"])
                    runtime.machine.transitionFailed()
                    return
                }
            }
        }
        do {
            try await store.closeCycle(closure)
        } catch {
            logger.error("cycle transition not persisted; retrying on the next tick", metadata: ["process": "\(processID)", "error": "\(error)"])
            if let current = runtimes[processID] {
                current.machine.transitionFailed()
            }
            // Built on a checkpoint the store has moved past: what is held here is stale, so the store's state is taken up.
            if (error as? StoreError)?.code == .corrupt { _ = await reload(processID: processID) }
            return
        }
        // The runtime may have been replaced meanwhile (reloaded from the store), which then already reflects the transition.
        guard let current = runtimes[processID], current === runtime else { return }
        current.machine.apply(transition)
        current.sum = RunningSum(count: current.layout.totalCount)
        current.unfolded = []
        current.summedAtLoad = []
        current.bufferStaleness = (0, 0, 0)
        for key in current.previousKeys { processForKey[key] = nil }
        // Buffered: the assignments carried into the next buffer keep their keys.
        let carried = Set(current.machine.assignments.values.map(\.requestKey))
        current.previousKeys = current.currentKeys.subtracting(carried)
        current.currentKeys = carried
        current.secure = freshSecureCycle(current)
        if let newWeights {
            current.checkpointBytes = newWeights
            current.optimizer = newOptimizer
            if let newLedger, let mechanism = current.privacy?.mechanism {
                current.privacy = (mechanism, newLedger)
                metrics.recordPrivacy(process: current.process, ledger: newLedger)
            }
            current.process.latestCheckpoint = transition.checkpoint
            current.process.cyclesCompleted += 1
            scheduleEvaluation(processID: processID, checkpoint: transition.checkpoint, weights: newWeights, model: current.process.model)
            metrics.cyclesAggregated.increment()
            if current.process.serverConfig.evaluation != nil {
                await finalizeSupersededEvaluations(processID: processID)
            }
        } else {
            current.process.cyclesAbandoned += 1
            metrics.cyclesAbandoned.increment()
            if nonFinite { metrics.cyclesAbandonedNonFinite.increment() }
        }
        current.process.completed = transition.nextCycle == nil
        metrics.aggregationSeconds.recordNanoseconds((ContinuousClock.now - started).inNanoseconds)
        metrics.openCycleAssigned.record(0)
        metrics.openCycleReported.record(0)
        switch action {
        case .aggregate(let cycle, let reports) where nonFinite:
            logger.notice("cycle abandoned", metadata: ["process": "\(processID)", "cycle": "\(cycle)", "reports": "\(reports)", "reason": "non_finite"])
        case .aggregate(let cycle, let reports):
            logger.info(
                "cycle aggregated",
                metadata: ["process": "\(processID)", "cycle": "\(cycle)", "reports": "\(reports)", "checkpoint": "\(transition.checkpoint)"])
        case .abandon(let cycle, let reports):
            logger.notice("cycle abandoned", metadata: ["process": "\(processID)", "cycle": "\(cycle)", "reports": "\(reports)"])
        }
    }
}

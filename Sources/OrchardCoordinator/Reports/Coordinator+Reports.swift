import OrchardSupport
import CoreMetrics
import Foundation
import Logging
import OrchardFormats
public import OrchardProtocol
import Synchronization

// The report pipeline: checks in the actor, validation and the durable commit outside it, the fold into the running sum.
extension Coordinator {
    /// Accepts a report held whole in memory (a `ReportEnvelope`); returns only after its contribution is
    /// committed. The same path as an upload (``beginUpload(session:)``) fed one chunk.
    /// - Parameters:
    ///   - body: The safetensors body.
    ///   - session: What the session token proves.
    public nonisolated func report(_ body: [UInt8], session: DeviceSession) async throws(CoordinatorError) -> ReportResponse {
        let upload = try beginUpload(session: session)
        do {
            try await upload.consume(body)
            return try await upload.finish()
        } catch {
            await upload.abandon()
            throw error
        }
    }

    /// Starts receiving a report as it arrives (``ReportUpload``), taking one of the coordinator's
    /// ``CoordinatorConfiguration/maximumUploadsInFlight`` places.
    /// - Throws: `too_many_uploads` with ``CoordinatorConfiguration/uploadRetryAfter`` when every place is taken, or
    ///   the session's worker already holds ``CoordinatorConfiguration/maximumUploadsPerWorker``.
    public nonisolated func beginUpload(session: DeviceSession) throws(CoordinatorError) -> ReportUpload {
        try takeUploadPlace(workerID: session.workerID)
        return ReportUpload(coordinator: self, session: session)
    }

    /// Takes one of the ``CoordinatorConfiguration/maximumUploadsInFlight`` places (a report, or a large
    /// secure-aggregation step such as a masked input) for `workerID`; give it back with ``endUpload(workerID:)``.
    /// - Throws: `too_many_uploads` with ``CoordinatorConfiguration/uploadRetryAfter`` when every place is taken, or
    ///   the worker already holds ``CoordinatorConfiguration/maximumUploadsPerWorker`` (one session cannot take them
    ///   all).
    public nonisolated func takeUploadPlace(workerID: String) throws(CoordinatorError) {
        let limit = configuration.maximumUploadsInFlight
        let perWorker = configuration.maximumUploadsPerWorker
        let refusal = uploadPlaces.withLock { places -> String? in
            guard places.taken < limit else { return "the coordinator is receiving \(limit) reports already" }
            let held = places.byWorker[workerID, default: 0]
            guard held < perWorker else { return "worker \(workerID) is sending \(held) uploads already" }
            places.taken += 1
            places.byWorker[workerID] = held + 1
            metrics.uploadsInFlight.record(places.taken)
            return nil
        }
        if let refusal {
            metrics.uploadsRefusedBusy.increment()
            throw CoordinatorError(
                .tooManyUploads, "\(refusal); retry in \(configuration.uploadRetryAfter.secondsText) s", retryAfter: configuration.uploadRetryAfter.inSeconds)
        }
    }

    /// Gives back an upload's place, taken for `workerID`.
    public nonisolated func endUpload(workerID: String) {
        uploadPlaces.withLock { places in
            places.taken -= 1
            places.givenBack += 1
            let held = places.byWorker[workerID, default: 1] - 1
            places.byWorker[workerID] = held > 0 ? held : nil
            metrics.uploadsInFlight.record(places.taken)
        }
    }

    nonisolated func refused() { metrics.reportsRefused.increment() }

    func beginReport(_ metadata: ReportMetadata, session: DeviceSession) async throws(CoordinatorError) -> ReportTicket {
        try await beginReport(metadata, session: session, caughtUp: false)
    }

    /// ``beginReport(_:session:)``; a buffered report told to wait over a shared store first takes up what the other
    /// instances did (a buffer they released moves its assignment into the next) and decides once more.
    private func beginReport(_ metadata: ReportMetadata, session: DeviceSession, caughtUp: Bool) async throws(CoordinatorError) -> ReportTicket {
        // The metrics go into the cycle history and the dashboard: bounded and named as an evaluation report's are.
        if let failure = WireLimits.metricsFailure(metadata.metrics) {
            metrics.reportsRefused.increment()
            throw CoordinatorError(.invalidRequest, "the report's metrics: \(failure)")
        }
        try await requireKnownWorker(metadata.workerID)
        do throws(CoordinatorError) {
            try await adoptSharedKey(metadata.requestKey)
        } catch {
            metrics.reportsRefused.increment()
            throw error
        }
        let processID: String, runtime: Runtime
        do throws(CoordinatorError) {
            (processID, runtime) = try keyedRuntime(requestKey: metadata.requestKey, session: session)
            if runtime.process.serverConfig.secureAggregation != nil {
                throw CoordinatorError(
                    .aggregationModeMismatch,
                    "process '\(runtime.process.name)' version \(runtime.process.version) uses secure aggregation: devices send masked updates to \(Endpoint.secureAggregation), never a plain report"
                )
            }
        } catch {
            metrics.reportsRefused.increment()
            throw error
        }
        var staleness: Int?
        if let buffer = runtime.process.serverConfig.bufferedAggregation {
            do throws(CoordinatorError) {
                staleness = try Self.staleness(of: metadata, current: runtime.machine.checkpoint, buffer: buffer)
            } catch {
                // A report too stale keeps its assignment: the device's next cycle request is told the latest checkpoint,
                // and it trains again from that.
                metrics.reportsRefused.increment()
                throw error
            }
        }
        switch runtime.machine.beginReport(workerID: metadata.workerID, requestKey: metadata.requestKey, now: clock.date) {
        case .refused(let code, let message):
            metrics.reportsRefused.increment()
            throw CoordinatorError(code, message)
        case .retry(let after, let message):
            if store.isShared && !caughtUp {
                let before = (runtime.machine.cycle, runtime.generation)
                _ = await catchUpShared(processID: processID)
                if let now = runtimes[processID], (now.machine.cycle, now.generation) != before {
                    return try await beginReport(metadata, session: session, caughtUp: true)
                }
            }
            metrics.reportsRefused.increment()
            throw CoordinatorError(.bufferReleasing, message, retryAfter: after)
        case .proceed(let cycle):
            let server = runtime.process.serverConfig
            return ReportTicket(
                processID: processID, cycle: cycle, layout: runtime.layout, maximumSampleCount: server.maximumSampleCount,
                updateNormBound: server.updateNormBound, updateNormPolicy: server.updateNormPolicy,
                privacyClippingNorm: runtime.privacy.flatMap { $0.mechanism.serverClippingNorm($0.ledger) },
                localNormCeiling: runtime.privacy?.mechanism.localNormCeiling(dimension: runtime.layout.trainableCount),
                requestKey: metadata.requestKey, generation: runtime.generation, staleness: staleness,
                releaseLimit: server.bufferedAggregation.map { _ in runtime.machine.configuration.goalCount },
                foldScale: Runtime.foldScale(staleness: staleness, server: server),
                finishBy: runtime.machine.reportDeadline(workerID: metadata.workerID).addingTimeInterval(configuration.reportUploadGrace.inSeconds)
            )
        }
    }

    /// A buffered report's staleness: checkpoints published since the one it says it trained from.
    /// - Throws: `invalid_request` without a checkpoint or with one not yet published; `report_too_stale` past
    ///   `max_staleness`.
    static func staleness(of metadata: ReportMetadata, current: Int, buffer: BufferedAggregationConfig) throws(CoordinatorError) -> Int {
        guard let trained = metadata.checkpoint else {
            throw CoordinatorError(
                .invalidRequest, "a report to a buffered process must say which checkpoint it trained from (checkpoint in the report's metadata)")
        }
        guard (0...current).contains(trained) else {
            throw CoordinatorError(.invalidRequest, "checkpoint \(trained) is not one the process has published (the latest is \(current))")
        }
        let staleness = current - trained
        if staleness > buffer.maxStaleness {
            throw CoordinatorError(
                .reportTooStale,
                "the report trained from checkpoint \(trained), \(staleness) checkpoints ago; this process takes reports at most \(buffer.maxStaleness) old (max_staleness): check in again for the latest checkpoint"
            )
        }
        return staleness
    }

    /// Reloads a process from the store after its in-memory state could not be kept in step with it; returns
    /// whether it was reloaded.
    func reload(processID: String) async -> Bool {
        // Concurrent callers share one reload: a second would replace the runtime the first handed out.
        if let running = reloading[processID] { return await running.value }
        let task = Task { await self.reloadNow(processID: processID) }
        reloading[processID] = task
        let reloaded = await task.value
        reloading[processID] = nil
        return reloaded
    }

    private func reloadNow(processID: String) async -> Bool {
        do {
            let processes = try await store.processes()
            guard let process = processes.first(where: { $0.id == processID }) else {
                // Deleted through another instance, and perhaps hosted again under its name and version there: that one
                // is taken up now, so the name is not answered unknown meanwhile.
                let old = runtimes[processID]?.process
                forget(processID: processID)
                if let old, let successor = processes.first(where: { $0.name == old.name && $0.version == old.version }), runtimes[successor.id] == nil {
                    processLookup.forget(.nameVersion(old.name, old.version))
                    do { try await load(successor) } catch {
                        logger.error("could not load a process hosted again elsewhere", metadata: ["process": "\(successor.id)", "error": "\(error)"])
                    }
                }
                return false
            }
            try await load(process)
            return true
        } catch {
            logger.error("could not reload a process from the store", metadata: ["process": "\(processID)", "error": "\(error)"])
            return false
        }
    }

    func abortReport(_ ticket: ReportTicket, workerID: String) async {
        metrics.reportsRefused.increment()
        guard let runtime = runtimes[ticket.processID], runtime.machine.cycle == ticket.cycle else { return }
        let action = runtime.machine.abortReport(workerID: workerID)
        if let action { await perform(action, processID: ticket.processID) }
    }

    /// Sets ``reportRecordedHook`` (tests).
    func setReportRecordedHook(_ hook: (@Sendable (String) async -> Void)?) { reportRecordedHook = hook }

    /// Counts a committed report (`folded`: committed into this instance's partial sum, which the running sum then holds;
    /// `storeReported`: the reports of the cycle the store held at every instance right after it, when known).
    func commitReport(
        _ ticket: ReportTicket, workerID: String, sampleCount: Int, unclipped: Bool, diff: any StagedDiff, folded: Bool = false, storeReported: Int? = nil
    ) async -> ReportResponse {
        if let hook = reportRecordedHook { await hook(ticket.processID) }
        metrics.reportsAccepted.increment()
        guard let runtime = runtimes[ticket.processID], runtime.machine.cycle == ticket.cycle else {
            // The process was deleted while the report was committed; it was still acknowledged by the store.
            return ReportResponse(cycle: ticket.cycle, reportsReceived: 0, retryAfter: 0)
        }
        // Reloaded from the store while the report was committed: the new state was read before the commit or after it.
        // Read after, it holds the report (its diff among the pending ones folded in, its assignment reported); read
        // before, it lacks both. Either way the report counts once.
        let reloaded = runtime.generation != ticket.generation
        // Whether the reload summed it, whatever a fold since then did to `unfolded`.
        let alreadySummed = reloaded && runtime.summedAtLoad.contains(workerID)
        var summed = false
        do throws(StoreError) {
            // A robust rule reads every report back from the store when the cycle closes; nothing is summed here.
            if runtime.robust == nil && !alreadySummed && !folded {
                try runtime.sum.add(diff, weight: runtime.foldWeight(sampleCount: sampleCount), scale: ticket.foldScale, unclipped: unclipped)
                summed = true
            }
        } catch {
            // The report is committed in the store but could not be read back into the running sum: reload the
            // process from the store, which folds every committed diff again.
            logger.error("could not read a committed diff back", metadata: ["process": "\(ticket.processID)", "error": "\(error)"])
            if await reload(processID: ticket.processID) {
                let received = runtimes[ticket.processID]?.machine.reported ?? 0
                return ReportResponse(cycle: ticket.cycle, reportsReceived: received, retryAfter: 0)
            }
            // The store could not be read either: the report counts as received, and the cycle is reloaded before it
            // closes (``perform(_:processID:combined:)``), so the aggregate holds it.
            runtime.sumLacksReports = true
            logger.error(
                "the running sum lacks a committed report; the process is reloaded before its cycle closes",
                metadata: ["process": "\(ticket.processID)", "worker": "\(workerID)"])
        }
        // Only a diff the sum holds is folded (and so forgotten by the store); one it lacks stays for recovery.
        if summed { runtime.unfolded.append(workerID) }
        if let staleness = ticket.staleness, !alreadySummed {
            runtime.bufferStaleness.sum += staleness
            runtime.bufferStaleness.count += 1
            runtime.bufferStaleness.max = max(runtime.bufferStaleness.max, staleness)
            metrics.reportStaleness.record(staleness)
        }
        var action =
            reloaded
            ? runtime.machine.synchronize(with: [CycleStateMachine.Assignment(workerID: workerID, requestKey: ticket.requestKey, state: .reported)])
            : runtime.machine.commitReport(workerID: workerID)
        if action == nil && store.isShared {
            // The goal counts reports at every instance: the count the commit returned, or one read now.
            action = await goalReachedShared(processID: ticket.processID, cycle: ticket.cycle, reported: storeReported)
        }
        let received = runtime.machine.reported
        var retryAfter = runtime.machine.nextCycleExpected(now: clock.date, jitter: Double.random(in: 0...1, using: &random))
        metrics.openCycleReported.record(received)
        let fold: (sum: [UInt8], weight: Double, reports: Int, unclipped: Int, workers: [String])?
        if action == nil && !folded && !runtime.folding && runtime.unfolded.count >= configuration.foldInterval {
            runtime.folding = true
            fold = (runtime.sum.bytes, runtime.sum.weight, runtime.sum.reports, runtime.sum.unclipped, runtime.unfolded)
        } else {
            fold = nil
        }
        var closed = false
        if let action {
            await perform(action, processID: ticket.processID)
            // Closed when the transition went through: the process moved past the report's cycle (or finished).
            closed = runtimes[ticket.processID].map { $0.machine.cycle != ticket.cycle } ?? true
            // This report closed the cycle and the next one is open: the device may ask for it at once.
            if closed { retryAfter = 0 }
        } else if let fold {
            do {
                try await store.foldReports(
                    processID: ticket.processID, cycle: ticket.cycle, instance: foldInstance,
                    sum: StoredPartialSum(bytes: fold.sum, weight: fold.weight, reports: fold.reports, unclipped: fold.unclipped), workers: fold.workers
                )
                if let current = runtimes[ticket.processID], current.machine.cycle == ticket.cycle {
                    let folded = Set(fold.workers)
                    current.unfolded.removeAll { folded.contains($0) }
                }
                runtime.folding = false
            } catch {
                runtime.folding = false
                // The diffs stay in the store and are folded again on recovery; nothing is lost.
                logger.warning("could not write the running sum", metadata: ["process": "\(ticket.processID)", "error": "\(error)"])
            }
        }
        return ReportResponse(cycle: ticket.cycle, reportsReceived: received, retryAfter: retryAfter, cycleClosed: closed)
    }
}

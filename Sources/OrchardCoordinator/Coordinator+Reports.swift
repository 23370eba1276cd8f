public import OrchardSupport
import CoreMetrics
import Foundation
public import Logging
import OrchardFormats
public import OrchardProtocol
import Synchronization

// The report pipeline: checks in the actor, validation and the durable commit outside it, the fold into the running sum.
extension Coordinator {
    /// Accepts a report (a ``ReportEnvelope``); returns only after its contribution is committed.
    /// - Parameters:
    ///   - body: The safetensors body.
    ///   - session: What the session token proves.
    public nonisolated func report(_ body: [UInt8], session: DeviceSession) async throws(CoordinatorError) -> ReportResponse {
        let index: SafetensorsIndex
        do throws(FormatError) {
            index = try Safetensors.index(body)
        } catch {
            await refused()
            if error.code == .dtypeMismatch || error.code == .unsupportedDType {
                throw CoordinatorError(.dtypeMismatch, error.message)
            }
            throw CoordinatorError(.malformedSafetensors, error.message)
        }
        let metadata: ReportMetadata
        do throws(FormatError) {
            metadata = try ReportEnvelope.metadata(in: index.metadata)
        } catch {
            await refused()
            throw CoordinatorError(.invalidRequest, error.message)
        }
        guard metadata.workerID == session.workerID else {
            await refused()
            throw CoordinatorError(.forbidden, "the session token belongs to another worker")
        }
        let ticket = try await beginReport(metadata, session: session)
        var flat: [UInt8]
        do throws(CoordinatorError) {
            guard (1...ticket.maximumSampleCount).contains(metadata.sampleCount) else {
                throw CoordinatorError(.invalidSampleCount, "sample_count \(metadata.sampleCount) is not in 1...\(ticket.maximumSampleCount)")
            }
            flat = try ticket.layout.flattenBytes(index, in: body)
            try ticket.layout.checkDiff(bytes: flat)
            try Self.boundNorm(of: &flat, ticket: ticket, metrics: metrics)
        } catch {
            await abortReport(ticket, workerID: metadata.workerID)
            throw error
        }
        let metricsJSON = (try? WireCoding.encoder().encode(metadata.metrics)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
        let record = ReportRecord(
            processID: ticket.processID, cycle: ticket.cycle, workerID: metadata.workerID, requestKey: metadata.requestKey,
            sampleCount: metadata.sampleCount, metricsJSON: metricsJSON, diff: flat
        )
        let started = ContinuousClock.now
        do {
            try await store.recordReport(record)
        } catch {
            await abortReport(ticket, workerID: metadata.workerID)
            if let storeError = error as? StoreError, storeError.code == .cycleClosed {
                throw CoordinatorError(.deadlinePassed, "cycle \(ticket.cycle) closed before the report was committed")
            }
            if let storeError = error as? StoreError, storeError.code == .duplicate {
                throw CoordinatorError(.reportAlreadyReceived, storeError.message)
            }
            throw await storeFailure(error, "commit the report")
        }
        metrics.reportCommitSeconds.recordNanoseconds((ContinuousClock.now - started).inNanoseconds)
        metrics.reportBytes.increment(by: body.count)
        return await commitReport(ticket, workerID: metadata.workerID, sampleCount: metadata.sampleCount, diff: flat)
    }

    func refused() { metrics.reportsRefused.increment() }

    /// Applies the process's update norm bound to a checked flat diff: nothing when no bound is set or the diff is
    /// within it; otherwise scales the diff down to the bound (`clip`) or refuses it (`reject`).
    static func boundNorm(of flat: inout [UInt8], ticket: ReportTicket, metrics: CoordinatorMetrics) throws(CoordinatorError) {
        guard let bound = ticket.updateNormBound else { return }
        let norm = ticket.layout.l2Norm(bytes: flat)
        guard norm > bound else { return }
        switch ticket.updateNormPolicy {
        case .reject:
            throw CoordinatorError(.updateNormExceeded, "the diff's L2 norm \(norm) exceeds server_config.update_norm_bound \(bound)")
        default:
            ticket.layout.scale(bytes: &flat, by: bound / norm)
            metrics.reportsClipped.increment()
        }
    }

    func beginReport(_ metadata: ReportMetadata, session: DeviceSession) async throws(CoordinatorError) -> ReportTicket {
        try await requireKnownWorker(metadata.workerID)
        let processID: String, runtime: Runtime
        do throws(CoordinatorError) {
            (processID, runtime) = try keyedRuntime(requestKey: metadata.requestKey, session: session)
        } catch {
            metrics.reportsRefused.increment()
            throw error
        }
        switch runtime.machine.beginReport(workerID: metadata.workerID, requestKey: metadata.requestKey, now: clock.date) {
        case .refused(let code, let message):
            metrics.reportsRefused.increment()
            switch code {
            case .invalidRequestKey: throw CoordinatorError(code, message)
            default: throw CoordinatorError(code, message)
            }
        case .proceed(let cycle):
            let server = runtime.process.serverConfig
            return ReportTicket(
                processID: processID, cycle: cycle, layout: runtime.layout, maximumSampleCount: server.maximumSampleCount,
                updateNormBound: server.updateNormBound, updateNormPolicy: server.updateNormPolicy
            )
        }
    }

    func abortReport(_ ticket: ReportTicket, workerID: String) async {
        metrics.reportsRefused.increment()
        guard let runtime = runtimes[ticket.processID], runtime.machine.cycle == ticket.cycle else { return }
        let action = runtime.machine.abortReport(workerID: workerID)
        if let action { await perform(action, processID: ticket.processID) }
    }

    func commitReport(_ ticket: ReportTicket, workerID: String, sampleCount: Int, diff: [UInt8]) async -> ReportResponse {
        metrics.reportsAccepted.increment()
        guard let runtime = runtimes[ticket.processID], runtime.machine.cycle == ticket.cycle else {
            // The process was deleted while the report was committed; it was still acknowledged by the store.
            return ReportResponse(cycle: ticket.cycle, reportsReceived: 0, retryAfter: 0)
        }
        runtime.sum.add(bytes: diff, weight: Double(sampleCount))
        runtime.unfolded.append(workerID)
        let action = runtime.machine.commitReport(workerID: workerID)
        let received = runtime.machine.reported
        let retryAfter = max(0, runtime.machine.deadline.timeIntervalSince(clock.date)).rounded(.up)
        metrics.openCycleReported.record(received)
        let fold: (sum: [UInt8], weight: Double, reports: Int, workers: [String])?
        if action == nil && !runtime.folding && runtime.unfolded.count >= configuration.foldInterval {
            runtime.folding = true
            fold = (runtime.sum.bytes, runtime.sum.weight, runtime.sum.reports, runtime.unfolded)
        } else {
            fold = nil
        }
        var closed = false
        if let action {
            await perform(action, processID: ticket.processID)
            // Closed when the transition went through: the process moved past the report's cycle (or finished).
            closed = runtimes[ticket.processID].map { $0.machine.cycle != ticket.cycle } ?? true
        } else if let fold {
            do {
                try await store.foldReports(processID: ticket.processID, cycle: ticket.cycle, sum: fold.sum, weight: fold.weight, reports: fold.reports, workers: fold.workers)
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

import CoreMetrics
import Foundation
import Logging
import OrchardSupport
import OrchardFormats
public import OrchardProtocol

/// A report being received (``Coordinator/beginUpload(session:)``): fed the body's bytes as they arrive
/// (``consume(_:)``), then ``finish()`` or, if the body never completes, ``abandon()``.
///
/// The header is checked and the report admitted (worker, request key, open cycle, sample count) as soon as the
/// header is in, before any tensor data is read; each data byte is then checked and written straight to the store's
/// staged diff, so memory per upload is O(header + chunk), whatever the model's size. The norm bound is applied
/// and the report committed at ``finish()``. One task drives an upload; it is not shared.
public final class ReportUpload {
    private let coordinator: Coordinator
    private let session: DeviceSession
    private var stream: ReportStream
    private var received = 0
    private var metadata: ReportMetadata?
    private var ticket: Coordinator.ReportTicket?
    private var staged: (any StagedDiff)?
    /// Whether the upload ended (finished, refused or abandoned) and gave back its place.
    private var ended = false

    init(coordinator: Coordinator, session: DeviceSession) {
        self.coordinator = coordinator
        self.session = session
        // The announced header length is refused before any of the header is read if it exceeds either limit.
        let limits = coordinator.configuration
        stream = ReportStream(maximumHeaderBytes: min(Safetensors.maximumHeaderSize, limits.maximumReportBytes, limits.maximumReportHeaderBytes))
    }

    deinit {
        // A dropped upload (its task cancelled) still gives back its place and its file.
        guard !ended else { return }
        staged?.discard()
        // The place goes back once the admission is undone: a free place means the device may report again.
        if let ticket, let workerID = metadata?.workerID {
            let coordinator = coordinator
            let holder = session.workerID
            Task {
                await coordinator.abortReport(ticket, workerID: workerID)
                coordinator.endUpload(workerID: holder)
            }
        } else {
            coordinator.endUpload(workerID: session.workerID)
        }
    }

    /// Takes the next bytes of the body.
    /// - Throws: The report's refusal (the upload is then over and cleaned up): `payload_too_large`,
    ///   `malformed_safetensors`, `invalid_request`, `forbidden`, the admission's codes, `tensor_mismatch`,
    ///   `shape_mismatch`, `dtype_mismatch`, `non_finite_values`, `frozen_tensor_changed`, `invalid_sample_count`.
    public func consume(_ bytes: some Collection<UInt8>) async throws(CoordinatorError) {
        precondition(!ended, "consume after the upload ended")
        let limit = coordinator.configuration.maximumReportBytes
        received += bytes.count
        guard received <= limit else {
            throw await fail(CoordinatorError(.payloadTooLarge, "body exceeds the limit of \(limit) bytes"))
        }
        let consumed: Int
        switch takeBytes(bytes) {
        case .success(let count): consumed = count
        case .failure(let error): throw await fail(error)
        }
        if stream.header != nil && ticket == nil {
            // The header just completed: admit the report, then take the rest of the chunk as data.
            try await admit()
        }
        try await requireInTime()
        guard consumed < bytes.count else { return }
        if case .failure(let error) = takeBytes(bytes.dropFirst(consumed)) {
            throw await fail(error)
        }
    }

    /// Refuses an admitted upload still arriving past its ticket's ``Coordinator/ReportTicket/finishBy``.
    private func requireInTime() async throws(CoordinatorError) {
        guard let ticket, coordinator.clock.date > ticket.finishBy else { return }
        let grace = coordinator.configuration.reportUploadGrace.inSeconds
        throw await fail(
            CoordinatorError(.deadlinePassed, "the report was still arriving \(grace) s after its time to report ended (cycle \(ticket.cycle))"))
    }

    /// ``take(_:)`` over any collection of bytes (copied only if not contiguous).
    private func takeBytes(_ bytes: some Collection<UInt8>) -> Result<Int, CoordinatorError> {
        bytes.withContiguousStorageIfAvailable { buffer in Result { () throws(CoordinatorError) in try take(UnsafeRawBufferPointer(buffer)) } }
            ?? Array(bytes).withUnsafeBytes { raw in Result { () throws(CoordinatorError) in try take(raw) } }
    }

    /// Completes the report: every tensor's bytes arrived, the norm bound holds (or the diff is clipped to it),
    /// and the report is committed; returns only then.
    public func finish() async throws(CoordinatorError) -> ReportResponse {
        precondition(!ended, "finish after the upload ended")
        if stream.header != nil && ticket == nil { try await admit() }
        try await requireInTime()
        do throws(CoordinatorError) {
            try stream.finish()
        } catch {
            throw await fail(error)
        }
        guard let ticket, let metadata, let staged else {
            throw await fail(.internalError("a complete report was never admitted"))
        }
        let metrics = coordinator.metrics
        let norm = stream.sumOfSquares.squareRoot()
        /// Scales the staged diff down to `bound`.
        func clip(to bound: Double) async throws(CoordinatorError) {
            do throws(StoreError) {
                try Self.scale(staged, count: ticket.layout.totalCount, by: bound / norm)
            } catch {
                throw await fail(.internalError("could not clip the diff: \(error.message)"))
            }
            metrics.reportsClipped.increment()
        }
        // Under central differential privacy every report is clipped to the cycle's bound; whether it was already
        // within it is counted for adaptive clipping.
        var unclipped = false
        if let bound = ticket.privacyClippingNorm {
            unclipped = norm <= bound
            if !unclipped { try await clip(to: bound) }
        }
        if let ceiling = ticket.localNormCeiling, norm > ceiling {
            throw await fail(
                CoordinatorError(
                    .updateNormExceeded,
                    "the diff's L2 norm \(norm) exceeds \(ceiling), more than a report clipped to server_config.privacy.clipping_norm and noised as the plan says can have"
                ))
        }
        if let bound = ticket.updateNormBound, norm > bound {
            switch ticket.updateNormPolicy {
            case .reject:
                throw await fail(CoordinatorError(.updateNormExceeded, "the diff's L2 norm \(norm) exceeds server_config.update_norm_bound \(bound)"))
            default:
                try await clip(to: bound)
            }
        }
        var recorded = metadata.metrics
        // Buffered: the cycle history's metrics carry each release's mean staleness (the coordinator's, not the device's).
        if let staleness = ticket.staleness { recorded["staleness"] = Double(staleness) }
        let metricsJSON = (try? WireCoding.encoder().encode(recorded)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
        let record = ReportRecord(
            processID: ticket.processID, cycle: ticket.cycle, workerID: metadata.workerID, requestKey: metadata.requestKey,
            sampleCount: metadata.sampleCount, metricsJSON: metricsJSON, unclipped: unclipped, instance: coordinator.foldInstance,
            staleness: ticket.staleness, releaseLimit: ticket.releaseLimit
        )
        let started = ContinuousClock.now
        let folded = await coordinator.foldsAtCommit(processID: ticket.processID)
        var storeReported: Int?
        do {
            if folded {
                storeReported = try await coordinator.recordFolded(record, ticket: ticket, diff: staged)
            } else {
                try await coordinator.store.recordReport(record, diff: staged)
            }
        } catch {
            let refusal: CoordinatorError
            if let storeError = error as? StoreError, storeError.code == .cycleClosed {
                if !(await coordinator.confirmShared(processID: ticket.processID)) {
                    refusal = CoordinatorError(.unknownProcess, "the process of this report is no longer hosted")
                } else if ticket.staleness != nil {
                    // Buffered: another instance published the buffer meanwhile; the assignment moved into the next one.
                    // Taken up now, so the device's report sent again a moment later is admitted into that buffer here.
                    _ = await coordinator.catchUpShared(processID: ticket.processID)
                    refusal = CoordinatorError(
                        .bufferReleasing, "buffer \(ticket.cycle) was published before the report was committed; send it again", retryAfter: 1)
                } else {
                    refusal = CoordinatorError(.deadlinePassed, "cycle \(ticket.cycle) closed before the report was committed")
                }
            } else if let storeError = error as? StoreError, storeError.code == .duplicate {
                refusal = CoordinatorError(.reportAlreadyReceived, storeError.message)
            } else {
                refusal = await coordinator.storeFailure(error, "commit the report")
            }
            throw await fail(refusal)
        }
        metrics.reportCommitSeconds.recordNanoseconds((ContinuousClock.now - started).inNanoseconds)
        metrics.reportBytes.increment(by: received)
        ended = true
        coordinator.endUpload(workerID: session.workerID)
        return await coordinator.commitReport(
            ticket, workerID: metadata.workerID, sampleCount: metadata.sampleCount, unclipped: unclipped, diff: staged, folded: folded,
            storeReported: storeReported)
    }

    /// Ends an upload whose body will not complete (the device went away, or a refusal from outside): its staged
    /// diff is deleted, its admission undone, its place given back. Does nothing if the upload already ended.
    public func abandon() async {
        guard !ended else { return }
        _ = await fail(CoordinatorError(.invalidRequest, "the upload was abandoned"))
    }

    /// Takes bytes of the header, or of the data once admitted; returns how many were taken (fewer than given
    /// only when the header completed inside them and the report is not yet admitted).
    private func take(_ chunk: UnsafeRawBufferPointer) throws(CoordinatorError) -> Int {
        if stream.header == nil {
            var rest = chunk
            do throws(CoordinatorError) {
                guard try stream.gatherHeader(&rest) != nil else { return chunk.count }
            } catch {
                coordinator.refused()
                throw error
            }
            return chunk.count - rest.count
        }
        guard let staged else { return 0 }
        try stream.consume(chunk) { bytes, offset throws(StoreError) in try staged.write(bytes, at: offset) }
        return chunk.count
    }

    /// Checks the complete header's metadata and admits the report (the coordinator's checks, then the layout's),
    /// staging its diff.
    private func admit() async throws(CoordinatorError) {
        guard let header = stream.header else { return }
        let metadata: ReportMetadata
        do throws(FormatError) {
            metadata = try ReportEnvelope.metadata(in: header.index.metadata)
        } catch {
            coordinator.refused()
            throw await fail(CoordinatorError(.invalidRequest, error.message))
        }
        guard metadata.workerID == session.workerID else {
            coordinator.refused()
            throw await fail(CoordinatorError(.forbidden, "the session token belongs to another worker"))
        }
        self.metadata = metadata
        let ticket: Coordinator.ReportTicket
        do throws(CoordinatorError) {
            ticket = try await coordinator.beginReport(metadata, session: session)
        } catch {
            throw await fail(error)
        }
        self.ticket = ticket
        do throws(CoordinatorError) {
            guard (1...ticket.maximumSampleCount).contains(metadata.sampleCount) else {
                throw CoordinatorError(.invalidSampleCount, "sample_count \(metadata.sampleCount) is not in 1...\(ticket.maximumSampleCount)")
            }
            try stream.place(header, in: ticket.layout)
            do throws(StoreError) {
                staged = try coordinator.store.stageDiff(processID: ticket.processID, cycle: ticket.cycle, requestKey: metadata.requestKey)
            } catch {
                throw await coordinator.storeFailure(error, "stage the report")
            }
        } catch {
            throw await fail(error)
        }
    }

    /// Ends the upload after a refusal: undoes the admission, deletes the staged diff, gives back the place.
    private func fail(_ error: CoordinatorError) async -> CoordinatorError {
        guard !ended else { return error }
        ended = true
        // The server's own failures (a spool file it cannot write, a full disk) are logged; the device is told only
        // that the report could not be stored, not the coordinator's paths or system errors.
        var error = error
        if error.code == .internalError {
            coordinator.logger.error("report upload failed", metadata: ["error": "\(error.message)"])
            error = .internalError("the coordinator could not store the report; send it again")
        }
        staged?.discard()
        if let ticket, let workerID = metadata?.workerID {
            await coordinator.abortReport(ticket, workerID: workerID)
        }
        // Given back after the admission is undone, so a free place means the device may report again.
        coordinator.endUpload(workerID: session.workerID)
        return error
    }

    /// Multiplies every value of a staged diff by `factor`, in blocks.
    private static func scale(_ diff: any StagedDiff, count: Int, by factor: Double) throws(StoreError) {
        let block = 1 << 18
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(4, min(block, count) * 4), alignment: 4)
        defer { buffer.deallocate() }
        var start = 0
        while start < count {
            let n = min(block, count - start)
            let slice = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<(n * 4)])
            try diff.read(into: slice, at: start * 4)
            for i in 0..<n {
                let value = Float(bitPattern: UInt32(littleEndian: slice.load(fromByteOffset: i * 4, as: UInt32.self)))
                slice.storeBytes(of: Float(Double(value) * factor).bitPattern.littleEndian, toByteOffset: i * 4, as: UInt32.self)
            }
            try diff.write(UnsafeRawBufferPointer(slice), at: start * 4)
            start += n
        }
    }
}

import Logging

/// A report waiting for the next folded commit of its process (``Coordinator/recordFolded(_:ticket:diff:)``).
struct FoldedReport: Sendable {
    let record: ReportRecord
    let ticket: Coordinator.ReportTicket
    let diff: any StagedDiff
    /// What the diff adds to the sum: its fold weight, its staleness scale, and whether it was within the clipping bound.
    let weight: Double
    let scale: Double
    let continuation: CheckedContinuation<Int?, any Error>
}

/// A process's reports waiting for its next folded commit, and their sum (read as each arrived, while the batch
/// before was committing).
/// A class, mutated in place on the coordinator's actor: as a value in a dictionary every report would copy the sum.
final class FoldQueue {
    var items: [FoldedReport] = []
    var delta: RunningSum

    init(count: Int) { delta = RunningSum(count: count) }
}

extension Coordinator {
    /// Whether a report to `processID` is committed folded into this instance's partial sum
    /// (``FoldingStore/recordFoldedReports(_:base:forgetting:fold:)``) rather than stored as a diff of its own: over a
    /// folding store, for a process summed as reports come (not a robust rule's) whose running sum holds every report
    /// committed here.
    func foldsAtCommit(processID: String) -> Bool {
        guard store is any FoldingStore, let runtime = runtimes[processID] else { return false }
        return runtime.robust == nil && !runtime.sumLacksReports
    }

    /// Commits a report folded into this instance's partial sum, in one transaction with the reports to the same process
    /// that arrive while the one before is committing (a group commit: a burst of reports writes the sum a few times,
    /// not once per report). Returns once the report is durable, with the reports of the cycle the store then held at
    /// every instance (nil when unknown); throws the store's refusal of it (or of the batch). The staged diff is read
    /// into the sum and discarded.
    func recordFolded(_ record: ReportRecord, ticket: ReportTicket, diff: any StagedDiff) async throws -> Int? {
        let processID = ticket.processID
        guard let runtime = runtimes[processID] else { throw StoreError(.cycleClosed, "process '\(processID)' is no longer hosted here") }
        let weight = runtime.foldWeight(sampleCount: record.sampleCount)
        let count = runtime.layout.totalCount
        // Read into the waiting reports' sum now, so that a batch's commit has only to add it to the running sum.
        let draining = foldQueues[processID] != nil
        let queue = foldQueues[processID] ?? FoldQueue(count: count)
        try queue.delta.add(diff, weight: weight, scale: ticket.foldScale, unclipped: record.unclipped)
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Int?, any Error>) in
            queue.items.append(
                FoldedReport(record: record, ticket: ticket, diff: diff, weight: weight, scale: ticket.foldScale, continuation: continuation))
            foldQueues[processID] = queue
            if !draining { Task { await self.drainFolds(processID: processID) } }
        }
    }

    /// Commits the process's waiting reports, batch after batch, until none is waiting.
    private func drainFolds(processID: String) async {
        while let queue = foldQueues[processID], !queue.items.isEmpty {
            foldQueues[processID] = FoldQueue(count: queue.delta.sum.count)
            await commitFolded(queue, processID: processID)
        }
        foldQueues[processID] = nil
    }

    /// Commits one batch and answers each of its reports.
    private func commitFolded(_ queue: FoldQueue, processID: String) async {
        let batch = queue.items
        defer { for item in batch { item.diff.discard() } }
        guard let store = store as? any FoldingStore, let runtime = runtimes[processID] else {
            for item in batch { item.continuation.resume(throwing: StoreError(.cycleClosed, "process '\(processID)' is no longer hosted here")) }
            return
        }
        let cycle = runtime.machine.cycle
        let limit = batch.first { $0.ticket.cycle == cycle }?.ticket.releaseLimit
        var current: [FoldedReport] = []
        for item in batch {
            // A report of a cycle this instance has since closed (or seen closed) is refused as the store would refuse it.
            if item.ticket.cycle == cycle && item.ticket.releaseLimit == limit {
                current.append(item)
            } else {
                item.continuation.resume(throwing: StoreError(.cycleClosed, "cycle \(item.ticket.cycle) of process '\(processID)' is closed"))
            }
        }
        guard !current.isEmpty else { return }
        let generation = runtime.generation
        let base = runtime.sum
        // Diffs this instance summed from the store at its last load and has not written into its partial sum since:
        // the new sum holds them, so the store forgets them in the same transaction.
        let forgetting = runtime.unfolded
        let folds = current.map { (weight: $0.weight, scale: $0.scale, unclipped: $0.record.unclipped) }
        let diffs = current.map(\.diff)
        let whole = current.count == batch.count ? queue.delta : nil
        let count = base.sum.count
        /// What the reports at `accepted` add to the sum, in order (the waiting reports' sum when all of them are).
        @Sendable func delta(_ accepted: [Int]) throws(StoreError) -> RunningSum {
            if let whole, accepted.count == folds.count { return whole }
            var delta = RunningSum(count: count)
            for index in accepted {
                try delta.add(diffs[index], weight: folds[index].weight, scale: folds[index].scale, unclipped: folds[index].unclipped)
            }
            return delta
        }
        let outcomes: [Result<Void, StoreError>]
        let reported: Int?
        do {
            (outcomes, reported) = try await store.recordFoldedReports(
                current.map(\.record), base: base.reports - forgetting.count, forgetting: forgetting
            ) { accepted in
                // The running sum gets the same delta after the commit, added the same way, so the two stay equal bit for bit.
                var sum = base
                sum.add(try delta(accepted))
                return StoredPartialSum(bytes: sum.bytes, weight: sum.weight, reports: sum.reports, unclipped: sum.unclipped)
            }
        } catch {
            if let storeError = error as? StoreError, storeError.code == .corrupt {
                // The running sum and the stored partial sum disagree: the store's is the truth.
                logger.error(
                    "the running sum disagrees with the stored partial sum; reloading the process", metadata: ["process": "\(processID)", "error": "\(error)"])
                _ = await reload(processID: processID)
            }
            for item in current { item.continuation.resume(throwing: error) }
            return
        }
        if let now = runtimes[processID], now.machine.cycle == cycle {
            let forgotten = Set(forgetting)
            now.unfolded.removeAll { forgotten.contains($0) }
            // Reloaded (or combined) while the batch committed, the load read the store before the commit or after it: a
            // report it found reported is in its sum already, one it did not is added now.
            let reloaded = now.generation != generation
            let accepted = outcomes.indices.filter {
                (try? outcomes[$0].get()) != nil && !(reloaded && now.summedAtLoad.contains(current[$0].record.workerID))
            }
            do throws(StoreError) {
                now.sum.add(try delta(accepted))
            } catch {
                now.sumLacksReports = true
                logger.error(
                    "the running sum lacks committed reports; the process is reloaded before its cycle closes",
                    metadata: ["process": "\(processID)", "error": "\(error)"])
            }
        }
        for (item, outcome) in zip(current, outcomes) { item.continuation.resume(with: outcome.map { reported }.mapError { $0 as any Error }) }
    }
}

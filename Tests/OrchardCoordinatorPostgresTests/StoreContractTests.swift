import Foundation
import OrchardCoordinator
import OrchardProtocol
import Synchronization
import Testing

/// The ``CoordinatorStore`` contract, run against every store: SQLite always, PostgreSQL when `ORCHARD_POSTGRES_URL`
/// names a server (see ``TestDatabase``). With PostgreSQL, `peer` is a second store instance on the same database, as
/// a second coordinator instance would hold.
@Suite struct StoreContractTests {
    typealias F = ContractFixture

    /// Shows why PostgreSQL cases are missing (skipped with the reason), and fails clearly when the server is
    /// configured or required but cannot be used.
    @Test("PostgreSQL cases run", TestDatabase.requirement)
    func postgresIsAvailable() async throws {
        try await TestDatabase.withDatabase { _ in }
    }

    // MARK: Processes, checkpoints, state

    @Test(arguments: StoreKind.underTest)
    func processesAreCreatedListedAndDeleted(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            #expect(try await store.processes().isEmpty)
            try await F.host(store)
            try await F.host(store, id: "q", name: "tiny", version: SemanticVersion(1, 1))

            let listed = try await stores.peer.processes()
            #expect(listed.map(\.id) == ["p", "q"])
            let first = try #require(listed.first)
            #expect(first == F.process())
            #expect(first.createdAt == F.epoch)
            #expect(!first.completed && first.latestCheckpoint == 0 && first.cyclesCompleted == 0 && first.cyclesAbandoned == 0)
            #expect(try await store.checkpointNumbers(processID: "p") == [0])
            #expect(try await store.checkpoint(processID: "p", number: 0) == F.initialWeights)
            #expect(try await store.optimizerState(processID: "p") == nil)
            #expect(try await store.privacyState(processID: "p") == nil)
            let open = try #require(try await store.openCycle(processID: "p"))
            #expect(open.cycle == StoredCycle(number: 1, checkpoint: 0, openedAt: F.epoch))
            #expect(open.status == .open && open.sealedAt == nil && open.assignments.isEmpty && open.partialSums.isEmpty)

            // Same name and version under another id: refused, and nothing of it is stored.
            #expect(try await storeErrorCode { try await F.host(stores.peer, id: "r") } == .duplicate)
            #expect(try await store.processes().count == 2)

            try await F.assign(store, 0..<2)
            try await store.deleteProcess(id: "p")
            #expect(try await store.processes().map(\.id) == ["q"])
            #expect(try await store.checkpointNumbers(processID: "p").isEmpty)
            #expect(try await store.openCycle(processID: "p") == nil)
            #expect(try await store.assignment(requestKey: "k0") == nil)
            #expect(try await storeErrorCode { try await store.deleteProcess(id: "p") } == .notFound)
            // The name is free again.
            try await F.host(store)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func federatedEvaluationResultsAreCountedOnceAndFinalizedOnce(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            // w2's result is a sequence model's, with its positions (kept by the store as they came).
            func result(_ worker: String, checkpoint: Int = 3, samples: Int = 2, loss: Double = 0.5) -> StoredEvaluationResult {
                StoredEvaluationResult(
                    checkpoint: checkpoint, workerID: worker, samples: samples, metrics: ["loss": loss], receivedAt: 10, positions: worker == "w2" ? 37 : nil)
            }
            #expect(try await store.recordEvaluationResult(result("w1"), processID: "p") == 1)
            #expect(try await stores.peer.recordEvaluationResult(result("w2", samples: 4, loss: 1), processID: "p") == 2)
            #expect(try await store.recordEvaluationResult(result("w1", checkpoint: 4), processID: "p") == 1)
            // One result a worker and checkpoint, whichever instance it reaches; none for an unknown process.
            #expect(try await storeErrorCode { _ = try await stores.peer.recordEvaluationResult(result("w1"), processID: "p") } == .duplicate)
            #expect(try await storeErrorCode { _ = try await store.recordEvaluationResult(result("w9"), processID: "nope") } == .notFound)
            #expect(try await store.pendingEvaluationCheckpoints(processID: "p") == [3, 4])
            let results = try await stores.peer.evaluationResults(processID: "p", checkpoint: 3)
            #expect(results == [result("w1"), result("w2", samples: 4, loss: 1)])
            // Finalized once, from the results read inside the transaction: the second finalization (another instance, other
            // numbers) records nothing and clears the rows.
            let evaluation = CheckpointEvaluation(checkpoint: 3, samples: 6, metrics: ["loss": 0.8], evaluatedAt: 20, devices: 2, epsilon: 0.5)
            let seen = Mutex<([StoredEvaluationResult], Int)?>(nil)
            let recorded = try await store.finalizeFederatedEvaluation(processID: "p", checkpoint: 3) { results, earlier in
                seen.withLock { $0 = (results, earlier) }
                return evaluation
            }
            #expect(recorded == evaluation)
            #expect(seen.withLock { $0?.0 } == [result("w1"), result("w2", samples: 4, loss: 1)] && seen.withLock { $0?.1 } == 0)
            let again = try await stores.peer.finalizeFederatedEvaluation(processID: "p", checkpoint: 3) { _, _ in
                Issue.record("a finalized checkpoint was aggregated again")
                return evaluation
            }
            #expect(again == nil)
            #expect(try await store.evaluationResults(processID: "p", checkpoint: 3).isEmpty)
            #expect(try await store.pendingEvaluationCheckpoints(processID: "p") == [4])
            #expect(try await stores.peer.federatedEvaluations(processID: "p", limit: 5) == [evaluation])
            #expect(try await store.federatedEvaluations(processID: "p", limit: 10).count == 1)
            // A result for a finalized checkpoint is refused.
            #expect(try await storeErrorCode { _ = try await store.recordEvaluationResult(result("w3"), processID: "p") } == .cycleClosed)
            #expect(try await store.finalizeFederatedEvaluation(processID: "nope", checkpoint: 3) { _, _ in evaluation } == nil)
            #expect(try await store.finalizeFederatedEvaluation(processID: "p", checkpoint: 9) { _, _ in evaluation } == nil, "no results")
            // The next finalization counts the earlier one (the noised evaluations' accountant).
            let counted = try await stores.peer.finalizeFederatedEvaluation(processID: "p", checkpoint: 4) { results, earlier in
                CheckpointEvaluation(checkpoint: 4, samples: results.count, metrics: [:], evaluatedAt: Double(earlier))
            }
            #expect(counted?.evaluatedAt == 1)
            // Deleted with the process.
            try await store.deleteProcess(id: "p")
            try await F.host(store)
            #expect(try await store.federatedEvaluations(processID: "p", limit: 5).isEmpty)
            #expect(try await store.pendingEvaluationCheckpoints(processID: "p").isEmpty)
            #expect(try await store.federatedEvaluations(processID: "p", limit: 10).isEmpty)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func evaluationDataAndEvaluationsAreKeptPerProcessAndDeletedWithIt(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            #expect(try await store.evaluationData(processID: "p") == nil)
            #expect(try await store.evaluations(processID: "p", limit: 5).isEmpty)
            #expect(try await storeErrorCode { try await store.setEvaluationData(processID: "nope", data: ([1], 1)) } == .notFound)
            try await store.setEvaluationData(processID: "p", data: ([1, 2, 3], 7))
            try await stores.peer.setEvaluationData(processID: "p", data: ([4, 5], 9))  // replaces, from another instance
            let data = try #require(try await store.evaluationData(processID: "p"))
            #expect(data.bytes == [4, 5] && data.samples == 9)
            let size = try #require(try await stores.peer.evaluationDataSize(processID: "p"))
            #expect(size.bytes == 2 && size.samples == 9)
            #expect(try await store.evaluationDataSize(processID: "nope") == nil)
            for checkpoint in [2, 0, 1] {
                try await store.recordEvaluation(
                    CheckpointEvaluation(checkpoint: checkpoint, samples: 9, metrics: ["loss": Double(checkpoint), "accuracy": 0.5], evaluatedAt: 100),
                    processID: "p")
            }
            // Evaluated again: replaced, not listed twice.
            try await stores.peer.recordEvaluation(CheckpointEvaluation(checkpoint: 1, samples: 9, metrics: ["loss": 0.25], evaluatedAt: 101), processID: "p")
            let listed = try await stores.peer.evaluations(processID: "p", limit: 2)
            #expect(
                listed == [
                    CheckpointEvaluation(checkpoint: 1, samples: 9, metrics: ["loss": 0.25], evaluatedAt: 101),
                    CheckpointEvaluation(checkpoint: 2, samples: 9, metrics: ["loss": 2, "accuracy": 0.5], evaluatedAt: 100),
                ])
            // An evaluation of a process that is gone is dropped.
            try await store.recordEvaluation(CheckpointEvaluation(checkpoint: 0, samples: 1, metrics: [:], evaluatedAt: 1), processID: "nope")
            #expect(try await store.evaluations(processID: "nope", limit: 5).isEmpty)
            try await store.setEvaluationData(processID: "p", data: nil)
            #expect(try await store.evaluationData(processID: "p") == nil)
            #expect(try await store.evaluations(processID: "p", limit: 5).count == 3)
            try await store.setEvaluationData(processID: "p", data: ([6], 1))
            try await store.deleteProcess(id: "p")
            try await F.host(store)
            #expect(try await store.evaluationData(processID: "p") == nil)
            #expect(try await store.evaluations(processID: "p", limit: 5).isEmpty)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func checkpointsArePrunedToTheRetention(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            for cycle in 1...4 {
                let weights = [UInt8](repeating: UInt8(cycle), count: 8)
                try await store.closeCycle(
                    CycleClosure(
                        processID: "p", closedCycle: cycle, checkpoint: (cycle, weights), optimizerState: [UInt8(cycle)],
                        nextCycle: F.next(cycle + 1, checkpoint: cycle), retention: 2
                    ))
            }
            #expect(try await store.checkpointNumbers(processID: "p") == [3, 4])
            #expect(try await stores.peer.checkpoint(processID: "p", number: 4) == [UInt8](repeating: 4, count: 8))
            #expect(try await store.checkpoint(processID: "p", number: 2) == nil)
            #expect(try await store.checkpoint(processID: "p", number: 0) == nil)
            #expect(try await store.optimizerState(processID: "p") == [4])
            let process = try #require(try await store.processes().first)
            #expect(process.latestCheckpoint == 4 && process.cyclesCompleted == 4 && process.cyclesAbandoned == 0)
        }
    }

    /// A checkpoint built on weights the store has moved past is refused and nothing of the close is written; an
    /// abandonment publishes nothing and is not checked.
    @Test(arguments: StoreKind.underTest)
    func aCheckpointBuiltOnAnOlderOneIsRefused(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            try await store.closeCycle(
                CycleClosure(
                    processID: "p", closedCycle: 1, checkpoint: (1, [1]), optimizerState: [1], nextCycle: F.next(2, checkpoint: 1), retention: 5,
                    baseCheckpoint: 0))
            await #expect {
                try await stores.peer.closeCycle(
                    CycleClosure(
                        processID: "p", closedCycle: 2, checkpoint: (2, [2]), optimizerState: [2], nextCycle: F.next(3, checkpoint: 2), retention: 5,
                        baseCheckpoint: 0))
            } throws: { error in
                (error as? StoreError)?.code == .corrupt && "\(error)".contains("built on checkpoint 0, but the latest is 1")
            }
            let process = try #require(try await store.processes().first)
            #expect(process.latestCheckpoint == 1 && process.cyclesCompleted == 1)
            #expect(try await store.checkpoint(processID: "p", number: 2) == nil)
            #expect(try await store.optimizerState(processID: "p") == [1])
            #expect(try await store.cycleProgress(processID: "p")?.number == 2, "cycle 2 is still open")
            try await store.closeCycle(
                CycleClosure(
                    processID: "p", closedCycle: 2, checkpoint: nil, optimizerState: nil, nextCycle: F.next(3, checkpoint: 1), retention: 5,
                    baseCheckpoint: 0))
            try await stores.peer.closeCycle(
                CycleClosure(
                    processID: "p", closedCycle: 3, checkpoint: (2, [2]), optimizerState: [2], nextCycle: F.next(4, checkpoint: 2), retention: 5,
                    baseCheckpoint: 1))
            #expect(try await store.checkpoint(processID: "p", number: 2) == [2])
        }
    }

    @Test(arguments: StoreKind.underTest)
    func optimizerAndPrivacyStatesRoundTrip(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            let optimizer: [UInt8] = [0, 1, 2, 255, 0]
            let privacy = Array("{\"epsilon\":1.5}".utf8)
            try await store.closeCycle(
                CycleClosure(
                    processID: "p", closedCycle: 1, checkpoint: (1, [9]), optimizerState: optimizer, privacyState: privacy,
                    nextCycle: F.next(2, checkpoint: 1), retention: 5
                ))
            #expect(try await stores.peer.optimizerState(processID: "p") == optimizer)
            #expect(try await stores.peer.privacyState(processID: "p") == privacy)
            // An abandoned cycle leaves both as they were.
            try await store.closeCycle(
                CycleClosure(processID: "p", closedCycle: 2, checkpoint: nil, optimizerState: nil, nextCycle: F.next(3, checkpoint: 1), retention: 5))
            #expect(try await store.optimizerState(processID: "p") == optimizer)
            #expect(try await store.privacyState(processID: "p") == privacy)
            // An aggregated cycle without them clears them.
            try await store.closeCycle(
                CycleClosure(processID: "p", closedCycle: 3, checkpoint: (2, [8]), optimizerState: nil, nextCycle: F.next(4, checkpoint: 2), retention: 5))
            #expect(try await store.optimizerState(processID: "p") == nil)
            #expect(try await store.privacyState(processID: "p") == nil)
            #expect(try await store.optimizerState(processID: "absent") == nil)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func closedCyclesAreRecordedWithTheirParticipationAndMeanMetrics(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            #expect(try await store.cycleRecords(processID: "p", limit: 10).isEmpty)
            // Cycle 1: three assigned, two report (losses 0 and 1, through two instances), aggregated into checkpoint 1.
            try await F.assign(store, 0..<3)
            try await store.recordReport(F.report(0), bytes: F.diff(0))
            try await stores.peer.recordReport(F.report(1, instance: "b"), bytes: F.diff(1))
            let closed = F.epoch.addingTimeInterval(30)
            try await store.closeCycle(
                CycleClosure(
                    processID: "p", closedCycle: 1, checkpoint: (1, [1]), optimizerState: nil, nextCycle: F.next(2, checkpoint: 1), retention: 5,
                    closedAt: closed
                ))
            // Cycle 2: one assigned, nobody reports: abandoned. Cycle 3 stays open and is not listed.
            try await F.assign(store, 3..<4, cycle: 2)
            try await stores.peer.closeCycle(
                CycleClosure(
                    processID: "p", closedCycle: 2, checkpoint: nil, optimizerState: nil, nextCycle: F.next(3, checkpoint: 1), retention: 5,
                    closedAt: closed.addingTimeInterval(60)
                ))
            let records = try await stores.peer.cycleRecords(processID: "p", limit: 10)
            #expect(
                records == [
                    CycleRecord(
                        cycle: 1, outcome: .aggregated, assigned: 3, reported: 2, checkpoint: 1, openedAt: F.epoch.timeIntervalSince1970,
                        closedAt: closed.timeIntervalSince1970, metrics: ["loss": 0.5]
                    ),
                    CycleRecord(
                        cycle: 2, outcome: .abandoned, assigned: 1, reported: 0, checkpoint: nil,
                        openedAt: F.next(2, checkpoint: 1).openedAt.timeIntervalSince1970,
                        closedAt: closed.timeIntervalSince1970 + 60, metrics: [:]
                    ),
                ])
            #expect(try await store.cycleRecords(processID: "p", limit: 1).map(\.cycle) == [2], "the newest, oldest first")
            #expect(try await store.cycleRecords(processID: "absent", limit: 10).isEmpty)
            try await store.deleteProcess(id: "p")
            #expect(try await store.cycleRecords(processID: "p", limit: 10).isEmpty)
        }
    }

    // MARK: Secrets and workers

    @Test(arguments: StoreKind.underTest)
    func aSecretIsCreatedOnceAndSharedByInstances(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let first = try await stores.main.secret(named: "signing") { Array(repeating: 7, count: 32) }
            let second = try await stores.peer.secret(named: "signing") { Array(repeating: 9, count: 32) }
            #expect(first == Array(repeating: 7, count: 32))
            #expect(second == first)
            let other = try await stores.peer.secret(named: "other") { [1, 2, 3] }
            #expect(other == [1, 2, 3])
        }
    }

    @Test(arguments: StoreKind.underTest)
    func workersAreScopedByProcessAndIssuer(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            try await F.host(store, id: "q", name: "other")
            try await store.registerWorker(id: "a", processID: "p", issuer: "https://idp", subject: "alice", at: F.epoch)
            // The same identity again (a racing first authentication, here on the other instance): the first stays.
            try await stores.peer.registerWorker(id: "a2", processID: "p", issuer: "https://idp", subject: "alice", at: F.epoch)
            // The same subject under another issuer or process is another worker.
            try await store.registerWorker(id: "b", processID: "p", issuer: "https://other", subject: "alice", at: F.epoch)
            try await store.registerWorker(id: "c", processID: "q", issuer: "https://idp", subject: "alice", at: F.epoch)
            // Anonymous workers never collide.
            try await store.registerWorker(id: "d", processID: "p", issuer: nil, subject: nil, at: F.epoch)
            try await store.registerWorker(id: "e", processID: "p", issuer: nil, subject: nil, at: F.epoch)

            #expect(try await stores.peer.workerID(processID: "p", issuer: "https://idp", subject: "alice") == "a")
            #expect(try await store.workerID(processID: "p", issuer: "https://other", subject: "alice") == "b")
            #expect(try await store.workerID(processID: "q", issuer: "https://idp", subject: "alice") == "c")
            #expect(try await store.workerID(processID: "p", issuer: "https://idp", subject: "bob") == nil)
            #expect(try await store.workerExists(id: "a"))
            #expect(try await !store.workerExists(id: "a2"))
            #expect(try await stores.peer.workerExists(id: "e"))
            #expect(try await store.workerCount(processID: "p") == 4)
            #expect(try await store.workerCount(processID: "q") == 1)
            #expect(try await store.workerCount(processID: "absent") == 0)
        }
    }

    // MARK: Admissions

    @Test(arguments: StoreKind.underTest)
    func recordedAssignmentsAreUniquePerWorkerAndKey(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            let store = stores.main
            try await F.host(store)
            try await F.assign(store, 0..<2)
            #expect(
                try await storeErrorCode {
                    try await stores.peer.recordAssignment(processID: "p", cycle: 1, workerID: "w0", requestKey: "k9", at: F.epoch)
                } == .duplicate)
            #expect(
                try await storeErrorCode {
                    try await store.recordAssignment(processID: "p", cycle: 1, workerID: "w9", requestKey: "k1", at: F.epoch)
                } == .duplicate)
            let open = try #require(try await stores.peer.openCycle(processID: "p"))
            #expect(
                Set(open.assignments) == [
                    StoredAssignment(workerID: "w0", requestKey: "k0", reported: false, assignedAt: F.epoch),
                    StoredAssignment(workerID: "w1", requestKey: "k1", reported: false, assignedAt: F.epoch),
                ])
        }
    }

    @Test(arguments: StoreKind.underTest)
    func admissionsAdmitFindTheExistingAssignmentAndStopAtTheLimit(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            let at = F.epoch
            #expect(try await stores.main.admit(processID: "p", cycle: 1, workerID: "w0", requestKey: "k0", at: at, limit: 2) == .admitted)
            #expect(
                try await stores.peer.admit(processID: "p", cycle: 1, workerID: "w0", requestKey: "k0-again", at: at, limit: 2)
                    == .existing(StoredAssignment(workerID: "w0", requestKey: "k0", reported: false, assignedAt: F.epoch)))
            #expect(try await stores.peer.admit(processID: "p", cycle: 1, workerID: "w1", requestKey: "k1", at: at, limit: 2) == .admitted)
            #expect(try await stores.main.admit(processID: "p", cycle: 1, workerID: "w2", requestKey: "k2", at: at, limit: 2) == .full)
            // A worker already admitted still finds its assignment when the cycle is full.
            #expect(
                try await stores.main.admit(processID: "p", cycle: 1, workerID: "w1", requestKey: "k1b", at: at, limit: 2)
                    == .existing(StoredAssignment(workerID: "w1", requestKey: "k1", reported: false, assignedAt: F.epoch)))
            let progress = try #require(try await stores.main.cycleProgress(processID: "p"))
            #expect(progress.assigned == 2 && progress.reported == 0)
            // A cycle that does not exist is not open.
            #expect(
                try await storeErrorCode {
                    _ = try await stores.main.admit(processID: "p", cycle: 7, workerID: "w3", requestKey: "k3", at: at, limit: 2)
                } == .cycleClosed)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func bufferedAdmissionCountsOnlyTheDevicesInFlightAndClosingCarriesThemOver(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            let late = F.epoch.addingTimeInterval(100)
            for i in 0..<3 {
                try await stores.main.registerWorker(id: "w\(i)", processID: "p", issuer: nil, subject: nil, at: F.epoch)
            }
            // w0 admitted at the epoch, w1 and w2 100 s later; w1 reports (staleness 2).
            #expect(
                try await stores.main.admit(processID: "p", cycle: 1, workerID: "w0", requestKey: "k0", at: F.epoch, limit: 2, inFlightAfter: nil) == .admitted)
            #expect(
                try await stores.peer.admit(processID: "p", cycle: 1, workerID: "w1", requestKey: "k1", at: late, limit: 2, inFlightAfter: nil) == .admitted)
            var report = F.report(1, instance: "b")
            report.staleness = 2
            try await stores.peer.recordReport(report, bytes: F.diff(1))
            #expect(try await PendingCollector.pending(stores.main).map(\.staleness) == [2])
            // Counting every assignment the cycle is full; counting those in flight (unreported, admitted after 50 s), w0's
            // has expired and w1 reported: room for w2.
            #expect(try await stores.main.admit(processID: "p", cycle: 1, workerID: "w2", requestKey: "k2", at: late, limit: 2, inFlightAfter: nil) == .full)
            #expect(
                try await stores.main.admit(
                    processID: "p", cycle: 1, workerID: "w2", requestKey: "k2", at: late, limit: 1, inFlightAfter: F.epoch.addingTimeInterval(50))
                    == .admitted)
            #expect(
                try await stores.peer.admit(
                    processID: "p", cycle: 1, workerID: "w3", requestKey: "k3", at: late, limit: 1, inFlightAfter: F.epoch.addingTimeInterval(50))
                    == .full)
            // Closing with a carry-over: w2 (unreported, admitted after the cutoff) moves into cycle 2 with its key; w0
            // (expired) and w1 (reported) do not.
            try await stores.peer.closeCycle(
                CycleClosure(
                    processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil, nextCycle: F.next(2, checkpoint: 0), retention: 2,
                    carryOverAfter: F.epoch.addingTimeInterval(50)))
            let open = try #require(try await stores.main.openCycle(processID: "p"))
            #expect(open.cycle.number == 2)
            #expect(open.assignments == [StoredAssignment(workerID: "w2", requestKey: "k2", reported: false, assignedAt: late)])
            #expect(try await stores.main.assignment(requestKey: "k2")?.cycle == 2)
            #expect(try await stores.main.assignment(requestKey: "k0") == nil)
            var carried = F.report(2, cycle: 2, instance: "a")
            carried.staleness = 1
            try await stores.main.recordReport(carried, bytes: F.diff(2))
            #expect(try await stores.peer.cycleProgress(processID: "p")?.reported == 1)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func admissionsAreRefusedOnceTheCycleIsSealedOrClosed(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            #expect(try await stores.main.admit(processID: "p", cycle: 1, workerID: "w0", requestKey: "k0", at: F.epoch, limit: 10) == .admitted)
            #expect(try await stores.peer.sealCycle(processID: "p", cycle: 1, at: F.epoch.addingTimeInterval(5)))
            #expect(
                try await storeErrorCode {
                    _ = try await stores.main.admit(processID: "p", cycle: 1, workerID: "w1", requestKey: "k1", at: F.epoch, limit: 10)
                } == .cycleClosed)
            // Even the worker already holding an assignment is refused: the cycle takes nothing more.
            #expect(
                try await storeErrorCode {
                    _ = try await stores.main.admit(processID: "p", cycle: 1, workerID: "w0", requestKey: "k0", at: F.epoch, limit: 10)
                } == .cycleClosed)
            try await stores.main.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil, nextCycle: F.next(2, checkpoint: 0), retention: 2))
            #expect(
                try await storeErrorCode {
                    _ = try await stores.peer.admit(processID: "p", cycle: 1, workerID: "w1", requestKey: "k1", at: F.epoch, limit: 10)
                } == .cycleClosed)
            #expect(try await stores.peer.admit(processID: "p", cycle: 2, workerID: "w1", requestKey: "k1", at: F.epoch, limit: 10) == .admitted)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func requestKeysAreFoundWhileTheirCycleIsOpenOrSealed(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            #expect(try await stores.main.admit(processID: "p", cycle: 1, workerID: "w0", requestKey: "k0", at: F.epoch, limit: 10) == .admitted)
            #expect(
                try await stores.peer.assignment(requestKey: "k0")
                    == StoredKeyedAssignment(
                        processID: "p", cycle: 1, assignment: StoredAssignment(workerID: "w0", requestKey: "k0", reported: false, assignedAt: F.epoch)))
            #expect(try await stores.peer.assignment(requestKey: "nope") == nil)
            try await stores.peer.recordReport(F.report(0, instance: "b"), bytes: F.diff(0))
            #expect(
                try await stores.main.assignment(requestKey: "k0")?.assignment
                    == StoredAssignment(workerID: "w0", requestKey: "k0", reported: true, instance: "b", assignedAt: F.epoch))
            #expect(try await stores.main.sealCycle(processID: "p", cycle: 1, at: F.epoch))
            #expect(try await stores.peer.assignment(requestKey: "k0")?.cycle == 1)
            try await stores.main.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil, nextCycle: F.next(2, checkpoint: 0), retention: 2))
            #expect(try await stores.peer.assignment(requestKey: "k0") == nil)
        }
    }

    /// 64 admissions racing (over both instances) for 10 places: exactly 10 are admitted.
    @Test(arguments: StoreKind.underTest)
    func racingAdmissionsNeverExceedTheLimit(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            let outcomes = try await withThrowingTaskGroup(of: StoredAdmission.self) { group in
                for i in 0..<64 {
                    let store = i.isMultiple(of: 2) ? stores.main : stores.peer
                    group.addTask {
                        try await store.admit(processID: "p", cycle: 1, workerID: "w\(i)", requestKey: "k\(i)", at: F.epoch, limit: 10)
                    }
                }
                var all: [StoredAdmission] = []
                for try await outcome in group { all.append(outcome) }
                return all
            }
            #expect(outcomes.count == 64)
            #expect(outcomes.filter { $0 == .admitted }.count == 10)
            #expect(outcomes.filter { $0 == .full }.count == 54)
            #expect(try await stores.main.cycleProgress(processID: "p")?.assigned == 10)
            #expect(try await stores.peer.openCycle(processID: "p")?.assignments.count == 10)
        }
    }

    // MARK: Reports and folds

    @Test(arguments: StoreKind.underTest)
    func aReportIsRecordedOnceWithItsDiff(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<3)
            // Staged piecewise, as an upload arrives.
            let staged = try stores.main.stageDiff(processID: "p", cycle: 1, requestKey: "k0")
            let diff = F.diff(0, count: 4096)
            try diff[0..<1000].withUnsafeBytes { try staged.write($0, at: 0) }
            try diff[1000...].withUnsafeBytes { try staged.write($0, at: 1000) }
            var back = [UInt8](repeating: 0, count: 16)
            try back.withUnsafeMutableBytes { try staged.read(into: $0, at: 1000) }
            #expect(back == Array(diff[1000..<1016]))
            try await stores.main.recordReport(F.report(0, instance: "a", unclipped: true), diff: staged)
            try await stores.peer.recordReport(F.report(1, instance: "b"), bytes: F.diff(1))

            // A duplicate (on either instance) is refused and the committed diff stays.
            #expect(try await storeErrorCode { try await stores.peer.recordReport(F.report(0, instance: "b"), bytes: F.diff(9)) } == .duplicate)
            #expect(try await storeErrorCode { try await stores.main.recordReport(F.report(0, instance: "a"), bytes: F.diff(9)) } == .duplicate)
            // A report under a key its worker was not given is refused too.
            var wrongKey = F.report(2)
            wrongKey.requestKey = "k0"
            #expect(try await storeErrorCode { try await stores.main.recordReport(wrongKey, bytes: F.diff(2)) } == .duplicate)

            let pending = try await PendingCollector.pending(stores.peer)
            #expect(pending.map(\.workerID) == ["w0", "w1"])
            #expect(pending[0].diff == diff && pending[0].sampleCount == 1 && pending[0].unclipped && pending[0].instance == "a")
            #expect(pending[1].diff == F.diff(1) && pending[1].sampleCount == 2 && !pending[1].unclipped && pending[1].instance == "b")

            let open = try #require(try await stores.main.openCycle(processID: "p"))
            #expect(
                Set(open.assignments) == [
                    StoredAssignment(workerID: "w0", requestKey: "k0", reported: true, instance: "a", assignedAt: F.epoch),
                    StoredAssignment(workerID: "w1", requestKey: "k1", reported: true, instance: "b", assignedAt: F.epoch),
                    StoredAssignment(workerID: "w2", requestKey: "k2", reported: false, assignedAt: F.epoch),
                ])
            #expect(try await stores.main.cycleProgress(processID: "p")?.reported == 2)
        }
    }

    /// A buffer's reports racing at two instances, each admitted against its own count: the store commits exactly the
    /// release's limit and refuses the rest `cycle_closed` (the coordinator answers `buffer_releasing`), so a release
    /// never holds more reports than central privacy's noise and accounting assume.
    @Test(arguments: StoreKind.underTest)
    func racingReportsNeverFillABufferPastItsRelease(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<12)
            let outcomes = try await withThrowingTaskGroup(of: StoreError.Code?.self) { group in
                for i in 0..<12 {
                    let store = i.isMultiple(of: 2) ? stores.main : stores.peer
                    group.addTask {
                        var report = F.report(i, instance: i.isMultiple(of: 2) ? "a" : "b")
                        report.releaseLimit = 5
                        return try await storeErrorCode { try await store.recordReport(report, bytes: F.diff(i)) }
                    }
                }
                var all: [StoreError.Code?] = []
                for try await outcome in group { all.append(outcome) }
                return all
            }
            #expect(outcomes.filter { $0 == nil }.count == 5 && outcomes.filter { $0 == .cycleClosed }.count == 7, "\(outcomes)")
            #expect(try await stores.main.cycleProgress(processID: "p")?.reported == 5)
            #expect(try await PendingCollector.pending(stores.peer).count == 5)
            // Without a limit (synchronous cycles) a refused worker's report commits.
            let pending = Set(try await PendingCollector.pending(stores.peer).map(\.workerID))
            let refused = try #require((0..<12).first { !pending.contains("w\($0)") })
            try await stores.main.recordReport(F.report(refused, instance: "a"), bytes: F.diff(refused))
            #expect(try await stores.main.cycleProgress(processID: "p")?.reported == 6)
        }
    }

    /// Reports whose diffs cannot be read back are discarded: no longer reported, their diffs forgotten; the others and
    /// the workers' assignments stay.
    @Test(arguments: StoreKind.underTest)
    func discardedReportsAreNoLongerReportedNorPending(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<3)
            for i in 0..<3 { try await stores.main.recordReport(F.report(i), bytes: F.diff(i)) }
            try await stores.peer.discardReports(processID: "p", cycle: 1, workers: ["w1", "w9"])
            #expect(try await PendingCollector.pending(stores.main).map(\.workerID) == ["w0", "w2"])
            #expect(try await stores.main.cycleProgress(processID: "p")?.reported == 2)
            let open = try #require(try await stores.main.openCycle(processID: "p"))
            #expect(open.assignments.first { $0.workerID == "w1" }?.reported == false && open.assignments.count == 3)
        }
    }

    /// An admission written after its cycle closed (a buffer released while the write waited its turn) is refused, not
    /// left in the closed cycle where its report could never be recorded.
    @Test(arguments: StoreKind.underTest)
    func anAssignmentIntoAClosedCycleIsRefused(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<1)
            try await stores.main.registerWorker(id: "w5", processID: "p", issuer: nil, subject: nil, at: F.epoch)
            try await stores.peer.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil, nextCycle: F.next(2, checkpoint: 0), retention: 2))
            #expect(
                try await storeErrorCode {
                    try await stores.main.recordAssignment(processID: "p", cycle: 1, workerID: "w5", requestKey: "k5", at: F.epoch)
                } == .cycleClosed)
            try await stores.main.recordAssignment(processID: "p", cycle: 2, workerID: "w5", requestKey: "k5", at: F.epoch)
            let open = try #require(try await stores.peer.openCycle(processID: "p"))
            #expect(open.assignments.map(\.workerID) == ["w5"])
        }
    }

    @Test(arguments: StoreKind.underTest)
    func aReportIntoASealedOrClosedCycleIsRefused(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<3)
            try await stores.main.recordReport(F.report(0), bytes: F.diff(0))
            #expect(try await stores.peer.sealCycle(processID: "p", cycle: 1, at: F.epoch))
            #expect(try await storeErrorCode { try await stores.main.recordReport(F.report(1), bytes: F.diff(1)) } == .cycleClosed)
            // The refused report left nothing behind; the committed one is still pending for the closing instance.
            #expect(try await PendingCollector.pending(stores.main).map(\.workerID) == ["w0"])
            #expect(try await stores.main.cycleProgress(processID: "p")?.reported == 1)
            try await stores.peer.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil, nextCycle: F.next(2, checkpoint: 0), retention: 2))
            #expect(try await storeErrorCode { try await stores.main.recordReport(F.report(2), bytes: F.diff(2)) } == .cycleClosed)
            #expect(try await PendingCollector.pending(stores.main).isEmpty)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func eachInstanceFoldsIntoItsOwnPartialSum(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<4)
            for i in 0..<4 {
                try await (i < 2 ? stores.main : stores.peer).recordReport(F.report(i, instance: i < 2 ? "a" : "b"), bytes: F.diff(i))
            }
            let sumA = StoredPartialSum(bytes: [1, 2, 3, 4, 5, 6, 7, 8], weight: 1, reports: 1, unclipped: 1)
            try await stores.main.foldReports(processID: "p", cycle: 1, instance: "a", sum: sumA, workers: ["w0"])
            #expect(try await PendingCollector.pending(stores.peer).map(\.workerID) == ["w1", "w2", "w3"])
            // A later fold of the same instance replaces its sum.
            let sumA2 = StoredPartialSum(bytes: [8, 7, 6, 5, 4, 3, 2, 1], weight: 3, reports: 2, unclipped: 1)
            try await stores.main.foldReports(processID: "p", cycle: 1, instance: "a", sum: sumA2, workers: ["w1"])
            let sumB = StoredPartialSum(bytes: [0, 0, 0, 0, 0, 0, 240, 63], weight: 7, reports: 2, unclipped: 0)
            try await stores.peer.foldReports(processID: "p", cycle: 1, instance: "b", sum: sumB, workers: ["w2", "w3"])
            #expect(try await PendingCollector.pending(stores.main).isEmpty)

            let open = try #require(try await stores.peer.openCycle(processID: "p"))
            #expect(open.partialSums == ["a": sumA2, "b": sumB])
            let allReported = open.assignments.allSatisfy { $0.reported }
            #expect(allReported)

            // The convenience fold writes the default instance's sum.
            try await stores.main.foldReports(processID: "p", cycle: 1, sum: [9, 9, 9, 9, 9, 9, 9, 9], weight: 0, reports: 0, workers: [])
            #expect(try await stores.main.openCycle(processID: "p")?.partialSums.count == 3)
            #expect(
                try await stores.main.openCycle(processID: "p")?.partialSums[CoordinatorConfiguration.defaultInstanceID]?.bytes == [9, 9, 9, 9, 9, 9, 9, 9])

            // Once sealed, folds are refused and the sums read are final.
            #expect(try await stores.main.sealCycle(processID: "p", cycle: 1, at: F.epoch))
            #expect(
                try await storeErrorCode {
                    try await stores.peer.foldReports(processID: "p", cycle: 1, instance: "b", sum: sumA, workers: [])
                } == .cycleClosed)
            let sealed = try #require(try await stores.peer.openCycle(processID: "p"))
            #expect(sealed.partialSums["b"] == sumB)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func aFoldAfterSealingLeavesTheDiffsPending(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<2)
            try await stores.main.recordReport(F.report(0, instance: "a"), bytes: F.diff(0))
            try await stores.peer.recordReport(F.report(1, instance: "b"), bytes: F.diff(1))
            #expect(try await stores.peer.sealCycle(processID: "p", cycle: 1, at: F.epoch))
            #expect(
                try await storeErrorCode {
                    try await stores.main.foldReports(
                        processID: "p", cycle: 1, instance: "a", sum: StoredPartialSum(bytes: [1], weight: 1, reports: 1, unclipped: 0), workers: ["w0"])
                } == .cycleClosed)
            let pending = try await PendingCollector.pending(stores.peer)
            #expect(pending.map(\.workerID) == ["w0", "w1"])
            #expect(pending.map(\.instance) == ["a", "b"])
            #expect(try await stores.main.openCycle(processID: "p")?.partialSums.isEmpty == true)
        }
    }

    // MARK: Sealing and closing

    @Test(arguments: StoreKind.underTest)
    func sealingSucceedsOnceUntilTheCycleCloses(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            let sealedAt = F.epoch.addingTimeInterval(42.5)
            #expect(try await stores.main.sealCycle(processID: "p", cycle: 1, at: sealedAt))
            #expect(try await !stores.peer.sealCycle(processID: "p", cycle: 1, at: sealedAt.addingTimeInterval(1)))
            #expect(try await !stores.main.sealCycle(processID: "p", cycle: 1, at: sealedAt.addingTimeInterval(2)))

            let progress = try #require(try await stores.peer.cycleProgress(processID: "p"))
            #expect(progress.number == 1 && progress.checkpoint == 0 && progress.openedAt == F.epoch)
            #expect(progress.status == .closing && progress.sealedAt == sealedAt)
            let open = try #require(try await stores.peer.openCycle(processID: "p"))
            #expect(open.status == .closing && open.sealedAt == sealedAt && open.cycle.number == 1)

            try await stores.main.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: (1, [1]), optimizerState: nil, nextCycle: F.next(2, checkpoint: 1), retention: 2))
            #expect(try await storeErrorCode { _ = try await stores.peer.sealCycle(processID: "p", cycle: 1, at: sealedAt) } == .cycleClosed)
            #expect(try await storeErrorCode { _ = try await stores.peer.sealCycle(processID: "p", cycle: 9, at: sealedAt) } == .cycleClosed)
            let next = try #require(try await stores.peer.cycleProgress(processID: "p"))
            #expect(next.number == 2 && next.status == .open && next.sealedAt == nil)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func anAggregatedCycleClosesExactlyOnceAndOpensTheNext(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<3)
            try await stores.main.recordReport(F.report(0), bytes: F.diff(0))
            try await stores.main.foldReports(
                processID: "p", cycle: 1, instance: "a", sum: StoredPartialSum(bytes: [1], weight: 1, reports: 1, unclipped: 0), workers: ["w0"])
            try await stores.main.appendSecureAggregationEvent(
                StoredSecureAggregationEvent(sequence: 0, body: [1]), processID: "p", cycle: 1, reportedWorker: nil)
            let closure = CycleClosure(
                processID: "p", closedCycle: 1, checkpoint: (1, [5, 5]), optimizerState: [3], privacyState: [4],
                nextCycle: F.next(2, checkpoint: 1), retention: 3
            )
            try await stores.peer.closeCycle(closure)
            #expect(try await storeErrorCode { try await stores.main.closeCycle(closure) } == .cycleClosed)
            #expect(try await storeErrorCode { try await stores.peer.closeCycle(closure) } == .cycleClosed)

            let process = try #require(try await stores.main.processes().first)
            #expect(process.latestCheckpoint == 1 && process.cyclesCompleted == 1 && process.cyclesAbandoned == 0 && !process.completed)
            #expect(try await stores.main.checkpointNumbers(processID: "p") == [0, 1])
            let open = try #require(try await stores.main.openCycle(processID: "p"))
            #expect(open.cycle == F.next(2, checkpoint: 1))
            #expect(open.status == .open && open.assignments.isEmpty && open.partialSums.isEmpty)
            // The closed cycle's assignments, pending diffs and events went with it.
            #expect(try await PendingCollector.pending(stores.main, cycle: 1).isEmpty)
            #expect(try await stores.main.secureAggregationEvents(processID: "p", cycle: 1).isEmpty)
            #expect(try await stores.main.assignment(requestKey: "k1") == nil)
            // Worker records outlive the cycle, and keys of the old cycle can be reused.
            #expect(try await stores.main.workerCount(processID: "p") == 3)
            try await F.assign(stores.peer, 3..<4, cycle: 2)
            #expect(try await stores.main.cycleProgress(processID: "p")?.assigned == 1)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func abandonedAndFinalCyclesClose(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<2)
            try await stores.main.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil, nextCycle: F.next(2, checkpoint: 0), retention: 2))
            var process = try #require(try await stores.peer.processes().first)
            #expect(process.cyclesAbandoned == 1 && process.cyclesCompleted == 0 && process.latestCheckpoint == 0 && !process.completed)
            #expect(try await stores.peer.checkpointNumbers(processID: "p") == [0])
            #expect(try await stores.peer.openCycle(processID: "p")?.cycle.number == 2)

            // The last cycle: no next one, and the process completes.
            try await stores.peer.closeCycle(
                CycleClosure(processID: "p", closedCycle: 2, checkpoint: (1, [1]), optimizerState: nil, nextCycle: nil, retention: 2))
            process = try #require(try await stores.main.processes().first)
            #expect(process.completed && process.cyclesCompleted == 1 && process.cyclesAbandoned == 1 && process.latestCheckpoint == 1)
            #expect(try await stores.main.openCycle(processID: "p") == nil)
            #expect(try await stores.main.cycleProgress(processID: "p") == nil)
            #expect(
                try await storeErrorCode {
                    try await stores.main.closeCycle(
                        CycleClosure(processID: "p", closedCycle: 2, checkpoint: nil, optimizerState: nil, nextCycle: nil, retention: 2))
                } == .cycleClosed)
            #expect(
                try await storeErrorCode {
                    _ = try await stores.main.admit(processID: "p", cycle: 2, workerID: "w9", requestKey: "k9", at: F.epoch, limit: 5)
                } == .cycleClosed)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func aSealedCycleCloses(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<2)
            try await stores.main.recordReport(F.report(0, instance: "a"), bytes: F.diff(0))
            #expect(try await stores.main.sealCycle(processID: "p", cycle: 1, at: F.epoch))
            try await stores.peer.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: (1, [7]), optimizerState: nil, nextCycle: F.next(2, checkpoint: 1), retention: 2))
            let progress = try #require(try await stores.main.cycleProgress(processID: "p"))
            #expect(progress.number == 2 && progress.status == .open && progress.assigned == 0 && progress.reported == 0)
            #expect(try await stores.main.checkpoint(processID: "p", number: 1) == [7])
        }
    }

    /// Two instances closing one cycle at once: exactly one succeeds.
    @Test(arguments: StoreKind.underTest)
    func racingClosesSucceedExactlyOnce(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<4)
            for round in 0..<5 {
                let cycle = round + 1
                let outcomes = try await withThrowingTaskGroup(of: StoreError.Code?.self) { group in
                    for (index, store) in [stores.main, stores.peer].enumerated() {
                        group.addTask {
                            try await storeErrorCode {
                                try await store.closeCycle(
                                    CycleClosure(
                                        processID: "p", closedCycle: cycle, checkpoint: (cycle, [UInt8(index)]), optimizerState: [UInt8(index)],
                                        nextCycle: F.next(cycle + 1, checkpoint: cycle), retention: 10
                                    ))
                            }
                        }
                    }
                    var all: [StoreError.Code?] = []
                    for try await outcome in group { all.append(outcome) }
                    return all
                }
                #expect(outcomes.filter { $0 == nil }.count == 1, "round \(round): \(outcomes)")
                #expect(outcomes.filter { $0 == .cycleClosed }.count == 1, "round \(round): \(outcomes)")
            }
            let process = try #require(try await stores.main.processes().first)
            #expect(process.cyclesCompleted == 5 && process.latestCheckpoint == 5)
            #expect(try await stores.main.checkpointNumbers(processID: "p") == [0, 1, 2, 3, 4, 5])
            #expect(try await stores.main.cycleProgress(processID: "p")?.number == 6)
        }
    }

    @Test(arguments: StoreKind.underTest)
    func progressCountsEveryInstance(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            #expect(try await stores.main.cycleProgress(processID: "absent") == nil)
            for i in 0..<6 {
                let store = i.isMultiple(of: 2) ? stores.main : stores.peer
                #expect(try await store.admit(processID: "p", cycle: 1, workerID: "w\(i)", requestKey: "k\(i)", at: F.epoch, limit: 100) == .admitted)
            }
            for i in 0..<3 {
                let store = i.isMultiple(of: 2) ? stores.main : stores.peer
                try await store.recordReport(F.report(i, instance: i.isMultiple(of: 2) ? "a" : "b"), bytes: F.diff(i))
            }
            for store in [stores.main, stores.peer] {
                let progress = try #require(try await store.cycleProgress(processID: "p"))
                #expect(progress == StoredCycleProgress(number: 1, checkpoint: 0, openedAt: F.epoch, status: .open, sealedAt: nil, assigned: 6, reported: 3))
            }
        }
    }

    // MARK: Secure aggregation

    @Test(arguments: StoreKind.underTest)
    func secureAggregationEventsAreAppendedInOrderAndGoWithTheCycle(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            try await F.assign(stores.main, 0..<2)
            let first = StoredSecureAggregationEvent(sequence: 0, body: Array("{\"advertise\":0}".utf8))
            let second = StoredSecureAggregationEvent(sequence: 1, body: Array("{\"masked\":1}".utf8), words: [1, 0, 0, 0, 2, 0, 0, 0])
            try await stores.peer.appendSecureAggregationEvent(second, processID: "p", cycle: 1, reportedWorker: nil)
            try await stores.main.appendSecureAggregationEvent(first, processID: "p", cycle: 1, reportedWorker: "w0")
            #expect(
                try await storeErrorCode {
                    try await stores.peer.appendSecureAggregationEvent(
                        StoredSecureAggregationEvent(sequence: 1, body: [0]), processID: "p", cycle: 1, reportedWorker: nil)
                } == .duplicate)
            #expect(try await stores.main.secureAggregationEvents(processID: "p", cycle: 1) == [first, second])
            #expect(try await stores.peer.secureAggregationEvents(processID: "p", cycle: 1, from: 1) == [second], "the events another instance appended")
            #expect(try await stores.peer.secureAggregationEvents(processID: "p", cycle: 1, from: 2).isEmpty)
            // The advertisement counted the worker as reported (in the same transaction).
            #expect(try await stores.peer.cycleProgress(processID: "p")?.reported == 1)
            #expect(try await stores.peer.assignment(requestKey: "k0")?.assignment.reported == true)
            // A worker without an assignment: refused, and the event is not kept.
            #expect(
                try await storeErrorCode {
                    try await stores.main.appendSecureAggregationEvent(
                        StoredSecureAggregationEvent(sequence: 2, body: [2]), processID: "p", cycle: 1, reportedWorker: "w9")
                } == .notFound)
            #expect(try await stores.main.secureAggregationEvents(processID: "p", cycle: 1).count == 2)

            #expect(try await stores.main.sealCycle(processID: "p", cycle: 1, at: F.epoch))
            #expect(
                try await storeErrorCode {
                    try await stores.peer.appendSecureAggregationEvent(
                        StoredSecureAggregationEvent(sequence: 2, body: [2]), processID: "p", cycle: 1, reportedWorker: nil)
                } == .cycleClosed)
            try await stores.main.closeCycle(
                CycleClosure(processID: "p", closedCycle: 1, checkpoint: nil, optimizerState: nil, nextCycle: F.next(2, checkpoint: 0), retention: 2))
            #expect(try await stores.peer.secureAggregationEvents(processID: "p", cycle: 1).isEmpty)
            #expect(
                try await storeErrorCode {
                    try await stores.peer.appendSecureAggregationEvent(first, processID: "p", cycle: 1, reportedWorker: nil)
                } == .cycleClosed)
            try await stores.peer.appendSecureAggregationEvent(first, processID: "p", cycle: 2, reportedWorker: nil)
            #expect(try await stores.main.secureAggregationEvents(processID: "p", cycle: 2) == [first])
        }
    }

    /// Bodies run under one process's lock from both handles (two pools over PostgreSQL) one at a time, with a store
    /// round trip between reading and writing a shared counter: no update is lost and no two bodies overlap; another
    /// process's lock is taken meanwhile; a body that throws releases the lock.
    @Test(arguments: StoreKind.underTest)
    func theSecureAggregationLockAdmitsOneHolderPerProcessAcrossHandles(_ kind: StoreKind) async throws {
        try await withStores(kind) { stores in
            try await F.host(stores.main)
            final class Shared: Sendable {
                let state = Mutex((counter: 0, inside: 0, most: 0))
            }
            let shared = Shared()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<16 {
                    let store = index % 2 == 0 ? stores.main : stores.peer
                    group.addTask {
                        try await store.withSecureAggregationLock(processID: "p") {
                            let seen = shared.state.withLock { state in
                                state.inside += 1
                                state.most = max(state.most, state.inside)
                                return state.counter
                            }
                            _ = try await store.cycleProgress(processID: "p")
                            shared.state.withLock { state in
                                state.counter = seen + 1
                                state.inside -= 1
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            #expect(shared.state.withLock { $0.counter } == 16, "no update lost")
            #expect(shared.state.withLock { $0.most } == 1, "one holder at a time")
            struct Refusal: Error {}
            await #expect(throws: Refusal.self) {
                try await stores.main.withSecureAggregationLock(processID: "p") { () async throws -> Int in throw Refusal() }
            }
            // Released despite the throw, and a lock per process: these nest without waiting on each other.
            let nested = try await stores.peer.withSecureAggregationLock(processID: "p") {
                try await stores.main.withSecureAggregationLock(processID: "q") { 7 }
            }
            #expect(nested == 7)
            // Taken only if free: nil at once while the other handle holds it (the timer's steps never wait on it), and
            // taken once it is released.
            let busy = try await stores.main.withSecureAggregationLock(processID: "p") {
                try await stores.peer.withSecureAggregationLockIfFree(processID: "p") { 1 }
            }
            #expect(busy == nil)
            #expect(try await stores.peer.withSecureAggregationLockIfFree(processID: "p") { 2 } == 2)
        }
    }
}

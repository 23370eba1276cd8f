import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import Testing

/// Read-after-write across coordinator instances over one store: what one instance hosts, closes or deletes, another
/// answers for at once (no tick in between), endpoint by endpoint; and unknown names cost the store a bounded number of
/// lookups.
@Suite(.serialized) struct CrossInstanceLookupTests {
    typealias Group = MultiInstanceTests.Group
    typealias Device = (response: AuthenticateResponse, session: DeviceSession)

    /// The multi-instance process, gated on link speed so that the speed test's admission is one of the endpoints.
    static func host(goal: Int) -> HostProcessRequest {
        var request = MultiInstanceTests.host(goal: goal)
        request.serverConfig.minimumDownloadMbps = 1
        return request
    }

    static let cycleRequest = CycleRequest(workerID: "", processName: "multi", processVersion: SemanticVersion(1, 0), downloadMbps: 100)

    static func requestCycle(_ device: Device, at coordinator: Coordinator) async throws -> CycleResponse {
        var request = cycleRequest
        request.workerID = device.response.workerID
        return try await coordinator.requestCycle(request, session: try await coordinator.session(forToken: device.response.sessionToken))
    }

    static func report(_ device: Device, _ assignment: CycleAssignment, at coordinator: Coordinator) async throws -> ReportResponse {
        let body = ReportEnvelope.encode(
            diff: MultiInstanceTests.diff(1),
            metadata: ReportMetadata(workerID: device.response.workerID, requestKey: assignment.requestKey, sampleCount: 2, metrics: ["loss": 0.5]))
        return try await coordinator.report(body, session: try await coordinator.session(forToken: device.response.sessionToken))
    }

    /// The code of the error `body` throws (nil when it returns).
    static func code(_ body: () async throws -> Void) async -> CoordinatorError.Code? {
        do {
            try await body()
            return nil
        } catch let error as CoordinatorError {
            return error.code
        } catch {
            Issue.record("not a CoordinatorError: \(error)")
            return nil
        }
    }

    @Test(arguments: StoreKind.underTest) func aProcessHostedAtOneInstanceIsServedAtOnceByAnother(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let (a, b) = (group[0], group[1])
            let hosted = try await a.host(Self.host(goal: 3))
            // Admin endpoints at B, before any tick there.
            #expect(try await b.status(processID: hosted.processID).name == "multi")
            #expect(try await b.processList().processes.map(\.processID) == [hosted.processID])
            #expect(try await b.cycles(processID: hosted.processID).cycles.isEmpty)
            #expect(try await b.checkpoint(processID: hosted.processID, number: nil).number == 0)

            // A device authenticated at A, everything else at B.
            let atA = try await group.device(at: 0)
            let sessionAtB = try await b.session(forToken: atA.response.sessionToken)
            #expect(try await b.admitSpeedTest(.download, requested: nil, session: sessionAtB) == hosted.serverConfig.speedTestDownloadBytes)
            let assignment = try MultiInstanceTests.accepted(try await Self.requestCycle(atA, at: b))
            #expect(try await b.plan(assignment.planID, requestKey: assignment.requestKey, session: sessionAtB).planID == hosted.processID)
            #expect(try await b.model(assignment.modelID, requestKey: assignment.requestKey, session: sessionAtB).bytes.isEmpty == false)
            #expect(try await Self.report(atA, assignment, at: b).cycle == 1)

            // A key issued at A, used at B.
            let second = try await group.device(at: 0)
            let issuedAtA = try MultiInstanceTests.accepted(try await Self.requestCycle(second, at: a))
            let secondAtB = try await b.session(forToken: second.response.sessionToken)
            #expect(try await b.plan(issuedAtA.planID, requestKey: issuedAtA.requestKey, session: secondAtB).planID == hosted.processID)
            #expect(try await Self.report(second, issuedAtA, at: b).reportsReceived >= 1)
        }
    }

    /// What the first devices of a new process behind a round-robin balancer do: a burst of authentications at an
    /// instance that has not loaded the process yet. They share one lookup, and every one succeeds (before they shared
    /// it, the budget turned all but the first 20 away).
    @Test(arguments: StoreKind.underTest) func aBurstOfDevicesAtASecondInstanceSharesOneLookup(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let b = group[1]
            let before = await b.processLookupCounts
            _ = try await group[0].host(Self.host(goal: 3))
            let workers = try await withThrowingTaskGroup(of: String.self) { tasks in
                for _ in 0..<200 {
                    tasks.addTask {
                        try await b.authenticate(AuthenticateRequest(processName: "multi", processVersion: SemanticVersion(1, 0))).workerID
                    }
                }
                return try await tasks.reduce(into: Set<String>()) { $0.insert($1) }
            }
            #expect(workers.count == 200)
            let after = await b.processLookupCounts
            #expect(after.found - before.found == 1 && after.limited == before.limited && after.missing == before.missing)
        }
    }

    @Test(arguments: StoreKind.underTest) func aCycleClosedAtOneInstanceIsTakenUpAtOnceByAnother(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let (a, b) = (group[0], group[1])
            let hosted = try await a.host(Self.host(goal: 1))
            #expect(try await b.status(processID: hosted.processID).currentCycle?.number == 1)
            // B issues a key in cycle 1; A's device closes cycle 1 with its report.
            let atB = try await group.device(at: 1)
            let stale = try MultiInstanceTests.accepted(try await Self.requestCycle(atB, at: b))
            let atA = try await group.device(at: 0)
            let closing = try MultiInstanceTests.accepted(try await Self.requestCycle(atA, at: a))
            #expect(try await Self.report(atA, closing, at: a).cycleClosed)

            // At B, with no tick: the admin view is cycle 2 and checkpoint 1 …
            let status = try await b.status(processID: hosted.processID)
            #expect(status.currentCycle?.number == 2 && status.latestCheckpoint == 1 && status.cyclesCompleted == 1)
            #expect(try await b.checkpoint(processID: hosted.processID, number: nil).number == 1)
            #expect(try await b.cycles(processID: hosted.processID).cycles.count == 1)
            // … cycle 1's key is refused for the plan, the model and the report …
            let session = try await b.session(forToken: atB.response.sessionToken)
            #expect(await Self.code { _ = try await b.plan(stale.planID, requestKey: stale.requestKey, session: session) } == .deadlinePassed)
            #expect(await Self.code { _ = try await b.model(stale.modelID, requestKey: stale.requestKey, session: session) } == .deadlinePassed)
            #expect(await Self.code { _ = try await Self.report(atB, stale, at: b) } == .deadlinePassed)
            // … and a cycle request gets cycle 2.
            let next = try MultiInstanceTests.accepted(try await Self.requestCycle(atB, at: b))
            #expect(next.cycle == 2 && next.checkpoint == 1)
        }
    }

    /// The endpoints a second instance is asked first, right after the process was deleted through the first.
    enum Endpoint: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case authenticate, cycleRequest, repeatedCycleRequest, speedTest, plan, model, report, status, cycles, checkpoint, delete
        var testDescription: String { rawValue }
    }

    @Test(arguments: StoreKind.underTest, Endpoint.allCases)
    func aProcessDeletedAtOneInstanceIsUnknownAtOnceAtAnother(kind: StoreKind, endpoint: Endpoint) async throws {
        try await Group.with(kind, instances: 2) { group in
            let (a, b) = (group[0], group[1])
            let hosted = try await a.host(Self.host(goal: 3))
            // B knows the process, and a device it admitted holds a key of the open cycle.
            let device = try await group.device(at: 1)
            let assignment = try MultiInstanceTests.accepted(try await Self.requestCycle(device, at: b))
            let session = try await b.session(forToken: device.response.sessionToken)
            // Another device B authenticated but has not asked for a cycle yet.
            let newcomer = try await group.device(at: 1)
            try await a.delete(processID: hosted.processID)

            // The endpoint is the first thing B is asked (no tick, no other call in between).
            let id = hosted.processID
            let code: CoordinatorError.Code?
            switch endpoint {
            case .authenticate:
                code = await Self.code { _ = try await b.authenticate(AuthenticateRequest(processName: "multi", processVersion: SemanticVersion(1, 0))) }
            case .cycleRequest: code = await Self.code { _ = try await Self.requestCycle(newcomer, at: b) }
            case .repeatedCycleRequest:
                // A device asking again for the assignment it holds is answered from memory, as every turned-away or
                // repeated check-in is (no database work): the deletion reaches it with the instance's next process
                // refresh, at most a second later.
                #expect(try await Self.requestCycle(device, at: b) == .accepted(assignment))
                group.clock.advance(by: .seconds(1))
                await b.tick()
                code = await Self.code { _ = try await Self.requestCycle(device, at: b) }
            case .speedTest: code = await Self.code { _ = try await b.admitSpeedTest(.upload, requested: 10, session: session) }
            case .plan: code = await Self.code { _ = try await b.plan(assignment.planID, requestKey: assignment.requestKey, session: session) }
            case .model: code = await Self.code { _ = try await b.model(assignment.modelID, requestKey: assignment.requestKey, session: session) }
            case .report: code = await Self.code { _ = try await Self.report(device, assignment, at: b) }
            case .status: code = await Self.code { _ = try await b.status(processID: id) }
            case .cycles: code = await Self.code { _ = try await b.cycles(processID: id) }
            case .checkpoint: code = await Self.code { _ = try await b.checkpoint(processID: id, number: nil) }
            case .delete: code = await Self.code { try await b.delete(processID: id) }
            }
            #expect(code == .unknownProcess, "\(endpoint) at the second instance")
            #expect(try await b.processList().processes.isEmpty)
        }
    }

    @Test(arguments: StoreKind.underTest) func unknownNamesCostTheStoreABoundedNumberOfLookups(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let b = group[1]
            let lookups = await b.processLookupCounts
            // A stream of 200 distinct unknown names in one instant: the budget (20 at once) bounds the lookups; the
            // rest are told to try again (they may exist), not that they are unknown.
            var codes: [CoordinatorError.Code?] = []
            for i in 0..<200 {
                let request = AuthenticateRequest(processName: "ghost-\(i)", processVersion: SemanticVersion(1, 0))
                codes.append(await Self.code { _ = try await b.authenticate(request) })
            }
            #expect(codes.prefix(20).allSatisfy { $0 == .unknownProcess } && codes.dropFirst(20).allSatisfy { $0 == .rateLimited })
            var counts = await b.processLookupCounts
            #expect(counts.missing - lookups.missing == 20)
            #expect(counts.limited - lookups.limited == 180)
            // The same unknown name again: answered from memory for a moment, looked up again later.
            group.clock.advance(by: .seconds(10))
            let ghost = AuthenticateRequest(processName: "ghost", processVersion: SemanticVersion(1, 0))
            for _ in 0..<50 { #expect(await Self.code { _ = try await b.authenticate(ghost) } == .unknownProcess) }
            let before = counts
            counts = await b.processLookupCounts
            #expect(counts.missing - before.missing == 1 && counts.cached - before.cached == 49)
            // A name asked for just before another instance hosts it: unknown for at most the miss's lifetime (a
            // second), then found.
            let multi = AuthenticateRequest(processName: "multi", processVersion: SemanticVersion(1, 0))
            #expect(await Self.code { _ = try await b.authenticate(multi) } == .unknownProcess)
            _ = try await group[0].host(MultiInstanceTests.host(goal: 3))
            #expect(await Self.code { _ = try await b.authenticate(multi) } == .unknownProcess)
            group.clock.advance(by: .seconds(1))
            #expect(!(try await b.authenticate(multi).workerID.isEmpty))
        }
    }

    /// A process deleted through one instance and hosted again under its name through another, before that one noticed
    /// the deletion: when it does notice (its next tick), it forgets the old process, not the new one's name.
    @Test(arguments: StoreKind.underTest) func aNameHostedAgainSurvivesTheOldProcessBeingForgotten(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let (a, b) = (group[0], group[1])
            let first = try await a.host(MultiInstanceTests.host(goal: 3))
            _ = try await group.device(at: 0)
            try await b.delete(processID: first.processID)
            let second = try await a.host(MultiInstanceTests.host(goal: 3))
            #expect(second.processID != first.processID)
            group.clock.advance(by: .seconds(2))
            await a.tick()
            let device = try await group.device(at: 0)
            let assignment = try MultiInstanceTests.accepted(try await group.requestCycle(device, at: 0))
            #expect(assignment.processID == second.processID)
            group.clock.advance(by: .seconds(2))
            await a.tick()
            #expect(!(try await a.authenticate(AuthenticateRequest(processName: "multi", processVersion: SemanticVersion(1, 0))).workerID.isEmpty))
        }
    }

    /// A process deleted and hosted again under its name through another instance: this instance, which still holds the
    /// old one, authenticates a device for the new one at once (no tick in between) instead of answering unknown_process.
    @Test(arguments: StoreKind.underTest) func aNameDeletedAndHostedAgainElsewhereIsAuthenticatedAtOnce(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let (a, b) = (group[0], group[1])
            let first = try await b.host(MultiInstanceTests.host(goal: 3))
            _ = try await group.device(at: 0)
            try await b.delete(processID: first.processID)
            let second = try await b.host(MultiInstanceTests.host(goal: 3))
            let device = try await group.device(at: 0)
            let assignment = try MultiInstanceTests.accepted(try await group.requestCycle(device, at: 0))
            #expect(assignment.processID == second.processID)
        }
    }
}

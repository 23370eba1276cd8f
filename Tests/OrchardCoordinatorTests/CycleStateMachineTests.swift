import Foundation
import OrchardCoordinator
import OrchardProtocol
import OrchardSupport
import Testing

private let t0 = Date(timeIntervalSince1970: 1_000_000)

private func machine(goal: Int = 3, capacity: Int = 4, minimum: Int = 2, length: Double = 100, cycles: Int = 0, window: Double = 10) -> CycleStateMachine {
    CycleStateMachine(
        configuration: .init(goalCount: goal, capacity: capacity, minimumReports: minimum, cycleLength: length, cycles: cycles, paceSteeringWindow: window),
        openedAt: t0
    )
}

private extension CycleStateMachine {
    mutating func admit(_ worker: String, at time: Date = t0) -> String {
        guard case .assigned(let assignment, _, _) = requestCycle(workerID: worker, now: time, newRequestKey: "key-\(worker)", jitter: 0) else {
            Issue.record("\(worker) was not admitted")
            return ""
        }
        return assignment.requestKey
    }

    mutating func deliver(_ worker: String, at time: Date = t0) -> CycleAction? {
        guard case .proceed = beginReport(workerID: worker, requestKey: "key-\(worker)", now: time) else {
            Issue.record("report of \(worker) was refused")
            return nil
        }
        return commitReport(workerID: worker)
    }
}

@Suite struct CycleStateMachineTests {
    @Test func admitsUpToCapacityThenRejectsWithRetryAfter() {
        var m = machine(goal: 2, capacity: 3, window: 10)
        for worker in ["a", "b", "c"] { _ = m.admit(worker) }
        let decision = m.requestCycle(workerID: "d", now: t0.addingTimeInterval(40), newRequestKey: "key-d", jitter: 0.5)
        // 60 s until the deadline, plus half of the 10 s pace-steering window.
        #expect(decision == .rejected(retryAfter: 65, reason: "cycle_full"))
        #expect(m.assignments.count == 3)
    }

    @Test func aReporterIsToldWhenTheNextCycleIsExpectedNotTheOldDeadline() {
        var m = machine(goal: 4, capacity: 5, length: 100)
        for worker in ["a", "b", "c", "d"] { _ = m.admit(worker) }
        // Nobody reported yet: the deadline is the only bound.
        #expect(m.nextCycleExpected(now: t0.addingTimeInterval(5), jitter: 0) == 95)
        // One report 10 s in, three to go at that rate: 30 s, not the 90 s left until the deadline.
        #expect(m.deliver("a", at: t0.addingTimeInterval(10)) == nil)
        #expect(m.nextCycleExpected(now: t0.addingTimeInterval(10), jitter: 0) == 30)
        #expect(m.nextCycleExpected(now: t0.addingTimeInterval(10), jitter: 1) == 33, "spread over a tenth of the estimate")
        // The same device asking again is told the same.
        #expect(
            m.requestCycle(workerID: "a", now: t0.addingTimeInterval(10), newRequestKey: "x", jitter: 0)
                == .rejected(retryAfter: 30, reason: "already_reported"))
        // Slow reports: the estimate never passes the deadline.
        #expect(m.nextCycleExpected(now: t0.addingTimeInterval(80), jitter: 0) == 20)
        // Closed at the goal: the next cycle opens at once.
        _ = m.deliver("b"); _ = m.deliver("c")
        #expect(m.deliver("d") != nil)
        #expect(m.nextCycleExpected(now: t0.addingTimeInterval(40), jitter: 0) == 0)
    }

    @Test func repeatedRequestReturnsTheSameAssignment() {
        var m = machine()
        let key = m.admit("a")
        let again = m.requestCycle(workerID: "a", now: t0.addingTimeInterval(10), newRequestKey: "other", jitter: 0)
        #expect(again == .assigned(.init(workerID: "a", requestKey: key), reportWithin: 90, isNew: false))
    }

    @Test func goalClosesTheCycleWithAggregation() {
        var m = machine(goal: 2, capacity: 3, minimum: 1)
        _ = m.admit("a"); _ = m.admit("b"); _ = m.admit("c")
        #expect(m.deliver("a") == nil)
        #expect(m.deliver("b") == .aggregate(cycle: 1, reports: 2))
        #expect(m.phase == .transitioning)
        // Late report from the third device: the cycle no longer accepts reports.
        #expect(m.beginReport(workerID: "c", requestKey: "key-c", now: t0) == .refused(.deadlinePassed, "cycle 1 stopped accepting reports"))
    }

    @Test func goalWaitsForReportsInFlight() {
        var m = machine(goal: 2, capacity: 3, minimum: 1)
        _ = m.admit("a"); _ = m.admit("b"); _ = m.admit("c")
        #expect(m.beginReport(workerID: "c", requestKey: "key-c", now: t0) == .proceed(cycle: 1))
        #expect(m.deliver("a") == nil)
        #expect(m.deliver("b") == nil)  // goal reached, but c is still committing
        #expect(m.phase == .closing)
        #expect(m.commitReport(workerID: "c") == .aggregate(cycle: 1, reports: 3))
    }

    @Test func deadlineAggregatesWhenTheMinimumArrived() {
        var m = machine(goal: 3, minimum: 2, length: 100)
        _ = m.admit("a"); _ = m.admit("b")
        _ = m.deliver("a"); _ = m.deliver("b")
        #expect(m.timerFired(now: t0.addingTimeInterval(99)) == nil)
        #expect(m.timerFired(now: t0.addingTimeInterval(100)) == .aggregate(cycle: 1, reports: 2))
    }

    @Test func deadlineAbandonsAndReopensOnTheSameCheckpoint() {
        var m = machine(goal: 3, minimum: 2, length: 100)
        _ = m.admit("a")
        _ = m.deliver("a")
        let action = m.timerFired(now: t0.addingTimeInterval(150))
        #expect(action == .abandon(cycle: 1, reports: 1))
        let transition = m.plan(action!, now: t0.addingTimeInterval(150))
        #expect(transition.checkpoint == 0)
        #expect(transition.nextCycle == 2)
        m.apply(transition)
        #expect(m.phase == .open)
        #expect(m.cycle == 2 && m.checkpoint == 0 && m.abandonedCycles == 1 && m.completedCycles == 0)
        #expect(m.deadline == t0.addingTimeInterval(250))
        #expect(m.assignments.isEmpty)
        // The abandoned cycle's key now reads as "too late", an unknown key as invalid.
        #expect(
            m.beginReport(workerID: "a", requestKey: "key-a", now: t0.addingTimeInterval(151))
                == .refused(.deadlinePassed, "request key belongs to cycle 1, which has closed"))
        if case .refused(let code, _) = m.beginReport(workerID: "a", requestKey: "nonsense", now: t0.addingTimeInterval(151)) {
            #expect(code == .invalidRequestKey)
        } else {
            Issue.record("unknown key accepted")
        }
    }

    @Test func aggregationPublishesTheNextCheckpointAndCompletesAfterTheConfiguredCycles() {
        var m = machine(goal: 1, capacity: 1, minimum: 1, cycles: 2)
        for round in 1...2 {
            _ = m.admit("w\(round)", at: m.openedAt)
            let action = m.deliver("w\(round)", at: m.openedAt)
            #expect(action == .aggregate(cycle: round, reports: 1))
            let transition = m.plan(action!, now: m.openedAt.addingTimeInterval(1))
            #expect(transition.checkpoint == round)
            m.apply(transition)
        }
        #expect(m.phase == .completed)
        #expect(m.completedCycles == 2 && m.checkpoint == 2)
        #expect(
            m.requestCycle(workerID: "x", now: t0, newRequestKey: "k", jitter: 0)
                == .rejected(retryAfter: CycleStateMachine.completedRetryAfter, reason: "process_completed"))
    }

    @Test func refusesWrongAndReusedKeys() {
        var m = machine()
        _ = m.admit("a"); _ = m.admit("b")
        #expect(m.beginReport(workerID: "a", requestKey: "key-b", now: t0) == .refused(.invalidRequestKey, "request key was issued to another worker"))
        #expect(m.beginReport(workerID: "a", requestKey: "key-a", now: t0) == .proceed(cycle: 1))
        #expect(
            m.beginReport(workerID: "a", requestKey: "key-a", now: t0) == .refused(.reportAlreadyReceived, "a report for this request key is being processed"))
        _ = m.commitReport(workerID: "a")
        #expect(
            m.beginReport(workerID: "a", requestKey: "key-a", now: t0) == .refused(.reportAlreadyReceived, "a report for this request key was already accepted")
        )
        // One of three reports in at once: the next cycle is expected two seconds on (a second of history at least).
        #expect(m.requestCycle(workerID: "a", now: t0, newRequestKey: "new", jitter: 0) == .rejected(retryAfter: 2, reason: "already_reported"))
    }

    @Test func abortedReportCanBeResent() {
        var m = machine()
        _ = m.admit("a")
        #expect(m.beginReport(workerID: "a", requestKey: "key-a", now: t0) == .proceed(cycle: 1))
        #expect(m.abortReport(workerID: "a") == nil)
        #expect(m.reporting == 0)
        #expect(m.beginReport(workerID: "a", requestKey: "key-a", now: t0) == .proceed(cycle: 1))
    }

    @Test func reportAfterTheDeadlineIsRefusedEvenBeforeTheTimerFires() {
        var m = machine(length: 100)
        _ = m.admit("a")
        #expect(
            m.beginReport(workerID: "a", requestKey: "key-a", now: t0.addingTimeInterval(100)) == .refused(.deadlinePassed, "cycle 1 stopped accepting reports")
        )
    }

    @Test func failedTransitionIsRetriedOnTheNextTick() {
        var m = machine(goal: 1, capacity: 1, minimum: 1)
        _ = m.admit("a")
        let action = m.deliver("a")
        #expect(action == .aggregate(cycle: 1, reports: 1))
        m.transitionFailed()
        #expect(m.phase == .closing)
        #expect(m.timerFired(now: t0) == .aggregate(cycle: 1, reports: 1))
    }

    @Test func restoredStateCountsReportsAndForgetsUncommittedOnes() {
        let m = CycleStateMachine(
            configuration: .init(goalCount: 3, capacity: 4, minimumReports: 1, cycleLength: 100),
            cycle: 5, checkpoint: 4, openedAt: t0, completedCycles: 4,
            assignments: [.init(workerID: "a", requestKey: "ka", state: .reported), .init(workerID: "b", requestKey: "kb", state: .reporting)]
        )
        #expect(m.reported == 1)
        #expect(m.reporting == 0)
        #expect(m.assignments["b"]?.state == .assigned)
    }

    @Test(arguments: [0.0, 0.25, 1.0])
    func retryAfterIsSpreadOverTheWindow(jitter: Double) {
        var m = machine(goal: 1, capacity: 1, length: 100, window: 40)
        _ = m.admit("a")
        let decision = m.requestCycle(workerID: "b", now: t0.addingTimeInterval(30), newRequestKey: "k", jitter: jitter)
        #expect(decision == .rejected(retryAfter: (70 + 40 * jitter).rounded(.up), reason: "cycle_full"))
    }
}

/// Over loopback HTTP: devices that reported before the goal are told when the next cycle is expected (not the old
/// deadline), and the device whose report closed the cycle may ask for the next one at once.
@Suite struct NextCycleRetryTests {
    @Test func reportersAreToldWhenTheNextCycleOpens() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host(Fixture.host(goal: 2, minimum: 1, overSelection: 1, cycleLength: 600))
            let first = try await harness.device(), second = try await harness.device()
            let a = try await harness.join(first), b = try await harness.join(second)
            harness.clock.advance(by: .seconds(30))
            let early = try await harness.report(first, a, diff: Fixture.diff(0.1), samples: 4).decode(ReportResponse.self)
            #expect(early.cycleClosed == false)
            // One of two reports 30 s in: the next cycle is expected about 30 s on (at most 10 % later), not in 570 s.
            #expect(early.retryAfter >= 30 && early.retryAfter <= 33, "retry_after \(early.retryAfter)")
            let closing = try await harness.report(second, b, diff: Fixture.diff(0.2), samples: 4).decode(ReportResponse.self)
            #expect(closing.cycleClosed == true)
            #expect(closing.retryAfter == 0)
            // And the next cycle admits the closer at once.
            guard case .accepted = try await harness.requestCycle(second) else {
                Issue.record("the next cycle did not admit the device whose report closed the last one")
                return
            }
        }
    }

    /// A buffered release holds exactly buffer_size reports: with that many committed or arriving, another report is
    /// told to retry (into the next buffer), and takes the place of one that fails.
    @Test func aBufferAdmitsNoMoreReportsThanItReleases() {
        var m = CycleStateMachine(
            configuration: .init(goalCount: 2, capacity: 5, minimumReports: 2, cycleLength: 100, paceSteeringWindow: 10, buffered: true), openedAt: t0)
        for worker in ["a", "b", "c"] { _ = m.admit(worker) }
        #expect(m.beginReport(workerID: "a", requestKey: "key-a", now: t0) == .proceed(cycle: 1))
        #expect(m.beginReport(workerID: "b", requestKey: "key-b", now: t0) == .proceed(cycle: 1))
        guard case .retry = m.beginReport(workerID: "c", requestKey: "key-c", now: t0) else {
            Issue.record("a third report was let into a buffer of two")
            return
        }
        // One of the two fails: the third takes its place.
        #expect(m.abortReport(workerID: "b") == nil)
        #expect(m.beginReport(workerID: "c", requestKey: "key-c", now: t0) == .proceed(cycle: 1))
        #expect(m.commitReport(workerID: "a") == nil)
        #expect(m.commitReport(workerID: "c") == .aggregate(cycle: 1, reports: 2))
    }

    /// A buffered report's time to report is its own assignment's, not the buffer's.
    @Test func aBufferedReportIsDueCycleLengthAfterItsAssignment() {
        var m = CycleStateMachine(
            configuration: .init(goalCount: 2, capacity: 5, minimumReports: 2, cycleLength: 100, paceSteeringWindow: 10, buffered: true), openedAt: t0)
        _ = m.admit("late", at: t0.addingTimeInterval(40))
        #expect(m.reportDeadline(workerID: "late") == t0.addingTimeInterval(140))
        var plain = machine(length: 100)
        _ = plain.admit("a", at: t0.addingTimeInterval(40))
        #expect(plain.reportDeadline(workerID: "a") == plain.deadline)
    }
}

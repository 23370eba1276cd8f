import Foundation
import OrchardSupport
import OrchardScheduler
import Testing

@Suite("Scheduling policy")
struct PolicyTests {
    let now = Date(timeIntervalSince1970: 1_700_000_000)
    let policy = SchedulingPolicy()

    func candidate(_ id: String, priority: Int, waited: Double, runs: [Double] = [], lastRunAgo: Double = 0, expected: Double? = nil, limit: Double = 30)
        -> SchedulingPolicy.Candidate
    {
        var history: TaskHistory?
        if !runs.isEmpty {
            var h = TaskHistory(identifier: id)
            h.recentRunTimes = runs.map { .seconds($0) }
            h.lastRunEnd = now.addingTimeInterval(-lastRunAgo)
            history = h
        }
        return SchedulingPolicy.Candidate(
            identifier: id, priority: TaskPriorityLevel(priority), eligibleSince: now.addingTimeInterval(-waited),
            history: history, expectedDuration: expected.map { .seconds($0) }, timeLimit: .seconds(limit)
        )
    }

    /// The worked example, in the spirit of Selene's blog post (a 10 s budget; tasks with priority, average
    /// response time and waiting time). The blog's own table was not retrievable here, so these numbers are ours:
    ///
    /// | task     | priority | average | waiting | score = p/5 × (1 + waiting/1 h) |
    /// |----------|----------|---------|---------|----------------------------------|
    /// | contacts | 3        | 3 s     | 2 h     | 0.6 × 3   = 1.8                  |
    /// | flags    | 4        | 5 s     | 1 h     | 0.8 × 2   = 1.6                  |
    /// | calendar | 5        | 6 s     | 0 (just due) | 1.0 × 1   = 1.0                  |
    /// | address  | 1        | 2 s     | 30 min  | 0.2 × 1.5 = 0.3                  |
    ///
    /// Greedy fit into 10 s: contacts (3 s, 7 left), flags (5 s, 2 left), calendar (6 s) does not fit but does not
    /// stop the walk, address (2 s, 0 left). Selene would have scored the new `calendar` task 0 (its elapsed time is
    /// the minimum, normalised to 0) and timed each task from the batch's start.
    @Test func workedExampleWithTenSecondBudget() {
        let tasks = [
            candidate("calendar", priority: 5, waited: 0, runs: [6, 6, 6]),
            candidate("contacts", priority: 3, waited: 7200, runs: [2, 3, 4]),
            candidate("flags", priority: 4, waited: 3600, runs: [5]),
            candidate("address", priority: 1, waited: 1800, runs: [1, 3]),
        ]
        let plan = policy.plan(tasks, budget: .seconds(10), now: now)
        #expect(plan.selected.map(\.identifier) == ["contacts", "flags", "address"])
        #expect(plan.deferred.map(\.identifier) == ["calendar"])
        let scores = Dictionary(uniqueKeysWithValues: (plan.selected + plan.deferred).map { ($0.identifier, $0.score) })
        #expect(abs(scores["contacts"]! - 1.8) < 1e-9)
        #expect(abs(scores["flags"]! - 1.6) < 1e-9)
        #expect(abs(scores["calendar"]! - 1.0) < 1e-9)
        #expect(abs(scores["address"]! - 0.3) < 1e-9)
        let used = plan.selected.reduce(Duration.zero) { $0 + $1.estimate }
        #expect(used == .seconds(10))
    }

    /// The example in Selene's source comments: scores x > y > z, times 20, 5, 10 s, a 30 s window: x and y run.
    @Test func seleneSourceExampleThirtySeconds() {
        let tasks = [
            candidate("x", priority: 5, waited: 0, runs: [20]),
            candidate("y", priority: 4, waited: 0, runs: [5]),
            candidate("z", priority: 3, waited: 0, runs: [10]),
        ]
        let plan = policy.plan(tasks, budget: .seconds(30), now: now)
        #expect(plan.selected.map(\.identifier) == ["x", "y"])
        #expect(plan.deferred.map(\.identifier) == ["z"])
    }

    @Test(arguments: 1...5)
    func aNewTaskHasANonZeroScore(priority: Int) {
        let score = policy.score(candidate("new", priority: priority, waited: 0), now: now)
        #expect(score > 0)
        #expect(score == Double(priority) / 5)
    }

    @Test func agingLetsALowPriorityTaskOvertake() {
        let fresh = candidate("fresh", priority: 5, waited: 0)
        let before = candidate("old", priority: 1, waited: 3 * 3600)
        let after = candidate("old", priority: 1, waited: 5 * 3600)
        #expect(policy.score(before, now: now) < policy.score(fresh, now: now))
        #expect(policy.score(after, now: now) > policy.score(fresh, now: now))
        // Aging stops at the cap: a week of waiting scores as a day does.
        let day = policy.score(candidate("d", priority: 1, waited: 24 * 3600), now: now)
        let week = policy.score(candidate("w", priority: 1, waited: 7 * 24 * 3600), now: now)
        #expect(day == week)
    }

    @Test func movingAverageKeepsTheLastNRuns() {
        var history = TaskHistory(identifier: "t")
        for seconds in [100.0, 2, 4, 6] { history = policy.recording(.seconds(seconds), in: history) }
        #expect(history.recentRunTimes == [.seconds(2), .seconds(4), .seconds(6)])
        history.lastRunEnd = now
        let c = SchedulingPolicy.Candidate(identifier: "t", priority: .normal, eligibleSince: now, history: history, timeLimit: .seconds(30))
        #expect(policy.estimate(c, now: now) == .seconds(4))

        let five = SchedulingPolicy(historyLength: 5)
        var long = TaskHistory(identifier: "t")
        for seconds in [1.0, 2, 3, 4, 5, 6] { long = five.recording(.seconds(seconds), in: long) }
        #expect(long.recentRunTimes.count == 5)
        #expect(long.recentRunTimes.first == .seconds(2))
    }

    @Test func estimateFallsBackToTheRequestThenTheDefaultAndNeverExceedsTheTimeLimit() {
        #expect(policy.estimate(candidate("a", priority: 3, waited: 0, expected: 7), now: now) == .seconds(7))
        #expect(policy.estimate(candidate("b", priority: 3, waited: 0), now: now) == policy.defaultEstimate)
        #expect(policy.estimate(candidate("c", priority: 3, waited: 0, runs: [50], limit: 30), now: now) == .seconds(30))
    }

    @Test func aStaleEstimateDecaysSoAnOverlongTaskIsTriedAgain() {
        let big = { (ago: Double) in self.candidate("big", priority: 3, waited: 0, runs: [20, 20, 20], lastRunAgo: ago) }
        #expect(policy.plan([big(0)], budget: .seconds(10), now: now).selected.isEmpty)
        #expect(policy.plan([big(3 * 3600)], budget: .seconds(10), now: now).selected.isEmpty)
        // After one half-life the estimate is 10 s: it fits a 10 s window.
        let plan = policy.plan([big(6 * 3600)], budget: .seconds(10), now: now)
        #expect(plan.selected.map(\.identifier) == ["big"])
        #expect(abs(plan.selected[0].estimate.inSeconds - 10) < 1e-6)
    }

    @Test func tiesBreakByIdentifier() {
        let plan = policy.plan([candidate("b", priority: 3, waited: 0), candidate("a", priority: 3, waited: 0)], budget: .seconds(100), now: now)
        #expect(plan.selected.map(\.identifier) == ["a", "b"])
    }

    @Test func retryDelaysDoubleFromThirtySecondsUpToTheCap() {
        let retry = RetryPolicy(cap: .seconds(300))
        #expect((1...6).map { retry.delay(afterFailures: $0) } == [30, 60, 120, 240, 300, 300].map { .seconds($0) })
        #expect(RetryPolicy.exponential.delay(afterFailures: 40) == .seconds(5 * 3600))
        #expect(RetryPolicy(maxAttempts: 2).allowsRetry(afterFailures: 1))
        #expect(!RetryPolicy(maxAttempts: 2).allowsRetry(afterFailures: 2))
        #expect(!RetryPolicy.never.allowsRetry(afterFailures: 1))
    }
}

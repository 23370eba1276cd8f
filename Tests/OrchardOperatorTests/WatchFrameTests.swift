import Foundation
import OrchardOperator
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// `orchard process watch`'s frames (pure: status and time → lines) and its polling loop on an injected clock.
@Suite struct WatchFrameTests {
    static let now = Date(timeIntervalSince1970: 1_700_000_000)

    static func status(state: ProcessState = .running, reported: Int = 17, cycles: Int = 10) -> ProcessStatus {
        ProcessStatus(
            processID: "p_0123456789abcdef", name: "housing", version: SemanticVersion(1, 2), state: state, latestCheckpoint: 3,
            checkpoints: [1, 2, 3], cyclesCompleted: 3, cyclesAbandoned: 1,
            currentCycle: state == .completed
                ? nil
                : CycleStatus(
                    number: 5, checkpoint: 3, openedAt: now.timeIntervalSince1970 - 100, deadline: now.timeIntervalSince1970 + 252,
                    assigned: 40, reported: reported, goal: 100, capacity: 130
                ),
            clientConfig: ClientConfig(), serverConfig: ServerConfig(cycles: cycles, goalCount: 100)
        )
    }

    @Test func aTerminalFrameHasTheCycleTheCountsTheCountdownAndABar() {
        let lines = WatchFrame.lines(Self.status(), now: Self.now, style: .terminal(width: 120))
        #expect(
            lines == [
                "housing 1.2.0 (p_0123456789abcdef)  running  checkpoint 3  cycles 3/10 done, 1 abandoned",
                "cycle 5  assigned 40/130  reported 17/100  deadline in 4m 12s",
                "[█████░░░░░░░░░░░░░░░░░░░░░░░░░]  17% of goal",
            ])
        // Cut to the terminal's width, so a redraw moves up exactly one row per line.
        let narrow = WatchFrame.lines(Self.status(), now: Self.now, style: .terminal(width: 40))
        #expect(narrow.allSatisfy { $0.count < 40 })
        #expect(narrow[0].hasSuffix("…"))
    }

    @Test func aPlainFrameIsOneLineStartingWithTheTime() {
        #expect(
            WatchFrame.lines(Self.status(), now: Self.now, style: .plain) == [
                "2023-11-14T22:13:20Z p_0123456789abcdef running cycle 5/10: assigned 40/130, reported 17/100, deadline in 4m 12s, checkpoint 3"
            ])
        #expect(
            WatchFrame.lines(Self.status(state: .completed), now: Self.now, style: .plain) == [
                "2023-11-14T22:13:20Z p_0123456789abcdef completed: checkpoint 3, 3 cycles completed, 1 abandoned"
            ])
        let late = Self.now.addingTimeInterval(300)
        #expect(WatchFrame.lines(Self.status(), now: late, style: .plain)[0].contains("deadline passed 48s ago"))
    }

    @Test func theBarIsFullAtTheGoalAndEmptyWithoutReports() {
        #expect(WatchFrame.bar(reported: 0, goal: 10) == "[" + String(repeating: "░", count: 30) + "]   0% of goal")
        #expect(WatchFrame.bar(reported: 12, goal: 10) == "[" + String(repeating: "█", count: 30) + "] 100% of goal")
    }

    @Test func aRedrawGoesBackUpOverThePreviousFrame() {
        #expect(WatchFrame.redraw(previous: 0, lines: ["a", "b"]) == "a\u{1B}[K\nb\u{1B}[K\n")
        #expect(WatchFrame.redraw(previous: 3, lines: ["a", "b"]) == "\u{1B}[3Fa\u{1B}[K\nb\u{1B}[K\n\u{1B}[J")
    }

    @Test func durations() {
        #expect(OperatorFormat.duration(45.9) == "45s")
        #expect(OperatorFormat.duration(252) == "4m 12s")
        #expect(OperatorFormat.duration(7500) == "2h 05m")
        #expect(OperatorFormat.duration(3 * 86_400 + 4 * 3600 + 5) == "3d 4h")
    }

    @Test func theLoopPollsEveryIntervalOnTheClockAndStopsWhenTheProcessCompletes() async throws {
        let clock = RecordingClock()
        let answers = Mutex([Self.status(reported: 1), Self.status(reported: 50), Self.status(state: .completed)])
        var frames: [(Int?, Date)] = []
        let ending = try await ProcessWatcher.run(interval: .seconds(2), clock: clock) { () throws(OperatorError) in
            answers.withLock { $0.removeFirst() }
        } show: { status, date in
            frames.append((status.currentCycle?.reported, date))
        }
        #expect(ending == .completed)
        #expect(clock.sleeps == [.seconds(2), .seconds(2)])
        #expect(frames.map(\.0) == [1, 50, nil])
        #expect(frames.map(\.1.timeIntervalSince1970) == [1_700_000_000, 1_700_000_002, 1_700_000_004])
    }

    @Test func onceShowsOneFrameAndAFailedPollEndsTheLoop() async throws {
        let clock = RecordingClock()
        var shown = 0
        let ending = try await ProcessWatcher.run(interval: .seconds(5), once: true, clock: clock) { () throws(OperatorError) in
            Self.status()
        } show: { _, _ in
            shown += 1
        }
        #expect(ending == .once && shown == 1 && clock.sleeps.isEmpty)
        let error = await #expect(throws: OperatorError.self) {
            try await ProcessWatcher.run(interval: .seconds(1), clock: clock) { () throws(OperatorError) in
                throw OperatorError(.unreachable, "gone")
            } show: { _, _ in
            }
        }
        #expect(error?.description == "unreachable: gone")
    }

    @Test func cancellingTheTaskEndsTheLoop() async throws {
        let clock = RecordingClock { _ in try await Task.sleep(for: .seconds(60)) }
        let task = Task {
            try await ProcessWatcher.run(interval: .seconds(1), clock: clock) { () throws(OperatorError) in
                Self.status()
            } show: { _, _ in
            }
        }
        try await Task.sleep(for: .milliseconds(50))
        task.cancel()
        #expect(try await task.value == .cancelled)
    }
}

/// How evaluations read in `orchard process status`, `watch` and `evaluation`.
@Suite struct EvaluationFormattingTests {
    static let server = CheckpointEvaluation(checkpoint: 3, samples: 1000, metrics: ["loss": 0.412, "accuracy": 0.861], evaluatedAt: 1_700_000_000)
    static let federated = CheckpointEvaluation(
        checkpoint: 2, samples: 412, metrics: ["loss": 0.5, "accuracy": 0.8], evaluatedAt: 1_700_000_000, devices: 20)
    static let noised = CheckpointEvaluation(
        checkpoint: 2, samples: 400, metrics: ["loss": 0.5], evaluatedAt: 1_700_000_000, epsilon: 0.25)

    @Test func oneLineSaysTheSamplesTheDevicesOrTheNoiseThenTheLossFirst() {
        #expect(OperatorFormat.evaluation(Self.server) == "checkpoint 3 on 1000 samples: loss 0.412, accuracy 0.861")
        #expect(OperatorFormat.evaluation(Self.federated) == "checkpoint 2 on 412 samples from 20 devices: loss 0.5, accuracy 0.8")
        #expect(OperatorFormat.evaluation(Self.noised) == "checkpoint 2 on 400 samples (noised, ε 0.250): loss 0.5")
    }

    @Test func statusAndWatchShowBothKinds() {
        var status = WatchFrameTests.status()
        status.evaluation = Self.server
        status.federatedEvaluation = Self.federated
        let rows = OperatorFormat.status(status, now: WatchFrameTests.now)
        #expect(rows.contains { $0.hasPrefix("evaluation ") && $0.hasSuffix("checkpoint 3 on 1000 samples: loss 0.412, accuracy 0.861") })
        #expect(rows.contains { $0.hasPrefix("federated evaluation") && $0.contains("from 20 devices") })
        let plain = WatchFrame.lines(status, now: WatchFrameTests.now, style: .plain)
        #expect(plain.count == 1 && plain[0].contains("; federated evaluation checkpoint 2 on 412 samples from 20 devices"))
        let terminal = WatchFrame.lines(status, now: WatchFrameTests.now, style: .terminal(width: 200))
        #expect(terminal.last == "federated evaluation: checkpoint 2 on 412 samples from 20 devices: loss 0.5, accuracy 0.8")
    }

    @Test func theEvaluationListHasAFederatedTable() {
        let list = ProcessEvaluations(processID: "p", dataBytes: nil, dataSamples: nil, evaluations: [Self.server], federated: [Self.federated, Self.noised])
        let lines = OperatorFormat.evaluations(list)
        #expect(lines.contains("federated evaluation (devices' held-out samples):"))
        let header = lines.firstIndex { $0.hasPrefix("CHECKPOINT") && $0.contains("DEVICES") }
        #expect(header != nil)
        #expect(lines.contains { $0.contains("noised") })
        // Without federated evaluations the list is as before.
        #expect(
            !OperatorFormat.evaluations(ProcessEvaluations(processID: "p", dataBytes: nil, dataSamples: nil, evaluations: [])).contains {
                $0.contains("federated")
            })
    }
}

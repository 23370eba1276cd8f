import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardScheduler
import OrchardTesting
import Synchronization
import Testing

/// A device's sysfs and procfs as files in a temporary directory: a battery, a mains supply and an Ethernet
/// default route. (A device without a battery counts as mains-powered, so the battery is what makes it unpluggable.)
struct FakeDeviceRoot {
    let sysfs: URL
    let procfs: URL

    init(in directory: URL, onMains: Bool) throws {
        sysfs = directory.appendingPathComponent("sys", isDirectory: true)
        procfs = directory.appendingPathComponent("proc", isDirectory: true)
        try write("Mains\n", "class/power_supply/AC/type", under: sysfs)
        try write("Battery\n", "class/power_supply/BAT0/type", under: sysfs)
        try write("80\n", "class/power_supply/BAT0/capacity", under: sysfs)
        try write("up\n", "class/net/eth0/operstate", under: sysfs)
        try write("1\n", "class/net/eth0/type", under: sysfs)
        try write(
            """
            Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
            eth0\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0

            """, "net/route", under: procfs)
        try setMains(onMains)
    }

    /// Plugs the device in or out.
    func setMains(_ online: Bool) throws {
        try write(online ? "1\n" : "0\n", "class/power_supply/AC/online", under: sysfs)
        try write(online ? "Charging\n" : "Discharging\n", "class/power_supply/BAT0/status", under: sysfs)
    }

    private func write(_ text: String, _ path: String, under root: URL) throws {
        let url = root.appendingPathComponent(path)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(text.utf8).write(to: url, options: .atomic)
    }
}

/// One status line of `orchard agent`.
struct StatusLine: Decodable, Sendable {
    var event: String
    var met: Bool?
    var unmet: [String]?
    var phase: String?
    var outcome: String?
    var cycle: Int?
    var restored: Bool?
    var earliestBegin: Double?

    enum CodingKeys: String, CodingKey {
        case event, met, unmet, phase, outcome, cycle, restored
        case earliestBegin = "earliest_begin"
    }
}

/// Status lines a predicate set aside while waiting for others.
final class SeenLines: Sendable {
    private let lines = Mutex<[StatusLine]>([])
    func add(_ line: StatusLine) { lines.withLock { $0.append(line) } }
    var all: [StatusLine] { lines.withLock { $0 } }
}

/// `orchard agent` as a child process, with its status lines (JSON on standard output) as they arrive.
final class AgentProcess: Sendable {
    private let process: ChildProcess
    private let lines: AsyncStream<StatusLine>
    private let exited: AsyncStream<(Int32, ChildProcess.TerminationReason)>

    init(arguments: [String]) throws {
        let process = ChildProcess()
        process.executableURL = try OrchardExecutable.url()
        process.arguments = ["agent"] + arguments
        let output = Pipe()
        process.standardOutput = output
        let (lines, continuation) = AsyncStream<StatusLine>.makeStream()
        let buffer = Mutex([UInt8]())
        output.fileHandleForReading.readabilityHandler = { handle in
            let chunk = handle.availableData
            if chunk.isEmpty {
                handle.readabilityHandler = nil
                continuation.finish()
                return
            }
            let complete = buffer.withLock { buffer -> [[UInt8]] in
                buffer += chunk
                var found: [[UInt8]] = []
                while let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                    found.append(Array(buffer[..<newline]))
                    buffer.removeSubrange(...newline)
                }
                return found
            }
            for line in complete {
                if let status = try? JSONDecoder().decode(StatusLine.self, from: Data(line)) { continuation.yield(status) }
            }
        }
        let (exited, exit) = AsyncStream<(Int32, ChildProcess.TerminationReason)>.makeStream()
        process.terminationHandler = { process in
            exit.yield((process.terminationStatus, process.terminationReason))
            exit.finish()
        }
        try process.run()
        self.process = process
        self.lines = lines
        self.exited = exited
    }

    /// Reads status lines until one satisfies `predicate` `count` times; fails after `seconds`.
    func waitForLine(_ description: String, count: Int = 1, within seconds: Double, where predicate: @escaping @Sendable (StatusLine) -> Bool) async throws {
        let lines = self.lines
        try await withDeadline(seconds, description) {
            var seen = 0
            for await line in lines where predicate(line) {
                seen += 1
                if seen == count { return }
            }
            throw AgentTestError(description: "the agent's output ended before \(description)")
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    func terminate(within seconds: Double) async throws -> (Int32, ChildProcess.TerminationReason) {
        process.terminate()
        let exited = self.exited
        return try await withDeadline(seconds, "the agent's exit after SIGTERM") {
            for await status in exited { return status }
            throw AgentTestError(description: "no exit status")
        }
    }

    /// Kills the process if it still runs (cleanup after a failed expectation).
    func kill() {
        if process.isRunning { process.interrupt(); process.terminate() }
    }
}

struct AgentTestError: Error, CustomStringConvertible {
    var description: String
}

/// Runs `body`, failing when it has not finished after `seconds` (a bound on a child process, not a timing).
func withDeadline<T: Sendable>(_ seconds: Double, _ what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw AgentTestError(description: "timed out after \(seconds) s waiting for \(what)")
        }
        return value
    }
}

@Suite("orchard agent as a daemon", .serialized)
struct AgentProcessTests {
    /// A device directory with its fake sysfs/procfs and data file, and the agent's arguments for it.
    struct Device {
        let root: FakeDeviceRoot
        let directory: URL

        init(harness: ClientHarness, onMains: Bool) throws {
            directory = harness.directory.appendingPathComponent("agent-device", isDirectory: true)
            root = try FakeDeviceRoot(in: directory, onMains: onMains)
            try Data(Fixture.dataFile()).write(to: data)
        }

        var data: URL { directory.appendingPathComponent("data.safetensors") }
        var state: URL { directory.appendingPathComponent("state", isDirectory: true) }

        func launch(_ harness: ClientHarness) throws -> AgentProcess {
            try AgentProcess(arguments: [
                "--server", harness.url, "--process", "regressor", "--version", "1.0", "--data", data.path, "--state", state.path,
                "--sysfs-root", root.sysfs.path, "--procfs-root", root.procfs.path, "--poll-interval", "0.05", "--window", "600",
                "--log-level", "warning",
            ])
        }
    }

    /// Runs `body` with a loopback coordinator, killing a still-running agent and stopping the coordinator after.
    func withAgentHarness(_ body: (ClientHarness, inout AgentProcess?) async throws -> Void) async throws {
        let harness = try await ClientHarness.start()
        var agent: AgentProcess?
        do {
            try await body(harness, &agent)
        } catch {
            agent?.kill()
            await harness.stop()
            throw error
        }
        agent?.kill()
        await harness.stop()
    }

    @Test("the agent trains and reports only while its conditions hold, and stops cleanly on SIGTERM")
    func agentFollowsConditions() async throws {
        try await withAgentHarness { harness, agentSlot in
            let hosted = try await harness.host(Fixture.host(goal: 5))
            let device = try Device(harness: harness, onMains: false)
            let agent = try device.launch(harness)
            agentSlot = agent
            try await agent.waitForLine("the start line", within: 60) { $0.event == "started" }
            // Two readings on battery: the scheduler read the conditions, declined to run, and read them again.
            try await agent.waitForLine("two checks on battery", count: 2, within: 60) { line in
                line.event == "conditions" && line.met == false && line.unmet?.contains { $0.contains("external") } == true
            }
            let idle = try await harness.coordinator.status(processID: hosted.processID)
            #expect(idle.currentCycle?.assigned == 0)
            #expect(idle.currentCycle?.reported == 0)

            try device.root.setMains(true)
            try await agent.waitForLine("a reported cycle", within: 300) { $0.event == "cycle" && $0.outcome == "reported" }
            let trained = try await harness.coordinator.status(processID: hosted.processID)
            #expect(trained.currentCycle?.reported == 1)
            #expect(trained.currentCycle?.assigned == 1)

            let (status, reason) = try await agent.terminate(within: 60)
            #expect(reason == .exit)
            #expect(status == 0)
            try await agent.waitForLine("the stop line", within: 10) { $0.event == "stopped" }
        }
    }

    @Test("the scheduler's queue survives a restart: a request waiting for the coordinator's retry-after is kept, not sent again at once")
    func queueSurvivesRestart() async throws {
        try await withAgentHarness { harness, agentSlot in
            let hosted = try await harness.host(Fixture.host(goal: 1, overSelection: 1))
            // Another device holds the cycle's only place: the agent's request is rejected with a retry-after.
            let other = try await harness.coordinator.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1, 0)))
            _ = try await harness.coordinator.requestCycle(
                CycleRequest(workerID: other.workerID, processName: "regressor", processVersion: SemanticVersion(1, 0)),
                session: try await harness.coordinator.session(forToken: other.sessionToken)
            )
            let device = try Device(harness: harness, onMains: true)
            let first = try device.launch(harness)
            agentSlot = first
            try await first.waitForLine("a fresh request", within: 60) { $0.event == "scheduled" && $0.restored == false }
            try await first.waitForLine("the rejection", within: 120) { $0.event == "cycle" && $0.outcome == "rejected" }
            // The next check of the conditions comes after the run ended (and the job resubmitted itself).
            try await first.waitForLine("a check after the run", within: 60) { $0.event == "conditions" }
            let (status, reason) = try await first.terminate(within: 60)
            #expect(reason == .exit && status == 0)

            let storePath = device.state.appendingPathComponent("agent-scheduler-regressor.sqlite").path
            let pending = try #require(try SQLiteSchedulerStore(path: storePath).load().pending["dev.orchard.train.regressor"])
            let begin = try #require(pending.request.earliestBeginDate)
            #expect(begin > Date())

            let second = try device.launch(harness)
            agentSlot = second
            let expected = begin.timeIntervalSince1970
            try await second.waitForLine("the restored request with its begin date", within: 60) { line in
                line.event == "scheduled" && line.restored == true && line.earliestBegin.map { abs($0 - expected) < 0.001 } == true
            }
            // Three checks of the conditions (which hold) and no cycle started: the request waits for its begin date.
            let seen = SeenLines()
            try await second.waitForLine("three checks", count: 3, within: 60) { line in
                if line.event != "conditions" { seen.add(line) }
                return line.event == "conditions"
            }
            #expect(seen.all.map(\.event).isEmpty)
            let cycle = try await harness.coordinator.status(processID: hosted.processID).currentCycle
            #expect(cycle?.assigned == 1)
            let (secondStatus, _) = try await second.terminate(within: 60)
            #expect(secondStatus == 0)
        }
    }

    @Test("against a buffered process the agent reports the checkpoint it trained from, and trains again from each release")
    func agentFollowsABufferedProcess() async throws {
        try await withAgentHarness { harness, agentSlot in
            var request = try Fixture.host(goal: 1, overSelection: 1)
            request.serverConfig.aggregationMode = .buffered
            request.serverConfig.buffered = BufferedAggregationConfig(bufferSize: 1, maxConcurrency: 2, maxStaleness: 0)
            let hosted = try await harness.host(request)
            let device = try Device(harness: harness, onMains: true)
            let agent = try device.launch(harness)
            agentSlot = agent
            // Each report fills the one-report buffer, so each release asks the device straight back (retry_after 0);
            // with max_staleness 0 a report from an older checkpoint would be refused, so two accepted reports mean the
            // agent downloaded the release before training again.
            try await agent.waitForLine("two reported cycles", count: 2, within: 300) { $0.event == "cycle" && $0.outcome == "reported" }
            _ = try await agent.terminate(within: 60)
            let status = try await harness.coordinator.status(processID: hosted.processID)
            #expect(status.latestCheckpoint >= 2)
            #expect(status.cyclesCompleted >= 2 && status.cyclesAbandoned == 0)
            let history = try await harness.coordinator.cycles(processID: hosted.processID).cycles
            #expect(history.count >= 2 && history.allSatisfy { $0.metrics["staleness"] == 0 }, "\(history.map(\.metrics))")
        }
    }

    @Test("SIGTERM during training checkpoints and exits 0; the next agent resumes the same cycle and reports once")
    func sigtermMidTraining() async throws {
        try await withAgentHarness { harness, agentSlot in
            // Enough local epochs that training is still running when the signal lands.
            let long = ClientConfig(batchSize: 8, learningRate: 0.01, localEpochs: 3000)
            let hosted = try await harness.host(Fixture.host(goal: 5, clientConfig: long))
            let device = try Device(harness: harness, onMains: true)
            let first = try device.launch(harness)
            agentSlot = first
            try await first.waitForLine("training", within: 120) { $0.event == "phase" && $0.phase == "training" }
            let (status, reason) = try await first.terminate(within: 120)
            #expect(reason == .exit)
            #expect(status == 0)
            try await first.waitForLine("the stop line", within: 10) { $0.event == "stopped" }
            #expect(FileManager.default.fileExists(atPath: device.state.appendingPathComponent("regressor@1.0.0/training-checkpoint.bin").path))
            let interrupted = try await harness.coordinator.status(processID: hosted.processID)
            #expect(interrupted.currentCycle?.reported == 0)

            let second = try device.launch(harness)
            agentSlot = second
            try await second.waitForLine("resumed training", within: 120) { $0.event == "resumed_training" }
            try await second.waitForLine("a reported cycle", within: 600) { $0.event == "cycle" && $0.outcome == "reported" }
            let reported = try await harness.coordinator.status(processID: hosted.processID)
            #expect(reported.currentCycle?.reported == 1)
            #expect(reported.currentCycle?.assigned == 1)
            _ = try await second.terminate(within: 60)
        }
    }
}

import Foundation
@testable import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// An instance loading a process while another instance closes its cycle: the process row (checkpoint weights,
/// optimizer state) and the open cycle are read apart, and a load that mixed the two published the next checkpoint
/// built on the one before the last (the chaos run's "cycle 5, out.bias" under CI load).
@Suite struct LoadConsistencyTests {
    typealias Group = MultiInstanceTests.Group

    /// The initial weights plus each cycle's sample-weighted mean, in Double.
    static func expected(after cycles: [[Sent]]) -> [String: [Float]] {
        var out: [String: [Float]] = [:]
        for tensor in MultiInstanceTests.weights {
            out[tensor.name] = tensor.values.indices.map { i in
                var value = Double(tensor.values[i])
                for reports in cycles {
                    let total = Double(reports.reduce(0) { $0 + $1.samples })
                    value += reports.reduce(0.0) { $0 + Double($1.samples) * Double($1.scale) * Double(i + 1) } / total
                }
                return Float(value)
            }
        }
        return out
    }

    /// A device checked in for the open cycle.
    struct Checked: Sendable {
        var device: (response: AuthenticateResponse, session: DeviceSession)
        var assignment: CycleAssignment
    }

    /// A report: the diff's scale and the sample count.
    struct Sent: Sendable {
        var scale: Float
        var samples: Int
    }

    /// Two devices checked in at `instance` for the open cycle.
    static func assigned(_ group: Group, at instance: Int) async throws -> [Checked] {
        var out: [Checked] = []
        for _ in 0..<2 {
            let device = try await group.device(at: instance)
            out.append(Checked(device: device, assignment: try MultiInstanceTests.accepted(try await group.requestCycle(device, at: instance))))
        }
        return out
    }

    /// Reports `sent[i]` for `checked[i]` at `instance`; returns whether one of them closed the cycle.
    @discardableResult
    static func report(_ group: Group, _ checked: [Checked], _ sent: [Sent], at instance: Int) async throws -> Bool {
        var closed = false
        for (device, report) in zip(checked, sent) {
            let response = try await group.report(device.device, device.assignment, scale: report.scale, samples: report.samples, at: instance)
            closed = closed || response.cycleClosed
        }
        return closed
    }

    @Test(arguments: StoreKind.underTest) func aCycleClosedElsewhereWhileAnInstanceLoadsIsTakenUpWithItsCheckpoint(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let hosted = try await group[0].host(MultiInstanceTests.host(goal: 2))
            let first = try await Self.assigned(group, at: 0)
            let cycle1 = [Sent(scale: 1.5, samples: 3), Sent(scale: -0.5, samples: 5)]
            // Instance 1 loads the process hosted at instance 0 on its tick; between its reads of the process and of the
            // open cycle, instance 0 takes cycle 1's reports and closes it.
            let closes = Counter()
            await group[1].setLoadReadHook { _ in
                guard closes.next() == 0 else { return }
                _ = try? await Self.report(group, first, cycle1, at: 0)
            }
            await group[1].tick()
            await group[1].setLoadReadHook(nil)
            #expect(closes.value >= 2, "the load read the process again after the cycle closed")
            let status = try await group[1].status(processID: hosted.processID)
            #expect(status.latestCheckpoint == 1 && status.cyclesCompleted == 1 && status.currentCycle?.number == 2)
            MultiInstanceTests.expectClose(try await group.checkpoint(hosted.processID, at: 1), Self.expected(after: [cycle1]))

            // Cycle 2 closes at instance 1: its checkpoint builds on checkpoint 1, not on the initial weights.
            let second = try await Self.assigned(group, at: 1)
            let cycle2 = [Sent(scale: 2, samples: 1), Sent(scale: 0.25, samples: 4)]
            #expect(try await Self.report(group, second, cycle2, at: 1), "the second report closes cycle 2 at instance 1")
            await group[0].tick()
            #expect(try await group[0].status(processID: hosted.processID).latestCheckpoint == 2)
            MultiInstanceTests.expectClose(try await group.checkpoint(hosted.processID, at: 0), Self.expected(after: [cycle1, cycle2]))
        }
    }

    /// A store whose open cycle does not follow from its process row (no close in between: the row reads the same
    /// twice) is reported as damaged when the coordinator starts, not retried as if other instances were closing cycles.
    @Test(arguments: StoreKind.underTest) func anOpenCycleThatDoesNotFollowItsProcessIsReportedAsDamaged(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 1) { group in
            let host = MultiInstanceTests.host(goal: 2)
            let process = StoredProcess(
                id: "p_damaged", name: host.name, version: host.version, model: host.model, clientConfig: host.clientConfig,
                serverConfig: host.serverConfig, createdAt: group.clock.date)
            // No cycle was ever closed, yet cycle 3 is the open one.
            try await group.store.createProcess(
                process, initialWeights: host.initialWeights, firstCycle: StoredCycle(number: 3, checkpoint: 0, openedAt: group.clock.date))
            let coordinator = Coordinator(
                store: group.store, configuration: CoordinatorConfiguration(adminToken: "admin", instanceID: "late"), clock: group.clock)
            await #expect {
                try await coordinator.start()
            } throws: { error in
                (error as? StoreError)?.code == .corrupt && "\(error)".contains("process p_damaged has no open cycle 1 on checkpoint 0")
            }
        }
    }

    /// The guard behind the load: a runtime whose weights are not those of the latest checkpoint never publishes an
    /// aggregate built on them (the store refuses the close); it takes the store's state up and closes from that.
    @Test(arguments: StoreKind.underTest) func aRuntimeHoldingAnOlderCheckpointsWeightsNeverPublishesFromThem(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 1) { group in
            let hosted = try await group[0].host(MultiInstanceTests.host(goal: 2))
            let first = try await Self.assigned(group, at: 0)
            let cycle1 = [Sent(scale: 1, samples: 2), Sent(scale: 3, samples: 1)]
            try await Self.report(group, first, cycle1, at: 0)
            let second = try await Self.assigned(group, at: 0)
            // What the race left behind: the initial weights held while cycle 2 trains from checkpoint 1.
            let initial = Safetensors.encode(MultiInstanceTests.weights)
            await group[0].replaceHeldCheckpoint(processID: hosted.processID, number: 0, weights: initial)
            let cycle2 = [Sent(scale: -1, samples: 3), Sent(scale: 0.5, samples: 2)]
            try await Self.report(group, second, cycle2, at: 0)
            await group[0].tick()
            let status = try await group[0].status(processID: hosted.processID)
            #expect(status.latestCheckpoint == 2 && status.cyclesCompleted == 2 && status.currentCycle?.number == 3)
            MultiInstanceTests.expectClose(try await group.checkpoint(hosted.processID, at: 0), Self.expected(after: [cycle1, cycle2]))
        }
    }
}

extension Coordinator {
    /// Makes the runtime hold `weights` as checkpoint `number` (tests: the state a torn load left).
    fileprivate func replaceHeldCheckpoint(processID: String, number: Int, weights: [UInt8]) {
        runtimes[processID]?.checkpointBytes = weights
        runtimes[processID]?.process.latestCheckpoint = number
    }
}

/// A count shared with a hook.
private final class Counter: Sendable {
    private let count = Mutex(0)
    /// The count before this call.
    func next() -> Int {
        count.withLock { count in
            defer { count += 1 }
            return count
        }
    }
    var value: Int { count.withLock { $0 } }
}

import Foundation
public import OrchardSupport
public import OrchardCoordinator
public import OrchardProtocol
import OrchardPrivacy
import OrchardClient
public import OrchardML

/// The coordinator a fleet runs against, as the simulation drives it: a real
/// `Coordinator` hosting the process, its manual clock following the simulation's virtual
/// time (virtual time 0 is the clock's time when the process is hosted). The round's cycle is the coordinator's
/// own: admission, over-selection, deadline, aggregation and its store. Devices reach it through their own
/// transports; this type opens rounds, moves the clock to each call's virtual time, and expires cycles.
public actor FleetCoordinator {
    /// Reports that close a cycle.
    public nonisolated let goal: Int
    /// The hosted process's name.
    public nonisolated let processName: String
    /// The hosted process's version.
    public nonisolated let processVersion: SemanticVersion
    /// How the process's devices train, resolved by the SDK from what the coordinator sends (the architecture's
    /// training section under the process's client config); the seed is each device's own.
    public nonisolated let training: TrainingConfiguration
    private let coordinator: Coordinator
    private nonisolated let clock: ManualClock
    private nonisolated let epoch: WallInstant
    /// The hosted process's identifier.
    public nonisolated let processID: String
    /// The coordinator's cycle counts when the round opened.
    private var countsAtOpening: (current: Int, completed: Int, abandoned: Int)?
    /// Seconds each later stage of secure aggregation stays open at most, when the process uses it.
    public nonisolated let secureStageTimeout: Double?
    /// Whether the process's secure aggregation signs its steps and checks consistency (a fifth stage).
    public nonisolated let secureConsistencyCheck: Bool
    /// Whether the process runs federated evaluation (its devices take evaluation tasks).
    public nonisolated let evaluates: Bool
    /// The latest checkpoint when the round opened (the one its devices train from and evaluate).
    public private(set) var roundCheckpoint = 0
    /// Whether the process aggregates buffered (a round is then one release of the buffer).
    public nonisolated let buffered: Bool

    /// Hosts the process on the coordinator.
    /// - Parameters:
    ///   - coordinator: A started coordinator whose clock is `clock`.
    ///   - clock: The coordinator's clock.
    ///   - process: The process to host (model, initial weights, client and server configuration).
    public init(coordinator: Coordinator, clock: ManualClock, process: HostProcessRequest) async throws(SimulationError) {
        self.coordinator = coordinator
        self.clock = clock
        epoch = clock.now
        goal = process.serverConfig.releaseGoal
        buffered = process.serverConfig.bufferedAggregation != nil
        secureStageTimeout = process.serverConfig.secureAggregation?.stageTimeout
        secureConsistencyCheck = process.serverConfig.secureAggregation?.parameters.consistencyCheck ?? false
        evaluates = process.serverConfig.evaluation != nil
        processName = process.name
        processVersion = process.version
        do throws(OrchardClientError) {
            training = try TrainingConfiguration.resolved(architecture: process.model, clientConfig: process.clientConfig, seed: 0)
        } catch {
            throw SimulationError(.invalidOption, "the process's training settings are unusable: \(error.message)")
        }
        do { processID = try await coordinator.host(process).processID } catch {
            throw SimulationError(.coordinator, "the coordinator refused the process: \(error)")
        }
    }

    /// Moves the coordinator's clock to virtual time `time` (never back).
    public nonisolated func move(to time: Double) {
        clock.advance(to: epoch.advanced(by: .seconds(time)))
    }

    private func status() async throws(SimulationError) -> ProcessStatus {
        do { return try await coordinator.status(processID: processID) } catch {
            throw SimulationError(.coordinator, "cannot read the process status: \(error)")
        }
    }

    /// Lets the coordinator's timer run at `time` (closing a stale cycle) and returns the open cycle's deadline.
    public func openRound(at time: Double) async throws(SimulationError) -> Double {
        move(to: time)
        await coordinator.tick()
        let status = try await status()
        guard let current = status.currentCycle else {
            throw SimulationError(.coordinator, "the coordinator has no open cycle for the process")
        }
        roundCheckpoint = status.latestCheckpoint
        countsAtOpening = await coordinator.cycleCounts(processID: processID)
        return current.deadline - epoch.date.timeIntervalSince1970
    }

    /// Whether the round's cycle has closed, aggregated or abandoned: by a device's report or stage message, or by a
    /// stage whose deadline had passed when a device's call reached the coordinator (the coordinator then opens the
    /// next cycle at once, so the round must end there and not run on to its deadline).
    public func roundCycleClosed() async -> Bool {
        guard let counts = await coordinator.cycleCounts(processID: processID), let opening = countsAtOpening else { return false }
        return counts.current != opening.current || counts.completed != opening.completed || counts.abandoned != opening.abandoned
    }

    /// Whether the round's cycle, once closed, was aggregated (not abandoned).
    public func roundCycleAggregated() async -> Bool {
        guard let counts = await coordinator.cycleCounts(processID: processID), let opening = countsAtOpening else { return false }
        return counts.completed > opening.completed
    }

    /// ε spent so far under the process's differential privacy and the clipping bound of the open cycle, or nil
    /// without privacy.
    /// Buffered: the releases since the round opened, the mean staleness of their reports (from the cycle history; each
    /// release weighs alike) and the devices in flight now.
    public func bufferedProgress() async throws(SimulationError) -> (releases: Int, reported: Int, staleness: Double?, inFlight: Int?) {
        do {
            let counts = await coordinator.cycleCounts(processID: processID)
            let releases = max(0, (counts?.completed ?? 0) - (countsAtOpening?.completed ?? 0))
            let released = try await coordinator.cycles(processID: processID).cycles.suffix(releases)
            let means = released.compactMap { $0.metrics["staleness"] }
            let status = try await status()
            return (
                releases, released.reduce(0) { $0 + $1.reported }, means.isEmpty ? nil : means.reduce(0, +) / Double(means.count),
                status.currentCycle?.buffered?.inFlight
            )
        } catch let error as SimulationError {
            throw error
        } catch {
            throw SimulationError(.coordinator, "cannot read the buffer's progress: \(error)")
        }
    }

    public func privacy() async throws(SimulationError) -> (epsilon: Double, clippingNorm: Double)? {
        try await status().privacy.map { ($0.epsilon, $0.clippingNorm) }
    }

    /// The federated evaluation of checkpoint `number`, once finalized.
    public func federatedEvaluation(checkpoint number: Int) async throws(SimulationError) -> CheckpointEvaluation? {
        do { return try await coordinator.evaluations(processID: processID).federated.last { $0.checkpoint == number } } catch {
            throw SimulationError(.coordinator, "cannot read the federated evaluations: \(error)")
        }
    }

    /// The latest checkpoint's safetensors bytes.
    public func currentModel() async throws(SimulationError) -> [UInt8] {
        do { return try await coordinator.checkpoint(processID: processID, number: nil).bytes } catch {
            throw SimulationError(.coordinator, "cannot read the latest checkpoint: \(error)")
        }
    }

    /// The coordinator's virtual time (it may be past the round's last call when secure-aggregation stages timed out).
    public nonisolated var now: Double { epoch.duration(to: clock.now).inSeconds }

    /// Lets the coordinator close the round's cycle once its devices stopped calling, at the time its own timer would:
    /// the cycle's deadline `time`, or before it the deadline of a secure-aggregation stage still waiting for a device
    /// that went away (and after it, each later stage's). True when the cycle aggregated.
    public func expireCycle(at time: Double) async throws(SimulationError) -> Bool {
        let before = try await status()
        var after = before
        var pastDeadline = false, moves = 0
        while moves < 12, after.currentCycle?.number == before.currentCycle?.number {
            moves += 1
            let secure = after.currentCycle?.secureAggregation
            let stageEnd = secure.map { $0.stageDeadline - epoch.date.timeIntervalSince1970 }
            // A millisecond past a deadline, so that the coordinator's `now >= deadline` holds whatever the rounding
            // of the virtual-to-wall-clock conversion.
            if !pastDeadline, !(stageEnd.map { $0 < time } ?? false) {
                move(to: time + 0.001)
                pastDeadline = true
            } else if let secure, let stageEnd, !pastDeadline || secure.stage != .advertiseKeys {
                move(to: stageEnd + 0.001)
            } else {
                break
            }
            await coordinator.tick()
            after = try await status()
        }
        return after.cyclesCompleted > before.cyclesCompleted
    }
}

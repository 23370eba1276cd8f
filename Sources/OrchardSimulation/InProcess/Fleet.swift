public import Foundation
public import OrchardClient
public import OrchardML
import OrchardFormats
public import OrchardSupport
import OrchardProtocol
import Synchronization
import OrchardPrivacy

/// The devices' computation: local training and the evaluation of a global model.
public protocol FleetWorkload: Sendable {
    /// Samples `device` trains on (its weight in the average).
    func sampleCount(device: Int) -> Int
    /// Runs the device SDK's trainer on `device`'s data for `task`, whose settings are what the coordinator sent
    /// as the SDK resolved them; resumes from a checkpoint of an earlier stretch of the same cycle, and pauses at
    /// `LocalTrainingTask.pauseAfterUpdates`. With `indices`, only those samples of the device's data train (the
    /// part outside its held-out split).
    func train(device: Int, _ task: LocalTrainingTask, on indices: [Int]?, resumingFrom checkpoint: [UInt8]?) throws(OrchardClientError)
        -> LocalTrainingOutcome
    /// Runs the device SDK's evaluation of `model` on the samples `indices` of `device`'s data (its held-out split).
    func evaluate(device: Int, model: CycleModel, on indices: [Int]) throws(OrchardClientError) -> EvaluationMetrics
    /// The updates a checkpoint of `device`'s `task` has done.
    func completedUpdates(device: Int, in checkpoint: [UInt8], of task: LocalTrainingTask) throws(OrchardClientError) -> Int
    /// Evaluates a global model on the held-out test set.
    func evaluate(model: [UInt8]) async throws(SimulationError) -> Evaluation
    /// Metadata the hosted model's initial weights carry (a text model's vocabulary); none by default.
    var weightsMetadata: [String: String] { get }
}

extension FleetWorkload {
    public var weightsMetadata: [String: String] { [:] }
}

/// Runs a fleet of virtual devices against a coordinator, round by round, on virtual time.
///
/// Every device is a `VirtualDevice`: its own clock, its own `BackgroundScheduler` (power
/// and network scripted from the availability trace), its own `FederatedJob` with its state on
/// disk, its own link speeds and data slice. The simulation plays the OS: each round, eligible devices are
/// granted a background window at their check-in time (spread over a few virtual seconds); the device's
/// scheduler launches the training task, whose job asks the coordinator for the cycle, downloads the model,
/// trains, and reports. Training that outlasts the window is expired by the scheduler and checkpointed by the
/// job; the OS grants the next window after a delay while the device is still eligible, and the job resumes the
/// same cycle. A device that drops out is killed at a seeded point of its work.
///
/// Devices run in parallel (at most `parallelism` trainings at a time); their calls to the coordinator are put
/// in virtual-time order by a `FleetTimeline`, so the coordinator sees the same sequence on every run whatever
/// the thread scheduling. The round ends when the coordinator closes the cycle or at its deadline; a device's
/// calls after that are refused and it stops (its late work stays in its job's state, as on a phone).
public struct FleetSimulation: Sendable {
    /// Number of devices.
    public var devices: Int
    /// Fleet behaviour.
    public var conditions: FleetConditions
    /// The simulation seed.
    public var seed: UInt64
    /// Rounds to run.
    public var rounds: Int
    /// Most devices training at the same time (defaults to the number of cores).
    public var parallelism: Int
    /// The global model is evaluated after every `evaluateEvery`-th round and after the last one.
    public var evaluateEvery: Int
    /// What happens to devices that check in after the round's cycle is full.
    public var turnedAway: TurnedAwayChoice
    /// The run ends after the round in progress once this much virtual time has passed (nil: after `rounds`).
    public var virtualSecondsLimit: Double?

    /// Devices handed to the runner ahead of the earliest one, so that setting one up overlaps the others' work. A
    /// constant, not a multiple of the cores: which devices are reached before a cycle fills (run through the whole
    /// stack, drawing from the coordinator's generator) must not depend on the machine, or neither would the results.
    static let lookahead = 4

    /// Creates a simulation.
    public init(
        devices: Int, conditions: FleetConditions = FleetConditions(), seed: UInt64 = 0, rounds: Int = 10,
        parallelism: Int = ProcessInfo.processInfo.activeProcessorCount, evaluateEvery: Int = 1, turnedAway: TurnedAwayChoice = .modeled
    ) {
        self.turnedAway = turnedAway
        self.devices = devices
        self.conditions = conditions
        self.seed = seed
        self.rounds = rounds
        self.parallelism = max(1, parallelism)
        self.evaluateEvery = max(1, evaluateEvery)
    }

    /// Runs every round.
    /// - Parameters:
    ///   - coordinator: The coordinator, with the process hosted.
    ///   - transport: How devices reach it (in-process calls, or HTTP on loopback).
    ///   - workload: The devices' computation.
    ///   - directory: Where the devices keep their job state (one subdirectory each).
    ///   - wallClock: Real time, for the wall-seconds figures (injected).
    ///   - stop: Asked before each round: once requested, the run ends after the round in progress.
    ///   - onRound: Called after each round with its record.
    /// - Returns: The initial evaluation and one record per round.
    public func run(
        coordinator: FleetCoordinator, transport: any ClientTransport, workload: some FleetWorkload, directory: URL,
        wallClock: any WallClock, stop: SimulationStop? = nil, onRound: (RoundMetrics) -> Void = { _ in }
    ) async throws(SimulationError) -> (initial: Evaluation, rounds: [RoundMetrics]) {
        let timeline = FleetTimeline()
        let slots = AsyncSemaphore(permits: max(1, parallelism))
        // Every device's state is a tree of its own under `directory`, made and removed within seconds: spread the trees
        // over the file system's groups (on ext4, 10,000 devices' runs back to back took 1.45 times longer without it).
        do { try LocalFile.createDirectory(directory.path) } catch {
            throw SimulationError(.unwritable, "cannot create the devices' directory \(directory.path): \(error.message)")
        }
        LocalFile.spreadSubdirectories(of: directory.path)
        // Devices are set up the first time they check in: a population's devices cost memory only once they take part.
        var fleet = [VirtualDevice?](repeating: nil, count: devices)
        // The virtual time of a device not yet set up: the latest window it was granted (its clock once it is).
        var granted = [Double](repeating: 0, count: devices)
        func virtualDevice(_ index: Int) async throws(SimulationError) -> VirtualDevice {
            if let device = fleet[index] { return device }
            let profile = conditions.profile(device: index, seed: seed)
            let device = try await VirtualDevice(
                index: index, profile: profile, directory: directory.appendingPathComponent("device-\(index)", isDirectory: true),
                transport: transport, processName: coordinator.processName, processVersion: coordinator.processVersion.description,
                workload: workload, availability: conditions.availability, windowSeconds: conditions.windowSeconds, seed: seed,
                timeline: timeline, coordinator: coordinator, slots: slots
            )
            fleet[index] = device
            return device
        }
        let initialModel = try await coordinator.currentModel()
        let initial = try await workload.evaluate(model: initialModel)
        var records: [RoundMetrics] = []
        var pending: (record: RoundMetrics, evaluation: Task<Evaluation?, any Error>)?
        var pendingEvaluated = false
        var clock = 0.0
        for round in 1...max(rounds, 1) where rounds > 0 {
            if stop?.isRequested == true { break }
            if let limit = virtualSecondsLimit, clock >= limit { break }
            let wallStart = wallClock.now
            let start = openingTime(after: clock, goal: coordinator.goal)
            let cycleDeadline = try await coordinator.openRound(at: start)
            // Under secure aggregation the round goes on past the cycle's deadline for at most three stage timeouts (four
            // with consistency_check).
            let deadline = cycleDeadline + Double(coordinator.secureConsistencyCheck ? 4 : 3) * (coordinator.secureStageTimeout ?? 0)
            let modelBytes = try await coordinator.currentModel().count
            // Check-ins, in virtual-time order: each eligible device is granted a window a seeded moment after the opening.
            var checkIns: [(time: Double, device: Int)] = []
            for device in 0..<devices {
                let now = fleet[device]?.clock.seconds ?? granted[device]
                let time: Double
                let window: AvailabilityWindow
                if conditions.windowInterval != nil {
                    // The OS grants windows on its own schedule: the device checks in at the first one after the opening
                    // (or after its own work, when still busy).
                    guard let grant = conditions.grantedWindow(device: device, atOrAfter: max(start, now), seed: seed),
                        let span = conditions.availability.window(for: device, atOrAfter: grant, seed: seed)
                    else { continue }
                    (time, window) = (grant, span)
                } else {
                    guard let span = conditions.availability.window(for: device, atOrAfter: start, seed: seed) else { continue }
                    var jitter = OrchardRandomAccess.uniform(seed: seed, a: UInt64(device), b: UInt64(round), salt: 0xC4EC_C1)
                    jitter *= conditions.checkInSpread
                    (time, window) = (max(start, span.start) + jitter, span)
                }
                guard time < cycleDeadline && time < window.end && now < cycleDeadline else { continue }
                // A device still busy from an earlier round (or granted a window then that the round's end cut) checks in
                // once its clock gets there.
                if let existing = fleet[device] { existing.clock.advance(to: time) } else { granted[device] = max(now, time) }
                checkIns.append((max(now, time), device))
            }
            // The timeline hands devices over in check-in order as the round reaches them (a few ahead, so that setting one
            // up overlaps the others' work); once the cycle is full, the rest are turned away without running (modeled).
            // Buffered: a device turned away (max_concurrency devices training) does not mean the others are; a place frees
            // with every report, so every check-in runs.
            // A release does not end a buffered round either: the devices still training go on into the next buffer, so a
            // buffered round is a span of virtual time (to the deadline), with as many releases as the reports make.
            await timeline.begin(
                deadline: deadline, checkIns: checkIns, lookahead: Self.lookahead, turnedAway: coordinator.buffered ? .fullStack : turnedAway,
                endsAtClose: !coordinator.buffered)
            let tasks = RoundTasks()
            let results = await withTaskCancellationHandler { () async -> [Result<DeviceRoundRecord, SimulationError>] in
                var setupFailure: SimulationError?
                while let batch = await timeline.launches() {
                    for (time, index) in batch {
                        let device: VirtualDevice
                        do throws(SimulationError) { device = try await virtualDevice(index) } catch {
                            setupFailure = setupFailure ?? error
                            await timeline.leave(index)
                            continue
                        }
                        device.clock.advance(to: time)
                        await timeline.started(index, clock: device.clock)
                        let conditions = self.conditions, seed = self.seed
                        let updates = coordinator.training.plannedUpdates(samples: workload.sampleCount(device: index))
                        tasks.append(
                            Task {
                                let result: Result<DeviceRoundRecord, SimulationError>
                                do throws(SimulationError) {
                                    result = .success(
                                        try await device.runRound(
                                            round: round, deadline: deadline, updates: updates, modelBytes: modelBytes, conditions: conditions,
                                            seed: seed, timeline: timeline
                                        ))
                                } catch {
                                    result = .failure(error)
                                }
                                await timeline.leave(device.index)
                                return result
                            })
                    }
                }
                // One task per device, awaited in order. (Not a task group: the runtime unlinks a finished child by walking
                // the group's list of children, which is quadratic over a round of ten thousand devices.)
                var results: [Result<DeviceRoundRecord, SimulationError>] = []
                for task in tasks.all { results.append(await task.value) }
                if let setupFailure { results.append(.failure(setupFailure)) }
                return results
            } onCancel: {
                tasks.cancelAll()
            }
            var deviceRecords: [DeviceRoundRecord] = []
            for result in results {
                switch result {
                case .success(let record): deviceRecords.append(record)
                case .failure(let error): throw error
                }
            }
            let end = await timeline.roundEnd()
            var aggregated = end.closed ? await coordinator.roundCycleAggregated() : try await coordinator.expireCycle(at: max(cycleDeadline, end.time))
            if coordinator.buffered { aggregated = await coordinator.roundCycleAggregated() }
            // When no device could call before the round's deadline, the round ended where the coordinator's timer closed
            // the cycle: a secure stage waiting for a device that went away closes at its own deadline, long before that.
            let endTime = end.closed ? end.time : min(end.time, coordinator.now)
            // The global model is evaluated while the next round runs (it uses the cores the round leaves idle); the
            // round's record is published once its evaluation is in.
            let model = round % evaluateEvery == 0 || round == rounds ? try await coordinator.currentModel() : nil
            let evaluation = Task { () async throws -> Evaluation? in
                guard let model else { return nil }
                return try await workload.evaluate(model: model)
            }
            let selected = deviceRecords.filter { $0.assignedAt != nil }
            let accepted = selected.count { ($0.reportedAt ?? .infinity) <= endTime }
            // A device that went away after its input was in (a secure-aggregation stage after masked_input) counts once, as
            // accepted.
            let dropouts = selected.count { ($0.droppedAt ?? .infinity) <= endTime && ($0.reportedAt ?? .infinity) > endTime }
            let privacy = try await coordinator.privacy()
            let modeled = await timeline.modeledTurnedAway(before: endTime)
            var record = RoundMetrics(
                round: round, wallSeconds: wallStart.duration(to: wallClock.now).inSeconds, virtualStart: start, virtualEnd: endTime,
                availableFraction: conditions.availability.availableFraction(devices: devices, at: start, seed: seed),
                selected: selected.count, participants: aggregated ? accepted : 0, dropouts: dropouts,
                late: selected.count - accepted - dropouts,
                expirations: deviceRecords.reduce(0) { $0 + $1.expirations.count { $0 <= endTime } },
                resumed: deviceRecords.reduce(0) { $0 + $1.resumptions.count { $0 <= endTime } },
                bytesUp: deviceRecords.reduce(0) { $0 + $1.uploads.filter { $0.time <= endTime }.reduce(0) { $0 + $1.bytes } },
                bytesDown: deviceRecords.reduce(0) { $0 + $1.downloads.filter { $0.time <= endTime }.reduce(0) { $0 + $1.bytes } },
                aggregated: aggregated, testLoss: nil, testAccuracy: nil, testRMSE: nil, epsilon: privacy?.epsilon, clippingNorm: privacy?.clippingNorm,
                checkIns: deviceRecords.count { ($0.checkedInAt ?? .infinity) <= endTime }, turnedAwayModeled: modeled
            )
            if coordinator.evaluates {
                // The round's starting checkpoint, evaluated by devices during the round (final at its goal or at the
                // next publication).
                record.federatedEvaluation = try await coordinator.federatedEvaluation(checkpoint: await coordinator.roundCheckpoint)
            }
            let diverged = selected.count { $0.diverged && ($0.droppedAt ?? .infinity) <= endTime }
            if diverged > 0 { record.diverged = diverged }
            if coordinator.secureStageTimeout != nil {
                func count(_ stage: SecureAggregationStage) -> Int { selected.count { $0.secureSteps.contains(stage) } }
                record.secureAggregation = SecureStageCounts(
                    advertised: count(.advertiseKeys), shared: count(.shareKeys), masked: count(.maskedInput),
                    signed: coordinator.secureConsistencyCheck ? count(.consistencyCheck) : nil, unmasked: count(.unmask))
            }
            if coordinator.buffered {
                let progress = try await coordinator.bufferedProgress()
                record.staleness = progress.staleness
                record.inFlight = progress.inFlight
                record.releases = progress.releases
                // The reports this round's releases aggregated, whenever they arrived (a buffer carries reports over from
                // round to round, and a device may report more than once in one).
                record.participants = progress.reported
            }
            if let previous = pending { records.append(try await Self.publish(previous, onRound)) }
            pending = (record, evaluation)
            pendingEvaluated = model != nil
            clock = max(endTime, coordinator.now)
        }
        if var last = pending {
            // The last round is always evaluated: a run ended by Ctrl-C or --virtual-hours between evaluations would
            // otherwise report an older round's accuracy, or the initial model's, as its final one.
            if !pendingEvaluated {
                let model = try await coordinator.currentModel()
                last.evaluation = Task { try await workload.evaluate(model: model) }
            }
            records.append(try await Self.publish(last, onRound))
        }
        return (initial, records)
    }

    /// Completes a round's record with its evaluation and publishes it.
    private static func publish(
        _ round: (record: RoundMetrics, evaluation: Task<Evaluation?, any Error>), _ onRound: (RoundMetrics) -> Void
    ) async throws(SimulationError) -> RoundMetrics {
        var record = round.record
        let result: Evaluation?
        do { result = try await round.evaluation.value } catch let error as SimulationError { throw error } catch {
            throw SimulationError(.training, "cannot evaluate the global model: \(error)")
        }
        if let evaluation = result {
            record.testLoss = evaluation.loss
            record.testAccuracy = evaluation.accuracy
            record.testRMSE = evaluation.rmse
            record.testPerplexity = evaluation.perplexity
        }
        onRound(record)
        return record
    }

    /// The first time at or after `time` when at least `goal` devices are eligible (the coordinator's pace
    /// steering tells devices to come back then), looking ahead up to two virtual days in five-minute steps.
    func openingTime(after time: Double, goal: Int) -> Double {
        var candidate = time
        while candidate < time + 2 * Availability.day {
            let eligible = (0..<devices).count { conditions.availability.isAvailable($0, at: candidate, seed: seed) }
            if eligible >= goal { return candidate }
            candidate += 300
        }
        return time
    }
}

/// The tasks of a round's devices, started as the round reaches them; cancelling the round cancels them, and one
/// started after that.
final class RoundTasks: Sendable {
    private let state = Mutex<(tasks: [Task<Result<DeviceRoundRecord, SimulationError>, Never>], cancelled: Bool)>(([], false))

    var all: [Task<Result<DeviceRoundRecord, SimulationError>, Never>] { state.withLock { $0.tasks } }

    func append(_ task: Task<Result<DeviceRoundRecord, SimulationError>, Never>) {
        let cancelled = state.withLock { state in
            state.tasks.append(task)
            return state.cancelled
        }
        if cancelled { task.cancel() }
    }

    func cancelAll() {
        let tasks = state.withLock { state in
            state.cancelled = true
            return state.tasks
        }
        for task in tasks { task.cancel() }
    }
}

/// At most `permits` trainings at the same time, admitted in arrival order; a training cancelled while it waits
/// does not run.
///
/// A training is a long synchronous computation, so it runs on a Dispatch worker thread rather than on Swift's
/// cooperative pool (as wide as the cores): there it would hold a pool thread for its whole length, and the devices'
/// check-ins, transfers and coordinator calls — the fleet's critical path — would wait for it.
extension AsyncSemaphore {
    func runTraining<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        await wait()
        defer { signal() }
        try Task.checkCancellation()
        return try await offCooperativePool(body)
    }
}

/// Random-access draws: a uniform number in [0, 1) from (seed, a, b), independent of any other draw.
enum OrchardRandomAccess {
    static func uniform(seed: UInt64, a: UInt64, b: UInt64, salt: UInt64) -> Double {
        // Each word is hashed on its own before it joins the state. XOR-ing raw words into the state made small seeds
        // relabel the same draws (seed 1's device 0 drew what seed 2's device 3 drew) and left a round's draws at one
        // secure-aggregation stage correlated with its draws at the others.
        var z = SplitMix64.mix(seed &+ salt &* SplitMix64.increment)
        for word in [a, b] { z = SplitMix64.mix(z &+ SplitMix64.mix(word &+ SplitMix64.increment)) }
        return Double(z >> 11) * 0x1.0p-53
    }
}

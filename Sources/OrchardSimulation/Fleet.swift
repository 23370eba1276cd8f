public import Foundation

/// A device's assignment to a round, as the coordinator handed it out.
public struct FleetAssignment: Sendable, Hashable {
    /// The device.
    public var device: Int
    /// The worker id the coordinator knows the device by.
    public var worker: String
    /// The coordinator's cycle number.
    public var cycle: Int
    /// The global model the device starts from (safetensors bytes).
    public var model: [UInt8]
    /// An opaque handle the server adapter needs to accept the report (e.g. a request key).
    public var handle: String

    /// Creates an assignment.
    public init(device: Int, worker: String, cycle: Int, model: [UInt8], handle: String) {
        self.device = device
        self.worker = worker
        self.cycle = cycle
        self.model = model
        self.handle = handle
    }
}

/// A device's finished local training.
public struct DeviceUpdate: Sendable, Hashable {
    /// The device.
    public var device: Int
    /// The report body the device uploads (the weight diff, safetensors bytes).
    public var diff: [UInt8]
    /// Training samples behind the update (the aggregation weight).
    public var sampleCount: Int
    /// Mean training loss over the local run.
    public var trainingLoss: Double
    /// Checkpoints written when a window expired and read back to resume.
    public var checkpointsRestored: Int

    /// Creates an update.
    public init(device: Int, diff: [UInt8], sampleCount: Int, trainingLoss: Double, checkpointsRestored: Int) {
        self.device = device
        self.diff = diff
        self.sampleCount = sampleCount
        self.trainingLoss = trainingLoss
        self.checkpointsRestored = checkpointsRestored
    }
}

/// What the coordinator answered to a report.
public struct ReportReceipt: Sendable, Hashable {
    /// Whether the update was accepted into the cycle.
    public var accepted: Bool
    /// Whether the cycle closed (and aggregated) with this report.
    public var closedCycle: Bool

    /// Creates a receipt.
    public init(accepted: Bool, closedCycle: Bool) {
        self.accepted = accepted
        self.closedCycle = closedCycle
    }
}

/// The coordinator, as the simulated fleet talks to it. Every call carries the virtual time at which it
/// happens; the adapter moves the coordinator's clock there first.
public protocol FleetServer: Sendable {
    /// Reports the cycle needs before it closes.
    var goal: Int { get }
    /// Makes sure a cycle is open at virtual time `time` (closing a stale one) and returns its deadline.
    func openRound(at time: Double) async throws(SimulationError) -> Double
    /// The current global model (safetensors bytes).
    func currentModel() async throws(SimulationError) -> [UInt8]
    /// A device asks for work; nil when the coordinator turns it away (cycle full, or closed).
    func checkIn(device: Int, at time: Double) async throws(SimulationError) -> FleetAssignment?
    /// A device uploads its update.
    func report(_ update: DeviceUpdate, for assignment: FleetAssignment, at time: Double) async throws(SimulationError) -> ReportReceipt
    /// Moves the clock to the cycle's deadline and lets the coordinator close it; true when it aggregated.
    func expireCycle(at time: Double) async throws(SimulationError) -> Bool
}

/// The devices' computation: local training and the evaluation of a global model.
public protocol FleetWorkload: Sendable {
    /// Optimizer updates `device`'s local training takes in one round.
    func updatesPerRound(device: Int) -> Int
    /// Trains `device` from `assignment.model`, checkpointing and resuming between the given stretches
    /// (`updatesPerWindow`, in order; their sum is the whole local run).
    func train(_ assignment: FleetAssignment, updatesPerWindow: [Int], round: Int) async throws(SimulationError) -> DeviceUpdate
    /// Evaluates a global model on the held-out test set.
    func evaluate(model: [UInt8]) async throws(SimulationError) -> Evaluation
}

/// Runs a fleet of virtual devices against a coordinator, round by round, on a virtual clock.
///
/// Per round, a discrete-event loop on the virtual clock: eligible devices check in (spread over a few virtual
/// seconds; the coordinator assigns the first ones up to its capacity); each assigned device's round is planned
/// at check-in (``DeviceSchedule``: dropouts, expired background windows, resumptions, missed deadlines), and a
/// device that will report starts training for real at check-in, in the background (at most `parallelism` at a
/// time); reports are delivered one by one in virtual-time order (ties by device id), each waiting for its
/// training, so aggregation sees the same sequence on every run whatever the thread scheduling. The round ends
/// when the coordinator closes the cycle (goal met) or at its deadline. Devices still due after the close are
/// counted late and their trainings are cancelled (the coordinator would refuse their reports).
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

    /// Creates a simulation.
    public init(
        devices: Int, conditions: FleetConditions = FleetConditions(), seed: UInt64 = 0, rounds: Int = 10,
        parallelism: Int = ProcessInfo.processInfo.activeProcessorCount, evaluateEvery: Int = 1
    ) {
        self.devices = devices
        self.conditions = conditions
        self.seed = seed
        self.rounds = rounds
        self.parallelism = max(1, parallelism)
        self.evaluateEvery = max(1, evaluateEvery)
    }

    /// Runs every round.
    /// - Parameters:
    ///   - server: The coordinator.
    ///   - workload: The devices' computation.
    ///   - now: Real time, for the wall-seconds figures (injected).
    ///   - onRound: Called after each round with its record.
    /// - Returns: The initial evaluation and one record per round.
    public func run(
        server: some FleetServer, workload: some FleetWorkload, now: @Sendable () -> Double,
        onRound: (RoundMetrics) -> Void = { _ in }
    ) async throws(SimulationError) -> (initial: Evaluation, rounds: [RoundMetrics]) {
        let profiles = (0..<devices).map { DeviceProfile.sample(device: $0, seed: seed, medianSecondsPerUpdate: conditions.medianSecondsPerUpdate, spread: conditions.speedSpread) }
        let initial = try await workload.evaluate(model: server.currentModel())
        let slots = TrainingSlots(parallelism)
        var records: [RoundMetrics] = []
        var clock = 0.0
        for round in 1...max(rounds, 1) where rounds > 0 {
            let wallStart = now()
            let start = openingTime(after: clock, goal: server.goal)
            let deadline = try await server.openRound(at: start)
            // Check-ins, in virtual-time order.
            var checkIns: [(time: Double, device: Int)] = []
            for device in 0..<devices {
                guard let window = conditions.availability.window(for: device, atOrAfter: start, seed: seed) else { continue }
                var jitter = OrchardRandomAccess.uniform(seed: seed, a: UInt64(device), b: UInt64(round), salt: 0xC4EC_C1)
                jitter *= conditions.checkInSpread
                let time = max(start, window.start) + jitter
                if time < deadline && time < window.end { checkIns.append((time, device)) }
            }
            checkIns.sort { ($0.time, $0.device) < ($1.time, $1.device) }
            // The round as a discrete-event loop: check-ins and report deliveries in virtual-time order (reports
            // first on ties, then by device). A device's training starts (in the background, at most `parallelism`
            // at a time) as soon as it checks in, since it depends only on its assignment; its report waits for it.
            var schedules: [DeviceSchedule] = []
            var assignmentByDevice: [Int: FleetAssignment] = [:]
            var reportsDue: [(time: Double, device: Int)] = []
            var trainings: [Int: Task<DeviceUpdate, any Error>] = [:]
            defer { for training in trainings.values { training.cancel() } }
            var nextCheckIn = 0
            var end = deadline
            var accepted = 0
            var bytesUp = 0
            var closed = false
            while !closed {
                let report = reportsDue.min { ($0.time, $0.device) < ($1.time, $1.device) }
                let checkIn = nextCheckIn < checkIns.count ? checkIns[nextCheckIn] : nil
                if let report, checkIn.map({ report.time <= $0.time }) ?? true {
                    guard report.time <= deadline else { break }
                    reportsDue.removeAll { $0.device == report.device }
                    let update = try await Self.result(of: trainings.removeValue(forKey: report.device)!)
                    let receipt = try await server.report(update, for: assignmentByDevice[report.device]!, at: report.time)
                    bytesUp += update.diff.count
                    if receipt.accepted { accepted += 1 }
                    if receipt.closedCycle {
                        closed = true
                        end = report.time
                    }
                } else if let checkIn {
                    nextCheckIn += 1
                    guard checkIn.time < deadline else { continue }
                    guard let assignment = try await server.checkIn(device: checkIn.device, at: checkIn.time) else { continue }
                    let schedule = DeviceSchedule.plan(
                        device: checkIn.device, checkIn: checkIn.time, updates: workload.updatesPerRound(device: checkIn.device),
                        downloadBytes: assignment.model.count, uploadBytes: assignment.model.count, deadline: deadline, round: round,
                        profile: profiles[checkIn.device], conditions: conditions, seed: seed
                    )
                    schedules.append(schedule)
                    assignmentByDevice[checkIn.device] = assignment
                    if case .reports(let time) = schedule.outcome {
                        reportsDue.append((time, checkIn.device))
                        let windows = schedule.updatesPerWindow
                        trainings[checkIn.device] = Task {
                            try await slots.run { try await workload.train(assignment, updatesPerWindow: windows, round: round) }
                        }
                    }
                } else {
                    break
                }
            }
            // Devices still due after the close are late: their trainings stop at the next batch boundary.
            for training in trainings.values { training.cancel() }
            for training in trainings.values { _ = try? await training.value }
            trainings = [:]
            let aggregated = closed ? true : try await server.expireCycle(at: deadline)
            let evaluation = round % evaluateEvery == 0 || round == rounds ? try await workload.evaluate(model: server.currentModel()) : nil
            let bytesDown = assignmentByDevice.values.reduce(0) { $0 + $1.model.count }
            let dropouts = schedules.count { schedule in
                if case .dropsOut(let time) = schedule.outcome { return time <= end }
                return false
            }
            let record = RoundMetrics(
                round: round, wallSeconds: now() - wallStart, virtualStart: start, virtualEnd: end,
                availableFraction: conditions.availability.availableFraction(devices: devices, at: start, seed: seed),
                selected: schedules.count, participants: aggregated ? accepted : 0, dropouts: dropouts,
                late: schedules.count - accepted - dropouts,
                expirations: schedules.reduce(0) { $0 + $1.expirations.count { $0 <= end } },
                resumed: schedules.reduce(0) { $0 + $1.resumptions.count { $0 <= end } },
                bytesUp: bytesUp, bytesDown: bytesDown, aggregated: aggregated,
                testLoss: evaluation?.loss, testAccuracy: evaluation?.accuracy, testRMSE: evaluation?.rmse
            )
            records.append(record)
            onRound(record)
            clock = end
        }
        return (initial, records)
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

    /// The update a background training produced, its failure as a ``SimulationError``.
    private static func result(of training: Task<DeviceUpdate, any Error>) async throws(SimulationError) -> DeviceUpdate {
        do {
            return try await training.value
        } catch let error as SimulationError {
            throw error
        } catch {
            throw SimulationError(.training, "device training failed: \(error)")
        }
    }
}

/// At most `count` trainings at the same time, admitted in arrival order; a training cancelled while it waits
/// does not run.
actor TrainingSlots {
    private var free: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(_ count: Int) { free = max(1, count) }

    func run<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T {
        if free > 0 {
            free -= 1
        } else {
            await withCheckedContinuation { waiting.append($0) }
        }
        defer { release() }
        try Task.checkCancellation()
        return try await body()
    }

    private func release() {
        if waiting.isEmpty { free += 1 } else { waiting.removeFirst().resume() }
    }
}

/// Random-access draws: a uniform number in [0, 1) from (seed, a, b), independent of any other draw.
enum OrchardRandomAccess {
    static func uniform(seed: UInt64, a: UInt64, b: UInt64, salt: UInt64) -> Double {
        var z = seed ^ salt &* 0x9E37_79B9_7F4A_7C15
        for word in [a, b] {
            z = (z ^ word) &+ 0x9E37_79B9_7F4A_7C15
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            z ^= z >> 31
        }
        return Double(z >> 11) * 0x1.0p-53
    }
}

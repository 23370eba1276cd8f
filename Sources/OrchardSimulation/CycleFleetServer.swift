import Foundation
import OrchardCoordinator
import OrchardFormats
public import OrchardProtocol

/// The coordinator's cycle logic and aggregation, driven in-process on the virtual clock: admission,
/// over-selection, deadlines and closing come from ``OrchardCoordinator/CycleStateMachine``; the running sum,
/// layout checks and the server optimizer (FedAvg/FedAvgM/FedAdam/FedYogi) from the coordinator's aggregation
/// module. Reports are the wire format (``OrchardProtocol/ReportEnvelope``), parsed and checked as the server does.
public actor CycleFleetServer: FleetServer {
    /// Reports that close a cycle.
    public nonisolated let goal: Int
    private let epoch = Date(timeIntervalSince1970: 1_700_000_000)
    private let server: ServerConfig
    private let layout: ModelLayout
    private var machine: CycleStateMachine
    private var weights: [Float]
    private var checkpointBytes: [UInt8]
    private var sum: RunningSum
    private var optimizer = OrchardCoordinator.OptimizerState()
    private var random: OrchardCoordinator.SplitMix64
    private var workers: [Int: String] = [:]

    /// Creates a server for a process.
    /// - Parameters:
    ///   - process: The model, initial weights and configurations, as a coordinator would host them.
    ///   - seed: Seeds request keys and pace-steering jitter.
    public init(process: HostProcessRequest, seed: UInt64) throws(SimulationError) {
        if let failure = process.serverConfig.validationFailure() ?? process.clientConfig.validationFailure() {
            throw SimulationError(.invalidOption, failure)
        }
        do {
            let archive = try Safetensors.decode(process.initialWeights)
            layout = try ModelLayout(weights: archive.tensors, model: process.model)
            weights = try layout.flatten(archive.tensors)
        } catch {
            throw SimulationError(.coordinator, "the initial weights do not fit the model: \(error)")
        }
        server = process.serverConfig
        goal = server.goalCount
        machine = CycleStateMachine(configuration: CycleStateMachine.Configuration(server), openedAt: epoch)
        sum = RunningSum(count: layout.totalCount)
        random = OrchardCoordinator.SplitMix64(seed: seed)
        checkpointBytes = Safetensors.encode(layout.records(weights), metadata: ["orchard.checkpoint": "0"])
    }

    private func date(_ time: Double) -> Date { epoch.addingTimeInterval(time) }

    private func close(_ action: CycleStateMachine.CycleAction?, at time: Double) -> Bool {
        guard let action else { return false }
        let transition = machine.plan(action, now: date(time))
        if transition.aggregated {
            ServerOptimizer.step(weights: &weights, delta: sum.mean(), state: &optimizer, config: server.aggregator, layout: layout)
            checkpointBytes = Safetensors.encode(layout.records(weights), metadata: ["orchard.checkpoint": String(transition.checkpoint)])
        }
        sum = RunningSum(count: layout.totalCount)
        machine.apply(transition)
        return transition.aggregated
    }

    public func openRound(at time: Double) -> Double {
        _ = close(machine.timerFired(now: date(time)), at: time)
        return machine.deadline.timeIntervalSince(epoch)
    }

    public func currentModel() -> [UInt8] { checkpointBytes }

    public func checkIn(device: Int, at time: Double) -> FleetAssignment? {
        let worker = workers[device] ?? String(format: "w_%06d", device)
        workers[device] = worker
        let key = String(random.next(), radix: 16)
        let jitter = Double(random.next() >> 11) * 0x1.0p-53
        guard case .assigned(let assignment, _, _) = machine.requestCycle(workerID: worker, now: date(time), newRequestKey: key, jitter: jitter) else {
            return nil
        }
        return FleetAssignment(device: device, worker: worker, cycle: machine.cycle, model: checkpointBytes, handle: assignment.requestKey)
    }

    public func report(_ update: DeviceUpdate, for assignment: FleetAssignment, at time: Double) throws(SimulationError) -> ReportReceipt {
        let flat: [Float]
        let metadata: ReportMetadata
        do {
            let archive = try Safetensors.decode(update.diff)
            metadata = try ReportEnvelope.metadata(of: archive)
            flat = try layout.flatten(archive.tensors)
            try layout.checkDiff(flat)
        } catch {
            throw SimulationError(.coordinator, "device \(update.device)'s report is malformed: \(error)")
        }
        guard case .proceed = machine.beginReport(workerID: metadata.workerID, requestKey: metadata.requestKey, now: date(time)) else {
            return ReportReceipt(accepted: false, closedCycle: false)
        }
        flat.withUnsafeBufferPointer { sum.add($0, weight: Double(metadata.sampleCount)) }
        let cycle = machine.cycle
        _ = close(machine.commitReport(workerID: metadata.workerID), at: time)
        return ReportReceipt(accepted: true, closedCycle: machine.cycle != cycle)
    }

    public func expireCycle(at time: Double) -> Bool {
        close(machine.timerFired(now: date(time)), at: time)
    }
}

import Foundation
import OrchardFormats
@testable import OrchardSimulation

/// A coordinator stand-in for orchestration tests: one cycle at a time, first come first served up to a capacity,
/// sample-weighted averaging of diffs in delivery order, closing at the goal or at the deadline.
actor FakeServer: FleetServer {
    nonisolated let goal: Int
    nonisolated let cycleSeconds: Double
    let capacity: Int
    let minimumReports: Int
    private(set) var weights: [Float]
    private var cycle = 1
    private var assigned: Set<Int> = []
    private var sum: [Double]
    private var weightSum = 0.0
    private var reports = 0
    private(set) var deliveries: [(device: Int, time: Double)] = []

    init(weights: [Float], goal: Int, capacity: Int, cycleSeconds: Double = 300, minimumReports: Int = 1) {
        self.weights = weights
        self.goal = goal
        self.capacity = capacity
        self.cycleSeconds = cycleSeconds
        self.minimumReports = minimumReports
        sum = [Double](repeating: 0, count: weights.count)
    }

    func currentModel() -> [UInt8] { FakeModel.encode(weights) }

    func openRound(at time: Double) -> Double { time + cycleSeconds }

    func checkIn(device: Int, at time: Double) -> FleetAssignment? {
        guard assigned.count < capacity else { return nil }
        assigned.insert(device)
        return FleetAssignment(device: device, worker: "w\(device)", cycle: cycle, model: FakeModel.encode(weights), handle: "c\(cycle)-d\(device)")
    }

    func report(_ update: DeviceUpdate, for assignment: FleetAssignment, at time: Double) throws(SimulationError) -> ReportReceipt {
        guard assignment.cycle == cycle, assigned.contains(update.device) else { return ReportReceipt(accepted: false, closedCycle: false) }
        deliveries.append((update.device, time))
        let diff = try FakeModel.decode(update.diff)
        for i in sum.indices { sum[i] += Double(diff[i]) * Double(update.sampleCount) }
        weightSum += Double(update.sampleCount)
        reports += 1
        if reports >= goal {
            close()
            return ReportReceipt(accepted: true, closedCycle: true)
        }
        return ReportReceipt(accepted: true, closedCycle: false)
    }

    func expireCycle(at time: Double) -> Bool {
        let aggregate = reports >= minimumReports
        if aggregate { close() } else { reset() }
        return aggregate
    }

    private func close() {
        for i in weights.indices { weights[i] += Float(sum[i] / weightSum) }
        reset()
    }

    private func reset() {
        cycle += 1
        assigned = []
        sum = [Double](repeating: 0, count: weights.count)
        weightSum = 0
        reports = 0
    }
}

/// A workload whose "training" pulls the weights toward the device's own optimum, a fraction per update.
struct FakeWorkload: FleetWorkload {
    let optima: [[Float]]
    let samples: [Int]
    let updates: Int
    let step: Float

    func updatesPerRound(device: Int) -> Int { updates }

    func train(_ assignment: FleetAssignment, updatesPerWindow: [Int], round: Int) async throws(SimulationError) -> DeviceUpdate {
        let start = try FakeModel.decode(assignment.model)
        var w = start
        for stretch in updatesPerWindow {
            for _ in 0..<stretch {
                for i in w.indices { w[i] += step * (optima[assignment.device][i] - w[i]) }
            }
        }
        let diff = zip(w, start).map { $0 - $1 }
        return DeviceUpdate(
            device: assignment.device, diff: FakeModel.encode(diff), sampleCount: samples[assignment.device], trainingLoss: 0,
            checkpointsRestored: updatesPerWindow.count - 1
        )
    }

    func evaluate(model: [UInt8]) async throws(SimulationError) -> Evaluation {
        let w = try FakeModel.decode(model)
        let total = Float(samples.reduce(0, +))
        var loss = 0.0
        for i in w.indices {
            let target = zip(optima, samples).reduce(Float(0)) { $0 + $1.0[i] * Float($1.1) } / total
            loss += Double((w[i] - target) * (w[i] - target))
        }
        return Evaluation(loss: loss, accuracy: 1 / (1 + loss))
    }
}

enum FakeModel {
    static func encode(_ values: [Float]) -> [UInt8] {
        Safetensors.encode([TensorRecord(name: "w", shape: [values.count], values: values)], metadata: [:])
    }

    static func decode(_ bytes: [UInt8]) throws(SimulationError) -> [Float] {
        do { return try Safetensors.decode(bytes).byName["w"]!.values } catch {
            throw SimulationError(.training, "bad fake model: \(error)")
        }
    }
}

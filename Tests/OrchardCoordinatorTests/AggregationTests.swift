import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

private let model = ModelSpec(
    name: "m", inputs: [InputSpec(name: "x", shape: [2])],
    layers: [
        LayerSpec(name: "frozen", type: .dense, inputs: ["x"], frozen: true, units: 2, inputSize: 2, useBias: false),
        LayerSpec(name: "head", type: .dense, inputs: ["frozen"], units: 1, inputSize: 2, useBias: true),
    ])

private let weights = [
    TensorRecord(name: "head.weight", shape: [1, 2], values: [0.5, -0.5]),
    TensorRecord(name: "head.bias", shape: [1], values: [0.1]),
    TensorRecord(name: "frozen.weight", shape: [2, 2], values: [1, 0, 0, 1]),
]

@Suite struct AggregationTests {
    @Test func layoutOrdersByNameAndMarksFrozenTensors() throws {
        let layout = try ModelLayout(weights: weights, model: model)
        #expect(layout.entries.map(\.name) == ["frozen.weight", "head.bias", "head.weight"])
        #expect(layout.entries.map(\.offset) == [0, 4, 5])
        #expect(layout.entries.map(\.frozen) == [true, false, false])
        let flat = try layout.flatten(weights)
        #expect(flat == [1, 0, 0, 1, 0.1, 0.5, -0.5])
        #expect(layout.records(flat).sorted { $0.name < $1.name } == weights.sorted { $0.name < $1.name })
    }

    /// The device flattens its update with `FlatOrder` (secure aggregation masks that vector); the coordinator places
    /// tensors by `ModelLayout`: the two agree coordinate by coordinate, whatever the names (case, digits, non-ASCII).
    @Test func layoutAndTheDevicesFlatOrderAgree() throws {
        let names = ["head", "Head", "layer10", "layer2", "éta", "_b", "a"]
        let spec = ModelSpec(
            name: "m", inputs: [InputSpec(name: "x", shape: [1])],
            layers: names.map { LayerSpec(name: $0, type: .dense, inputs: ["x"], units: 1, inputSize: 1, useBias: true) })
        var tensors: [TensorRecord] = []
        for (i, name) in names.enumerated() {
            tensors.append(TensorRecord(name: "\(name).weight", shape: [1, 1], values: [Float(i) + 0.25]))
            tensors.append(TensorRecord(name: "\(name).bias", shape: [1], values: [Float(i) + 0.75]))
        }
        for shuffled in [tensors, tensors.reversed(), tensors.enumerated().sorted { ($0.offset * 7) % 11 < ($1.offset * 7) % 11 }.map(\.element)] {
            let layout = try ModelLayout(weights: shuffled, model: spec)
            #expect(try layout.flatten(shuffled) == FlatOrder.flatten(shuffled))
            #expect(try layout.flatten(shuffled) == FlatOrder.flatten(tensors))
        }
    }

    @Test func layoutRejectsWeightsOfUnknownLayers() {
        #expect(throws: CoordinatorError.self) {
            try ModelLayout(weights: [TensorRecord(name: "ghost.weight", shape: [1], values: [0])], model: model)
        }
    }

    @Test func flattenNamesTheOffendingTensor() throws {
        let layout = try ModelLayout(weights: weights, model: model)
        var wrongShape = weights
        wrongShape[1] = TensorRecord(name: "head.bias", shape: [1, 1], values: [0])
        #expect { try layout.flatten(wrongShape) } throws: { ($0 as? CoordinatorError)?.code == .shapeMismatch }
        #expect { try layout.flatten(Array(weights.dropLast())) } throws: { ($0 as? CoordinatorError)?.code == .tensorMismatch }
        var renamed = weights
        renamed[0] = TensorRecord(name: "head.other", shape: [1, 2], values: [0, 0])
        #expect { try layout.flatten(renamed) } throws: { ($0 as? CoordinatorError)?.code == .tensorMismatch }
    }

    @Test(arguments: [Float.nan, .infinity, -.infinity])
    func nonFiniteDiffsAreRejected(bad: Float) throws {
        let layout = try ModelLayout(weights: weights, model: model)
        var flat = [Float](repeating: 0, count: layout.totalCount)
        flat[5] = bad
        #expect { try layout.checkDiff(flat) } throws: { ($0 as? CoordinatorError)?.code == .nonFiniteValues }
    }

    @Test func frozenTensorsMustBeUnchanged() throws {
        let layout = try ModelLayout(weights: weights, model: model)
        var flat = [Float](repeating: 0, count: layout.totalCount)
        try layout.checkDiff(flat)
        flat[2] = 1e-7
        #expect { try layout.checkDiff(flat) } throws: { ($0 as? CoordinatorError)?.code == .frozenTensorChanged }
    }

    @Test func runningSumIsTheSampleWeightedMeanAndSurvivesStorage() throws {
        var sum = RunningSum(count: 2)
        let diffs: [([Float], Double)] = [([1, 2], 1), ([3, -2], 3), ([0, 4], 4)]
        for (diff, weight) in diffs { diff.withUnsafeBufferPointer { sum.add($0, weight: weight) } }
        // (1·1 + 3·3 + 0·4) / 8 = 1.25 ; (2·1 − 2·3 + 4·4) / 8 = 1.5
        #expect(sum.mean() == [1.25, 1.5])
        let restored = try RunningSum(bytes: sum.bytes, weight: sum.weight, reports: sum.reports, count: 2)
        #expect(restored == sum)
        #expect(throws: CoordinatorError.self) { try RunningSum(bytes: [1, 2, 3], weight: 1, reports: 1, count: 2) }
    }

    @Test func fedAvgAddsTheMeanScaledByTheServerLearningRate() throws {
        let layout = try ModelLayout(weights: weights, model: model)
        var w = try layout.flatten(weights)
        var state = ServerOptimizerState()
        let delta: [Float] = [0, 0, 0, 0, 0.2, 0.1, -0.1]
        ServerOptimizer.step(weights: &w, delta: delta, state: &state, config: AggregatorConfig(kind: .fedAvg, serverLearningRate: 0.5), layout: layout)
        #expect(w == [1, 0, 0, 1, 0.1 + 0.1, 0.5 + 0.05, -0.5 - 0.05])
        #expect(state.m.isEmpty && state.v.isEmpty)
    }

    @Test func fedAvgMAccumulatesMomentum() throws {
        let layout = try ModelLayout(weights: weights, model: model)
        var w = try layout.flatten(weights)
        var state = ServerOptimizerState()
        let config = AggregatorConfig(kind: .fedAvgM, serverLearningRate: 1, momentum: 0.5)
        let delta: [Float] = [0, 0, 0, 0, 1, 0, 0]
        ServerOptimizer.step(weights: &w, delta: delta, state: &state, config: config, layout: layout)
        ServerOptimizer.step(weights: &w, delta: delta, state: &state, config: config, layout: layout)
        // m1 = 1, m2 = 0.5·1 + 1 = 1.5; bias 0.1 + 1 + 1.5
        #expect(abs(w[4] - 2.6) < 1e-6)
        #expect(state.m[4] == 1.5)
    }

    @Test(arguments: [AggregatorConfig.Kind.fedAdam, .fedYogi])
    func adaptiveOptimizersFollowReddiEtAl(kind: AggregatorConfig.Kind) throws {
        let layout = try ModelLayout(weights: weights, model: model)
        var w = try layout.flatten(weights)
        var state = ServerOptimizerState()
        let config = AggregatorConfig(kind: kind, serverLearningRate: 0.1, beta1: 0.9, beta2: 0.99, tau: 0.01)
        let d: Float = 0.2
        let delta: [Float] = [0, 0, 0, 0, d, 0, 0]
        ServerOptimizer.step(weights: &w, delta: delta, state: &state, config: config, layout: layout)
        let m: Float = 0.1 * d
        let v0: Float = 0.01 * 0.01
        // Adam: v = β2 v0 + (1−β2) d²; Yogi: v = v0 − (1−β2) d² sign(v0 − d²) = v0 + (1−β2) d² (since v0 < d²).
        let v: Float = kind == .fedAdam ? 0.99 * v0 + 0.01 * d * d : v0 + 0.01 * d * d
        let expected: Float = 0.1 + 0.1 * m / (v.squareRoot() + 0.01)
        #expect(abs(w[4] - expected) < 1e-6)
        #expect(w[0...3] == [1, 0, 0, 1])  // frozen untouched
        #expect(w[5] == 0.5)  // zero delta: m = 0, no move
        let restored = try ServerOptimizerState(bytes: state.bytes)
        #expect(restored == state)
    }
}

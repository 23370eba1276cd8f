import OrchardSupport
import OrchardFormats
@testable import OrchardML
import Testing

/// Finite-difference checks of every layer's and loss's backward pass.
///
/// Each case is a small model in which the layer under test sits between trainable layers, so that both its
/// parameter gradients (if any) and its input gradient are exercised: the analytic gradient of the batch-mean
/// loss with respect to every checked parameter must match `(L(θ + h) − L(θ − h)) / 2h`.
@Suite struct GradientCheckTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var label: String
        var inputs: [InputSpec]
        var loss: LossType
        var layers: @Sendable () -> [any Layer]
        var testDescription: String { label }
    }

    static let vector = [InputSpec(name: "input", shape: [5])]
    static let image = [InputSpec(name: "input", shape: [2, 6, 5])]
    static let sequence = [InputSpec(name: "input", shape: [3, 9])]
    static let steps = [InputSpec(name: "input", shape: [4, 3])]

    static let cases: [Case] = [
        Case(label: "dense + relu + mse", inputs: vector, loss: .meanSquaredError) { [Dense(units: 4), ReLU(), Dense(units: 3)] },
        Case(label: "sigmoid", inputs: vector, loss: .meanSquaredError) { [Dense(units: 4), Sigmoid(), Dense(units: 2)] },
        Case(label: "tanh", inputs: vector, loss: .meanSquaredError) { [Dense(units: 4), Tanh(), Dense(units: 2)] },
        Case(label: "softmax inside a network", inputs: vector, loss: .meanSquaredError) { [Dense(units: 4), Softmax(), Dense(units: 2)] },
        Case(label: "cross-entropy fused with softmax", inputs: vector, loss: .crossEntropy) { [Dense(units: 4), Tanh(), Dense(units: 3), Softmax()] },
        Case(label: "cross-entropy on logits", inputs: vector, loss: .crossEntropy) { [Dense(units: 3)] },
        Case(label: "dense without bias", inputs: vector, loss: .meanSquaredError) {
            [Dense(units: 3, useBias: false), Tanh(), Dense(units: 2, useBias: false)]
        },
        Case(
            label: "embedding + concat", inputs: [InputSpec(name: "x", shape: [3]), InputSpec(name: "c", shape: [2], categorical: true)],
            loss: .meanSquaredError
        ) {
            [
                Embedding(vocabularySize: 4, embeddingSize: 3, name: "emb", inputs: ["c"]), Concat(name: "cat", inputs: ["x", "emb"]), Dense(units: 4), Tanh(),
                Dense(units: 2),
            ]
        },
        Case(label: "conv2d same stride 2 + maxpool + flatten", inputs: image, loss: .meanSquaredError) {
            [
                Conv2D(filters: 3, kernelSize: [3, 3], strides: [2, 2], padding: .same), Tanh(), MaxPool2D(poolSize: [2, 2], strides: [1, 1]), Flatten(),
                Dense(units: 2),
            ]
        },
        Case(label: "conv2d valid + explicit padding", inputs: image, loss: .meanSquaredError) {
            [
                Conv2D(filters: 2, kernelSize: [2, 3]), Tanh(), Conv2D(filters: 2, kernelSize: [3, 3], padding: .explicit(height: 1, width: 1)), Flatten(),
                Dense(units: 2),
            ]
        },
        Case(label: "maxpool same padding", inputs: image, loss: .meanSquaredError) {
            [Conv2D(filters: 2, kernelSize: [1, 1]), MaxPool2D(poolSize: [2, 2], padding: .same), Flatten(), Dense(units: 2)]
        },
        Case(label: "avgpool valid, overlapping windows", inputs: image, loss: .meanSquaredError) {
            [Conv2D(filters: 2, kernelSize: [3, 3]), Tanh(), AvgPool2D(poolSize: [2, 2], strides: [1, 1]), Flatten(), Dense(units: 2)]
        },
        Case(label: "avgpool same padding (padding not counted)", inputs: image, loss: .meanSquaredError) {
            [Conv2D(filters: 2, kernelSize: [1, 1]), AvgPool2D(poolSize: [3, 2], strides: [2, 2], padding: .same), Flatten(), Dense(units: 2)]
        },
        Case(label: "conv1d stride 2 + maxpool1d + flatten", inputs: sequence, loss: .meanSquaredError) {
            [Conv1D(filters: 3, kernelSize: 3, stride: 2), Tanh(), MaxPool1D(poolSize: 2, stride: 1), Flatten(), Dense(units: 2)]
        },
        Case(label: "conv1d stacked, same padding, avgpool1d same padding", inputs: sequence, loss: .meanSquaredError) {
            [
                Conv1D(filters: 2, kernelSize: 2), Tanh(), Conv1D(filters: 2, kernelSize: 3, padding: .same, useBias: false),
                AvgPool1D(poolSize: 3, stride: 2, padding: .same), Flatten(), Dense(units: 2),
            ]
        },
        Case(label: "lstm whole sequence into a gru's last step", inputs: steps, loss: .meanSquaredError) {
            [LSTM(units: 3, returnSequences: true), GRU(units: 3), Dense(units: 2)]
        },
        Case(label: "cifg lstm, dropout between stacked lstms", inputs: steps, loss: .meanSquaredError) {
            [LSTM(units: 3, returnSequences: true, cifg: true), Dropout(rate: 0.3), LSTM(units: 2, returnSequences: true), Flatten(), Dense(units: 2)]
        },
        Case(label: "frozen lstm under a gru without bias", inputs: steps, loss: .meanSquaredError) {
            [
                Conv1D(filters: 4, kernelSize: 1), LSTM(units: 3, returnSequences: true, frozen: true), GRU(units: 2, returnSequences: true, useBias: false),
                Flatten(), Dense(units: 2),
            ]
        },
        Case(label: "lstm classifier, cross-entropy", inputs: steps, loss: .crossEntropy) { [LSTM(units: 4), Dense(units: 3), Softmax()] },
        Case(
            label: "embedding, reshape, gru, dense over the last axis, per-step cross-entropy with padding",
            inputs: [InputSpec(name: "input", shape: [4], categorical: true)], loss: .crossEntropy
        ) { [Embedding(vocabularySize: 4, embeddingSize: 3), Reshape([4, 3]), GRU(units: 3, returnSequences: true), Dense(units: 4), Softmax()] },
        Case(label: "wide input, narrow gru (more features than gate rows)", inputs: [InputSpec(name: "input", shape: [3, 20])], loss: .meanSquaredError) {
            [Conv1D(filters: 3, kernelSize: 1), GRU(units: 2), Dense(units: 2)]
        },
        Case(label: "per-step cross-entropy on logits", inputs: steps, loss: .crossEntropy) {
            [LSTM(units: 3, returnSequences: true, cifg: true), Dense(units: 5)]
        },
        Case(label: "dropout (fixed mask)", inputs: vector, loss: .meanSquaredError) { [Dense(units: 6), Dropout(rate: 0.4), Tanh(), Dense(units: 2)] },
        Case(label: "value read by two layers", inputs: vector, loss: .meanSquaredError) {
            [Dense(units: 4, name: "a"), Tanh(name: "t", inputs: ["a"]), Concat(name: "both", inputs: ["a", "t"]), Dense(units: 2)]
        },
        Case(label: "frozen first layer", inputs: vector, loss: .meanSquaredError) { [Dense(units: 4, frozen: true), Tanh(), Dense(units: 2)] },
    ]

    @Test(arguments: cases)
    func analyticGradientsMatchFiniteDifferences(_ testCase: Case) throws {
        let model = try Model(name: "check", inputs: testCase.inputs, layers: testCase.layers(), seed: 5)
        let batch = 3
        var random = OrchardRandom(seed: 6)
        var feeds: [String: Tensor] = [:]
        for input in model.inputs {
            let count = batch * input.shape.reduce(1, *)
            let values = (0..<count).map { _ in input.categorical ? Float(random.nextInt(below: 4)) : random.nextFloat(symmetric: 1) }
            feeds[input.name] = Tensor(shape: [batch] + input.shape, scalars: values)
        }
        let targets: Tensor
        if testCase.loss == .crossEntropy {
            // A class index per sample, or per step of a sequence output (a quarter of them padding, −1).
            let classes = model.outputShape.last!
            let positions = model.outputShape.count == 1 ? 1 : model.outputShape.dropLast().reduce(1, *)
            let labels = (0..<(batch * positions)).map { _ in
                positions > 1 && random.nextInt(below: 4) == 0 ? CompiledModel.paddingTarget : Float(random.nextInt(below: classes))
            }
            targets = Tensor(shape: [batch, positions], scalars: labels)
        } else {
            let n = model.outputShape.reduce(1, *)
            targets = Tensor(shape: [batch] + model.outputShape, scalars: (0..<(batch * n)).map { _ in random.nextFloat(symmetric: 1) })
        }
        let plan = try CompiledModel(model: model, batchCapacity: batch, loss: testCase.loss)
        let dropoutStart = plan.dropoutRandom
        func loss(_ parameters: [Float]) throws -> Double {
            try plan.setFlatParameters(parameters)
            plan.dropoutRandom = dropoutStart
            return Double(try plan.computeGradients(inputs: feeds, targets: targets))
        }
        let theta = model.flatParameters()
        _ = try loss(theta)
        let analytic = plan.flatGradients()

        var checked = 0
        for (name, offset) in plan.parameterOffsets.sorted(by: { $0.key < $1.key }) {
            let count = model.parameterShapes[name]!.reduce(1, *)
            let trainable = model.trainableParameterNames.contains(name)
            // Up to 12 entries per parameter, spread over the tensor.
            let step = max(1, count / 12)
            for i in stride(from: offset, to: offset + count, by: step) {
                if !trainable {
                    #expect(analytic[i] == 0, "frozen \(name) got a gradient")
                    continue
                }
                let h: Float = 2e-3
                var plus = theta, minus = theta
                plus[i] += h
                minus[i] -= h
                let numeric = (try loss(plus) - loss(minus)) / Double(2 * h)
                let error = abs(Double(analytic[i]) - numeric)
                #expect(error <= 3e-3 + 2e-2 * abs(numeric), "\(name)[\(i - offset)]: analytic \(analytic[i]) vs numeric \(numeric)")
                checked += 1
            }
        }
        #expect(checked > 0)
    }

    @Test func averagePoolingAveragesOnlyThePositionsInsideTheImage() throws {
        // A 1×3×3 image 1…9, a 2×2 pool with stride 2 and same padding: windows of 4, 2, 2 and 1 real positions.
        let pool = AvgPool2D(poolSize: [2, 2], strides: [2, 2], padding: .same)
        let output = pool([Tensor(shape: [1, 1, 3, 3], scalars: (1...9).map(Float.init))])
        #expect(output.shape == [1, 1, 2, 2])
        let expected: [Float] = [12 / 4, 9 / 2, 15 / 2, 9]  // (1+2+4+5)/4, (3+6)/2, (7+8)/2, 9/1
        #expect(output.scalars == expected)
    }
}

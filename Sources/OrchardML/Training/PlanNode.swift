import OrchardSupport
/// One layer inside a ``CompiledModel``: pointers to its inputs, output, gradients, parameters and scratch.
final class PlanNode {
    typealias Ptr = UnsafeMutablePointer<Float>

    enum Kind {
        /// A dense layer over the last axis: `rows` rows per sample (1 for a rank-1 input, T for `[T, features]`).
        case dense(inSize: Int, outSize: Int, rows: Int)
        case embedding(indicesPerSample: Int, vocabulary: Int, dim: Int)
        case relu, sigmoid, tanh, flatten
        case softmax(width: Int)
        case dropout(rate: Float, mask: Ptr)
        case concat(widths: [Int], offsets: [Int], outer: Int)
        case conv(WindowGeometry, filters: Int, col: Ptr, dcol: Ptr)
        case maxPool(WindowGeometry, argmax: Ptr)
        case avgPool(WindowGeometry)
        /// An LSTM or GRU: its shape (the batch set per pass), parameters, the activations kept for back-propagation
        /// through time, and per-step scratch.
        case recurrent(RecurrentShape, RecurrentParameters, scratch: Ptr, step: Ptr)
    }

    let name: String
    let kind: Kind
    let inputs: [Ptr]
    let inputCounts: [Int]
    let inputGradients: [Ptr?]
    let accumulate: [Bool]
    let output: Ptr
    let outputCount: Int
    let outputGradient: Ptr?
    let weight: Ptr?
    let bias: Ptr?
    /// Weight and bias gradients, nil when the layer is frozen.
    let weightGradient: Ptr?
    let biasGradient: Ptr?
    let doesBackward: Bool

    init(
        layer: any Layer, inputShapes: [[Int]], outputShape: [Int], inputs: [Ptr], inputGradients: [Ptr?], accumulate: [Bool],
        output: Ptr, outputGradient: Ptr?, parameterOffsets: [String: Int], parameters: Ptr, gradients: Ptr,
        batchCapacity: Int, allocate: (Int) -> Ptr
    ) throws(EngineError) {
        let weightOffset = parameterOffsets["\(layer.name).weight"], biasOffset = parameterOffsets["\(layer.name).bias"]
        name = layer.name
        self.inputs = inputs
        inputCounts = inputShapes.map { $0.reduce(1, *) }
        self.inputGradients = inputGradients
        self.accumulate = accumulate
        self.output = output
        outputCount = outputShape.reduce(1, *)
        self.outputGradient = outputGradient
        weight = weightOffset.map { parameters + $0 }
        bias = biasOffset.map { parameters + $0 }
        let trains = !layer.isFrozen
        weightGradient = trains ? weightOffset.map { gradients + $0 } : nil
        biasGradient = trains ? biasOffset.map { gradients + $0 } : nil
        doesBackward = outputGradient != nil

        switch layer {
        case let l as Dense:
            kind = .dense(inSize: l.inputSize, outSize: l.units, rows: inputShapes[0].dropLast().reduce(1, *))
        case let l as Embedding:
            kind = .embedding(indicesPerSample: inputShapes[0][0], vocabulary: l.vocabularySize, dim: l.embeddingSize)
        case is ReLU: kind = .relu
        case is Sigmoid: kind = .sigmoid
        case is Tanh: kind = .tanh
        case is Flatten, is Reshape: kind = .flatten
        case is Softmax: kind = .softmax(width: outputShape.last!)
        case let l as Dropout:
            kind = .dropout(rate: l.rate, mask: allocate(batchCapacity * outputShape.reduce(1, *)))
        case is Concat:
            let widths = inputShapes.map { $0.last! }
            var offsets: [Int] = []
            var o = 0
            for w in widths { offsets.append(o); o += w }
            kind = .concat(widths: widths, offsets: offsets, outer: inputShapes[0].dropLast().reduce(1, *))
        case let l as Conv2D:
            let g = l.geometry(inputShapes[0])
            kind = .conv(g, filters: l.filters, col: allocate(g.patchSize * g.outputPlane), dcol: allocate(g.patchSize * g.outputPlane))
        case let l as MaxPool2D:
            let g = l.geometry(inputShapes[0])
            kind = .maxPool(g, argmax: allocate(batchCapacity * outputShape.reduce(1, *)))
        case let l as AvgPool2D:
            kind = .avgPool(l.geometry(inputShapes[0]))
        case let l as Conv1D:
            let g = l.geometry(inputShapes[0])
            kind = .conv(g, filters: l.filters, col: allocate(g.patchSize * g.outputPlane), dcol: allocate(g.patchSize * g.outputPlane))
        case let l as MaxPool1D:
            kind = .maxPool(l.geometry(inputShapes[0]), argmax: allocate(batchCapacity * outputShape.reduce(1, *)))
        case let l as AvgPool1D:
            kind = .avgPool(l.geometry(inputShapes[0]))
        case let l as any RecurrentLayer:
            func offset(_ suffix: String) -> Int? { parameterOffsets["\(layer.name).\(suffix)"] }
            guard let weightIH = offset("weight_ih"), let weightHH = offset("weight_hh") else {
                throw EngineError(.invalidModel, "\(layer.type) '\(layer.name)' has no weight_ih and weight_hh")
            }
            let biasIH = offset("bias_ih"), biasHH = offset("bias_hh")
            let p = RecurrentParameters(
                weightIH: parameters + weightIH, weightHH: parameters + weightHH,
                transposed: allocate(RecurrentShape.transposedCount(cell: l.cell, inputSize: inputShapes[0][1], hidden: l.units)),
                biasIH: biasIH.map { parameters + $0 },
                biasHH: biasHH.map { parameters + $0 }, weightIHGradient: trains ? gradients + weightIH : nil,
                weightHHGradient: trains ? gradients + weightHH : nil, biasIHGradient: trains ? biasIH.map { gradients + $0 } : nil,
                biasHHGradient: trains ? biasHH.map { gradients + $0 } : nil)
            let shape = RecurrentShape(
                cell: l.cell, batch: batchCapacity, steps: inputShapes[0][0], inputSize: inputShapes[0][1], hidden: l.units,
                returnSequences: l.returnSequences)
            kind = .recurrent(
                shape, p,
                scratch: allocate(
                    batchCapacity * RecurrentShape.scratchPerSample(cell: l.cell, steps: shape.steps, inputSize: shape.inputSize, hidden: l.units)),
                step: allocate(
                    batchCapacity * RecurrentShape.stepScratchPerSample(cell: l.cell, steps: shape.steps, inputSize: shape.inputSize, hidden: l.units)))
        default:
            throw EngineError(.invalidModel, "layer '\(layer.name)' of type \(layer.type) cannot be trained")
        }
    }

    /// Whether a plain SGD step can be applied during back-propagation: a trained dense layer.
    var updatesParametersInBackward: Bool {
        if case .dense = kind { return weightGradient != nil }
        return false
    }

    func forward(batch: Int, training: Bool, random: inout OrchardRandom) throws(EngineError) {
        let x = inputs[0]
        let count = batch * outputCount
        switch kind {
        case .dense(let inSize, let outSize, let rows):
            Ops.denseForward(batch: batch * rows, inSize: inSize, outSize: outSize, x: x, weight: weight!, bias: bias, y: output)
        case .embedding(let n, let vocabulary, let dim):
            if let bad = Ops.firstInvalidIndex(count: batch * n, indices: x, vocabulary: vocabulary) {
                throw EngineError(.invalidArgument, "embedding '\(name)': index \(bad) is not in 0..<\(vocabulary)")
            }
            Ops.embeddingForward(batch: batch, indicesPerSample: n, dim: dim, indices: x, table: weight!, y: output)
        case .relu: Ops.reluForward(count: count, x: x, y: output)
        case .sigmoid: Ops.sigmoidForward(count: count, x: x, y: output)
        case .tanh: Ops.tanhForward(count: count, x: x, y: output)
        case .flatten: output.update(from: x, count: count)
        case .softmax(let width): Ops.softmaxForward(rows: count / width, width: width, x: x, y: output)
        case .dropout(let rate, let mask):
            if training && rate > 0 {
                Ops.dropoutForward(count: count, rate: rate, x: x, y: output, mask: mask, random: &random)
            } else {
                output.update(from: x, count: count)
            }
        case .concat(let widths, _, let outer):
            Ops.concatForward(batchOuter: batch * outer, widths: widths, inputs: inputs, y: output)
        case .conv(let g, let filters, let col, _):
            Ops.convForward(g, filters: filters, batch: batch, x: x, weight: weight!, bias: bias, y: output, col: col)
        case .maxPool(let g, let argmax):
            Ops.maxPoolForward(g, batch: batch, x: x, y: output, argmax: argmax)
        case .avgPool(let g):
            Ops.avgPoolForward(g, batch: batch, x: x, y: output)
        case .recurrent(var shape, let p, let scratch, let step):
            shape.batch = batch
            Ops.recurrentForward(shape, x: x, parameters: p, scratch: scratch, step: step, y: output)
        }
    }

    /// Back-propagates through the layer. With `descentRate`, a dense layer applies the plain SGD step to its
    /// own parameters instead of storing their gradients (see ``updatesParametersInBackward``).
    func backward(batch: Int, descentRate: Float? = nil) {
        guard let dy = outputGradient else { return }
        let count = batch * outputCount
        let dx = inputGradients[0]
        let acc = accumulate[0]
        switch kind {
        case .dense(let inSize, let outSize, let rows):
            Ops.denseBackward(
                batch: batch * rows, inSize: inSize, outSize: outSize, x: inputs[0], weight: weight!, bias: bias, dy: dy,
                dWeight: weightGradient, dBias: biasGradient, dx: dx, accumulateDx: acc, descentRate: descentRate
            )
        case .embedding(let n, let vocabulary, let dim):
            if let dTable = weightGradient {
                Ops.embeddingBackward(batch: batch, indicesPerSample: n, dim: dim, vocabulary: vocabulary, indices: inputs[0], dy: dy, dTable: dTable)
            }
        case .relu: if let dx { Ops.reluBackward(count: count, y: output, dy: dy, dx: dx, accumulate: acc) }
        case .sigmoid: if let dx { Ops.sigmoidBackward(count: count, y: output, dy: dy, dx: dx, accumulate: acc) }
        case .tanh: if let dx { Ops.tanhBackward(count: count, y: output, dy: dy, dx: dx, accumulate: acc) }
        case .flatten: if let dx { Ops.passGradient(count: count, dy: dy, dx: dx, accumulate: acc) }
        case .softmax(let width):
            if let dx { Ops.softmaxBackward(rows: count / width, width: width, y: output, dy: dy, dx: dx, accumulate: acc) }
        case .dropout(let rate, let mask):
            if let dx {
                if rate > 0 {
                    Ops.dropoutBackward(count: count, mask: mask, dy: dy, dx: dx, accumulate: acc)
                } else {
                    Ops.passGradient(count: count, dy: dy, dx: dx, accumulate: acc)
                }
            }
        case .concat(let widths, let offsets, let outer):
            for i in inputs.indices {
                guard let dxi = inputGradients[i] else { continue }
                Ops.concatBackward(batchOuter: batch * outer, widths: widths, index: i, offset: offsets[i], dy: dy, dx: dxi, accumulate: accumulate[i])
            }
        case .conv(let g, let filters, let col, let dcol):
            Ops.convBackward(
                g, filters: filters, batch: batch, x: inputs[0], weight: weight!, dy: dy,
                dWeight: weightGradient, dBias: biasGradient, dx: dx, accumulateDx: acc, col: col, dcol: dcol
            )
        case .maxPool(let g, let argmax):
            if let dx { Ops.maxPoolBackward(g, batch: batch, argmax: argmax, dy: dy, dx: dx, accumulate: acc) }
        case .avgPool(let g):
            if let dx { Ops.avgPoolBackward(g, batch: batch, dy: dy, dx: dx, accumulate: acc) }
        case .recurrent(var shape, let p, let scratch, let step):
            shape.batch = batch
            Ops.recurrentBackward(shape, x: inputs[0], parameters: p, scratch: scratch, step: step, dy: dy, dx: dx, accumulateDx: acc)
        }
    }
}

/// Per-sample blob shapes under Core ML's rank-5 array mapping: `[C]` for vectors, `[C, H, W]` for images.
///
/// Core ML treats `[C]` as `[C, 1, 1]`; the two are kept apart here because Orchard's layouts differ for them.
enum CoreMLShapes {
    /// The output shape of `layer` for its input shapes, or an error naming the layer when they do not fit.
    static func output(of layer: ProtoLayer, inputs: [[Int]]) throws(CoreMLError) -> [Int] {
        func fail(_ message: String) -> CoreMLError { CoreMLError(.invalidModel, message, layer: layer.name) }
        func single() throws(CoreMLError) -> [Int] {
            guard inputs.count == 1 else { throw fail("\(layer.typeName) takes one input, not \(inputs.count)") }
            return inputs[0]
        }
        func channels(_ shape: [Int]) -> Int { shape[0] }
        func isVectorLike(_ shape: [Int]) -> Bool { shape.count == 1 || (shape.count == 3 && shape[1] == 1 && shape[2] == 1) }

        func size(_ value: UInt64, _ what: String) throws(CoreMLError) -> Int {
            try CoreMLShapes.size(value, what, layer: layer.name)
        }

        switch layer.layer {
        case .innerProduct(let p):
            let input = try single()
            guard isVectorLike(input) else {
                throw fail("inner product needs a vector input, not \(input); flatten it first")
            }
            let expected = try size(p.inputChannels, "input channels")
            guard channels(input) == expected else {
                throw fail("inner product expects \(p.inputChannels) inputs but receives \(channels(input))")
            }
            return [try size(p.outputChannels, "output channels")]
        case .embedding(let p):
            let input = try single()
            guard isVectorLike(input), channels(input) == 1 else {
                throw fail("embedding reads one category index per sample, not shape \(input)")
            }
            _ = try size(p.inputDim, "input dimension")
            return [try size(p.outputChannels, "output channels")]
        case .activation, .softmax:
            return try single()
        case .flatten:
            let input = try single()
            guard let count = elementCount(input) else { throw fail("shape \(input) is too large") }
            return [count]
        case .concat(let p):
            guard !p.sequenceConcat else { throw fail("sequence concatenation is not supported") }
            guard inputs.count >= 1 else { throw fail("concat has no inputs") }
            guard inputs.allSatisfy({ $0.count == 1 || $0.count == 3 }) else { throw fail("concat reads [C] or [C, H, W] inputs, not \(inputs)") }
            // The channels add up within the largest size read (a sum of large sizes would overflow).
            var channels = 0
            for input in inputs {
                channels += input[0]
                guard channels <= maximumSize else { throw fail("concat of \(inputs) has more than \(maximumSize) channels") }
            }
            if inputs.allSatisfy({ $0.count == 1 }) { return [channels] }
            let spatial = inputs.map { $0.count == 3 ? Array($0[1...]) : [1, 1] }
            guard Set(spatial).count == 1 else { throw fail("concat inputs differ in height or width: \(inputs)") }
            return [channels] + spatial[0]
        case .convolution(let p):
            let input = try single()
            guard input.count == 3 else { throw fail("convolution needs a [C, H, W] input, not \(input)") }
            let groups = try p.nGroups == 0 ? 1 : size(p.nGroups, "groups")
            let kernelChannels = try size(p.kernelChannels, "kernel channels")
            guard kernelChannels * groups == input[0] else {
                throw fail("convolution expects \(kernelChannels * groups) input channels but receives \(input[0])")
            }
            let kernel = try pair(p.kernelSize, default: 3, what: "kernel size", layer: layer)
            let stride = try pair(p.stride, default: 1, what: "stride", layer: layer)
            let dilation = try pair(p.dilationFactor, default: 1, what: "dilation", layer: layer)
            let effective = [(kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1]
            var out = [try size(p.outputChannels, "output channels")]
            for axis in 0..<2 {
                let size: Int
                switch p.convolutionPaddingType {
                case .same, nil: size = (input[axis + 1] + stride[axis] - 1) / stride[axis]
                case .valid(let v):
                    let pad = try amounts(v, axis: axis, layer: layer)
                    size = windows(input[axis + 1] + pad.0 + pad.1 - effective[axis], stride[axis])
                }
                guard size > 0 else { throw fail("convolution output is empty for input \(input)") }
                out.append(size)
            }
            return out
        case .pooling(let p):
            let input = try single()
            guard input.count == 3 else { throw fail("pooling needs a [C, H, W] input, not \(input)") }
            if p.globalPooling { return [input[0], 1, 1] }
            let kernel = try pair(p.kernelSize, default: 3, what: "kernel size", layer: layer)
            let stride = try pair(p.stride, default: 1, what: "stride", layer: layer)
            var out = [input[0]]
            for axis in 0..<2 {
                let size: Int
                switch p.poolingPaddingType {
                case .same: size = (input[axis + 1] + stride[axis] - 1) / stride[axis]
                case .valid(let v):
                    let pad = try amounts(v, axis: axis, layer: layer)
                    size = windows(input[axis + 1] + pad.0 + pad.1 - kernel[axis], stride[axis])
                case nil:
                    size = windows(input[axis + 1] - kernel[axis], stride[axis])
                case .includeLastPixel(let v):
                    let pad = try v.paddingAmounts.count == 2 ? CoreMLShapes.size(v.paddingAmounts[axis], "padding", layer: layer.name, allowZero: true) : 0
                    let span = input[axis + 1] + 2 * pad - kernel[axis]
                    size = span < 0 ? 0 : (span + stride[axis] - 1) / stride[axis] + 1
                }
                guard size > 0 else { throw fail("pooling output is empty for input \(input)") }
                out.append(size)
            }
            return out
        case nil:
            throw CoreMLError(.unsupportedLayer, "layer type '\(layer.typeName)' is not supported", layer: layer.name)
        }
    }

    /// Shapes of every blob, from the model inputs through each layer in order.
    /// - Parameter lenient: when true, layers whose shape cannot be computed are skipped (for inspection).
    static func blobShapes(inputs: [String: [Int]], layers: [ProtoLayer], lenient: Bool) throws(CoreMLError) -> [String: [Int]] {
        var read: [[[Int]]] = []
        return try blobShapes(inputs: inputs, layers: layers, lenient: lenient, read: &read)
    }

    /// ``blobShapes(inputs:layers:lenient:)``, also giving each layer's input shapes as that layer read them: a later
    /// layer may write a blob name again (an in-place layer), so the final shape of a name is not what an earlier
    /// layer read under it.
    static func blobShapes(inputs: [String: [Int]], layers: [ProtoLayer], lenient: Bool, read: inout [[[Int]]]) throws(CoreMLError)
        -> [String: [Int]]
    {
        var shapes = inputs
        read = []
        for layer in layers {
            let known = layer.input.compactMap { shapes[$0] }
            read.append(known.count == layer.input.count ? known : [])
            guard known.count == layer.input.count else {
                if lenient { continue }
                let missing = layer.input.first { shapes[$0] == nil } ?? ""
                throw CoreMLError(.invalidModel, "reads '\(missing)', which no earlier layer or input produces", layer: layer.name)
            }
            do {
                let shape = try output(of: layer, inputs: known)
                for name in layer.output { shapes[name] = shape }
            } catch {
                if !lenient { throw error }
            }
        }
        return shapes
    }

    /// A multi-array input's per-sample shape: `[C]` or `[C, H, W]`, the form the layers' shape rules read.
    ///
    /// Under rank-5 mapping the declared shape is that already. Under exact mapping (Core ML specification 4+) it is
    /// the blob's own rank: `[C]` (one vector), `[1, C]` (a batch axis and a vector) or `[1, C, H, W]` (a batch axis
    /// and an image); the leading batch axis must be 1 as declared. Rank 3 (Core ML reads it as a sequence of
    /// vectors) and rank 5 are refused.
    static func perSample(_ shape: [Int], exact: Bool) -> [Int]? {
        guard exact else { return shape.count == 1 || shape.count == 3 ? shape : nil }
        switch shape.count {
        case 1: return shape
        case 2: return shape[0] == 1 ? [shape[1]] : nil
        case 4: return shape[0] == 1 ? (shape[2] == 1 && shape[3] == 1 ? [shape[1]] : Array(shape[1...])) : nil
        default: return nil
        }
    }

    /// Shapes of every blob under exact array shape mapping: the per-sample shapes of ``blobShapes(inputs:layers:lenient:)``
    /// after checking each layer's input ranks against Core ML's rules for it (convolution, pooling, flatten,
    /// embedding and concat read rank-4 `[B, C, H, W]` blobs; inner product, activations and softmax read ranks 1, 2
    /// and 4; a layer's output keeps its input's rank).
    /// - Parameter ranks: each input's declared rank (1, 2 or 4).
    static func exactBlobShapes(inputs: [String: [Int]], ranks: [String: Int], layers: [ProtoLayer], lenient: Bool) throws(CoreMLError) -> [String: [Int]] {
        var read: [[[Int]]] = []
        return try exactBlobShapes(inputs: inputs, ranks: ranks, layers: layers, lenient: lenient, read: &read)
    }

    /// ``exactBlobShapes(inputs:ranks:layers:lenient:)`` with each layer's input shapes as it read them.
    static func exactBlobShapes(
        inputs: [String: [Int]], ranks: [String: Int], layers: [ProtoLayer], lenient: Bool, read: inout [[[Int]]]
    ) throws(CoreMLError) -> [String: [Int]] {
        var ranks = ranks
        for layer in layers {
            let known = layer.input.compactMap { ranks[$0] }
            guard known.count == layer.input.count, let rank = known.first else { continue }
            let needsImage: String?
            switch layer.layer {
            case .convolution: needsImage = "convolution"
            case .pooling: needsImage = "pooling"
            case .flatten: needsImage = "flatten"
            case .embedding: needsImage = "embedding"
            case .concat where known.contains(4): needsImage = "concat"
            default: needsImage = nil
            }
            if let needsImage, !known.allSatisfy({ $0 == 4 }) {
                if lenient { continue }
                throw CoreMLError(
                    .unsupportedLayer,
                    "\(needsImage) reads a rank-\(known.first { $0 != 4 } ?? rank) blob; under exact shape mapping Core ML's \(needsImage) layer reads rank-4 [B, C, H, W] blobs",
                    layer: layer.name
                )
            }
            guard Set(known).count == 1 else {
                if lenient { continue }
                throw CoreMLError(.unsupportedLayer, "its inputs have different ranks \(known)", layer: layer.name)
            }
            for name in layer.output { ranks[name] = rank }
        }
        return try blobShapes(inputs: inputs, layers: layers, lenient: lenient, read: &read)
    }

    /// The number of windows that fit when `span` is the input length (with padding) minus the window length.
    private static func windows(_ span: Int, _ stride: Int) -> Int {
        span < 0 ? 0 : span / stride + 1
    }

    /// The largest size Orchard reads from a Core ML file, so that sizes and their products never overflow.
    static let maximumSize = 1 << 31

    /// Converts a size read from a file, rejecting zero (unless allowed) and absurd values.
    static func size(_ value: UInt64, _ what: String, layer: String, allowZero: Bool = false) throws(CoreMLError) -> Int {
        guard value <= UInt64(maximumSize), allowZero || value > 0 else {
            throw CoreMLError(.invalidModel, "\(what) \(value) is out of range", layer: layer)
        }
        return Int(value)
    }

    /// The number of elements of `shape`, or nil if it overflows.
    static func elementCount(_ shape: [Int]) -> Int? {
        var count = 1
        for dimension in shape {
            let (product, overflow) = count.multipliedReportingOverflow(by: dimension)
            guard !overflow, dimension >= 0 else { return nil }
            count = product
        }
        return count
    }

    private static func pair(_ values: [UInt64], default value: Int, what: String, layer: ProtoLayer) throws(CoreMLError) -> [Int] {
        if values.isEmpty { return [value, value] }
        guard values.count == 2 else {
            throw CoreMLError(.invalidModel, "\(what) must be two positive numbers, not \(values)", layer: layer.name)
        }
        return try [size(values[0], what, layer: layer.name), size(values[1], what, layer: layer.name)]
    }

    private static func amounts(_ padding: CoreML_Specification_ValidPadding?, axis: Int, layer: ProtoLayer) throws(CoreMLError) -> (Int, Int) {
        guard let borders = padding?.paddingAmounts.borderAmounts, !borders.isEmpty else { return (0, 0) }
        guard borders.count == 2 else {
            throw CoreMLError(.invalidModel, "padding amounts must cover height and width", layer: layer.name)
        }
        return (
            try size(borders[axis].startEdgeSize, "padding", layer: layer.name, allowZero: true),
            try size(borders[axis].endEdgeSize, "padding", layer: layer.name, allowZero: true)
        )
    }
}

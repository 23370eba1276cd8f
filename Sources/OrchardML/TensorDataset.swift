/// An in-memory dataset of batch-first tensors: one per named input, and the targets.
public struct TensorDataset: Dataset {
    /// Batch-first input tensors, in ``inputSpecs`` order.
    public let inputs: [Tensor]
    /// Batch-first targets.
    public let targets: Tensor
    public let inputSpecs: [FeatureSpec]
    public let targetSpec: FeatureSpec

    /// Creates a dataset; every tensor's first dimension is the sample count.
    /// - Parameters:
    ///   - inputs: Input name → tensor `[count] + perSampleShape`.
    ///   - targets: Targets `[count] + targetShape` (class indices as Float `[count, 1]` for cross-entropy).
    public init(inputs: [String: Tensor], targets: Tensor) throws(EngineError) {
        guard let count = targets.shape.first, targets.rank >= 2 || targets.rank == 1 else {
            throw EngineError(.shapeMismatch, "targets need a sample dimension, got shape \(targets.shape)")
        }
        let names = inputs.keys.sorted()
        var specs: [FeatureSpec] = []
        var tensors: [Tensor] = []
        for name in names {
            let t = inputs[name]!
            guard t.rank >= 2, t.shape[0] == count else {
                throw EngineError(.shapeMismatch, "input '\(name)' must be [\(count), …], got \(t.shape)")
            }
            specs.append(FeatureSpec(name: name, shape: Array(t.shape.dropFirst())))
            tensors.append(t)
        }
        self.inputs = tensors
        self.targets = targets.rank == 1 ? targets.reshaped([count, 1]) : targets
        self.inputSpecs = specs
        self.targetSpec = FeatureSpec(name: "target", shape: Array(self.targets.shape.dropFirst()))
    }

    /// Creates a dataset with a single input named `input`.
    public init(input: Tensor, targets: Tensor) throws(EngineError) {
        try self.init(inputs: ["input": input], targets: targets)
    }

    public var count: Int { targets.shape[0] }

    public func copyInput(_ input: Int, of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        let n = inputSpecs[input].elementCount
        inputs[input].withUnsafeBufferPointer { src in
            _ = destination.update(fromContentsOf: src[(index * n)..<((index + 1) * n)])
        }
    }

    public func copyTarget(of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        let n = targetSpec.elementCount
        targets.withUnsafeBufferPointer { src in
            _ = destination.update(fromContentsOf: src[(index * n)..<((index + 1) * n)])
        }
    }
}

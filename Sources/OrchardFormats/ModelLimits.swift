extension ModelSpec {
    /// The largest value of any size attribute (`units`, `input_size`, a kernel side, an input dimension, …).
    public static let maximumDimension = 1 << 24
    /// The longest model, input or layer name, in Unicode scalars.
    public static let maximumNameLength = 200
    /// The largest `training.epochs`.
    public static let maximumEpochs = 10_000
    /// The largest `training.batch_size`.
    public static let maximumBatchSize = 65_536
    /// The largest per-sample element count of any input or layer output, and of any parameter tensor.
    public static let maximumElementCount = 1 << 31

    /// The optimizer types the engine trains with.
    public static let optimizerTypes: Set<String> = ["sgd", "adam"]
    /// The losses the engine trains with.
    public static let losses: Set<LossType> = [.meanSquaredError, .crossEntropy]

    /// Checks every attribute and training setting against the ranges the engine accepts and the coordinator's
    /// limits (what `openapi.json` states for a hosted model), beyond the structure ``validate()`` checks: name
    /// lengths, sizes in 1…``maximumDimension`` (padding in 0…), dropout rates in [0, 1), a known loss and
    /// optimizer with usable hyper-parameters, epochs and batch size in range.
    /// - Throws: ``FormatError`` (`invalid_spec`) naming the field.
    public func validateLimits() throws(FormatError) {
        try validateArchitectureLimits()
        try validateTrainingLimits()
    }

    /// The part of ``validateLimits()`` about names and layer attributes (``parameters()`` checks it too).
    func validateArchitectureLimits() throws(FormatError) {
        func fail(_ message: String) -> FormatError { FormatError(.invalidSpec, message) }
        func checkName(_ name: String, _ what: String) throws(FormatError) {
            guard name.unicodeScalars.count <= Self.maximumNameLength else {
                throw fail("\(what) is longer than \(Self.maximumNameLength) characters")
            }
        }
        func checkSize(_ value: Int?, _ field: String, _ owner: String, minimum: Int = 1) throws(FormatError) {
            guard let value else { return }
            guard (minimum...Self.maximumDimension).contains(value) else {
                throw fail("\(owner): '\(field)' must be in \(minimum)...\(Self.maximumDimension), not \(value)")
            }
        }
        func checkPair(_ value: [Int]?, _ field: String, _ owner: String, minimum: Int = 1, count: Int = 2) throws(FormatError) {
            guard let value else { return }
            guard value.count == count else {
                throw fail("\(owner): '\(field)' must be \(count == 1 ? "one integer, [n]" : "two integers"), not \(value)")
            }
            for item in value { try checkSize(item, field, owner, minimum: minimum) }
        }
        try checkName(name, "model name")
        for input in inputs {
            try checkName(input.name, "input name")
            for dimension in input.shape { try checkSize(dimension, "shape", "input '\(input.name)'") }
        }
        for layer in layers {
            let owner = "layer '\(layer.name)'"
            try checkName(layer.name, "layer name")
            try checkSize(layer.units, "units", owner)
            try checkSize(layer.inputSize, "input_size", owner)
            try checkSize(layer.vocabularySize, "vocabulary_size", owner)
            try checkSize(layer.embeddingSize, "embedding_size", owner)
            try checkSize(layer.inChannels, "in_channels", owner)
            if let target = layer.targetShape {
                guard target.count <= 8 else { throw fail("\(owner): 'target_shape' has \(target.count) dimensions; at most 8") }
                for dimension in target { try checkSize(dimension, "target_shape", owner) }
            }
            // The 1-D layers take one-element windows.
            let axes = [LayerType.conv1d, .maxPool1d, .avgPool1d].contains(layer.type) ? 1 : 2
            try checkPair(layer.kernelSize, "kernel_size", owner, count: axes)
            try checkPair(layer.strides, "strides", owner, count: axes)
            if let amounts = layer.padding?.explicitAmounts {
                try checkPair([amounts.height, amounts.width], "padding", owner, minimum: 0)
            }
            if let rate = layer.rate, !(rate >= 0 && rate < 1) {
                throw fail("\(owner): 'rate' must be in [0, 1), not \(rate)")
            }
        }
    }

    /// The part of ``validateLimits()`` about the `training` section.
    func validateTrainingLimits() throws(FormatError) {
        func fail(_ message: String) -> FormatError { FormatError(.invalidSpec, message) }
        guard let training else { return }
        guard Self.losses.contains(training.loss) else {
            throw fail("training.loss '\(training.loss)' is not one of \(Self.losses.map(\.rawValue).sorted().joined(separator: ", "))")
        }
        guard (1...Self.maximumEpochs).contains(training.epochs) else {
            throw fail("training.epochs must be in 1...\(Self.maximumEpochs), not \(training.epochs)")
        }
        guard (1...Self.maximumBatchSize).contains(training.batchSize) else {
            throw fail("training.batch_size must be in 1...\(Self.maximumBatchSize), not \(training.batchSize)")
        }
        if let maxUpdates = training.maxUpdates, maxUpdates < 1 {
            throw fail("training.max_updates must be at least 1 when set, not \(maxUpdates)")
        }
        let optimizer = training.optimizer
        guard Self.optimizerTypes.contains(optimizer.type) else {
            throw fail("training.optimizer.type '\(optimizer.type)' is not one of \(Self.optimizerTypes.sorted().joined(separator: ", "))")
        }
        guard optimizer.learningRate > 0, optimizer.learningRate.isFinite else {
            throw fail("training.optimizer.learning_rate must be a positive number, not \(optimizer.learningRate)")
        }
        for (field, value) in [("momentum", optimizer.momentum), ("beta1", optimizer.beta1), ("beta2", optimizer.beta2)] where !(value >= 0 && value < 1) {
            throw fail("training.optimizer.\(field) must be in [0, 1), not \(value)")
        }
        guard optimizer.weightDecay >= 0, optimizer.weightDecay.isFinite else {
            throw fail("training.optimizer.weight_decay must be a non-negative number, not \(optimizer.weightDecay)")
        }
        guard optimizer.epsilon > 0, optimizer.epsilon.isFinite else {
            throw fail("training.optimizer.epsilon must be a positive number, not \(optimizer.epsilon)")
        }
    }
}

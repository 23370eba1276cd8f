/// Core ML's rules for updatable neural networks, checked on a model before it is written and after it is read,
/// so a violation is reported with the layer's name here rather than by `MLUpdateTask` on a device.
enum CoreMLUpdateRules {
    /// The layer types Core ML can update.
    static func isUpdatableType(_ layer: ProtoLayer) -> Bool {
        switch layer.layer {
        case .innerProduct, .convolution: true
        default: false
        }
    }

    /// Checks every rule for an updatable model; does nothing for a model that is not updatable.
    static func check(_ model: ProtoModel, network: CoreMLNetwork) throws(CoreMLError) {
        guard model.isUpdatable else {
            if let layer = network.layers.first(where: \.isUpdatable) {
                throw CoreMLError(.updateRules, "the layer is marked updatable but the model is not", layer: layer.name)
            }
            return
        }
        guard model.specificationVersion >= 4 else {
            throw CoreMLError(.updateRules, "updatable models need specification version 4 or later, not \(model.specificationVersion)")
        }
        try checkUpdatableLayers(network.layers)
        guard let update = network.updateParams else {
            throw CoreMLError(.updateRules, "an updatable model needs update parameters (loss, optimizer, epochs)")
        }
        guard update.lossLayers.count == 1 else {
            throw CoreMLError(.updateRules, "an updatable model needs exactly one loss layer, not \(update.lossLayers.count)")
        }
        let loss = update.lossLayers[0]
        var names = Set<String>()
        for name in network.layers.map(\.name) + [loss.name] where !names.insert(name).inserted {
            throw CoreMLError(.updateRules, "the name '\(name)' is used by more than one layer or loss layer", layer: name)
        }
        let producers = Dictionary(network.layers.flatMap { layer in layer.output.map { ($0, layer) } }, uniquingKeysWith: { $1 })
        let (input, target) = try lossEndpoints(loss)
        guard let source = producers[input] else {
            throw CoreMLError(.updateRules, "the loss input '\(input)' is not produced by any layer", layer: loss.name)
        }
        guard producers[target] == nil else {
            throw CoreMLError(.updateRules, "the loss target '\(target)' must be a training input, not a layer output", layer: loss.name)
        }
        let crossEntropy: Bool
        if case .categoricalCrossEntropyLossLayer = loss.lossLayerType { crossEntropy = true } else { crossEntropy = false }
        if crossEntropy, case .softmax = source.layer {
        } else if crossEntropy {
            throw CoreMLError(
                .updateRules, "categorical cross-entropy must read a softmax output, but '\(input)' comes from \(source.typeName) layer '\(source.name)'",
                layer: loss.name)
        }
        try checkBackPropagation(network.layers, lossSource: source, crossEntropy: crossEntropy, lossName: loss.name)
        try checkOptimizer(update)
        try checkTrainingInputs(model.description_p, target: target)
    }

    /// The input and target blob names of a loss layer.
    static func lossEndpoints(_ loss: CoreML_Specification_LossLayer) throws(CoreMLError) -> (input: String, target: String) {
        switch loss.lossLayerType {
        case .categoricalCrossEntropyLossLayer(let l): return (l.input, l.target)
        case .meanSquaredErrorLossLayer(let l): return (l.input, l.target)
        case nil:
            let name = UnknownFields.caseName(in: loss.unknownFields, table: CoreMLCaseNames.lossTypes) ?? "unknown"
            throw CoreMLError(
                .unsupportedFeature, "loss type '\(name)' is not supported; Core ML updates with MSE or categorical cross-entropy", layer: loss.name)
        }
    }

    private static func checkUpdatableLayers(_ layers: [ProtoLayer]) throws(CoreMLError) {
        var any = false
        for layer in layers where layer.isUpdatable {
            any = true
            guard isUpdatableType(layer) else {
                throw CoreMLError(.updateRules, "only inner-product and convolution layers can be updatable, not \(layer.typeName)", layer: layer.name)
            }
            for (role, params) in layer.weightParams {
                guard params.isFloat32 else {
                    throw CoreMLError(.updateRules, "the \(role) of an updatable layer must be float32, not float16 or quantized", layer: layer.name)
                }
                guard params.isUpdatable else {
                    throw CoreMLError(.updateRules, "the \(role) of an updatable layer must be marked updatable", layer: layer.name)
                }
            }
        }
        guard any else { throw CoreMLError(.updateRules, "the model is marked updatable but none of its layers is") }
    }

    /// Every layer on a path from an updatable layer to the loss must support back-propagation; a softmax that
    /// feeds a categorical cross-entropy loss directly is the one exception.
    private static func checkBackPropagation(_ layers: [ProtoLayer], lossSource: ProtoLayer, crossEntropy: Bool, lossName: String) throws(CoreMLError) {
        var producer: [String: Int] = [:]
        for (index, layer) in layers.enumerated() { for name in layer.output { producer[name] = index } }
        // Ancestors of the loss input, including the layer producing it.
        guard let sourceIndex = layers.firstIndex(where: { $0.name == lossSource.name }) else { return }
        var onPath = Set([sourceIndex])
        var stack = [sourceIndex]
        while let index = stack.popLast() {
            for input in layers[index].input {
                if let parent = producer[input], onPath.insert(parent).inserted { stack.append(parent) }
            }
        }
        // Descendants of updatable layers (reached from one) that lead to the loss.
        var fed = [Bool](repeating: false, count: layers.count)
        var feeder = [String?](repeating: nil, count: layers.count)
        for (index, layer) in layers.enumerated() {
            let upstream = layer.input.compactMap { producer[$0] }.first { fed[$0] || layers[$0].isUpdatable }
            guard let upstream else { continue }
            fed[index] = true
            feeder[index] = layers[upstream].isUpdatable ? layers[upstream].name : feeder[upstream]
            guard onPath.contains(index), !layer.supportsBackPropagation else { continue }
            if crossEntropy, index == sourceIndex, case .softmax = layer.layer { continue }
            throw CoreMLError(
                .updateRules,
                "\(layer.typeName) layer '\(layer.name)' does not support back-propagation but lies between updatable layer '\(feeder[index] ?? "?")' and the loss '\(lossName)'; layers such as embedding and concat must come before every updatable layer",
                layer: layer.name)
        }
    }

    private static func checkOptimizer(_ update: ProtoUpdateParameters) throws(CoreMLError) {
        func double(_ name: String, _ p: CoreML_Specification_DoubleParameter, present: Bool) throws(CoreMLError) {
            guard present else { throw CoreMLError(.updateRules, "the optimizer needs a \(name) parameter") }
            if case .range(let r) = p.allowedValues, !(r.minValue <= p.defaultValue && p.defaultValue <= r.maxValue) {
                throw CoreMLError(.updateRules, "\(name) \(p.defaultValue) is outside its allowed range [\(r.minValue), \(r.maxValue)]")
            }
        }
        func integer(_ name: String, _ p: CoreML_Specification_Int64Parameter, present: Bool) throws(CoreMLError) {
            guard present else { throw CoreMLError(.updateRules, "the update parameters need \(name)") }
            guard p.defaultValue > 0 else { throw CoreMLError(.updateRules, "\(name) must be positive, not \(p.defaultValue)") }
            switch p.allowedValues {
            case .range(let r) where !(r.minValue <= p.defaultValue && p.defaultValue <= r.maxValue):
                throw CoreMLError(.updateRules, "\(name) \(p.defaultValue) is outside its allowed range [\(r.minValue), \(r.maxValue)]")
            case .set(let s) where !s.values.contains(p.defaultValue):
                throw CoreMLError(.updateRules, "\(name) \(p.defaultValue) is not in its allowed set \(s.values)")
            default: break
            }
        }
        switch update.optimizer.optimizerType {
        case .sgdOptimizer(let o):
            try double("learning rate", o.learningRate, present: o.hasLearningRate)
            try integer("mini-batch size", o.miniBatchSize, present: o.hasMiniBatchSize)
            if o.hasMomentum { try double("momentum", o.momentum, present: true) }
        case .adamOptimizer(let o):
            try double("learning rate", o.learningRate, present: o.hasLearningRate)
            try integer("mini-batch size", o.miniBatchSize, present: o.hasMiniBatchSize)
            try double("beta1", o.beta1, present: o.hasBeta1)
            try double("beta2", o.beta2, present: o.hasBeta2)
            try double("eps", o.eps, present: o.hasEps)
        case nil:
            let name = UnknownFields.caseName(in: update.optimizer.unknownFields, table: CoreMLCaseNames.optimizerTypes)
            throw CoreMLError(.updateRules, name.map { "optimizer '\($0)' is not supported" } ?? "an updatable model needs an optimizer (SGD or Adam)")
        }
        try integer("epochs", update.epochs, present: update.hasEpochs)
    }

    private static func checkTrainingInputs(_ description: CoreML_Specification_ModelDescription, target: String) throws(CoreMLError) {
        let training = description.trainingInput
        guard training.contains(where: { $0.name == target }) || training.contains(where: { $0.name == description.predictedFeatureName && !$0.name.isEmpty })
        else {
            throw CoreMLError(.updateRules, "the training inputs must include the loss target '\(target)'")
        }
        let inputs = Set(description.input.map(\.name))
        guard training.contains(where: { inputs.contains($0.name) }) else {
            throw CoreMLError(.updateRules, "the training inputs must include at least one model input")
        }
    }
}

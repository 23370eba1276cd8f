import OrchardSupport
public import OrchardFormats
public import OrchardML

/// The image classifiers of McMahan et al. (2017), as architecture specs.
public enum ModelZoo {
    /// The 2NN: flatten, two hidden layers of 200 ReLU units, 10-way softmax (199,210 parameters on 28×28).
    /// - Parameters:
    ///   - imageShape: Per-sample input shape `[C, H, W]`.
    ///   - classes: Number of classes.
    ///   - learningRate: Local SGD learning rate.
    public static func mlp2nn(imageShape: [Int], classes: Int = 10, learningRate: Double = 0.05) -> ModelSpec {
        let inputSize = imageShape.reduce(1, *)
        return ModelSpec(
            name: "mlp2nn",
            inputs: [InputSpec(name: "image", shape: imageShape)],
            layers: [
                LayerSpec(name: "flatten", type: .flatten, inputs: ["image"]),
                LayerSpec(name: "hidden1", type: .dense, inputs: ["flatten"], units: 200, inputSize: inputSize),
                LayerSpec(name: "relu1", type: .relu, inputs: ["hidden1"]),
                LayerSpec(name: "hidden2", type: .dense, inputs: ["relu1"], units: 200, inputSize: 200),
                LayerSpec(name: "relu2", type: .relu, inputs: ["hidden2"]),
                LayerSpec(name: "logits", type: .dense, inputs: ["relu2"], units: classes, inputSize: 200),
                LayerSpec(name: "probabilities", type: .softmax, inputs: ["logits"]),
            ],
            output: "probabilities",
            training: TrainingSpec(loss: .crossEntropy, optimizer: .sgd(learningRate: learningRate), epochs: 1, batchSize: 10)
        )
    }

    /// The CNN: 5×5 convolutions with 32 and 64 channels (same padding), each followed by ReLU and 2×2 max
    /// pooling, a 512-unit ReLU layer and a 10-way softmax.
    /// - Parameters:
    ///   - imageShape: Per-sample input shape `[C, H, W]` (H and W divisible by 4).
    ///   - classes: Number of classes.
    ///   - learningRate: Local SGD learning rate.
    public static func cnn(imageShape: [Int], classes: Int = 10, learningRate: Double = 0.05) -> ModelSpec {
        let (c, h, w) = (imageShape[0], imageShape[1], imageShape[2])
        return ModelSpec(
            name: "cnn",
            inputs: [InputSpec(name: "image", shape: imageShape)],
            layers: [
                LayerSpec(name: "conv1", type: .conv2d, inputs: ["image"], units: 32, kernelSize: [5, 5], strides: [1, 1], padding: .same, inChannels: c),
                LayerSpec(name: "relu1", type: .relu, inputs: ["conv1"]),
                LayerSpec(name: "pool1", type: .maxPool2d, inputs: ["relu1"], kernelSize: [2, 2], strides: [2, 2]),
                LayerSpec(name: "conv2", type: .conv2d, inputs: ["pool1"], units: 64, kernelSize: [5, 5], strides: [1, 1], padding: .same, inChannels: 32),
                LayerSpec(name: "relu2", type: .relu, inputs: ["conv2"]),
                LayerSpec(name: "pool2", type: .maxPool2d, inputs: ["relu2"], kernelSize: [2, 2], strides: [2, 2]),
                LayerSpec(name: "flatten", type: .flatten, inputs: ["pool2"]),
                LayerSpec(name: "hidden", type: .dense, inputs: ["flatten"], units: 512, inputSize: 64 * (h / 4) * (w / 4)),
                LayerSpec(name: "relu3", type: .relu, inputs: ["hidden"]),
                LayerSpec(name: "logits", type: .dense, inputs: ["relu3"], units: classes, inputSize: 512),
                LayerSpec(name: "probabilities", type: .softmax, inputs: ["logits"]),
            ],
            output: "probabilities",
            training: TrainingSpec(loss: .crossEntropy, optimizer: .sgd(learningRate: learningRate), epochs: 1, batchSize: 10)
        )
    }

    /// A next-character model: an embedding of each of `length` characters (width `embedding`), viewed as a sequence, a
    /// CIFG LSTM of `units` over the whole sequence (Gboard's cell, Hard et al. 2018), and a per-step softmax over the
    /// vocabulary; trained with per-step cross-entropy, padding (−1) masked.
    public static func charLSTM(vocabularySize: Int, length: Int, embedding: Int = 8, units: Int = 128, learningRate: Double = 1) -> ModelSpec {
        ModelSpec(
            name: "char-lstm",
            inputs: [InputSpec(name: "chars", shape: [length], categorical: true)],
            layers: [
                LayerSpec(name: "embed", type: .embedding, inputs: ["chars"], vocabularySize: vocabularySize, embeddingSize: embedding),
                LayerSpec(name: "steps", type: .reshape, inputs: ["embed"], targetShape: [length, embedding]),
                LayerSpec(name: "lstm", type: .lstm, inputs: ["steps"], units: units, inputSize: embedding, returnSequences: true, cifg: true),
                LayerSpec(name: "logits", type: .dense, inputs: ["lstm"], units: vocabularySize, inputSize: units),
                LayerSpec(name: "next", type: .softmax, inputs: ["logits"]),
            ],
            output: "next",
            training: TrainingSpec(loss: .crossEntropy, optimizer: .sgd(learningRate: learningRate), epochs: 1, batchSize: 10)
        )
    }

    /// Draws fresh initial weights the way PyTorch's `nn.Linear` and `nn.Conv2d` do by default — weights and
    /// biases uniform in `±1/√fanIn` (`fanIn` = inputs per output unit) — so a federated run starts from the same
    /// distribution as the Python frameworks (Flower, FedML, pfl) that published FedAvg baselines are run with.
    /// The engine's own He-uniform start (`±√(6/fanIn)`, biases zero) is √6 ≈ 2.4× wider and learns measurably
    /// faster in the first rounds, which would make curves incomparable. Other layers are left as they are.
    /// - Parameters:
    ///   - model: The model whose dense and convolution layers are re-drawn.
    ///   - seed: The seed of the draw.
    public static func initializeAsPyTorch(_ model: inout Model, seed: UInt64) throws(EngineError) {
        var random = OrchardRandom.derived(seed: seed, stream: 0x1417_7041)
        for layer in model.spec.layers where layer.type == .dense || layer.type == .conv2d {
            guard let weight = model.parameter("\(layer.name).weight") else { continue }
            let fanIn = weight.shape.dropFirst().reduce(1, *)
            let bound = 1 / Float(max(fanIn, 1)).squareRoot()
            for suffix in ["weight", "bias"] {
                guard let current = model.parameter("\(layer.name).\(suffix)") else { continue }
                let values = (0..<current.count).map { _ in random.nextFloat(symmetric: bound) }
                try model.setParameter("\(layer.name).\(suffix)", to: Tensor(shape: current.shape, scalars: values))
            }
        }
    }
}

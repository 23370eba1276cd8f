public import OrchardFormats

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
}

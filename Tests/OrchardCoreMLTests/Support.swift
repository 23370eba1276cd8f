import Foundation
import OrchardSupport
import OrchardFormats
import OrchardTesting

enum Models {
    /// The seed's housing device model: frozen embeddings for the two categorical columns, trainable dense layers,
    /// MSE and SGD. Every attribute is explicit, so an import of its export compares equal.
    static func housing(optimizer: OptimizerSpec = .sgd(learningRate: 0.01, momentum: 0.9)) -> ModelSpec {
        ModelSpec(
            name: "housing",
            inputs: [
                InputSpec(name: "numeric", shape: [10]),
                InputSpec(name: "chas", shape: [1], categorical: true),
                InputSpec(name: "rad", shape: [1], categorical: true),
            ],
            layers: [
                LayerSpec(name: "chasEmbedding", type: .embedding, inputs: ["chas"], frozen: true, vocabularySize: 2, embeddingSize: 2),
                LayerSpec(name: "radEmbedding", type: .embedding, inputs: ["rad"], frozen: true, vocabularySize: 9, embeddingSize: 4),
                LayerSpec(name: "joined", type: .concat, inputs: ["numeric", "chasEmbedding", "radEmbedding"]),
                LayerSpec(name: "dense1", type: .dense, inputs: ["joined"], units: 64, inputSize: 16, useBias: true),
                LayerSpec(name: "relu1", type: .relu, inputs: ["dense1"]),
                LayerSpec(name: "dense2", type: .dense, inputs: ["relu1"], units: 32, inputSize: 64, useBias: true),
                LayerSpec(name: "relu2", type: .relu, inputs: ["dense2"]),
                LayerSpec(name: "out", type: .dense, inputs: ["relu2"], units: 1, inputSize: 32, useBias: true),
            ],
            training: TrainingSpec(loss: .meanSquaredError, optimizer: optimizer, epochs: 5, batchSize: 16)
        )
    }

    /// A small image classifier: same-padded strided convolution, explicit-padded convolution, max pooling,
    /// flatten, dense, softmax; cross-entropy and Adam; the first convolution frozen.
    static func convolutional() -> ModelSpec {
        ModelSpec(
            name: "digits",
            inputs: [InputSpec(name: "image", shape: [1, 12, 12])],
            layers: [
                LayerSpec(
                    name: "conv1", type: .conv2d, inputs: ["image"], frozen: true, units: 4, useBias: true,
                    kernelSize: [3, 3], strides: [2, 2], padding: .same, inChannels: 1),
                LayerSpec(name: "act1", type: .relu, inputs: ["conv1"]),
                LayerSpec(
                    name: "conv2", type: .conv2d, inputs: ["act1"], units: 6, useBias: false,
                    kernelSize: [3, 3], strides: [1, 1], padding: .explicit(height: 1, width: 1), inChannels: 4),
                LayerSpec(name: "act2", type: .tanh, inputs: ["conv2"]),
                LayerSpec(name: "pool", type: .maxPool2d, inputs: ["act2"], kernelSize: [2, 2], strides: [2, 2], padding: .valid),
                LayerSpec(name: "flat", type: .flatten, inputs: ["pool"]),
                LayerSpec(name: "fc", type: .dense, inputs: ["flat"], units: 3, inputSize: 54, useBias: true),
                LayerSpec(name: "probs", type: .softmax, inputs: ["fc"]),
            ],
            training: TrainingSpec(
                loss: .crossEntropy, optimizer: .adam(learningRate: 0.003, beta1: 0.8, beta2: 0.99, epsilon: 1e-6),
                epochs: 4, batchSize: 8)
        )
    }

    /// The parameter shapes of `spec`, from its (explicit) attributes.
    static func parameterShapes(_ spec: ModelSpec) -> [(String, [Int])] {
        spec.layers.flatMap { layer -> [(String, [Int])] in
            switch layer.type {
            case .dense:
                let units = layer.units!
                return [("\(layer.name).weight", [units, layer.inputSize!])] + ((layer.useBias ?? true) ? [("\(layer.name).bias", [units])] : [])
            case .embedding:
                return [("\(layer.name).weight", [layer.vocabularySize!, layer.embeddingSize!])]
            case .conv2d:
                let units = layer.units!
                return [("\(layer.name).weight", [units, layer.inChannels!] + layer.kernelSize!)]
                    + ((layer.useBias ?? true) ? [("\(layer.name).bias", [units])] : [])
            default:
                return []
            }
        }
    }

    /// Seeded random weights for every parameter of `spec`.
    static func weights(for spec: ModelSpec, seed: UInt64 = 42) -> [TensorRecord] {
        var rng = SplitMix64(seed: seed)
        return parameterShapes(spec).map { name, shape in
            TensorRecord(name: name, shape: shape, values: (0..<shape.reduce(1, *)).map { _ in Float.random(in: -1...1, using: &rng) })
        }
    }
}

/// Runs the Python helper scripts next to this file. Their tests are skipped when the packages are missing (see
/// ``OrchardTesting/PythonModules``) and fail loudly under `ORCHARD_REQUIRE_PYTHON=1`: these cross-checks are the
/// proof that the files are Apple's format, so CI must not pass without them.
enum Python {
    /// The Python packages the scripts import.
    static let modules = ["coremltools", "numpy", "safetensors"]

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    static let scripts = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Python")

    /// Runs `script` with `arguments`; returns its standard output.
    static func run(_ script: String, _ arguments: [String]) async throws -> String {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", scripts.appendingPathComponent(script).path] + arguments
        let errorLog = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-python-\(UUID().uuidString).log")
        _ = FileManager.default.createFile(atPath: errorLog.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: errorLog) }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = try FileHandle(forWritingTo: errorLog)
        do {
            try process.run()
        } catch {
            throw Failure(description: "could not start python3 (\(error)); install Python 3 and `python3 -m pip install coremltools numpy safetensors`")
        }
        let data = await output.fileHandleForReading.readToEndOfFile()
        await process.exited()
        guard process.terminationStatus == 0 else {
            let log = (try? String(contentsOf: errorLog, encoding: .utf8)) ?? ""
            let hint =
                process.terminationStatus == 127
                ? "python3 is not installed"
                : "run `python3 -m pip install coremltools numpy safetensors` if a package is missing"
            throw Failure(description: "\(script) exited with \(process.terminationStatus) (\(hint)):\n\(log.suffix(3000))")
        }
        return String(decoding: data, as: UTF8.self)
    }

    /// Runs `script` and decodes its standard output as JSON.
    static func json(_ script: String, _ arguments: [String]) async throws -> [String: Any] {
        let text = try await run(script, arguments)
        guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            throw Failure(description: "\(script) printed no JSON object: \(text.prefix(500))")
        }
        return object
    }
}

/// A fresh directory under the system temporary directory, removed by the caller.
func makeTemporaryDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-coreml-\(UUID().uuidString)", isDirectory: true)
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

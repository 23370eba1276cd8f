import ArgumentParser
import Foundation
import OrchardCoreML
import OrchardFormats

/// `orchard coreml`: export to, import from, and inspect Core ML `.mlmodel` files.
struct CoreMLCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coreml",
        abstract: "Export Orchard models as updatable Core ML models, import Core ML models, inspect .mlmodel files.",
        subcommands: [Export.self, Import.self, Inspect.self]
    )

    /// `orchard coreml export <model.json> <weights.safetensors> -o out.mlmodel`.
    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write an Orchard model and its weights as a Core ML neural network (updatable by default)."
        )

        @Argument(help: "The model architecture JSON.")
        var model: String

        @Argument(help: "The weights (safetensors).")
        var weights: String

        @Option(name: .shortAndLong, help: "The .mlmodel file to write.")
        var output: String

        @Flag(help: "Write a prediction-only model (no loss, optimizer or updatable layers).")
        var predictionOnly = false

        @Option(help: "Element type of multi-array features.")
        var arrayType: CoreMLArrayDataType = .double

        @Flag(help: "Leave dropout layers out instead of refusing to export them.")
        var omitDropout = false

        @Flag(help: "Leave out weight decay and update caps, which Core ML cannot express, instead of refusing.")
        var dropUnrepresentable = false

        @Option(help: "Short description stored in the model's metadata.")
        var shortDescription = ""

        @Option(help: "Author stored in the model's metadata.")
        var author = ""

        @Option(help: "License stored in the model's metadata.")
        var license = ""

        func run() throws {
            let spec = try ModelSpec.decode(json: Data(contentsOf: URL(fileURLWithPath: model)))
            let archive = try Safetensors.decode(try Data(contentsOf: URL(fileURLWithPath: weights)))
            let options = CoreMLExportOptions(
                updatable: !predictionOnly, arrayDataType: arrayType, dropout: omitDropout ? .omit : .reject,
                dropsUnrepresentableTrainingSettings: dropUnrepresentable,
                metadata: CoreMLMetadata(shortDescription: shortDescription, author: author, license: license)
            )
            let bytes = try CoreMLExporter(options: options).export(spec, weights: archive.tensors)
            try Data(bytes).write(to: URL(fileURLWithPath: output), options: .atomic)
            print("wrote \(output) (\(bytes.count) bytes)")
        }
    }

    /// `orchard coreml import in.mlmodel -o dir/`.
    struct Import: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Read a Core ML neural network into an Orchard architecture (model.json) and weights (weights.safetensors)."
        )

        @Argument(help: "The .mlmodel file to read.")
        var input: String

        @Option(name: .shortAndLong, help: "The directory to write model.json and weights.safetensors into.")
        var output: String

        @Option(help: "The model name to use when the file carries none.")
        var name = "coreml-model"

        func run() throws {
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: input)))
            let imported = try CoreMLImporter(options: CoreMLImportOptions(defaultModelName: name)).importModel(from: bytes)
            let directory = URL(fileURLWithPath: output, isDirectory: true)
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try imported.spec.jsonData().write(to: directory.appendingPathComponent("model.json"), options: .atomic)
            try Data(Safetensors.encode(imported.weights)).write(to: directory.appendingPathComponent("weights.safetensors"), options: .atomic)
            var written = ["model.json", "weights.safetensors"]
            if !imported.classLabels.isEmpty {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.prettyPrinted]
                try encoder.encode(imported.classLabels).write(to: directory.appendingPathComponent("labels.json"), options: .atomic)
                written.append("labels.json")
            }
            print("wrote \(written.joined(separator: ", ")) to \(output) (\(imported.spec.layers.count) layers, \(imported.weights.count) tensors)")
        }
    }

    /// `orchard coreml inspect in.mlmodel`.
    struct Inspect: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a Core ML model's features, layers, shapes, updatable layers, loss, optimizer and epochs."
        )

        @Argument(help: "The .mlmodel file to read.")
        var input: String

        func run() throws {
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: input)))
            print(try CoreMLModelSummary(bytes: bytes))
        }
    }
}

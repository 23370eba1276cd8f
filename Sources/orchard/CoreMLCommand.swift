import ArgumentParser
import Foundation
import OrchardCoreML
import OrchardFormats
import OrchardSupport

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
            let weightsFile = CommandFile("<weights>", weights)
            try CommandFile("--output", output).refuseOverwriting([CommandFile("<model>", model), weightsFile])
            let spec = try CommandFile("<model>", model).modelSpec()
            let archive = try weightsFile.safetensors()
            do throws(FormatError) {
                try spec.checkWeights(Dictionary(archive.tensors.map { ($0.name, $0.shape) }, uniquingKeysWith: { first, _ in first }))
            } catch {
                // An architecture that does not build is left to the exporter, which names the layer.
                if error.code != .invalidSpec { throw weightsFile.failure(error.code, "does not match the model '\(spec.name)': \(error.message)") }
            }
            let parameters = archive.tensors.reduce(0) { $0 + $1.values.count }
            if parameters >= CoreMLCommand.largeModelParameters {
                ProgressReporter.note("converting '\(spec.name)' (\(spec.layers.count) layers, \(parameters) parameters) to Core ML")
            }
            let options = CoreMLExportOptions(
                updatable: !predictionOnly, arrayDataType: arrayType, dropout: omitDropout ? .omit : .reject,
                dropsUnrepresentableTrainingSettings: dropUnrepresentable,
                metadata: CoreMLMetadata(shortDescription: shortDescription, author: author, license: license)
            )
            let bytes: [UInt8]
            do throws(CoreMLError) {
                bytes = try CoreMLExporter(options: options).export(spec, weights: archive.tensors)
            } catch {
                // A weight the architecture does not imply (or lacks) is the weights file's fault.
                throw error.code == .weightMismatch ? weightsFile.failure(error.code, CoreMLCommand.describe(error)) : error
            }
            try CommandFile("--output", output).write(Data(bytes))
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
            let file = CommandFile("<input>", input)
            let bytes = try CoreMLCommand.readModel(file)
            let imported: CoreMLImportedModel
            do throws(CoreMLError) {
                imported = try CoreMLImporter(options: CoreMLImportOptions(defaultModelName: name)).importModel(from: bytes)
            } catch {
                throw file.failure(error.code, CoreMLCommand.describe(error))
            }
            try CommandFile("--output", output).createDirectory()
            func write(_ name: String, _ data: Data) throws(CommandFailure) {
                try CommandFile("--output", URL(fileURLWithPath: output, isDirectory: true).appendingPathComponent(name).path).write(data)
            }
            try write("model.json", try imported.spec.jsonData())
            try write("weights.safetensors", Data(Safetensors.encode(imported.weights)))
            var written = ["model.json", "weights.safetensors"]
            if !imported.classLabels.isEmpty {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.prettyPrinted]
                try write("labels.json", try encoder.encode(imported.classLabels))
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
            let file = CommandFile("<input>", input)
            let bytes = try CoreMLCommand.readModel(file)
            do throws(CoreMLError) { print(try CoreMLModelSummary(bytes: bytes)) } catch { throw file.failure(error.code, CoreMLCommand.describe(error)) }
        }
    }

    /// Models with at least this many parameters get a line on standard error before their conversion starts.
    static let largeModelParameters = 10_000_000

    /// A `.mlmodel` file's bytes; a large one is announced on standard error before it is parsed.
    static func readModel(_ file: CommandFile) throws(CommandFailure) -> [UInt8] {
        let bytes = [UInt8](try file.read())
        if bytes.count >= largeModelParameters * 4 {
            ProgressReporter.note("reading '\(file.path)' (\(bytes.count / (1 << 20)) MiB)")
        }
        return bytes
    }

    /// A Core ML error without its code: `layer 'conv1': …` or the message alone.
    static func describe(_ error: CoreMLError) -> String {
        (error.layer.map { "layer '\($0)': " } ?? "") + error.message
    }
}

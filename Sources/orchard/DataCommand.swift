import ArgumentParser
import Foundation
import OrchardSupport
import OrchardData
import OrchardFormats
import OrchardML

/// `orchard data …`: preparing a device's training data.
struct DataCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "data",
        abstract: "Prepare a device's training data for `orchard client --data` and `orchard agent --data`.",
        subcommands: [DataPrepareCommand.self]
    )
}

/// `orchard data prepare`: a CSV file → the device data file, with the model's saved preprocessing.
struct DataPrepareCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "prepare",
        abstract: "Turn a CSV file into the safetensors file a device trains from, with the model's saved preprocessing.",
        discussion: """
            The preprocessing (standardisation of the numeric features, the categories' indices) is the one fitted \
            on the training rows and saved in the metadata of the model's weights (orchard.preprocessing), as \
            `orchard train housing --output DIR` writes them: <name>.json and <name>.safetensors side by side. The \
            output holds one tensor per model input, named as the input, and `target`.
            """
    )

    @Option(help: ArgumentHelp("The model architecture (JSON).", valueName: "file"))
    var model: String

    @Option(
        help: ArgumentHelp("The weights whose metadata holds the preprocessing (default: the --model file with the extension .safetensors).", valueName: "file")
    )
    var weights: String?

    @Option(help: ArgumentHelp("The device's rows: CSV with a header line naming the columns.", valueName: "file"))
    var csv: String

    @Option(help: ArgumentHelp("The CSV column holding the target, when it is not named as in training.", valueName: "column"))
    var target: String?

    @Option(name: [.customShort("o"), .customLong("output")], help: ArgumentHelp("The device data file to write (safetensors).", valueName: "file"))
    var output: String

    /// `--weights`, or the model's path with `.safetensors` for `.json`.
    var weightsPath: String {
        if let weights { return weights }
        let url = URL(fileURLWithPath: model)
        return url.pathExtension == "json" ? url.deletingPathExtension().appendingPathExtension("safetensors").path : model + ".safetensors"
    }

    func run() throws {
        do {
            let weightsOption = weights == nil ? "the weights next to --model" : "--weights"
            for (option, path) in [("--model", model), (weightsOption, weightsPath), ("--csv", csv)] where CommandFile.sameFile(path, output) {
                throw PrepareError(
                    line: "invalid_option: -o '\(output)' is the input \(option) '\(path)'; writing it would replace that file: choose another path")
            }
            let dataset = try prepare()
            try Data(DeviceDataFile.encode(dataset)).write(to: URL(fileURLWithPath: output), options: .atomic)
            let inputs = zip(dataset.inputSpecs, dataset.inputs).map { "\($0.0.name) \($0.1.shape)" }.joined(separator: ", ")
            print("wrote \(dataset.count) rows to \(output): \(inputs), target \(dataset.targets.shape)")
        } catch let error as PrepareError {
            FileHandle.standardError.write(Data("error: \(error.line)\n".utf8))
            throw ExitCode(1)
        } catch {
            FileHandle.standardError.write(Data("error: cannot write -o '\(output)': \(FileAccessError(error, writing: true).message)\n".utf8))
            throw ExitCode(1)
        }
    }

    /// A failure with the one line to print.
    struct PrepareError: Error {
        var line: String
    }

    /// Reads the model, its preprocessing and the CSV file; transforms the rows.
    func prepare() throws(PrepareError) -> TensorDataset {
        func fail(_ line: String) -> PrepareError { PrepareError(line: line) }
        func read(_ path: String, _ option: String) throws(PrepareError) -> Data {
            do throws(FileAccessError) { return try LocalFile.read(path) } catch { throw fail("missing_file: \(option) '\(path)': \(error.message)") }
        }
        let modelData = try read(model, "--model")
        let spec: ModelSpec
        do throws(FormatError) {
            spec = try ModelSpec.decode(json: modelData)
        } catch {
            throw fail("invalid_model: --model '\(model)': \(error.message)")
        }
        let weightsOption = weights == nil ? "the weights next to --model" : "--weights"
        let weightsData = try read(weightsPath, weightsOption)
        let metadata: [String: String]
        do throws(FormatError) {
            metadata = try Safetensors.index([UInt8](weightsData)).metadata
        } catch {
            throw fail("invalid_weights: \(weightsOption) '\(weightsPath)' is not safetensors: \(error.message)")
        }
        guard metadata[TabularPreprocessor.metadataKey] != nil else {
            throw fail(
                "missing_preprocessing: \(weightsOption) '\(weightsPath)' has no '\(TabularPreprocessor.metadataKey)' metadata; give the weights `orchard train housing --output` wrote with the model or a checkpoint of a process hosted with those weights"
            )
        }
        let preprocessor: TabularPreprocessor
        do throws(DataError) {
            preprocessor = try TabularPreprocessor(safetensorsMetadata: metadata)
            try preprocessor.checkFeeds(spec)
        } catch {
            throw fail("\(error.code): --model '\(model)' and its preprocessing in '\(weightsPath)' do not agree: \(error.message)")
        }
        _ = try read(csv, "--csv")
        do throws(DataError) {
            return try preprocessor.deviceData(csv: URL(fileURLWithPath: csv), targetColumn: target) { unseen in
                FileHandle.standardError.write(
                    Data(
                        "warning: --csv row \(unseen.row): \(unseen.column) '\(unseen.value)' was not seen in training; it is encoded as the reserved index for unseen categories\n"
                            .utf8
                    ))
            }
        } catch {
            let missingTarget = target == nil && error.code == .unknownColumn && error.message.hasPrefix("no column '\(preprocessor.target)'")
            var location = ""
            if let line = error.line { location = " at line \(line)" + (error.column.map { ", column \($0)" } ?? "") }
            throw fail("\(error.code)\(location): --csv '\(csv)': \(error.message)\(missingTarget ? "; name the target column with --target" : "")")
        }
    }
}

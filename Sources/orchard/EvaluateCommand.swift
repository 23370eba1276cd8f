import OrchardBenchmarks
import ArgumentParser
import Foundation
import OrchardData
import OrchardFormats
import OrchardML
import OrchardSupport

/// `orchard evaluate`: any checkpoint on disk against a held-out data file.
struct EvaluateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "evaluate",
        abstract: "Evaluate a model's weights (any checkpoint on disk) on a data file.",
        discussion: """
            Reads the architecture (--model, JSON), the weights (--weights, safetensors: a checkpoint from `orchard process \
            checkpoint` or the dashboard) and the samples (--data, as `orchard data prepare` writes them), and prints the \
            sample count, the mean loss, and accuracy for a classifier or RMSE and MAE for a regressor. The loss is the \
            model's training section's unless --loss names one. With --json, one JSON line with snake_case keys.
            """
    )

    @Option(help: ArgumentHelp("The model architecture (JSON).", valueName: "file"))
    var model: String

    @Option(help: ArgumentHelp("The weights to evaluate (safetensors).", valueName: "file"))
    var weights: String

    @Option(help: ArgumentHelp("The samples (as `orchard data prepare` writes them).", valueName: "file"))
    var data: String

    @Option(help: "The loss: mse or cross-entropy (default: the model's training section's).")
    var loss: EvaluationLoss?

    @Flag(help: "Print one JSON line instead of text.")
    var json = false

    func run() throws {
        let spec = try CommandFile("--model", model).modelSpec()
        let archive = try CommandFile("--weights", weights).safetensors()
        let lossType: LossType
        if let loss {
            lossType = loss.type
        } else if let trained = spec.training?.loss {
            lossType = trained
        } else {
            throw CommandFailure(
                code: "invalid_argument", message: "--model '\(model)' has no training section to take the loss from: give --loss mse or --loss cross-entropy")
        }
        var built: Model
        do throws(EngineError) {
            built = try Model(spec: spec)
            try built.loadWeights(from: archive)
        } catch {
            throw CommandFailure(code: "\(error.code)", message: "--weights '\(weights)' do not fit --model '\(model)': \(error.message)")
        }
        let dataset: TensorDataset
        do throws(DataError) { dataset = try DeviceDataFile.read(contentsOf: URL(fileURLWithPath: data)) } catch {
            throw CommandFailure(code: "\(error.code)", message: "--data '\(data)': \(error.message)")
        }
        let metrics: EvaluationMetrics
        do throws(EngineError) { metrics = try built.evaluationMetrics(on: dataset, loss: lossType) } catch {
            throw CommandFailure(code: "\(error.code)", message: "--data '\(data)' does not fit --model '\(model)': \(error.message)")
        }
        if json {
            // A diverged checkpoint's NaN or infinite loss is written as a string, not refused by the JSON writer.
            let object = metrics.all.mapValues(JSONLine.jsonValue).merging(["samples": metrics.samples]) { _, new in new }
            let line = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            print(String(decoding: line, as: UTF8.self))
        } else {
            print("samples  \(metrics.samples)")
            print("loss     \(metrics.loss)")
            for (name, value) in metrics.values.sorted(by: { $0.key < $1.key }) { print("\(name.padding(toLength: 8, withPad: " ", startingAt: 0)) \(value)") }
        }
    }
}

/// The losses `orchard evaluate --loss` takes.
enum EvaluationLoss: String, CaseIterable, ExpressibleByArgument {
    case mse
    case crossEntropy = "cross-entropy"

    var type: LossType { self == .mse ? .meanSquaredError : .crossEntropy }
}

import OrchardBenchmarks
import ArgumentParser
import Foundation
import OrchardData
import OrchardExamples
import OrchardFormats
import OrchardML
import OrchardSimulation
import OrchardSupport

/// `orchard train …`: the bundled training examples.
struct TrainCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "train",
        abstract: "Train one of the bundled examples.",
        subcommands: [TrainHousing.self, TrainKJV.self]
    )
}

/// `orchard train housing`: the seed article's transfer-learning example.
struct TrainHousing: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "housing",
        abstract: "Boston housing: a central model learns CHAS and RAD embeddings; a device model reuses them frozen.",
        discussion: """
            Trains the central model (embeddings, Dense+ReLU layers, MSE), then a device model of the same \
            architecture whose embeddings are copied from the central model and frozen while its dense layers train \
            from scratch. Prints train/test RMSE and MAE (in $1000s) of both models.
            """
    )

    @Option(parsing: .unconditional, help: "Passes over the training rows, for each model.")
    var epochs: Int = HousingConfiguration().training.epochs

    @Option(parsing: .unconditional, help: "Samples per update.")
    var batchSize: Int = HousingConfiguration().training.batchSize

    @Option(parsing: .unconditional, help: "Optimizer step size.")
    var learningRate: Double = HousingConfiguration().training.optimizer.learningRate

    /// `--optimizer`.
    enum Optimizer: String, CaseIterable, ExpressibleByArgument {
        case adam, sgd
    }

    @Option(help: "The optimizer.")
    var optimizer: Optimizer = Optimizer(rawValue: HousingConfiguration().training.optimizer.type) ?? .adam

    @Option(parsing: .unconditional, help: "SGD momentum (ignored by adam).")
    var momentum: Double = 0.9

    @Option(parsing: .unconditional, help: "Seed of the split, the initialisation and the shuffle order.")
    var seed: UInt64 = HousingConfiguration().seed

    @Option(parsing: .unconditional, help: "Share of rows held out for testing.")
    var testFraction: Double = HousingConfiguration().testFraction

    @Flag(help: "Print the results as JSON instead of a table.")
    var json = false

    @Option(
        help: ArgumentHelp(
            "Directory to write both trained models to (central/device .json + .safetensors, preprocessing in the metadata).",
            valueName: "directory"))
    var output: String?

    func validate() throws {
        // The bounds a model's training section takes (`orchard process create` and `flower join` refuse others).
        guard (1...ModelSpec.maximumEpochs).contains(epochs) else { throw ValidationError("--epochs must be in 1...\(ModelSpec.maximumEpochs)") }
        guard (1...ModelSpec.maximumBatchSize).contains(batchSize) else {
            throw ValidationError("--batch-size must be in 1...\(ModelSpec.maximumBatchSize)")
        }
        guard learningRate > 0, learningRate.isFinite else { throw ValidationError("--learning-rate must be positive") }
        guard testFraction > 0, testFraction < 1 else { throw ValidationError("--test-fraction must be in (0, 1)") }
    }

    func run() throws {
        let optimizerSpec: OptimizerSpec =
            switch optimizer {
            case .adam: .adam(learningRate: learningRate)
            case .sgd: .sgd(learningRate: learningRate, momentum: momentum)
            }
        let configuration = HousingConfiguration(
            seed: seed, testFraction: testFraction,
            training: TrainingSpec(loss: .meanSquaredError, optimizer: optimizerSpec, epochs: epochs, batchSize: batchSize)
        )
        if let output {
            // Made (or found wrong) before training, so a bad --output does not cost the training first.
            do throws(FileAccessError) { try LocalFile.createDirectory(output) } catch { throw ValidationError("--output '\(output)': \(error.message)") }
        }
        // Progress on standard error, an epoch at a time over both models; standard output keeps the results.
        let progress = ProgressReporter("train housing", total: 2 * epochs, unit: "epochs")
        let run = try HousingExample.run(configuration) { role, step in
            guard step.batch == step.batchesPerEpoch - 1 else { return }
            let done = (role == "central" ? 0 : epochs) + step.epoch + 1
            progress.update(done, detail: "\(role) model, loss \(String(format: "%.4g", step.loss))")
        }
        if let output {
            let directory = URL(fileURLWithPath: output, isDirectory: true)
            // A diverged model would be written, then refused by `orchard process create` and `flower join`.
            for trained in [run.central, run.device] where !trained.model.flatParameters().allSatisfy(\.isFinite) {
                FileHandle.standardError.write(
                    Data(
                        "error: the \(trained.metrics.model) model diverged (weights that are not finite); nothing was written to --output '\(output)': lower --learning-rate\n"
                            .utf8))
                throw ExitCode(1)
            }
            for trained in [run.central, run.device] {
                do {
                    try run.data.preprocessor.save(with: trained.model, to: directory, name: trained.metrics.model)
                } catch {
                    throw ValidationError(
                        "--output '\(output)': cannot write the \(trained.metrics.model) model: \(FileAccessError(error, writing: true).message)")
                }
            }
        }
        let output = HousingOutput(
            trainSamples: run.data.train.count, testSamples: run.data.test.count, seed: seed,
            optimizer: optimizer.rawValue, learningRate: learningRate, batchSize: batchSize, models: run.metrics
        )
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            // snake_case like the wire API and the simulator's files: `train_rmse`, `trainable_parameters`, ….
            encoder.keyEncodingStrategy = .convertToSnakeCase
            encoder.nonConformingFloatEncodingStrategy = JSONLine.nonFinite
            print(String(decoding: try encoder.encode(output), as: UTF8.self))
        } else {
            print(output.table)
        }
    }
}

/// What `orchard train housing` reports.
struct HousingOutput: Codable {
    var trainSamples: Int
    var testSamples: Int
    var seed: UInt64
    var optimizer: String
    var learningRate: Double
    var batchSize: Int
    var models: [HousingMetrics]

    var table: String {
        let header = ["model", "train RMSE", "train MAE", "test RMSE", "test MAE", "epochs", "trainable", "time (s)"]
        let rows = models.map { m in
            [m.model, f(m.trainRMSE), f(m.trainMAE), f(m.testRMSE), f(m.testMAE), "\(m.epochs)", "\(m.trainableParameters)", String(format: "%.2f", m.seconds)]
        }
        let widths = header.indices.map { i in ([header[i]] + rows.map { $0[i] }).map(\.count).max()! }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { i, cell in
                i == 0
                    ? cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[i] - cell.count) + cell
            }.joined(separator: "  ")
        }
        let rule = widths.map { String(repeating: "-", count: $0) }.joined(separator: "  ")
        let summary =
            "Boston housing: \(trainSamples) training rows, \(testSamples) test rows, \(optimizer) lr \(learningRate), batch \(batchSize), seed \(seed); errors in $1000s"
        return ([summary, line(header), rule] + rows.map(line)).joined(separator: "\n")
    }

    private func f(_ x: Double) -> String { String(format: "%.3f", x) }
}

/// `orchard train kjv`: the central baseline of `orchard simulate --dataset kjv`.
struct TrainKJV: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kjv",
        abstract: "The King James Bible's next-character model trained centrally: the baseline of `orchard simulate --dataset kjv`.",
        discussion: """
            Reads the text through Debian's `bible` program (apt-get install bible-kjv), cuts it into sequences as the \
            simulator does, pools every device's training sequences, trains the same char-lstm model with plain SGD, \
            and evaluates it on the same held-out sequences (the last tenth of each chapter's). Prints test accuracy \
            per character and perplexity before and after.
            """
    )

    @Option(parsing: .unconditional, help: "Passes over the pooled training sequences.")
    var epochs: Int = 1
    @Option(name: .customLong("batch-size"), parsing: .unconditional, help: "Sequences per update.")
    var batchSize: Int = SimulationConfiguration.text().batchSize
    @Option(name: .customLong("lr"), parsing: .unconditional, help: "SGD step size.")
    var learningRate: Double = SimulationConfiguration.text().learningRate
    @Option(name: .customLong("sequence-length"), parsing: .unconditional, help: "Characters per sequence.")
    var sequenceLength: Int = SimulationConfiguration.text().sequenceLength
    @Option(parsing: .unconditional, help: "Seed of the initialisation and the shuffle order.")
    var seed: UInt64 = 1
    @Flag(help: "Print the results as one JSON line.")
    var json = false

    func validate() throws {
        // The bounds a model's training section takes (`orchard process create` and `flower join` refuse others).
        guard (1...ModelSpec.maximumEpochs).contains(epochs) else { throw ValidationError("--epochs must be in 1...\(ModelSpec.maximumEpochs)") }
        guard (1...ModelSpec.maximumBatchSize).contains(batchSize) else {
            throw ValidationError("--batch-size must be in 1...\(ModelSpec.maximumBatchSize)")
        }
        guard learningRate > 0, learningRate.isFinite else { throw ValidationError("--lr must be positive") }
        guard (2...1000).contains(sequenceLength) else { throw ValidationError("--sequence-length must be in 2...1000") }
    }

    func run() throws {
        var configuration = SimulationConfiguration.text()
        configuration.batchSize = batchSize
        configuration.learningRate = learningRate
        configuration.sequenceLength = sequenceLength
        configuration.seed = seed
        let corpus: TextCorpus
        do throws(DataError) { corpus = try KingJamesBible.corpus() } catch {
            FileHandle.standardError.write(Data("error: \(error.message)\n".utf8))
            throw ExitCode(1)
        }
        let progress = ProgressReporter("train kjv", total: epochs, unit: "epochs")
        let result: CentralTextTraining.Result
        do {
            result = try CentralTextTraining.run(configuration, epochs: epochs, corpus: corpus, clock: SystemClock()) { step in
                guard step.batch == step.batchesPerEpoch - 1 else { return }
                progress.update(step.epoch + 1, detail: "loss \(String(format: "%.4g", step.loss))")
            }
        } catch {
            FileHandle.standardError.write(Data("error: \(error.message)\n".utf8))
            throw ExitCode(1)
        }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            encoder.nonConformingFloatEncodingStrategy = JSONLine.nonFinite
            print(String(decoding: try encoder.encode(result), as: UTF8.self))
        } else {
            print(
                """
                sequences (train / test)   \(result.trainSequences) / \(result.testSequences)
                parameters / updates       \(result.parameters) / \(result.updates)
                test accuracy              \(String(format: "%.4f → %.4f", result.initialAccuracy, result.accuracy))
                test perplexity            \(String(format: "%.2f → %.2f", result.initialPerplexity, result.perplexity))
                training                   \(String(format: "%.1f s", result.seconds))
                """)
        }
    }
}

public import Foundation
import OrchardSupport
public import OrchardData
public import OrchardFormats
public import OrchardML

/// The seed article's example: Boston housing prices with embeddings for the categorical features, trained once
/// centrally, then reused frozen by a device model that trains only its dense layers.
///
/// The pieces are separate calls so the fleet simulator can reuse them: ``loadTable()``, ``prepare(_:)``
/// (seeded split and preprocessing fitted on the training rows), ``modelSpec(preprocessor:configuration:)``,
/// ``trainCentral(_:configuration:clock:progress:)`` and ``deviceModel(from:preprocessor:configuration:)``.
public enum HousingExample {
    /// The numeric features, standardised and fed together to the `numeric` input (the `B` column is not shipped).
    public static let numericFeatures = ["CRIM", "ZN", "INDUS", "NOX", "RM", "AGE", "DIS", "TAX", "PTRATIO", "LSTAT"]
    /// The categorical features, each ordinal-encoded into its own input and embedding.
    public static let categoricalFeatures = ["CHAS", "RAD"]
    /// The regression target: median home value in $1000s.
    public static let target = "MEDV"
    /// The name of the model input that receives the numeric features.
    public static let numericInput = "numeric"

    /// The embedding layer of a categorical feature (e.g. `chas_embedding`).
    public static func embeddingLayer(for feature: String) -> String { "\(feature.lowercased())_embedding" }

    /// The names of the embedding layers, which the device model imports frozen.
    public static var embeddingLayers: [String] { categoricalFeatures.map(embeddingLayer(for:)) }

    /// The bundled data file.
    public static var dataURL: URL {
        get throws(DataError) {
            guard let url = Bundle.module.url(forResource: "boston_housing", withExtension: "csv", subdirectory: "Resources") else {
                throw DataError(.unreadable, "the bundled boston_housing.csv resource is missing")
            }
            return url
        }
    }

    /// Reads the bundled data: 506 rows, 12 features and `MEDV`.
    public static func loadTable() throws(DataError) -> Table {
        try TabularReader().read(contentsOf: try dataURL)
    }

    /// Splits the rows (seeded) and fits the preprocessing on the training rows only.
    public static func prepare(_ configuration: HousingConfiguration = HousingConfiguration()) throws(DataError) -> HousingData {
        try prepare(table: try loadTable(), configuration: configuration)
    }

    /// Splits `table` (seeded) and fits the preprocessing on its training rows only.
    public static func prepare(table: Table, configuration: HousingConfiguration) throws(DataError) -> HousingData {
        var random = OrchardRandom(seed: configuration.seed)
        let (train, test) = try table.split(testFraction: configuration.testFraction, using: &random)
        let preprocessor = try TabularPreprocessor(
            fitting: train, numeric: numericFeatures, categorical: categoricalFeatures, target: target,
            numericInput: numericInput, unknownCategories: configuration.unknownCategories
        )
        return HousingData(preprocessor: preprocessor, train: try preprocessor.transform(train), test: try preprocessor.transform(test))
    }

    /// The architecture: an embedding per categorical input, concatenated with the numeric input, then
    /// Dense+ReLU layers and one linear output unit; MSE loss.
    /// - Parameters:
    ///   - preprocessor: Supplies the embeddings' vocabulary sizes.
    ///   - configuration: Embedding widths, hidden layers and training hyper-parameters.
    ///   - frozenEmbeddings: Marks the embedding layers frozen (the device model).
    public static func modelSpec(
        preprocessor: TabularPreprocessor, configuration: HousingConfiguration = HousingConfiguration(), frozenEmbeddings: Bool = false
    ) throws(DataError) -> ModelSpec {
        var inputs = [InputSpec(name: numericInput, shape: [numericFeatures.count])]
        var layers: [LayerSpec] = []
        for feature in categoricalFeatures {
            inputs.append(InputSpec(name: feature, shape: [1], categorical: true))
            layers.append(
                LayerSpec(
                    name: embeddingLayer(for: feature), type: .embedding, inputs: [feature], frozen: frozenEmbeddings,
                    vocabularySize: try preprocessor.vocabularySize(of: feature), embeddingSize: configuration.embeddingSize(for: feature)
                ))
        }
        layers.append(LayerSpec(name: "features", type: .concat, inputs: [numericInput] + embeddingLayers))
        var previous = "features"
        for (i, units) in configuration.hiddenUnits.enumerated() {
            layers.append(LayerSpec(name: "dense\(i + 1)", type: .dense, inputs: [previous], units: units))
            layers.append(LayerSpec(name: "relu\(i + 1)", type: .relu, inputs: ["dense\(i + 1)"]))
            previous = "relu\(i + 1)"
        }
        layers.append(LayerSpec(name: "output", type: .dense, inputs: [previous], units: 1))
        return ModelSpec(name: frozenEmbeddings ? "housing-device" : "housing-central", inputs: inputs, layers: layers, training: configuration.training)
    }

    /// Step 1: trains the central model, embeddings included, from a fresh initialisation seeded by
    /// `configuration.seed`. `progress` is called after every batch with the role (`central`).
    public static func trainCentral<C: Clock>(
        _ data: HousingData, configuration: HousingConfiguration = HousingConfiguration(), clock: C = ContinuousClock(),
        progress: ((_ role: String, TrainingProgress) -> Void)? = nil
    ) throws -> TrainedHousingModel where C.Duration == Duration {
        let model = try Model(spec: try modelSpec(preprocessor: data.preprocessor, configuration: configuration), seed: configuration.seed)
        return try train(model, role: "central", data: data, configuration: configuration, clock: clock, progress: progress)
    }

    /// Step 2a: the device model — the same architecture, its dense layers freshly initialised (from
    /// `configuration.seed + 1`), its embeddings imported from `central` and frozen.
    public static func deviceModel(
        from central: Model, preprocessor: TabularPreprocessor, configuration: HousingConfiguration = HousingConfiguration()
    ) throws -> Model {
        var device = try Model(spec: try modelSpec(preprocessor: preprocessor, configuration: configuration), seed: configuration.seed &+ 1)
        device.name = "housing-device"
        try device.importFrozenLayers(embeddingLayers, from: central)
        return device
    }

    /// Step 2b: trains a model (typically the device model) on `data`'s training rows and measures it.
    /// `progress` is called after every batch with `role`.
    public static func train<C: Clock>(
        _ model: Model, role: String, data: HousingData, configuration: HousingConfiguration = HousingConfiguration(), clock: C = ContinuousClock(),
        progress: ((_ role: String, TrainingProgress) -> Void)? = nil
    ) throws -> TrainedHousingModel where C.Duration == Duration {
        let trainer = try Trainer(model: model, configuration: configuration.trainingConfiguration)
        let start = clock.now
        let outcome = try trainer.train(on: data.train, progress: progress.map { report in { report(role, $0) } })
        let elapsed = start.duration(to: clock.now)
        guard case .completed(let report) = outcome else {
            throw CancellationError()
        }
        let trained = report.model
        let metrics = HousingMetrics(
            model: role,
            trainRMSE: try trained.rootMeanSquaredError(on: data.train), trainMAE: try trained.meanAbsoluteError(on: data.train),
            testRMSE: try trained.rootMeanSquaredError(on: data.test), testMAE: try trained.meanAbsoluteError(on: data.test),
            epochs: report.epochs.count, finalLoss: report.epochs.last?.loss ?? .nan,
            trainableParameters: trained.trainableParameterNames.reduce(0) { $0 + (trained.parameter($1)?.count ?? 0) },
            seconds: elapsed.inSeconds
        )
        return TrainedHousingModel(model: trained, metrics: metrics)
    }

    /// Runs the whole example: prepare, train the central model, build and train the device model. `progress` is
    /// called after every batch of either model with its role (`central`, then `device`).
    public static func run<C: Clock>(
        _ configuration: HousingConfiguration = HousingConfiguration(), clock: C = ContinuousClock(),
        progress: ((_ role: String, TrainingProgress) -> Void)? = nil
    ) throws -> HousingRun where C.Duration == Duration {
        let data = try prepare(configuration)
        let central = try trainCentral(data, configuration: configuration, clock: clock, progress: progress)
        let initialDevice = try deviceModel(from: central.model, preprocessor: data.preprocessor, configuration: configuration)
        let device = try train(initialDevice, role: "device", data: data, configuration: configuration, clock: clock, progress: progress)
        return HousingRun(data: data, central: central, initialDevice: initialDevice, device: device, configuration: configuration)
    }
}

/// The options of the housing example; every field has a default that trains in seconds.
public struct HousingConfiguration: Sendable, Hashable {
    /// Seed of the split, the initialisation and the shuffle order.
    public var seed: UInt64
    /// Share of rows held out for testing.
    public var testFraction: Double
    /// How both models train (mean squared error; the optimizer, epochs and batch size), saved as the models'
    /// training section: a device trains with it unless the process's client config says otherwise.
    public var training: TrainingSpec
    /// Widths of the Dense+ReLU layers after the concatenation.
    public var hiddenUnits: [Int]
    /// Embedding width per categorical feature; features not listed use 4.
    public var embeddingSizes: [String: Int]
    /// What the preprocessing does with a category absent from the training rows.
    public var unknownCategories: UnknownCategoryPolicy

    /// Creates a configuration.
    public init(
        seed: UInt64 = 7, testFraction: Double = 0.2,
        training: TrainingSpec = TrainingSpec(loss: .meanSquaredError, optimizer: .adam(learningRate: 0.003), epochs: 150, batchSize: 32),
        hiddenUnits: [Int] = [64, 32],
        embeddingSizes: [String: Int] = ["CHAS": 2, "RAD": 5], unknownCategories: UnknownCategoryPolicy = .reservedIndex
    ) {
        self.seed = seed
        self.testFraction = testFraction
        self.training = training
        self.hiddenUnits = hiddenUnits
        self.embeddingSizes = embeddingSizes
        self.unknownCategories = unknownCategories
    }

    /// The embedding width of a categorical feature.
    public func embeddingSize(for feature: String) -> Int { embeddingSizes[feature] ?? 4 }

    /// The engine's training configuration: ``training`` with the seed.
    public var trainingConfiguration: TrainingConfiguration {
        TrainingConfiguration(training, seed: seed)
    }
}

/// The housing rows after the seeded split, transformed by preprocessing fitted on the training rows.
public struct HousingData: Sendable {
    /// The fitted preprocessing, saved with the model so a device transforms its rows the same way.
    public let preprocessor: TabularPreprocessor
    /// The training rows.
    public let train: TensorDataset
    /// The held-out test rows.
    public let test: TensorDataset
}

/// Errors and timing of one trained model.
public struct HousingMetrics: Sendable, Hashable, Codable {
    /// `central` or `device`.
    public var model: String
    /// Root mean squared error on the training rows, in $1000s.
    public var trainRMSE: Double
    /// Mean absolute error on the training rows, in $1000s.
    public var trainMAE: Double
    /// Root mean squared error on the test rows, in $1000s.
    public var testRMSE: Double
    /// Mean absolute error on the test rows, in $1000s.
    public var testMAE: Double
    /// Epochs trained.
    public var epochs: Int
    /// Mean training loss (MSE) of the last epoch.
    public var finalLoss: Double
    /// Number of parameter values the optimizer updated.
    public var trainableParameters: Int
    /// Training time in seconds, by the injected clock.
    public var seconds: Double
}

/// A trained model and its measurements.
public struct TrainedHousingModel: Sendable {
    /// The model with its trained weights.
    public let model: Model
    /// Its errors and timing.
    public let metrics: HousingMetrics
}

/// The outcome of ``HousingExample/run(_:clock:)``.
public struct HousingRun: Sendable {
    /// The split and preprocessing used.
    public let data: HousingData
    /// The central model (embeddings trained).
    public let central: TrainedHousingModel
    /// The device model before training: imported frozen embeddings, fresh dense layers.
    public let initialDevice: Model
    /// The device model after training its dense layers.
    public let device: TrainedHousingModel
    /// The configuration of the run.
    public let configuration: HousingConfiguration

    /// The measurements of both models, for printing or JSON.
    public var metrics: [HousingMetrics] { [central.metrics, device.metrics] }
}

import OrchardSupport
import Foundation
import OrchardData
import OrchardExamples
import OrchardFormats
import OrchardML
import OrchardTesting
import Testing

@Suite("Housing example")
struct HousingTests {
    @Test("the bundled data has 506 rows, 12 features and MEDV, and no B column")
    func resource() throws {
        let table = try HousingExample.loadTable()
        #expect(table.rowCount == 506)
        #expect(table.columnNames == ["CRIM", "ZN", "INDUS", "CHAS", "NOX", "RM", "AGE", "DIS", "RAD", "TAX", "PTRATIO", "LSTAT", "MEDV"])
        #expect(Set(try table.categories("CHAS")) == ["0", "1"])
        #expect(Set(try table.categories("RAD")).count == 9)
    }

    @Test("preprocessing is fitted on the training rows only")
    func fittedOnTrainingRows() throws {
        let configuration = HousingConfiguration()
        let table = try HousingExample.loadTable()
        let data = try HousingExample.prepare(table: table, configuration: configuration)
        #expect(data.train.count == 405)
        #expect(data.test.count == 101)

        // Recompute the split independently and the training mean of RM with a plain loop.
        var random = OrchardRandom(seed: configuration.seed)
        let split = try TrainTestSplit(count: 506, testFraction: configuration.testFraction, using: &random)
        let rm = try table.numeric("RM")
        let trainMean = split.train.reduce(0.0) { $0 + rm[$1] } / Double(split.train.count)
        let allMean = rm.reduce(0, +) / Double(rm.count)
        let j = HousingExample.numericFeatures.firstIndex(of: "RM")!
        #expect(abs(data.preprocessor.standardizer.means[j] - trainMean) < 1e-12)
        #expect(abs(trainMean - allMean) > 1e-6)
        // The training rows of the standardised column have mean 0 and sample standard deviation 1.
        let column = (0..<data.train.count).map { Double(read(data.train, input: "numeric", sample: $0)[j]) }
        let mean = column.reduce(0, +) / Double(column.count)
        let sd = (column.reduce(0) { $0 + ($1 - mean) * ($1 - mean) } / Double(column.count - 1)).squareRoot()
        #expect(abs(mean) < 1e-5)
        #expect(abs(sd - 1) < 1e-5)
    }

    @Test("the device model's embeddings stay bit-identical and its test RMSE is within 10 % of the central model's")
    func transferLearning() throws {
        let run = try HousingExample.run()
        let central = run.central.model
        let before = run.initialDevice
        let after = run.device.model
        for layer in HousingExample.embeddingLayers {
            let name = "\(layer).weight"
            let imported = try #require(before.parameter(name))
            #expect(imported.scalars.map(\.bitPattern) == central.parameter(name)!.scalars.map(\.bitPattern))
            #expect(after.parameter(name)!.scalars.map(\.bitPattern) == imported.scalars.map(\.bitPattern))
            #expect(!after.trainableParameterNames.contains(name))
        }
        // The dense layers did train.
        #expect(after.parameter("dense1.weight") != before.parameter("dense1.weight"))
        #expect(run.device.metrics.trainableParameters < run.central.metrics.trainableParameters)

        let centralRMSE = run.central.metrics.testRMSE
        let deviceRMSE = run.device.metrics.testRMSE
        // A sensible fit: MEDV's standard deviation is 9.2 ($1000s).
        #expect(centralRMSE < 5)
        #expect(abs(deviceRMSE - centralRMSE) <= 0.1 * centralRMSE)
    }

    @Test("importing frozen layers checks the layer exists in both models")
    func importErrors() throws {
        let data = try HousingExample.prepare()
        let spec = try HousingExample.modelSpec(preprocessor: data.preprocessor)
        let source = try Model(spec: spec, seed: 1)
        var target = try Model(spec: spec, seed: 2)
        #expect(throws: EngineError.self) { try target.importFrozenLayers(["nope"], from: source) }
        #expect(throws: EngineError.self) { try target.importFrozenLayers(["relu1"], from: source) }
        try target.importFrozenLayers(["dense2"], from: source)
        #expect(target.parameter("dense2.bias") == source.parameter("dense2.bias"))
        #expect(!target.trainableParameterNames.contains("dense2.weight"))
        #expect(target.parameter("dense1.weight") != source.parameter("dense1.weight"))
    }
}

@Suite("Tabular model files")
struct TabularModelFileTests {
    @Test("a model is saved with its preprocessing, and a device reloads both")
    func saveAndLoad() throws {
        let data = try HousingExample.prepare()
        let model = try Model(spec: try HousingExample.modelSpec(preprocessor: data.preprocessor), seed: 3)
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-model-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let files = try data.preprocessor.save(with: model, to: dir, name: "central")

        let archive = try Safetensors.decode(try Data(contentsOf: files.weights))
        #expect(try TabularPreprocessor(safetensorsMetadata: archive.metadata) == data.preprocessor)
        var reloaded = try Model(spec: try ModelSpec.decode(json: try Data(contentsOf: files.spec)), seed: 99)
        try reloaded.loadWeights(from: archive)
        #expect(reloaded.namedParameters == model.namedParameters)
        #expect(throws: DataError.self) { try TabularPreprocessor(safetensorsMetadata: [:]) }
    }
}

/// `orchard train housing --json`, run as a child process.
@Suite("orchard train --json")
struct TrainCommandJSONTests {
    @Test("the JSON a person or a pandas script reads uses snake_case keys")
    func snakeCaseKeys() async throws {
        let process = ChildProcess()
        process.executableURL = try OrchardExecutable.url()
        process.arguments = ["train", "housing", "--epochs", "1", "--json"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = await output.fileHandleForReading.readToEndOfFile()
        await process.exited()
        #expect(process.terminationStatus == 0)
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(Set(object.keys) == ["train_samples", "test_samples", "seed", "optimizer", "learning_rate", "batch_size", "models"])
        let models = try #require(object["models"] as? [[String: Any]])
        #expect(models.count == 2)
        for model in models {
            #expect(
                Set(model.keys) == [
                    "model", "train_rmse", "train_mae", "test_rmse", "test_mae", "epochs", "final_loss", "trainable_parameters", "seconds",
                ])
        }
    }
}

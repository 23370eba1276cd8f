import Foundation
import OrchardData
import OrchardFormats
import OrchardML
import OrchardTesting
import Testing

/// `orchard evaluate`: a checkpoint on disk against a data file, equal to a hand computation, and bad inputs refused in
/// one line naming the file.
@Suite struct EvaluateCommandTests {
    /// A regressor (the small model with an MSE training section), its weights and eight samples, in `files`.
    static func regressor(in files: TemporaryDirectory) throws -> (model: String, weights: String, data: String, built: Model, x: [Float], y: [Float]) {
        var spec = SmallModel.spec()
        spec.training = TrainingSpec(loss: .meanSquaredError)
        let built = try Model(spec: spec, seed: 7)
        let x: [Float] = (0..<24).map { Float(($0 * 5) % 11) / 5 - 1 }
        let y: [Float] = (0..<8).map { Float($0) / 4 - 1 }
        let data = try TensorDataset(inputs: ["x": Tensor(shape: [8, 3], scalars: x)], targets: Tensor(shape: [8, 1], scalars: y))
        return (
            try files.write("model.json", String(decoding: try spec.jsonData(), as: UTF8.self)),
            try files.write("weights.safetensors", bytes: built.weightsSafetensors()),
            try files.write("data.bin", bytes: DeviceDataFile.encode(data)), built, x, y
        )
    }

    @Test func aRegressorsMetricsEqualAHandComputation() async throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let (model, weights, data, built, x, y) = try Self.regressor(in: files)
        let run = try await Run.orchard(["evaluate", "--model", model, "--weights", weights, "--data", data, "--json"], in: files.url)
        #expect(run.status == 0, "\(run.error)")
        let line = try #require(try JSONSerialization.jsonObject(with: Data(run.output.utf8)) as? [String: Any])
        // By hand: each sample through the model, squared and absolute errors averaged.
        var squared = 0.0, absolute = 0.0
        for i in 0..<8 {
            let prediction = try built(Tensor(shape: [1, 3], scalars: Array(x[(3 * i)..<(3 * i + 3)]))).scalars[0]
            squared += Double((prediction - y[i]) * (prediction - y[i]))
            absolute += Double(abs(prediction - y[i]))
        }
        #expect(line["samples"] as? Int == 8)
        #expect(abs((line["loss"] as? Double ?? -1) - squared / 8) < 1e-6)
        #expect(abs((line["rmse"] as? Double ?? -1) - (squared / 8).squareRoot()) < 1e-6)
        #expect(abs((line["mae"] as? Double ?? -1) - absolute / 8) < 1e-6)
        #expect(line["accuracy"] == nil)
        #expect(Set(line.keys) == ["samples", "loss", "rmse", "mae"])

        let text = try await Run.orchard(["evaluate", "--model", model, "--weights", weights, "--data", data], in: files.url)
        #expect(text.status == 0 && text.output.contains("samples  8") && text.output.contains("rmse"))
        // A diverged checkpoint (NaN weights): the line is still JSON, its metrics the string "NaN".
        var diverged = built
        try diverged.setParameter("output.bias", to: Tensor(shape: [1], scalars: [.nan]))
        let nanWeights = try files.write("nan.safetensors", bytes: diverged.weightsSafetensors())
        let nan = try await Run.orchard(["evaluate", "--model", model, "--weights", nanWeights, "--data", data, "--json"], in: files.url)
        #expect(nan.status == 0, "\(nan.error)")
        let nanLine = try #require(try JSONSerialization.jsonObject(with: Data(nan.output.utf8)) as? [String: Any])
        #expect(nanLine["loss"] as? String == "NaN" && nanLine["samples"] as? Int == 8, "\(nan.output)")
    }

    @Test func badInputsAreRefusedNamingTheFile() async throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let (model, weights, data, _, _, _) = try Self.regressor(in: files)
        let other = try files.write("other.safetensors", bytes: try Model(spec: SmallModel.spec(hidden: 6), seed: 1).weightsSafetensors())
        let untrained = try files.write("untrained.json", try SmallModel.json())
        let json = try files.write("weights.json", "{}")
        let cases: [([String], String)] = [
            (["--model", model, "--weights", other, "--data", data], "--weights '\(other)' do not fit --model '\(model)'"),
            (["--model", untrained, "--weights", weights, "--data", data], "has no training section to take the loss from: give --loss"),
            (["--model", model, "--weights", json, "--data", data], "--weights '\(json)'"),
            (["--model", model, "--weights", weights, "--data", files.path("missing.bin")], "--data '\(files.path("missing.bin"))'"),
            (["--model", model, "--weights", weights, "--data", data, "--loss", "hinge"], "--loss"),
        ]
        for (arguments, expected) in cases {
            let run = try await Run.orchard(["evaluate"] + arguments, in: files.url)
            #expect(run.status != 0 && run.error.contains(expected), "\(arguments): \(run.error)")
            // One line, except ArgumentParser's own answer to a value outside --loss's choices (with its usage).
            #expect(run.errorLines.count == 1 || arguments.contains("hinge"), "\(arguments): \(run.error)")
        }
        // With --loss the untrained model is evaluated.
        let given = try await Run.orchard(["evaluate", "--model", untrained, "--weights", weights, "--data", data, "--loss", "mse", "--json"], in: files.url)
        #expect(given.status == 0, "\(given.error)")
    }
}

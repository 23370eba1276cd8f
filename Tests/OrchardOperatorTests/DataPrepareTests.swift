import Foundation
import OrchardData
import OrchardFormats
import OrchardML
import Testing

/// `orchard data prepare`: a CSV file → the device data file, with the preprocessing saved in the model's weights.
@Suite struct DataPrepareTests {
    /// A model fitted on 4 training rows: numeric `a` (mean 2.5, sample sd √(5/3)) and `b` (constant 10: only
    /// centred), categorical `c` (1, 2, 3 → 0, 1, 2; unseen → the reserved 3), target `y`. Written as `device.json`
    /// and `device.safetensors` (the preprocessing in its metadata), as `orchard train housing --output` does.
    static func savedModel(in directory: URL) throws -> (spec: URL, weights: URL) {
        let training = try TabularReader().read(text: "a,b,c,y\n1,10,1,1\n2,10,3,2\n3,10,2,3\n4,10,3,4\n")
        let preprocessor = try TabularPreprocessor(fitting: training, numeric: ["a", "b"], categorical: ["c"], target: "y", unknownCategories: .reservedIndex)
        let spec = ModelSpec(
            name: "device", inputs: [InputSpec(name: "numeric", shape: [2]), InputSpec(name: "c", shape: [1], categorical: true)],
            layers: [
                LayerSpec(
                    name: "c_embedding", type: .embedding, inputs: ["c"], frozen: true, vocabularySize: try preprocessor.vocabularySize(of: "c"),
                    embeddingSize: 2),
                LayerSpec(name: "features", type: .concat, inputs: ["numeric", "c_embedding"]),
                LayerSpec(name: "output", type: .dense, inputs: ["features"], units: 1),
            ]
        )
        return try preprocessor.save(with: try Model(spec: spec, seed: 1), to: directory, name: "device")
    }

    /// A device's 3 rows, columns in another order, a text column the model does not use, an unseen category.
    static let csv = "note,y,c,b,a\nfirst,5,3,12,2\nsecond,6,1,10,5\nthird,7,7,9,0.5\n"

    /// The same rows transformed by hand.
    static let sd = (5.0 / 3).squareRoot()
    static let numeric: [Float] = [Float((2 - 2.5) / sd), 2, Float((5 - 2.5) / sd), 0, Float((0.5 - 2.5) / sd), -1]
    static let categories: [Float] = [2, 0, 3]
    static let targets: [Float] = [5, 6, 7]

    @Test func thePreparedFileReadsBackAsTheRowsTransformedByHand() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let (specURL, weightsURL) = try Self.savedModel(in: files.url)
        let spec = try ModelSpec.decode(json: try Data(contentsOf: specURL))
        let metadata = try Safetensors.index([UInt8](try Data(contentsOf: weightsURL))).metadata
        let preprocessor = try TabularPreprocessor(safetensorsMetadata: metadata)
        try preprocessor.checkFeeds(spec)
        let dataset = try preprocessor.deviceData(csv: URL(fileURLWithPath: try files.write("rows.csv", Self.csv)))

        // Read back by the reader `orchard client --data` uses.
        let read = try DeviceDataFile.decode(DeviceDataFile.encode(dataset))
        #expect(read.count == 3)
        #expect(read.inputSpecs.map(\.name) == ["c", "numeric"])
        let inputs = Dictionary(uniqueKeysWithValues: zip(read.inputSpecs.map(\.name), read.inputs))
        #expect(inputs["numeric"]?.shape == [3, 2])
        #expect(zip(inputs["numeric"]?.scalars ?? [], Self.numeric).allSatisfy { abs($0 - $1) < 1e-6 }, "\(String(describing: inputs["numeric"]?.scalars))")
        #expect(inputs["c"]?.shape == [3, 1])
        #expect(inputs["c"]?.scalars == Self.categories)
        #expect(read.targets.shape == [3, 1])
        #expect(read.targets.scalars == Self.targets)
    }

    @Test func aTargetColumnNamedOtherwiseIsTakenWithTarget() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let (_, weightsURL) = try Self.savedModel(in: files.url)
        let preprocessor = try TabularPreprocessor(safetensorsMetadata: try Safetensors.index([UInt8](try Data(contentsOf: weightsURL))).metadata)
        let renamed = Self.csv.replacingOccurrences(of: "note,y,", with: "note,price,")
        let missing = #expect(throws: DataError.self) { try preprocessor.deviceData(csvText: renamed) }
        #expect(missing?.message.hasPrefix("no column 'y'") == true)
        let dataset = try preprocessor.deviceData(csvText: renamed, targetColumn: "price")
        #expect(dataset.targets.scalars == Self.targets)
    }

    @Test func aModelWhoseInputsThePreprocessingDoesNotWriteIsRefused() throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let (specURL, weightsURL) = try Self.savedModel(in: files.url)
        var spec = try ModelSpec.decode(json: try Data(contentsOf: specURL))
        spec.inputs[1].name = "C"
        let preprocessor = try TabularPreprocessor(safetensorsMetadata: try Safetensors.index([UInt8](try Data(contentsOf: weightsURL))).metadata)
        let error = #expect(throws: DataError.self) { try preprocessor.checkFeeds(spec) }
        #expect(error?.message == "the model's input 'C' is not written by its preprocessing (which writes numeric [2], c [1])")
    }
}

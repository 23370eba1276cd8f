public import Foundation
public import OrchardFormats
public import OrchardML

extension TabularPreprocessor {
    /// The safetensors metadata key under which a model's preprocessing is stored.
    public static let metadataKey = "orchard.preprocessing"

    /// Writes a model with this preprocessing: `<name>.json` (the architecture) and `<name>.safetensors` (the
    /// weights, with this preprocessor's JSON in the metadata under ``metadataKey``), each written atomically.
    /// - Parameters:
    ///   - model: The trained model.
    ///   - directory: An existing directory.
    ///   - name: The files' base name.
    /// - Returns: The two files written.
    @discardableResult
    public func save(with model: Model, to directory: URL, name: String) throws -> (spec: URL, weights: URL) {
        let specURL = directory.appendingPathComponent("\(name).json")
        let weightsURL = directory.appendingPathComponent("\(name).safetensors")
        let preprocessing = String(decoding: try jsonData(), as: UTF8.self)
        let weights = Safetensors.encode(model.weightRecords, metadata: ["format": "pt", "orchard.model": model.name, Self.metadataKey: preprocessing])
        try model.spec.jsonData().write(to: specURL, options: .atomic)
        try Data(weights).write(to: weightsURL, options: .atomic)
        return (specURL, weightsURL)
    }

    /// Reads the preprocessing stored in a model's safetensors metadata by ``save(with:to:name:)``.
    public init(safetensorsMetadata metadata: [String: String]) throws(DataError) {
        guard let json = metadata[Self.metadataKey] else {
            throw DataError(.unreadable, "the model file has no '\(Self.metadataKey)' metadata")
        }
        self = try Self.decode(json: Data(json.utf8))
    }
}

public import Foundation
import OrchardSupport
public import OrchardFormats
public import OrchardProtocol

/// The local files of a process to host, read and checked before anything is sent, so a mistake is named with the
/// file and what to fix: the model architecture (JSON syntax with line and column, structure, layer types, limits —
/// ``ModelSpec/validate()`` and ``ModelSpec/validateLimits()``), the weights (safetensors whose tensors the model
/// implies — ``ModelSpec/checkWeights(_:)``, the coordinator's own check), and the configurations.
public enum ProcessFiles {
    /// Reads a file named by `option`.
    /// - Throws: ``OperatorError`` (`missing_file`) naming the option and the path.
    public static func read(_ path: String, option: String) throws(OperatorError) -> Data {
        do throws(FileAccessError) { return try LocalFile.read(path) } catch {
            throw OperatorError(.missingFile, "\(option) '\(path)': \(error.message)")
        }
    }

    /// The model architecture at `path`, decoded and validated as the coordinator will.
    /// - Throws: ``OperatorError``: `missing_file`, or `invalid_model` naming the line and column of a JSON syntax
    ///   error, the key or layer at fault, an unknown layer type.
    public static func model(at path: String, option: String = "--model") throws(OperatorError) -> ModelSpec {
        let data = try read(path, option: option)
        if let syntax = syntaxError(data) {
            throw OperatorError(.invalidModel, "\(option) '\(path)' is not valid JSON: \(syntax)")
        }
        do throws(FormatError) {
            let spec = try ModelSpec.decode(json: data)
            try spec.validateLimits()
            _ = try spec.parameters()
            return spec
        } catch {
            let message = error.message.hasPrefix("model JSON: ") ? String(error.message.dropFirst("model JSON: ".count)) : error.message
            throw OperatorError(.invalidModel, "\(option) '\(path)' is not a valid model: \(message)")
        }
    }

    /// The weights at `path`, checked against `model`: safetensors, every tensor the architecture implies with its
    /// shape and nothing else, finite values.
    /// - Returns: The file's bytes, to send as they are.
    /// - Throws: ``OperatorError``: `missing_file`, or `invalid_weights` naming the tensor and the layer field.
    public static func weights(at path: String, for model: ModelSpec, option: String = "--weights") throws(OperatorError) -> [UInt8] {
        let bytes = [UInt8](try read(path, option: option))
        let archive: SafetensorsArchive
        do throws(FormatError) {
            archive = try Safetensors.decode(bytes)
        } catch {
            throw OperatorError(.invalidWeights, "\(option) '\(path)' is not a safetensors file of F32 tensors: \(error.message)")
        }
        do throws(FormatError) {
            try model.checkWeights(Dictionary(archive.tensors.map { ($0.name, $0.shape) }, uniquingKeysWith: { first, _ in first }))
        } catch {
            throw OperatorError(.invalidWeights, "\(option) '\(path)' does not match the model '\(model.name)': \(error.message)")
        }
        if let bad = archive.tensors.first(where: { $0.values.contains { !$0.isFinite } }) {
            throw OperatorError(.invalidWeights, "\(option) '\(path)': tensor '\(bad.name)' holds NaN or infinity")
        }
        return bytes
    }

    /// A client configuration JSON file (`batch_size`, `learning_rate`, `local_epochs`, `max_updates`, free keys).
    public static func clientConfig(at path: String, option: String = "--client-config") throws(OperatorError) -> ClientConfig {
        let config: ClientConfig = try decode(path, option: option)
        if let failure = config.validationFailure() { throw OperatorError(.invalidConfiguration, "\(option) '\(path)': \(failure)") }
        return config
    }

    /// A server configuration JSON file (the `server_config` object of the HTTP API; unknown keys are refused).
    public static func serverConfig(at path: String, option: String = "--server-config") throws(OperatorError) -> ServerConfig {
        let config: ServerConfig = try decode(path, option: option)
        if let failure = config.validationFailure() { throw OperatorError(.invalidConfiguration, "\(option) '\(path)': \(failure)") }
        return config
    }

    private static func decode<T: Decodable>(_ path: String, option: String) throws(OperatorError) -> T {
        let data = try read(path, option: option)
        if let syntax = syntaxError(data) {
            throw OperatorError(.invalidConfiguration, "\(option) '\(path)' is not valid JSON: \(syntax)")
        }
        do {
            return try WireCoding.strictDecoder().decode(T.self, from: data)
        } catch {
            throw OperatorError(.invalidConfiguration, "\(option) '\(path)': \(describe(error))")
        }
    }

    /// Where JSON text stops being JSON, as `line L, column C: reason`, or nil when it parses.
    public static func syntaxError(_ data: Data) -> String? {
        do {
            _ = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
            return nil
        } catch {
            return JSONSyntaxError.find(in: data)?.description
                ?? ((error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String) ?? "\(error)"
        }
    }

    /// A decoding error as `reason at path`.
    static func describe(_ error: any Error) -> String {
        guard let error = error as? DecodingError else { return "\(error)" }
        func path(_ context: DecodingError.Context) -> String {
            let joined = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
            return joined.isEmpty ? "" : " at \(joined)"
        }
        switch error {
        case .keyNotFound(let key, let context): return "missing key '\(key.stringValue)'\(path(context))"
        case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context): return context.debugDescription + path(context)
        @unknown default: return "\(error)"
        }
    }
}

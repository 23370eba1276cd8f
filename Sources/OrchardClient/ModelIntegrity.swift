import Crypto
import Foundation
import OrchardFormats

/// Checks model bytes before they are trained on: the SHA-256 the coordinator sent (RFC 9530 `Repr-Digest`),
/// the announced length, the safetensors structure, the plan's parameter shapes and finite values.
enum ModelIntegrity {
    /// The header the coordinator sends the model's SHA-256 in.
    static let digestHeader = "Repr-Digest"

    /// The SHA-256 of `bytes`.
    static func sha256(_ bytes: [UInt8]) -> [UInt8] { Array(SHA256.hash(data: bytes)) }

    /// The `Repr-Digest` field value of `digest`: `sha-256=:<base64>:`.
    static func fieldValue(sha256 digest: [UInt8]) -> String { "sha-256=:\(Data(digest).base64EncodedString()):" }

    /// The SHA-256 in a `Repr-Digest` field value (a structured-field dictionary, RFC 9530 §3); nil when the
    /// field names no `sha-256` member or its value is not a 32-byte base64 byte sequence.
    static func parseSHA256(fieldValue: String) -> [UInt8]? {
        for member in fieldValue.split(separator: ",") {
            let trimmed = member.trimmingCharacters(in: .whitespaces)
            guard let equals = trimmed.firstIndex(of: "="), trimmed[..<equals].lowercased() == "sha-256" else { continue }
            var value = trimmed[trimmed.index(after: equals)...]
            if let parameters = value.firstIndex(of: ";") { value = value[..<parameters] }
            guard value.count >= 2, value.first == ":", value.last == ":",
                let data = Data(base64Encoded: String(value.dropFirst().dropLast())), data.count == SHA256.byteCount
            else { return nil }
            return [UInt8](data)
        }
        return nil
    }

    /// Decodes and checks model bytes against what the coordinator announced and the plan's shapes.
    /// - Parameters:
    ///   - bytes: The whole model file.
    ///   - sha256: The digest the coordinator sent; a model without one cannot be verified and is refused.
    ///   - totalLength: The length the coordinator announced, when it did.
    ///   - shapes: The plan's parameter names and shapes.
    /// - Returns: The weights.
    static func verify(_ bytes: [UInt8], sha256 expected: [UInt8]?, totalLength: Int?, shapes: [String: [Int]]) throws(OrchardClientError) -> [TensorRecord] {
        if let totalLength, totalLength != bytes.count {
            throw OrchardClientError(.incompatibleModel, "the model download holds \(bytes.count) bytes, the server announced \(totalLength)")
        }
        guard let expected else {
            throw OrchardClientError(.incompatibleModel, "the coordinator sent no SHA-256 of the model (\(digestHeader) header), so it cannot be verified")
        }
        let actual = sha256(bytes)
        guard actual == expected else {
            throw OrchardClientError(
                .incompatibleModel,
                "the model's SHA-256 is \(Data(actual).base64EncodedString()), the coordinator announced \(Data(expected).base64EncodedString())"
            )
        }
        do throws(FormatError) {
            let archive = try Safetensors.decode(bytes)
            try archive.validate(against: shapes)
            for tensor in archive.tensors where !FloatScan.allFinite(tensor.values) {
                throw FormatError(.invalidHeader, "tensor '\(tensor.name)' holds NaN or infinity")
            }
            return archive.tensors
        } catch {
            throw OrchardClientError(.incompatibleModel, "the downloaded model does not fit the plan: \(error.message)")
        }
    }
}

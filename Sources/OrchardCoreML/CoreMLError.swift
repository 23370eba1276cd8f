public import OrchardSupport

/// An error exporting, importing or inspecting a Core ML model.
public struct CoreMLError: OrchardError, Hashable {
    /// A machine-readable category of a Core ML error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case invalidModel, unsupportedLayer, unsupportedFeature, weightMismatch, updateRules, malformedFile
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The Orchard model or the Core ML model is not internally consistent.
        public static let invalidModel = Code(.invalidModel)
        /// A layer has no counterpart on the other side (names the layer and its type).
        public static let unsupportedLayer = Code(.unsupportedLayer)
        /// A feature, attribute or training setting has no counterpart on the other side.
        public static let unsupportedFeature = Code(.unsupportedFeature)
        /// A weight is missing, extra, or of the wrong size.
        public static let weightMismatch = Code(.weightMismatch)
        /// The model breaks one of Core ML's rules for updatable models.
        public static let updateRules = Code(.updateRules)
        /// The bytes are not a Core ML protobuf model.
        public static let malformedFile = Code(.malformedFile)
        /// The code in snake case, e.g. `shape_mismatch`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// A human-readable explanation.
    public var message: String
    /// The layer the error is about, when there is one.
    public var layer: String?

    /// Creates an error.
    /// - Parameters:
    ///   - code: The category.
    ///   - message: What went wrong, for a person.
    ///   - layer: The layer concerned, if any.
    public init(_ code: Code, _ message: String, layer: String? = nil) {
        self.code = code
        self.message = message
        self.layer = layer
    }

    /// The code, the layer if any, and the message.
    public var description: String {
        if let layer { return "\(code) (layer '\(layer)'): \(message)" }
        return "\(code): \(message)"
    }
}

public import OrchardSupport

/// An error of the Flower interop: a bad object or message from the SuperLink, a model/array mismatch, or a failed
/// Fleet API call.
public struct FlowerError: OrchardError, Hashable {
    /// A machine-readable category of a Flower error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case invalidConfiguration, invalidObject, objectIdMismatch, missingObject, unsupportedDtype, shapeMismatch
            case invalidNpy, unsupportedEncoding
            case unsupportedMessage, arrayMismatch, training, superlinkUnreachable, superlinkRefused, unauthorized
            case invalidAnswer, cancelled, storage, registrationRefused
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// An option, file or setting of the node is invalid.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// An object's bytes are not a Flower object (header, body length, JSON or protobuf body).
        public static let invalidObject = Code(.invalidObject)
        /// An object's bytes do not hash to its id (`object_id_mismatch`).
        public static let objectIDMismatch = Code(.objectIdMismatch)
        /// An object a message refers to is missing.
        public static let missingObject = Code(.missingObject)
        /// An array's dtype is not one Orchard reads.
        public static let unsupportedDtype = Code(.unsupportedDtype)
        /// An array's data does not match its shape.
        public static let shapeMismatch = Code(.shapeMismatch)
        /// Bytes that should be a NumPy `.npy` file are not one (magic, version, header, data length).
        public static let invalidNpy = Code(.invalidNpy)
        /// A valid encoding Orchard does not read: a Fortran-order `.npy`, an array serialisation other than NumPy's.
        public static let unsupportedEncoding = Code(.unsupportedEncoding)
        /// A message type the device does not handle (neither `train` nor `evaluate`), or content it cannot use.
        public static let unsupportedMessage = Code(.unsupportedMessage)
        /// The server's arrays do not match the model's parameters (count, name or shape).
        public static let arrayMismatch = Code(.arrayMismatch)
        /// Local training or evaluation failed.
        public static let training = Code(.training)
        /// The SuperLink cannot be reached (connection refused, reset, timed out, TLS).
        public static let superlinkUnreachable = Code(.superlinkUnreachable)
        /// The SuperLink answered with an HTTP error other than 401.
        public static let superlinkRefused = Code(.superlinkRefused)
        /// The SuperLink refused the node's signature or identity (401).
        public static let unauthorized = Code(.unauthorized)
        /// The SuperLink's answer is not the expected protobuf message.
        public static let invalidAnswer = Code(.invalidAnswer)
        /// The work was cancelled (the background window ended).
        public static let cancelled = Code(.cancelled)
        /// The node's state directory cannot be read or written.
        public static let storage = Code(.storage)
        /// The SuperLink will not admit the node as configured: it refuses self-registration, or does not know the
        /// node's pre-registered key.
        public static let registrationRefused = Code(.registrationRefused)

        /// The code in snake case, e.g. `array_mismatch`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// A human-readable explanation naming the offending item.
    public var message: String
    /// The HTTP status of a refused call.
    public var httpStatus: Int?
    /// The id of the Flower object the error is about, when there is one.
    public var objectID: String?
    /// Flower's own error code (`ApiErrorCode`) of a refused call, when the SuperLink sent one.
    public var apiCode: Int?

    /// A refusal worth trying again as it is: a 5xx, 408 or 429 from the SuperLink or a proxy in front of it.
    public var isTransient: Bool {
        code == .superlinkRefused && httpStatus.map { $0 >= 500 || $0 == 408 || $0 == 429 } == true
    }

    /// Creates an error.
    public init(_ code: Code, _ message: String, httpStatus: Int? = nil, objectID: String? = nil, apiCode: Int? = nil) {
        self.code = code
        self.message = message
        self.httpStatus = httpStatus
        self.objectID = objectID
        self.apiCode = apiCode
    }

    /// The code, the object if any, and the message.
    public var description: String {
        if let objectID { return "\(code) (object \(objectID)): \(message)" }
        return "\(code): \(message)"
    }
}

/// The error codes of flwr 1.41's `ApiErrorCode` the node acts on.
package enum FlowerAPICode {
    /// `PUBLIC_KEY_ALREADY_IN_USE`: `register-node` with a key the SuperLink knows.
    package static let publicKeyInUse = 23
    /// `FLEET_SUPERNODE_REGISTRATION_DISABLED`: `register-node` on a SuperLink with `--enable-supernode-auth`.
    package static let registrationDisabled = 2001
    /// `FLEET_NODE_ACTIVATION_FAILED`: the key is unknown, or the node is still active.
    package static let activationFailed = 2004
}

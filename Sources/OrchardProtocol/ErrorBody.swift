/// A machine-readable error code carried in ``ErrorBody``; unknown codes from newer servers decode as-is.
public struct WireErrorCode: RawRepresentable, Sendable, Hashable, Codable, CustomStringConvertible {
    /// The snake-case code, e.g. `deadline_passed`.
    public var rawValue: String
    /// Creates a code from its string.
    public init(rawValue: String) { self.rawValue = rawValue }
    /// Creates a code from a string literal.
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public init(from decoder: any Decoder) throws {
        self.rawValue = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }

    /// The body is not valid JSON or lacks required fields (400).
    public static let malformedJSON = WireErrorCode("malformed_json")
    /// The body is not valid safetensors (400).
    public static let malformedSafetensors = WireErrorCode("malformed_safetensors")
    /// A request field is out of range or inconsistent (400).
    public static let invalidRequest = WireErrorCode("invalid_request")
    /// A hosted process's configuration or model is invalid (400).
    public static let invalidConfiguration = WireErrorCode("invalid_configuration")
    /// The peer speaks an incompatible protocol version (400).
    public static let unsupportedVersion = WireErrorCode("unsupported_version")
    /// Missing or invalid credentials (401).
    public static let unauthorized = WireErrorCode("unauthorized")
    /// The session may not do this: its token belongs to another worker, or its process runs no speed test (403).
    public static let forbidden = WireErrorCode("forbidden")
    /// The session token was issued for another process (name and version) than the one the request is for (403).
    public static let sessionProcessMismatch = WireErrorCode("session_process_mismatch")
    /// The worker id is not known to the coordinator (404).
    public static let unknownWorker = WireErrorCode("unknown_worker")
    /// No process with that id, or name and version (404).
    public static let unknownProcess = WireErrorCode("unknown_process")
    /// No such checkpoint, or it was pruned (404).
    public static let unknownCheckpoint = WireErrorCode("unknown_checkpoint")
    /// No such route (404).
    public static let notFound = WireErrorCode("not_found")
    /// The request key is not the one issued to this worker for the current cycle, e.g. another worker's (403).
    public static let invalidRequestKey = WireErrorCode("invalid_request_key")
    /// A report for this request key was already accepted (409).
    public static let reportAlreadyReceived = WireErrorCode("report_already_received")
    /// The cycle's reporting deadline passed or the cycle closed (409).
    public static let deadlinePassed = WireErrorCode("deadline_passed")
    /// A buffered process's report trained from a checkpoint more than `max_staleness` publications old (409).
    public static let reportTooStale = WireErrorCode("report_too_stale")
    /// A buffered process is publishing its buffer; the same report is accepted after `Retry-After` seconds (503).
    public static let bufferReleasing = WireErrorCode("buffer_releasing")
    /// The worker already sent its result for this checkpoint's federated evaluation.
    public static let evaluationAlreadyReceived = WireErrorCode("evaluation_already_received")
    /// The checkpoint's federated evaluation is finalized (its goal was met or a newer checkpoint was published).
    public static let evaluationClosed = WireErrorCode("evaluation_closed")
    /// A process with this name and version already exists (409).
    public static let processExists = WireErrorCode("process_exists")
    /// The diff's tensor names differ from the model's (422).
    public static let tensorMismatch = WireErrorCode("tensor_mismatch")
    /// A diff tensor's shape differs from the model's (422).
    public static let shapeMismatch = WireErrorCode("shape_mismatch")
    /// A diff tensor is not F32 (422).
    public static let dtypeMismatch = WireErrorCode("dtype_mismatch")
    /// A diff holds NaN or infinity (422).
    public static let nonFiniteValues = WireErrorCode("non_finite_values")
    /// A diff changes a tensor of a frozen layer (422).
    public static let frozenTensorChanged = WireErrorCode("frozen_tensor_changed")
    /// A diff's L2 norm exceeds the process's `update_norm_bound` under the `reject` policy (422).
    public static let updateNormExceeded = WireErrorCode("update_norm_exceeded")
    /// The sample count is not in 1…`max_sample_count` (422).
    public static let invalidSampleCount = WireErrorCode("invalid_sample_count")
    /// An open-mode process already has as many workers as the coordinator lets one register (403).
    public static let workerLimitReached = WireErrorCode("worker_limit_reached")
    /// Too many requests from this client address or session; the answer's `Retry-After` says when to ask again (429).
    public static let rateLimited = WireErrorCode("rate_limited")
    /// The body exceeds the coordinator's limit (413).
    public static let payloadTooLarge = WireErrorCode("payload_too_large")
    /// The requested byte range cannot be served (416).
    public static let rangeNotSatisfiable = WireErrorCode("range_not_satisfiable")
    /// The coordinator is receiving as many reports as it allows at once; retry after `Retry-After` seconds (503).
    public static let tooManyUploads = WireErrorCode("too_many_uploads")
    /// The method is not allowed on this path (405).
    public static let methodNotAllowed = WireErrorCode("method_not_allowed")
    /// A plain report was sent to a process that uses secure aggregation, or a secure-aggregation message to one that
    /// does not (409).
    public static let aggregationModeMismatch = WireErrorCode("aggregation_mode_mismatch")
    /// A secure-aggregation message for a stage that is not open, or for a cycle whose secure aggregation ended (409).
    public static let stageClosed = WireErrorCode("stage_closed")
    /// The device was declared dropped from this cycle's secure aggregation; it cannot come back into it (409).
    public static let droppedDevice = WireErrorCode("dropped_device")
    /// The device already sent this stage's message (409).
    public static let duplicateMessage = WireErrorCode("duplicate_message")
    /// A secure-aggregation message is malformed or does not fit the cycle: wrong lengths, senders or receivers, a
    /// public key already in use (422).
    public static let invalidSecureAggregationMessage = WireErrorCode("invalid_secure_aggregation_message")
    /// The model cannot be served in the format asked for (e.g. a layer or training setting Core ML does not have)
    /// (422).
    public static let unsupportedFormat = WireErrorCode("unsupported_format")
    /// The coordinator failed (500); never returned for bad input.
    public static let internalError = WireErrorCode("internal_error")

    /// Every code this build's coordinator sends (the `ErrorBody` schema of `openapi.json` lists the same).
    public static let allKnown: [WireErrorCode] = [
        .malformedJSON, .malformedSafetensors, .invalidRequest, .invalidConfiguration, .unsupportedVersion, .unauthorized,
        .forbidden, .sessionProcessMismatch, .unknownWorker, .unknownProcess, .unknownCheckpoint, .notFound,
        .invalidRequestKey, .reportAlreadyReceived, .deadlinePassed, .reportTooStale, .bufferReleasing, .evaluationAlreadyReceived, .evaluationClosed,
        .processExists, .tensorMismatch,
        .shapeMismatch,
        .dtypeMismatch, .nonFiniteValues, .frozenTensorChanged, .updateNormExceeded, .invalidSampleCount,
        .payloadTooLarge, .rangeNotSatisfiable, .workerLimitReached, .rateLimited, .tooManyUploads, .methodNotAllowed,
        .aggregationModeMismatch, .stageClosed, .droppedDevice, .duplicateMessage, .invalidSecureAggregationMessage,
        .unsupportedFormat, .internalError,
    ]
}

/// The body of every 4xx/5xx response: `{"error":{"code":…,"message":…}}`.
public struct ErrorBody: Sendable, Hashable, Codable {
    /// The error's details.
    public struct Detail: Sendable, Hashable, Codable {
        /// What went wrong, as a code.
        public var code: WireErrorCode
        /// A human-readable explanation.
        public var message: String
        /// Creates details.
        public init(code: WireErrorCode, message: String) {
            self.code = code
            self.message = message
        }
    }

    /// The error.
    public var error: Detail

    /// Creates an error body.
    public init(code: WireErrorCode, message: String) {
        self.error = Detail(code: code, message: message)
    }
}

public import OrchardPrivacy
public import OrchardFormats
import Foundation

/// A device's first call: proves who it is and which process it wants to join.
public struct AuthenticateRequest: Sendable, Hashable, Codable {
    /// The device's JWT (absent in open mode).
    public var authToken: String?
    /// The FL process's name.
    public var processName: String
    /// The FL process's version ("1.0" and "1.0.0" are the same).
    public var processVersion: SemanticVersion
    /// The protocol version the device speaks.
    public var protocolVersion: SemanticVersion

    enum CodingKeys: String, CodingKey {
        case authToken = "auth_token"
        case processName = "process_name"
        case processVersion = "process_version"
        case protocolVersion = "protocol_version"
    }

    /// Creates a request.
    public init(authToken: String? = nil, processName: String, processVersion: SemanticVersion, protocolVersion: SemanticVersion = WireProtocol.version) {
        self.authToken = authToken
        self.processName = processName
        self.processVersion = processVersion
        self.protocolVersion = protocolVersion
    }
}

/// The coordinator's answer to ``AuthenticateRequest``.
public struct AuthenticateResponse: Sendable, Hashable, Codable {
    /// The worker id; the same JWT subject always yields the same id.
    public var workerID: String
    /// The bearer token for the device's later calls; it is valid only for ``workerID``.
    public var sessionToken: String
    /// Seconds until the session token expires.
    public var expiresIn: Double
    /// Whether cycle requests must carry measured link speeds (see ``Endpoint/speedTest``).
    public var requiresSpeedTest: Bool
    /// Bytes to download for the speed test, when ``requiresSpeedTest`` (absent from coordinators before 2.1).
    public var speedTestDownloadBytes: Int?
    /// Bytes to upload for the speed test, when ``requiresSpeedTest`` (absent from coordinators before 2.1).
    public var speedTestUploadBytes: Int?
    /// The protocol version the coordinator speaks.
    public var protocolVersion: SemanticVersion

    enum CodingKeys: String, CodingKey {
        case workerID = "worker_id"
        case sessionToken = "session_token"
        case expiresIn = "expires_in"
        case requiresSpeedTest = "requires_speed_test"
        case speedTestDownloadBytes = "speed_test_download_bytes"
        case speedTestUploadBytes = "speed_test_upload_bytes"
        case protocolVersion = "protocol_version"
    }

    /// Creates a response.
    public init(
        workerID: String, sessionToken: String, expiresIn: Double, requiresSpeedTest: Bool, speedTestDownloadBytes: Int? = nil,
        speedTestUploadBytes: Int? = nil, protocolVersion: SemanticVersion = WireProtocol.version
    ) {
        self.workerID = workerID
        self.sessionToken = sessionToken
        self.expiresIn = expiresIn
        self.requiresSpeedTest = requiresSpeedTest
        self.speedTestDownloadBytes = speedTestDownloadBytes
        self.speedTestUploadBytes = speedTestUploadBytes
        self.protocolVersion = protocolVersion
    }
}

/// A device asks to join the current cycle of a process.
public struct CycleRequest: Sendable, Hashable, Codable {
    /// The worker id from ``AuthenticateResponse``.
    public var workerID: String
    /// The FL process's name.
    public var processName: String
    /// The FL process's version.
    public var processVersion: SemanticVersion
    /// Measured download speed in Mbit/s, when the process requires a speed test.
    public var downloadMbps: Double?
    /// Measured upload speed in Mbit/s, when the process requires a speed test.
    public var uploadMbps: Double?
    /// The tasks the device will take in this window; absent means training only (devices before protocol 2.5).
    public var tasks: [DeviceTask]?

    enum CodingKeys: String, CodingKey {
        case workerID = "worker_id"
        case processName = "process_name"
        case processVersion = "process_version"
        case downloadMbps = "download_mbps"
        case uploadMbps = "upload_mbps"
        case tasks
    }

    /// Creates a request.
    public init(
        workerID: String, processName: String, processVersion: SemanticVersion, downloadMbps: Double? = nil, uploadMbps: Double? = nil,
        tasks: [DeviceTask]? = nil
    ) {
        self.tasks = tasks
        self.workerID = workerID
        self.processName = processName
        self.processVersion = processVersion
        self.downloadMbps = downloadMbps
        self.uploadMbps = uploadMbps
    }
}

/// A device was admitted to a cycle.
public struct CycleAssignment: Sendable, Hashable, Codable {
    /// The key that authorizes this worker's downloads and its one report in this cycle.
    public var requestKey: String
    /// The process's id.
    public var processID: String
    /// The cycle's number (1-based).
    public var cycle: Int
    /// The checkpoint to train from.
    public var checkpoint: Int
    /// The id to download the model with (``Endpoint/model(_:)``).
    public var modelID: String
    /// The id to download the plan with (``Endpoint/plan(_:)``).
    public var planID: String
    /// Seconds from now until the report deadline.
    public var reportWithin: Double

    enum CodingKeys: String, CodingKey {
        case requestKey = "request_key"
        case processID = "process_id"
        case cycle, checkpoint
        case modelID = "model_id"
        case planID = "plan_id"
        case reportWithin = "report_within"
    }

    /// Creates an assignment.
    public init(requestKey: String, processID: String, cycle: Int, checkpoint: Int, modelID: String, planID: String, reportWithin: Double) {
        self.requestKey = requestKey
        self.processID = processID
        self.cycle = cycle
        self.checkpoint = checkpoint
        self.modelID = modelID
        self.planID = planID
        self.reportWithin = reportWithin
    }
}

/// A device was turned away; it should ask again after ``retryAfter`` seconds.
public struct CycleRejection: Sendable, Hashable, Codable {
    /// Seconds to wait before the next cycle request (always a number).
    public var retryAfter: Double
    /// Why, e.g. `cycle_full`, `speed_too_low`, `process_completed`, `already_assigned`, or `no_evaluation_task` (a request
    /// that offered evaluation only, when there is none for it).
    public var reason: String

    enum CodingKeys: String, CodingKey {
        case retryAfter = "retry_after"
        case reason
    }

    /// Creates a rejection.
    public init(retryAfter: Double, reason: String) {
        self.retryAfter = retryAfter
        self.reason = reason
    }
}

/// The answer to a ``CycleRequest``: `{"status":"accepted",…}`, `{"status":"evaluate",…}` (only to a request whose
/// ``CycleRequest/tasks`` include evaluation) or `{"status":"rejected","retry_after":…}`.
public enum CycleResponse: Sendable, Hashable, Codable {
    /// Admitted to the cycle, to train.
    case accepted(CycleAssignment)
    /// Given an evaluation task.
    case evaluate(EvaluationAssignment)
    /// Turned away.
    case rejected(CycleRejection)

    private enum StatusKey: String, CodingKey { case status }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: StatusKey.self)
        let status = try container.decode(String.self, forKey: .status)
        switch status {
        case "accepted": self = .accepted(try CycleAssignment(from: decoder))
        case "evaluate": self = .evaluate(try EvaluationAssignment(from: decoder))
        case "rejected": self = .rejected(try CycleRejection(from: decoder))
        default:
            throw DecodingError.dataCorruptedError(
                forKey: .status, in: container, debugDescription: "status '\(status)' is not accepted, evaluate or rejected")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: StatusKey.self)
        switch self {
        case .accepted(let assignment):
            try container.encode("accepted", forKey: .status)
            try assignment.encode(to: encoder)
        case .evaluate(let assignment):
            try container.encode("evaluate", forKey: .status)
            try assignment.encode(to: encoder)
        case .rejected(let rejection):
            try container.encode("rejected", forKey: .status)
            try rejection.encode(to: encoder)
        }
    }
}

/// What a device needs to train: the architecture and the process's client configuration (sent only here).
public struct TrainingPlan: Sendable, Hashable, Codable {
    /// The plan's id.
    public var planID: String
    /// The model architecture.
    public var model: ModelSpec
    /// How to train, as the process sets it (fields left out defer to the architecture's `training` section).
    public var clientConfig: ClientConfig
    /// Local differential privacy the device applies to its update before it leaves, if the process asks for it.
    public var localPrivacy: LocalPrivacy?
    /// Secure aggregation, when the process uses it: the device sends its update masked, through
    /// ``Endpoint/secureAggregation``, instead of a report.
    public var secureAggregation: SecureAggregationPlan?

    enum CodingKeys: String, CodingKey {
        case planID = "plan_id"
        case model
        case clientConfig = "client_config"
        case localPrivacy = "local_privacy"
        case secureAggregation = "secure_aggregation"
    }

    /// Creates a plan.
    public init(
        planID: String, model: ModelSpec, clientConfig: ClientConfig, localPrivacy: LocalPrivacy? = nil, secureAggregation: SecureAggregationPlan? = nil
    ) {
        self.planID = planID
        self.model = model
        self.clientConfig = clientConfig
        self.localPrivacy = localPrivacy
        self.secureAggregation = secureAggregation
    }
}

/// What a device needs to take part in a process's secure aggregation.
public struct SecureAggregationPlan: Sendable, Hashable, Codable {
    /// The protocol's parameters.
    public var parameters: SecureAggregationParameters
    /// The largest sample count a device may weight its update with.
    public var maximumSampleCount: Int
    /// Seconds each stage after advertise_keys stays open at most (the device waits that long for the others).
    public var stageTimeout: Double?

    enum CodingKeys: String, CodingKey {
        case parameters
        case maximumSampleCount = "maximum_sample_count"
        case stageTimeout = "stage_timeout"
    }

    /// Creates a plan.
    public init(parameters: SecureAggregationParameters, maximumSampleCount: Int, stageTimeout: Double? = nil) {
        self.parameters = parameters
        self.maximumSampleCount = maximumSampleCount
        self.stageTimeout = stageTimeout
    }

    /// The context string both sides bind into every derived key of a cycle: the process and the cycle.
    public static func context(processID: String, cycle: Int) -> String { "orchard/secure-aggregation/\(processID)/\(cycle)" }
}

/// What a device does to its update under local differential privacy: clip it to an L2 bound C, then add
/// N(0, (z·C)²) to every value, before it is sent.
public struct LocalPrivacy: Sendable, Hashable, Codable {
    /// C, the L2 bound the update is clipped to.
    public var clippingNorm: Double
    /// z, the noise's standard deviation as a multiple of C.
    public var noiseMultiplier: Double

    enum CodingKeys: String, CodingKey {
        case clippingNorm = "clipping_norm"
        case noiseMultiplier = "noise_multiplier"
    }

    /// Creates local privacy settings.
    public init(clippingNorm: Double, noiseMultiplier: Double) {
        self.clippingNorm = clippingNorm
        self.noiseMultiplier = noiseMultiplier
    }

    /// The largest noise standard deviation z·C a plan may ask for.
    public static let largestNoise: Double = 1e30

    /// Describes the first unusable field (a plan from a coordinator is checked before the device trusts it).
    public func validationFailure() -> String? {
        if !(clippingNorm > 0 && clippingNorm.isFinite) { return "local_privacy.clipping_norm must be a positive finite number, not \(clippingNorm)" }
        if !(noiseMultiplier > 0 && noiseMultiplier.isFinite) {
            return "local_privacy.noise_multiplier must be a positive finite number, not \(noiseMultiplier)"
        }
        // The noise is drawn and added in single precision: its scale must leave every noised value finite.
        if !(noiseMultiplier * clippingNorm <= Self.largestNoise) {
            return "local_privacy noise_multiplier × clipping_norm must be at most \(Self.largestNoise), not \(noiseMultiplier * clippingNorm)"
        }
        return nil
    }
}

/// The coordinator's acknowledgement of a report: sent only after the report's contribution is committed.
public struct ReportResponse: Sendable, Hashable, Codable {
    /// The cycle the report counted toward.
    public var cycle: Int
    /// Reports accepted so far in that cycle, this one included.
    public var reportsReceived: Int
    /// Seconds until the device should ask for its next cycle.
    public var retryAfter: Double
    /// Whether this report closed the cycle (its goal was reached and the new checkpoint is published).
    public var cycleClosed: Bool

    enum CodingKeys: String, CodingKey {
        case cycle
        case reportsReceived = "reports_received"
        case retryAfter = "retry_after"
        case cycleClosed = "cycle_closed"
    }

    /// Creates a response.
    public init(cycle: Int, reportsReceived: Int, retryAfter: Double, cycleClosed: Bool = false) {
        self.cycle = cycle
        self.reportsReceived = reportsReceived
        self.retryAfter = retryAfter
        self.cycleClosed = cycleClosed
    }

    /// Decodes a response; a missing `cycle_closed` reads as false.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        cycle = try c.decode(Int.self, forKey: .cycle)
        reportsReceived = try c.decode(Int.self, forKey: .reportsReceived)
        retryAfter = try c.decode(Double.self, forKey: .retryAfter)
        cycleClosed = try c.decodeIfPresent(Bool.self, forKey: .cycleClosed) ?? false
    }
}

/// The answer to a speed-test upload.
public struct SpeedTestUploadResponse: Sendable, Hashable, Codable {
    /// Bytes received.
    public var bytes: Int
    /// Creates a response.
    public init(bytes: Int) { self.bytes = bytes }
}

/// Admin: host a new FL process.
public struct HostProcessRequest: Sendable, Hashable, Codable {
    /// The process's name.
    public var name: String
    /// The process's version.
    public var version: SemanticVersion
    /// The model architecture.
    public var model: ModelSpec
    /// The initial weights as safetensors bytes (base64 in JSON).
    public var initialWeights: [UInt8]
    /// How devices train.
    public var clientConfig: ClientConfig
    /// How the coordinator runs cycles.
    public var serverConfig: ServerConfig

    enum CodingKeys: String, CodingKey, CaseIterable {
        case name, version, model
        case initialWeights = "initial_weights"
        case clientConfig = "client_config"
        case serverConfig = "server_config"
    }

    /// Creates a request.
    public init(
        name: String, version: SemanticVersion, model: ModelSpec, initialWeights: [UInt8], clientConfig: ClientConfig = ClientConfig(),
        serverConfig: ServerConfig = ServerConfig()
    ) {
        self.name = name
        self.version = version
        self.model = model
        self.initialWeights = initialWeights
        self.clientConfig = clientConfig
        self.serverConfig = serverConfig
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "the request")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        name = try c.decode(String.self, forKey: .name)
        version = try c.decode(SemanticVersion.self, forKey: .version)
        model = try c.decode(ModelSpec.self, forKey: .model)
        let base64 = try c.decode(String.self, forKey: .initialWeights)
        guard let data = Data(base64Encoded: base64) else {
            throw DecodingError.dataCorruptedError(forKey: .initialWeights, in: c, debugDescription: "initial_weights is not base64")
        }
        initialWeights = [UInt8](data)
        clientConfig = try c.decodeIfPresent(ClientConfig.self, forKey: .clientConfig) ?? ClientConfig()
        serverConfig = try c.decodeIfPresent(ServerConfig.self, forKey: .serverConfig) ?? ServerConfig()
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try c.encode(version, forKey: .version)
        try c.encode(model, forKey: .model)
        try c.encode(Data(initialWeights).base64EncodedString(), forKey: .initialWeights)
        try c.encode(clientConfig, forKey: .clientConfig)
        try c.encode(serverConfig, forKey: .serverConfig)
    }
}

/// The state of a process's open cycle.
public struct CycleStatus: Sendable, Hashable, Codable {
    /// The cycle's number (1-based).
    public var number: Int
    /// The checkpoint devices train from.
    public var checkpoint: Int
    /// When the cycle opened, in seconds since 1970.
    public var openedAt: Double
    /// The reporting deadline, in seconds since 1970.
    public var deadline: Double
    /// Devices admitted so far.
    public var assigned: Int
    /// Reports accepted so far.
    public var reported: Int
    /// Reports that close the cycle early.
    public var goal: Int
    /// Devices the cycle admits.
    public var capacity: Int
    /// Under secure aggregation: the stage and the devices at each step (`reported` counts advertisements).
    public var secureAggregation: SecureAggregationStatus?
    /// Under buffered aggregation: the buffer's fill, the devices training and the reports' staleness. The cycle is
    /// then the open buffer: `goal` is the buffer size, `capacity` the most devices training at once, and `deadline`
    /// when a device admitted now must have reported.
    public var buffered: BufferedStatus?

    enum CodingKeys: String, CodingKey {
        case number, checkpoint, deadline, assigned, reported, goal, capacity, buffered
        case openedAt = "opened_at"
        case secureAggregation = "secure_aggregation"
    }

    /// Creates a status.
    public init(
        number: Int, checkpoint: Int, openedAt: Double, deadline: Double, assigned: Int, reported: Int, goal: Int, capacity: Int,
        secureAggregation: SecureAggregationStatus? = nil, buffered: BufferedStatus? = nil
    ) {
        self.buffered = buffered
        self.secureAggregation = secureAggregation
        self.number = number
        self.checkpoint = checkpoint
        self.openedAt = openedAt
        self.deadline = deadline
        self.assigned = assigned
        self.reported = reported
        self.goal = goal
        self.capacity = capacity
    }
}

/// The open buffer of a buffered process, in its status.
public struct BufferedStatus: Sendable, Hashable, Codable {
    /// Reports per release (K).
    public var bufferSize: Int
    /// Reports in the open buffer.
    public var bufferFill: Int
    /// Devices admitted and not yet reported or expired (training now, across buffers).
    public var inFlight: Int
    /// The most devices training at once.
    public var maxConcurrency: Int
    /// Buffers published so far.
    public var releases: Int
    /// The mean staleness of the open buffer's reports counted at this coordinator instance (nil before the first).
    public var meanStaleness: Double?
    /// The largest staleness among them (nil before the first).
    public var maxStaleness: Int?

    enum CodingKeys: String, CodingKey {
        case releases
        case bufferSize = "buffer_size"
        case bufferFill = "buffer_fill"
        case inFlight = "in_flight"
        case maxConcurrency = "max_concurrency"
        case meanStaleness = "mean_staleness"
        case maxStaleness = "max_staleness"
    }

    /// Creates a status.
    public init(
        bufferSize: Int, bufferFill: Int, inFlight: Int, maxConcurrency: Int, releases: Int, meanStaleness: Double? = nil, maxStaleness: Int? = nil
    ) {
        self.bufferSize = bufferSize
        self.bufferFill = bufferFill
        self.inFlight = inFlight
        self.maxConcurrency = maxConcurrency
        self.releases = releases
        self.meanStaleness = meanStaleness
        self.maxStaleness = maxStaleness
    }
}

/// A process's privacy spend, in its status.
public struct PrivacyStatus: Sendable, Hashable, Codable {
    /// ε spent by the aggregates released so far, at ``delta``.
    public var epsilon: Double
    /// δ of the guarantee.
    public var delta: Double
    /// Aggregates released under privacy.
    public var releases: Int
    /// The sampling rate the accountant assumes (goal_count / population).
    public var samplingRate: Double
    /// The noise multiplier the accountant charges per release.
    public var noiseMultiplier: Double
    /// The clipping bound of the open cycle.
    public var clippingNorm: Double
    /// The budget, if set.
    public var targetEpsilon: Double?

    enum CodingKeys: String, CodingKey {
        case epsilon, delta, releases
        case samplingRate = "sampling_rate"
        case noiseMultiplier = "noise_multiplier"
        case clippingNorm = "clipping_norm"
        case targetEpsilon = "target_epsilon"
    }

    /// Creates a privacy status.
    public init(epsilon: Double, delta: Double, releases: Int, samplingRate: Double, noiseMultiplier: Double, clippingNorm: Double, targetEpsilon: Double?) {
        self.epsilon = epsilon
        self.delta = delta
        self.releases = releases
        self.samplingRate = samplingRate
        self.noiseMultiplier = noiseMultiplier
        self.clippingNorm = clippingNorm
        self.targetEpsilon = targetEpsilon
    }
}

/// Whether a process still runs cycles (`"running"` / `"completed"` on the wire).
public enum ProcessState: String, Sendable, Hashable, Codable, CustomStringConvertible {
    /// It opens cycles.
    case running
    /// It completed its cycles (`server_config.cycles`).
    case completed

    public var description: String { rawValue }
}

/// Admin view of a process.
public struct ProcessStatus: Sendable, Hashable, Codable {
    /// The process's id.
    public var processID: String
    /// Its name.
    public var name: String
    /// Its version.
    public var version: SemanticVersion
    /// Running or completed.
    public var state: ProcessState
    /// The latest published checkpoint.
    public var latestCheckpoint: Int
    /// Checkpoints still stored (older ones were pruned).
    public var checkpoints: [Int]
    /// Cycles that produced a checkpoint.
    public var cyclesCompleted: Int
    /// Cycles abandoned for too few reports.
    public var cyclesAbandoned: Int
    /// The open cycle, if the process is running.
    public var currentCycle: CycleStatus?
    /// The client configuration.
    public var clientConfig: ClientConfig
    /// The server configuration (secrets removed).
    public var serverConfig: ServerConfig
    /// What differential privacy has spent, when the process uses it.
    public var privacy: PrivacyStatus?
    /// The latest server-side evaluation of a checkpoint on the process's held-out data, when it has some.
    public var evaluation: CheckpointEvaluation?
    /// The latest federated evaluation of a checkpoint on devices' held-out splits, when there is one.
    public var federatedEvaluation: CheckpointEvaluation?

    enum CodingKeys: String, CodingKey {
        case processID = "process_id"
        case name, version, state, checkpoints, privacy, evaluation
        case federatedEvaluation = "federated_evaluation"
        case latestCheckpoint = "latest_checkpoint"
        case cyclesCompleted = "cycles_completed"
        case cyclesAbandoned = "cycles_abandoned"
        case currentCycle = "current_cycle"
        case clientConfig = "client_config"
        case serverConfig = "server_config"
    }

    /// Creates a status.
    public init(
        processID: String, name: String, version: SemanticVersion, state: ProcessState, latestCheckpoint: Int, checkpoints: [Int], cyclesCompleted: Int,
        cyclesAbandoned: Int, currentCycle: CycleStatus?, clientConfig: ClientConfig, serverConfig: ServerConfig, privacy: PrivacyStatus? = nil,
        evaluation: CheckpointEvaluation? = nil, federatedEvaluation: CheckpointEvaluation? = nil
    ) {
        self.federatedEvaluation = federatedEvaluation
        self.evaluation = evaluation
        self.privacy = privacy
        self.processID = processID
        self.name = name
        self.version = version
        self.state = state
        self.latestCheckpoint = latestCheckpoint
        self.checkpoints = checkpoints
        self.cyclesCompleted = cyclesCompleted
        self.cyclesAbandoned = cyclesAbandoned
        self.currentCycle = currentCycle
        self.clientConfig = clientConfig
        self.serverConfig = serverConfig
    }
}

/// Admin: every hosted process.
public struct ProcessList: Sendable, Hashable, Codable {
    /// The processes.
    public var processes: [ProcessStatus]
    /// Creates a list.
    public init(processes: [ProcessStatus]) { self.processes = processes }
}

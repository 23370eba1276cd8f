import OrchardPrivacy
/// How the process's devices train, as the operator set it: sent once per cycle, in the ``TrainingPlan``.
///
/// Every field is optional: a field left out falls back to the model architecture's `training` section, then to
/// Orchard's built-in default (the device SDK resolves the three layers in one place, `TrainingConfiguration.resolved`).
/// Known keys are `batch_size`, `learning_rate`, `local_epochs`, `max_updates`, `proximal_mu` and `holdout_fraction`; any
/// other key is kept in
/// ``extra`` and sent to the device unchanged.
public struct ClientConfig: Sendable, Hashable, Codable {
    /// Samples per local update.
    public var batchSize: Int?
    /// The device optimizer's learning rate.
    public var learningRate: Double?
    /// Passes over the local data per cycle.
    public var localEpochs: Int?
    /// Stop after this many local updates.
    public var maxUpdates: Int?
    /// FedProx's μ (Li et al. 2020): the device adds μ/2·‖w − w_received‖² to its local objective, which keeps a
    /// heterogeneous device's update near the model it received; 0 or absent is plain local training.
    public var proximalMu: Double?
    /// The fraction of its samples a device holds out for federated evaluation and never trains on, in [0, 0.9]; each
    /// sample's side is fixed by the device's seed and its index, so the split holds across windows and as data is added.
    public var holdoutFraction: Double?
    /// Free-form keys passed through to the device.
    public var extra: [String: JSONValue]

    /// Creates a client configuration; nil fields defer to the architecture.
    public init(
        batchSize: Int? = nil, learningRate: Double? = nil, localEpochs: Int? = nil, maxUpdates: Int? = nil, proximalMu: Double? = nil,
        holdoutFraction: Double? = nil, extra: [String: JSONValue] = [:]
    ) {
        self.holdoutFraction = holdoutFraction
        self.proximalMu = proximalMu
        self.batchSize = batchSize
        self.learningRate = learningRate
        self.localEpochs = localEpochs
        self.maxUpdates = maxUpdates
        self.extra = extra
    }

    private static let knownKeys: Set<String> = ["batch_size", "learning_rate", "local_epochs", "max_updates", "proximal_mu", "holdout_fraction"]

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: AnyKey.self)
        batchSize = try container.decodeIfPresent(Int.self, forKey: AnyKey("batch_size"))
        learningRate = try container.decodeIfPresent(Double.self, forKey: AnyKey("learning_rate"))
        localEpochs = try container.decodeIfPresent(Int.self, forKey: AnyKey("local_epochs"))
        maxUpdates = try container.decodeIfPresent(Int.self, forKey: AnyKey("max_updates"))
        proximalMu = try container.decodeIfPresent(Double.self, forKey: AnyKey("proximal_mu"))
        holdoutFraction = try container.decodeIfPresent(Double.self, forKey: AnyKey("holdout_fraction"))
        var extra: [String: JSONValue] = [:]
        for key in container.allKeys where !Self.knownKeys.contains(key.stringValue) {
            extra[key.stringValue] = try container.decode(JSONValue.self, forKey: key)
        }
        self.extra = extra
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: AnyKey.self)
        for (key, value) in extra where !Self.knownKeys.contains(key) {
            try container.encode(value, forKey: AnyKey(key))
        }
        try container.encodeIfPresent(batchSize, forKey: AnyKey("batch_size"))
        try container.encodeIfPresent(learningRate, forKey: AnyKey("learning_rate"))
        try container.encodeIfPresent(localEpochs, forKey: AnyKey("local_epochs"))
        try container.encodeIfPresent(maxUpdates, forKey: AnyKey("max_updates"))
        try container.encodeIfPresent(proximalMu, forKey: AnyKey("proximal_mu"))
        try container.encodeIfPresent(holdoutFraction, forKey: AnyKey("holdout_fraction"))
    }

    /// Describes the first invalid field, or nil when every field that is set is usable.
    public func validationFailure() -> String? {
        if let batchSize, !(1...WireLimits.maximumBatchSize).contains(batchSize) {
            return "client_config.batch_size must be in 1...\(WireLimits.maximumBatchSize), not \(batchSize)"
        }
        if let learningRate, !(learningRate > 0) || !learningRate.isFinite { return "client_config.learning_rate must be a positive number" }
        if let localEpochs, !(1...WireLimits.maximumLocalEpochs).contains(localEpochs) {
            return "client_config.local_epochs must be in 1...\(WireLimits.maximumLocalEpochs), not \(localEpochs)"
        }
        if let maxUpdates, maxUpdates < 1 { return "client_config.max_updates must be at least 1 when set" }
        if let proximalMu, !(proximalMu >= 0) || !proximalMu.isFinite {
            return "client_config.proximal_mu must be a non-negative number, not \(proximalMu)"
        }
        if let holdoutFraction, !(holdoutFraction >= 0 && holdoutFraction <= 0.9) {
            return "client_config.holdout_fraction must be in [0, 0.9], not \(holdoutFraction)"
        }
        return nil
    }
}

/// A coding key for any string.
struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(_ string: String) { stringValue = string }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

/// How devices prove who they are.
public struct AuthenticationConfig: Sendable, Hashable, Codable {
    /// The kind of authentication.
    public struct Mode: Sendable, Hashable, Codable, CustomStringConvertible {
        private enum Kind: String, Sendable, Hashable { case open, hs256, rs256 }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// No credential: any device gets a worker id (development only).
        public static let open = Mode(.open)
        /// A JWT signed with a shared HMAC-SHA256 secret; its `sub` claim names the device.
        public static let hs256 = Mode(.hs256)
        /// A JWT signed with an RSA key (RS256); its `sub` claim names the device.
        public static let rs256 = Mode(.rs256)

        public var description: String { kind.rawValue }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            let raw = try container.decode(String.self)
            guard let kind = Kind(rawValue: raw) else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "authentication mode '\(raw)' is not one of open, hs256, rs256")
            }
            self.kind = kind
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(kind.rawValue)
        }
    }

    /// The mode.
    public var mode: Mode
    /// The HMAC secret for ``Mode/hs256``.
    public var secret: String?
    /// The PEM public key for ``Mode/rs256``.
    public var publicKeyPEM: String?
    /// The required `iss` claim, if any.
    public var issuer: String?
    /// The required `aud` claim, if any.
    public var audience: String?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case mode, secret, issuer, audience
        case publicKeyPEM = "public_key_pem"
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.authentication")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        mode = try c.decode(Mode.self, forKey: .mode)
        secret = try c.decodeIfPresent(String.self, forKey: .secret)
        publicKeyPEM = try c.decodeIfPresent(String.self, forKey: .publicKeyPEM)
        issuer = try c.decodeIfPresent(String.self, forKey: .issuer)
        audience = try c.decodeIfPresent(String.self, forKey: .audience)
    }

    /// Creates an authentication configuration.
    public init(mode: Mode = .open, secret: String? = nil, publicKeyPEM: String? = nil, issuer: String? = nil, audience: String? = nil) {
        self.mode = mode
        self.secret = secret
        self.publicKeyPEM = publicKeyPEM
        self.issuer = issuer
        self.audience = audience
    }

    /// Open mode, for development.
    public static let open = AuthenticationConfig()
    /// HS256 with a shared secret.
    public static func hs256(secret: String, issuer: String? = nil, audience: String? = nil) -> AuthenticationConfig {
        AuthenticationConfig(mode: .hs256, secret: secret, issuer: issuer, audience: audience)
    }
    /// RS256 with a PEM public key.
    public static func rs256(publicKeyPEM: String, issuer: String? = nil, audience: String? = nil) -> AuthenticationConfig {
        AuthenticationConfig(mode: .rs256, publicKeyPEM: publicKeyPEM, issuer: issuer, audience: audience)
    }
}

/// The server-side optimizer that turns the averaged diff into the next checkpoint (Reddi et al. 2021).
public struct AggregatorConfig: Sendable, Hashable, Codable {
    /// Which server optimizer.
    public struct Kind: Sendable, Hashable, Codable, CustomStringConvertible {
        private enum Value: String, Sendable, Hashable { case fedavg, fedavgm, fedadam, fedyogi }
        private let value: Value
        private init(_ value: Value) { self.value = value }

        /// Sample-weighted mean of the diffs, applied with the server learning rate.
        public static let fedAvg = Kind(.fedavg)
        /// FedAvg with server momentum.
        public static let fedAvgM = Kind(.fedavgm)
        /// Adam on the server.
        public static let fedAdam = Kind(.fedadam)
        /// Yogi on the server.
        public static let fedYogi = Kind(.fedyogi)

        public var description: String { value.rawValue }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            let raw = try container.decode(String.self)
            guard let value = Value(rawValue: raw.lowercased()) else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "aggregator '\(raw)' is not one of fedavg, fedavgm, fedadam, fedyogi")
            }
            self.value = value
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(value.rawValue)
        }
    }

    /// The optimizer.
    public var kind: Kind
    /// The server learning rate η (1 for plain FedAvg).
    public var serverLearningRate: Double
    /// Momentum for FedAvgM.
    public var momentum: Double
    /// First-moment decay for FedAdam and FedYogi.
    public var beta1: Double
    /// Second-moment decay for FedAdam and FedYogi.
    public var beta2: Double
    /// Adaptivity τ for FedAdam and FedYogi (added to √v; v starts at τ²).
    public var tau: Double

    enum CodingKeys: String, CodingKey, CaseIterable {
        case kind, momentum, beta1, beta2, tau
        case serverLearningRate = "server_learning_rate"
    }

    /// Creates an aggregator configuration.
    public init(kind: Kind = .fedAvg, serverLearningRate: Double = 1, momentum: Double = 0.9, beta1: Double = 0.9, beta2: Double = 0.99, tau: Double = 1e-3) {
        self.kind = kind
        self.serverLearningRate = serverLearningRate
        self.momentum = momentum
        self.beta1 = beta1
        self.beta2 = beta2
        self.tau = tau
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.aggregator")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = AggregatorConfig()
        kind = try c.decodeIfPresent(Kind.self, forKey: .kind) ?? d.kind
        serverLearningRate = try c.decodeIfPresent(Double.self, forKey: .serverLearningRate) ?? d.serverLearningRate
        momentum = try c.decodeIfPresent(Double.self, forKey: .momentum) ?? d.momentum
        beta1 = try c.decodeIfPresent(Double.self, forKey: .beta1) ?? d.beta1
        beta2 = try c.decodeIfPresent(Double.self, forKey: .beta2) ?? d.beta2
        tau = try c.decodeIfPresent(Double.self, forKey: .tau) ?? d.tau
    }
}

/// What the coordinator does with a report whose diff's L2 norm exceeds ``ServerConfig/updateNormBound``.
public struct UpdateNormPolicy: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Value: String, Sendable, Hashable { case clip, reject }
    private let value: Value
    private init(_ value: Value) { self.value = value }

    /// The diff is scaled down to the bound before it is folded into the running sum (the default).
    public static let clip = UpdateNormPolicy(.clip)
    /// The report is refused with `update_norm_exceeded` (422).
    public static let reject = UpdateNormPolicy(.reject)

    public var description: String { value.rawValue }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let raw = try container.decode(String.self)
        guard let value = Value(rawValue: raw) else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "update_norm_policy '\(raw)' is not one of clip, reject")
        }
        self.value = value
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(value.rawValue)
    }
}

/// How the coordinator runs a process's cycles.
public struct ServerConfig: Sendable, Hashable, Codable {
    /// Seconds from a cycle's opening to its reporting deadline.
    public var cycleLength: Double
    /// How many cycles to complete; 0 runs without end.
    public var cycles: Int
    /// Reports that close a cycle early.
    public var goalCount: Int
    /// Devices admitted per cycle, as a multiple of ``goalCount`` (1.3 covers 6–10 % dropout).
    public var overSelection: Double
    /// Reports needed at the deadline to aggregate rather than abandon the cycle.
    public var minimumReports: Int
    /// Seconds over which rejected devices' `retry_after` is spread, so they do not return at once.
    public var paceSteeringWindow: Double
    /// Minimum download speed a device must report, in Mbit/s, if set.
    public var minimumDownloadMbps: Double?
    /// Minimum upload speed a device must report, in Mbit/s, if set.
    public var minimumUploadMbps: Double?
    /// Bytes a device downloads to measure its link (1…``SpeedTest/maximumBytes``), when the process gates on speed.
    public var speedTestDownloadBytes: Int
    /// Bytes a device uploads to measure its link (1…``SpeedTest/maximumBytes``), when the process gates on speed.
    public var speedTestUploadBytes: Int
    /// The largest sample count one report may claim.
    public var maximumSampleCount: Int
    /// Checkpoints kept; older ones are deleted when a new one is published (at least 1).
    public var checkpointRetention: Int
    /// How devices authenticate.
    public var authentication: AuthenticationConfig
    /// The server optimizer.
    public var aggregator: AggregatorConfig
    /// The largest L2 norm (over the whole diff) one report may carry, if set; see ``updateNormPolicy``.
    public var updateNormBound: Double?
    /// What happens to a report over ``updateNormBound``: clipped to it (default) or refused.
    public var updateNormPolicy: UpdateNormPolicy
    /// Differential privacy (clipping, noise, accounting), if set.
    public var privacy: PrivacyConfig?
    /// Secure aggregation (the coordinator sees only the sum of a cycle's updates), if set.
    public var secureAggregation: SecureAggregationConfig?
    /// A robust statistic of the cycle's reports instead of their weighted mean (median, trimmed mean, Multi-Krum), if set.
    public var robustAggregation: RobustAggregationConfig?
    /// Federated evaluation of published checkpoints on devices' held-out splits, if set.
    public var evaluation: FederatedEvaluationConfig?
    /// Synchronous cycles (the default) or buffered asynchronous aggregation.
    public var aggregationMode: AggregationMode
    /// The buffer's knobs when ``aggregationMode`` is buffered (defaults when absent).
    public var buffered: BufferedAggregationConfig?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case cycles, authentication, aggregator, privacy, evaluation, buffered
        case aggregationMode = "aggregation_mode"
        case secureAggregation = "secure_aggregation"
        case robustAggregation = "robust_aggregation"
        case updateNormBound = "update_norm_bound"
        case updateNormPolicy = "update_norm_policy"
        case cycleLength = "cycle_length"
        case goalCount = "goal_count"
        case overSelection = "over_selection"
        case minimumReports = "minimum_reports"
        case paceSteeringWindow = "pace_steering_window"
        case minimumDownloadMbps = "minimum_download_mbps"
        case minimumUploadMbps = "minimum_upload_mbps"
        case speedTestDownloadBytes = "speed_test_download_bytes"
        case speedTestUploadBytes = "speed_test_upload_bytes"
        case maximumSampleCount = "maximum_sample_count"
        case checkpointRetention = "checkpoint_retention"
    }

    /// Creates a server configuration.
    public init(
        cycleLength: Double = 600, cycles: Int = 0, goalCount: Int = 100, overSelection: Double = 1.3,
        minimumReports: Int = 1, paceSteeringWindow: Double = 60, minimumDownloadMbps: Double? = nil,
        minimumUploadMbps: Double? = nil, speedTestDownloadBytes: Int = SpeedTest.defaultBytes, speedTestUploadBytes: Int = SpeedTest.defaultBytes,
        maximumSampleCount: Int = 1_000_000, checkpointRetention: Int = 5,
        authentication: AuthenticationConfig = .open, aggregator: AggregatorConfig = AggregatorConfig(),
        updateNormBound: Double? = nil, updateNormPolicy: UpdateNormPolicy = .clip, privacy: PrivacyConfig? = nil,
        secureAggregation: SecureAggregationConfig? = nil, robustAggregation: RobustAggregationConfig? = nil,
        evaluation: FederatedEvaluationConfig? = nil, aggregationMode: AggregationMode = .synchronous, buffered: BufferedAggregationConfig? = nil
    ) {
        self.aggregationMode = aggregationMode
        self.buffered = buffered
        self.evaluation = evaluation
        self.robustAggregation = robustAggregation
        self.cycleLength = cycleLength
        self.cycles = cycles
        self.goalCount = goalCount
        self.overSelection = overSelection
        self.minimumReports = minimumReports
        self.paceSteeringWindow = paceSteeringWindow
        self.minimumDownloadMbps = minimumDownloadMbps
        self.minimumUploadMbps = minimumUploadMbps
        self.speedTestDownloadBytes = speedTestDownloadBytes
        self.speedTestUploadBytes = speedTestUploadBytes
        self.maximumSampleCount = maximumSampleCount
        self.checkpointRetention = checkpointRetention
        self.authentication = authentication
        self.aggregator = aggregator
        self.updateNormBound = updateNormBound
        self.updateNormPolicy = updateNormPolicy
        self.privacy = privacy
        self.secureAggregation = secureAggregation
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = ServerConfig()
        cycleLength = try c.decodeIfPresent(Double.self, forKey: .cycleLength) ?? d.cycleLength
        cycles = try c.decodeIfPresent(Int.self, forKey: .cycles) ?? d.cycles
        goalCount = try c.decodeIfPresent(Int.self, forKey: .goalCount) ?? d.goalCount
        overSelection = try c.decodeIfPresent(Double.self, forKey: .overSelection) ?? d.overSelection
        minimumReports = try c.decodeIfPresent(Int.self, forKey: .minimumReports) ?? d.minimumReports
        paceSteeringWindow = try c.decodeIfPresent(Double.self, forKey: .paceSteeringWindow) ?? d.paceSteeringWindow
        minimumDownloadMbps = try c.decodeIfPresent(Double.self, forKey: .minimumDownloadMbps)
        minimumUploadMbps = try c.decodeIfPresent(Double.self, forKey: .minimumUploadMbps)
        speedTestDownloadBytes = try c.decodeIfPresent(Int.self, forKey: .speedTestDownloadBytes) ?? d.speedTestDownloadBytes
        speedTestUploadBytes = try c.decodeIfPresent(Int.self, forKey: .speedTestUploadBytes) ?? d.speedTestUploadBytes
        maximumSampleCount = try c.decodeIfPresent(Int.self, forKey: .maximumSampleCount) ?? d.maximumSampleCount
        checkpointRetention = try c.decodeIfPresent(Int.self, forKey: .checkpointRetention) ?? d.checkpointRetention
        authentication = try c.decodeIfPresent(AuthenticationConfig.self, forKey: .authentication) ?? d.authentication
        aggregator = try c.decodeIfPresent(AggregatorConfig.self, forKey: .aggregator) ?? d.aggregator
        updateNormBound = try c.decodeIfPresent(Double.self, forKey: .updateNormBound)
        updateNormPolicy = try c.decodeIfPresent(UpdateNormPolicy.self, forKey: .updateNormPolicy) ?? d.updateNormPolicy
        privacy = try c.decodeIfPresent(PrivacyConfig.self, forKey: .privacy)
        secureAggregation = try c.decodeIfPresent(SecureAggregationConfig.self, forKey: .secureAggregation)
        robustAggregation = try c.decodeIfPresent(RobustAggregationConfig.self, forKey: .robustAggregation)
        evaluation = try c.decodeIfPresent(FederatedEvaluationConfig.self, forKey: .evaluation)
        aggregationMode = try c.decodeIfPresent(AggregationMode.self, forKey: .aggregationMode) ?? d.aggregationMode
        buffered = try c.decodeIfPresent(BufferedAggregationConfig.self, forKey: .buffered)
    }

    /// The buffer's knobs when the process aggregates buffered (the configured ones, or the defaults), else nil.
    public var bufferedAggregation: BufferedAggregationConfig? {
        aggregationMode == .buffered ? (buffered ?? BufferedAggregationConfig()) : nil
    }

    /// Reports in one release: the buffer size in buffered mode, else `goal_count`.
    public var releaseGoal: Int { bufferedAggregation?.bufferSize ?? goalCount }

    /// Devices one release draws from, for the privacy accountant's sampling rate: the buffer size in buffered mode
    /// (each release takes K devices), else the cycle's capacity.
    public var releaseCapacity: Int { bufferedAggregation?.bufferSize ?? capacity }

    /// Reports below which no release happens: the buffer size in buffered mode (a buffer is published full), else
    /// `minimum_reports`.
    public var releaseMinimum: Int { bufferedAggregation?.bufferSize ?? minimumReports }

    /// Devices admitted per cycle: ⌈goal × over-selection⌉.
    public var capacity: Int {
        Int((Double(goalCount) * overSelection).rounded(.up))
    }

    /// Describes the first invalid field, or nil when the configuration is usable.
    public func validationFailure() -> String? {
        let longest = WireLimits.maximumSeconds
        if !(cycleLength > 0 && cycleLength <= longest) {
            return "server_config.cycle_length must be a positive number of seconds, at most \(longest), not \(cycleLength)"
        }
        if cycles < 0 { return "server_config.cycles must be 0 (unbounded) or positive" }
        if !(1...WireLimits.maximumGoalCount).contains(goalCount) {
            return "server_config.goal_count must be in 1...\(WireLimits.maximumGoalCount), not \(goalCount)"
        }
        if !(overSelection >= 1 && overSelection <= WireLimits.maximumOverSelection) {
            return "server_config.over_selection must be in 1...\(WireLimits.maximumOverSelection), not \(overSelection)"
        }
        if minimumReports < 1 || minimumReports > goalCount { return "server_config.minimum_reports must be in 1...goal_count" }
        if !(paceSteeringWindow >= 0 && paceSteeringWindow <= longest) {
            return "server_config.pace_steering_window must be a non-negative number of seconds, at most \(longest), not \(paceSteeringWindow)"
        }
        if let v = minimumDownloadMbps, !(v >= 0) { return "server_config.minimum_download_mbps must be non-negative" }
        if let v = minimumUploadMbps, !(v >= 0) { return "server_config.minimum_upload_mbps must be non-negative" }
        for (key, bytes) in [("speed_test_download_bytes", speedTestDownloadBytes), ("speed_test_upload_bytes", speedTestUploadBytes)]
        where !(1...SpeedTest.maximumBytes).contains(bytes) {
            return "server_config.\(key) must be in 1...\(SpeedTest.maximumBytes), not \(bytes)"
        }
        if maximumSampleCount < 1 { return "server_config.maximum_sample_count must be at least 1" }
        if checkpointRetention < 1 { return "server_config.checkpoint_retention must be at least 1" }
        if let bound = updateNormBound, !(bound > 0) || !bound.isFinite {
            return "server_config.update_norm_bound must be a positive finite number when set, not \(bound)"
        }
        if buffered != nil && aggregationMode != .buffered {
            return "server_config.buffered needs server_config.aggregation_mode \"buffered\", not \"\(aggregationMode)\""
        }
        if let buffer = bufferedAggregation {
            if let failure = buffer.validationFailure() { return failure }
            if secureAggregation != nil {
                return
                    "server_config.aggregation_mode buffered cannot be used with server_config.secure_aggregation: masking needs its cohort fixed before anyone uploads and every member online through four stages, while a buffered device reports alone whenever its window allows; use synchronous cycles for secure aggregation"
            }
            if robustAggregation != nil {
                return
                    "server_config.aggregation_mode buffered cannot be used with server_config.robust_aggregation: a buffer mixes updates trained from different checkpoints, so a median or distance score would punish staleness as though it were malice; use synchronous cycles for robust aggregation"
            }
        }
        if let privacy {
            if let failure = privacy.validationFailure(goalCount: releaseGoal, capacity: releaseCapacity) { return failure }
            if privacy.mode == .distributed && secureAggregation == nil {
                return
                    "server_config.privacy.mode distributed needs server_config.secure_aggregation: the devices' noise shares protect only a sum the coordinator cannot take apart"
            }
            if updateNormBound != nil {
                return "server_config.update_norm_bound and server_config.privacy cannot both be set: privacy clips every report to its own bound"
            }
        }
        if let secureAggregation {
            if let failure = secureAggregation.validationFailure(goalCount: goalCount, maximumSampleCount: maximumSampleCount) { return failure }
            if updateNormBound != nil {
                return
                    "server_config.update_norm_bound and server_config.secure_aggregation cannot both be set: the coordinator never sees a single update's norm; secure_aggregation.clipping_range bounds every coordinate on the device"
            }
            if let privacy {
                if privacy.mode == .central {
                    return
                        "server_config.privacy.mode central cannot be used with server_config.secure_aggregation: the coordinator never sees an update to clip or noise; use mode distributed (each device adds its share of the noise) or local"
                }
                if let clip = privacy.clippingNorm, let device = privacy.devicePrivacy(minimumReports: minimumReports) {
                    // A coordinate of a clipped update is at most C, its noise's standard deviation z'·C: clipping the
                    // noised value to ±clipping_range would cut the noise the guarantee counts on.
                    let needed = clip * (1 + 6 * device.noiseMultiplier)
                    if Double(secureAggregation.parameters.clippingRange) < needed {
                        return
                            "server_config.secure_aggregation.clipping_range must be at least clipping_norm * (1 + 6 * the devices' noise multiplier) = \(needed) under privacy, so that no noised coordinate is clipped, not \(secureAggregation.parameters.clippingRange)"
                    }
                }
            }
            if minimumReports <= secureAggregation.parameters.threshold {
                return
                    "server_config.minimum_reports must exceed server_config.secure_aggregation.threshold (\(secureAggregation.parameters.threshold)): fewer advertisements cannot be unmasked, not \(minimumReports)"
            }
        }
        if let robustAggregation {
            if let failure = robustAggregation.validationFailure(minimumReports: minimumReports, capacity: capacity) { return failure }
            if secureAggregation != nil {
                return
                    "server_config.robust_aggregation cannot be used with server_config.secure_aggregation: the coordinator never sees a single update, only their sum, so it cannot take a median or score reports"
            }
            if privacy != nil {
                return
                    "server_config.robust_aggregation cannot be used with server_config.privacy: the noise is calibrated to one device's influence on a clipped mean, which a median, trimmed mean or Multi-Krum selection does not have"
            }
        }
        if let evaluation {
            if let failure = evaluation.validationFailure() { return failure }
            if secureAggregation != nil {
                return
                    "server_config.evaluation cannot be used with server_config.secure_aggregation: each device would send its metrics in the clear, which a process whose coordinator must see only sums does not allow; evaluate its checkpoints server-side (orchard process evaluation --data)"
            }
            if privacy?.mode == .local {
                return
                    "server_config.evaluation cannot be used with server_config.privacy.mode local: its devices trust no coordinator with anything un-noised, and an evaluation result is each device's exact metrics"
            }
            if evaluation.noise != nil && privacy == nil {
                return "server_config.evaluation.noise needs server_config.privacy: its releases are accounted at the privacy's delta and population"
            }
        }
        switch authentication.mode {
        case .hs256 where (authentication.secret ?? "").utf8.count < 32:
            return "server_config.authentication.secret of at least 32 bytes is required for hs256"
        case .rs256 where (authentication.publicKeyPEM ?? "").isEmpty:
            return "server_config.authentication.public_key_pem is required for rs256"
        default: break
        }
        let a = aggregator
        if !(a.serverLearningRate > 0) || !a.serverLearningRate.isFinite { return "server_config.aggregator.server_learning_rate must be positive" }
        if !(0..<1 ~= a.momentum) { return "server_config.aggregator.momentum must be in [0, 1)" }
        if !(0..<1 ~= a.beta1) || !(0..<1 ~= a.beta2) { return "server_config.aggregator.beta1 and beta2 must be in [0, 1)" }
        if !(a.tau > 0) || !a.tau.isFinite { return "server_config.aggregator.tau must be positive" }
        return nil
    }

    /// Whether a device must report its link speeds in the cycle request.
    public var requiresSpeedTest: Bool { minimumDownloadMbps != nil || minimumUploadMbps != nil }
}

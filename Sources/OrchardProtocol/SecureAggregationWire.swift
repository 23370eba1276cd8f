public import Foundation
public import OrchardFormats
public import OrchardPrivacy

/// Secure aggregation for a process (`server_config.secure_aggregation`): the coordinator learns only the sum of a
/// cycle's updates (Bonawitz et al. 2017; SecAgg+ of Bell et al. 2020 when `shares` is set).
///
/// A device trains as in a plain cycle, then, instead of uploading its update, goes through four short exchanges
/// (``SecureAggregationRequest``): advertise its public keys, send encrypted shares of its secrets to its
/// neighbours, send its masked input, and reveal the shares that remove the masks. The first stage closes like a
/// plain cycle (at `goal_count` advertisements or at the cycle's deadline); each later stage closes when every
/// device still in has answered, or `stage_timeout` seconds after it opened.
public struct SecureAggregationConfig: Sendable, Hashable, Codable {
    /// The protocol's parameters: `shares`, `threshold`, `clipping_range`, `quantization_range`, `modulus_bits`.
    public var parameters: SecureAggregationParameters
    /// Seconds each stage after advertise_keys stays open at most.
    public var stageTimeout: Double

    enum CodingKeys: String, CodingKey, CaseIterable {
        case shares, threshold
        case clippingRange = "clipping_range"
        case quantizationRange = "quantization_range"
        case modulusBits = "modulus_bits"
        case stageTimeout = "stage_timeout"
        case consistencyCheck = "consistency_check"
    }

    /// The default ``stageTimeout``.
    public static let defaultStageTimeout: Double = 60

    /// Creates a configuration.
    public init(parameters: SecureAggregationParameters, stageTimeout: Double = Self.defaultStageTimeout) {
        self.parameters = parameters
        self.stageTimeout = stageTimeout
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.secure_aggregation")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = SecureAggregationParameters(threshold: 2)
        parameters = SecureAggregationParameters(
            shares: try c.decodeIfPresent(Int.self, forKey: .shares),
            threshold: try c.decode(Int.self, forKey: .threshold),
            clippingRange: try c.decodeIfPresent(Float.self, forKey: .clippingRange) ?? d.clippingRange,
            quantizationRange: try c.decodeIfPresent(UInt32.self, forKey: .quantizationRange) ?? d.quantizationRange,
            modulusBits: try c.decodeIfPresent(Int.self, forKey: .modulusBits) ?? d.modulusBits,
            consistencyCheck: try c.decodeIfPresent(Bool.self, forKey: .consistencyCheck) ?? false
        )
        stageTimeout = try c.decodeIfPresent(Double.self, forKey: .stageTimeout) ?? Self.defaultStageTimeout
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encodeIfPresent(parameters.shares, forKey: .shares)
        try c.encode(parameters.threshold, forKey: .threshold)
        try c.encode(parameters.clippingRange, forKey: .clippingRange)
        try c.encode(parameters.quantizationRange, forKey: .quantizationRange)
        try c.encode(parameters.modulusBits, forKey: .modulusBits)
        try c.encode(stageTimeout, forKey: .stageTimeout)
        if parameters.consistencyCheck { try c.encode(true, forKey: .consistencyCheck) }
    }

    /// The first problem with the configuration for a process whose cycles close advertise_keys at `goalCount`
    /// advertisements (so a roster holds at most that many devices, however many were over-selected) with sample counts
    /// up to `maximumSampleCount`, or nil.
    public func validationFailure(goalCount: Int, maximumSampleCount: Int) -> String? {
        if !(stageTimeout > 0 && stageTimeout <= WireLimits.maximumSeconds) {
            return
                "server_config.secure_aggregation.stage_timeout must be a positive number of seconds, at most \(WireLimits.maximumSeconds), not \(stageTimeout)"
        }
        do {
            try parameters.validate(devices: goalCount, maximumSampleCount: maximumSampleCount)
        } catch {
            return
                "server_config.secure_aggregation: \(error.message) (a roster holds at most goal_count = \(goalCount) devices; maximum_sample_count = \(maximumSampleCount))"
        }
        return nil
    }
}

/// Device → coordinator (``Endpoint/secureAggregation``): one step of a device in its cycle's secure aggregation.
/// At most one of the stage messages is set; with none, the request asks what the device should do next (a poll).
public struct SecureAggregationRequest: Sendable, Hashable, Codable {
    /// The worker.
    public var workerID: String
    /// The request key of the worker's assignment in the cycle.
    public var requestKey: String
    /// advertise_keys: the device's two public keys (its index is assigned by the coordinator).
    public var advertiseKeys: SecureAggregationPublicKeys?
    /// share_keys: one encrypted bundle per neighbour.
    public var shareKeys: SecureAggregationShareKeys?
    /// masked_input: the masked words.
    public var maskedInput: SecureAggregationMaskedInput?
    /// consistency_check: the device's signature of the survivors it was sent.
    public var consistencyCheck: SecureAggregationConsistencySignature?
    /// unmask: the revealed shares.
    public var unmask: SecureAggregationUnmaskResponse?
    /// How a transport sends a masked input: as this JSON (base64 words) or, when the coordinator's reply offered it
    /// (``SecureAggregationReply/maskedInputFormat``), as a ``MaskedInputEnvelope``. Not part of the JSON.
    public var maskedInputFormat: MaskedInputFormat = .json

    enum CodingKeys: String, CodingKey {
        case unmask
        case workerID = "worker_id"
        case requestKey = "request_key"
        case advertiseKeys = "advertise_keys"
        case shareKeys = "share_keys"
        case maskedInput = "masked_input"
        case consistencyCheck = "consistency_check"
    }

    /// Creates a request.
    public init(
        workerID: String, requestKey: String, advertiseKeys: SecureAggregationPublicKeys? = nil, shareKeys: SecureAggregationShareKeys? = nil,
        maskedInput: SecureAggregationMaskedInput? = nil, consistencyCheck: SecureAggregationConsistencySignature? = nil,
        unmask: SecureAggregationUnmaskResponse? = nil
    ) {
        self.workerID = workerID
        self.requestKey = requestKey
        self.advertiseKeys = advertiseKeys
        self.shareKeys = shareKeys
        self.maskedInput = maskedInput
        self.consistencyCheck = consistencyCheck
        self.unmask = unmask
    }

    /// How many stage messages the request carries (a valid request carries at most one).
    public var messageCount: Int {
        [advertiseKeys != nil, shareKeys != nil, maskedInput != nil, consistencyCheck != nil, unmask != nil].count { $0 }
    }
}

/// A device's two X25519 public keys, raw 32 bytes each (base64 in JSON), and, for a process with
/// `consistency_check`, its certificate and its identity key's signature over them and its index.
public struct SecureAggregationPublicKeys: Sendable, Hashable, Codable {
    /// The key of the encrypted share channel.
    public var channelPublicKey: Data
    /// The key of the pairwise masks.
    public var maskPublicKey: Data
    /// The certificate and signature (``OrchardPrivacy/SecureAggregationAdvertisement/signed``).
    public var signed: SecureAggregationAdvertisementSignature?

    enum CodingKeys: String, CodingKey {
        case signed
        case channelPublicKey = "channel_public_key"
        case maskPublicKey = "mask_public_key"
    }

    /// Creates the keys.
    public init(channelPublicKey: Data, maskPublicKey: Data, signed: SecureAggregationAdvertisementSignature? = nil) {
        self.channelPublicKey = channelPublicKey
        self.maskPublicKey = maskPublicKey
        self.signed = signed
    }
}

/// Coordinator → device: where the device stands in its cycle's secure aggregation, and the input of its next step
/// when that step's stage is open.
public struct SecureAggregationReply: Sendable, Hashable, Codable {
    /// The cycle.
    public var cycle: Int
    /// The device's index in the cycle (≥ 1).
    public var device: Int
    /// The stage the coordinator is at.
    public var stage: SecureAggregationStage
    /// What the device must do next.
    public var next: SecureAggregationNextStep
    /// For ``SecureAggregationNextStep/wait``: seconds before asking again.
    public var retryAfter: Double?
    /// For ``SecureAggregationNextStep/shareKeys``: the participants and the neighbours' keys.
    public var roster: SecureAggregationRoster?
    /// For ``SecureAggregationNextStep/maskedInput``: the bundles addressed to the device.
    public var delivery: SecureAggregationShareDelivery?
    /// For ``SecureAggregationNextStep/consistencyCheck``: the survivors to sign.
    public var consistencyRequest: SecureAggregationConsistencyRequest?
    /// For ``SecureAggregationNextStep/unmask``: which shares to reveal (with `consistency_check`, with the
    /// neighbours' signatures of the survivors).
    public var unmaskRequest: SecureAggregationUnmaskRequest?
    /// Whether this request closed the cycle (the aggregate was published or the cycle abandoned).
    public var cycleClosed: Bool
    /// For ``SecureAggregationNextStep/maskedInput``: `safetensors` when the coordinator (2.4 and later) takes the
    /// masked input as a binary ``MaskedInputEnvelope``; absent, only as JSON.
    public var maskedInputFormat: MaskedInputFormat?

    enum CodingKeys: String, CodingKey {
        case cycle, device, stage, next, roster, delivery
        case retryAfter = "retry_after"
        case unmaskRequest = "unmask_request"
        case cycleClosed = "cycle_closed"
        case maskedInputFormat = "masked_input_format"
        case consistencyRequest = "consistency_request"
    }

    /// Creates a reply.
    public init(
        cycle: Int, device: Int, stage: SecureAggregationStage, next: SecureAggregationNextStep, retryAfter: Double? = nil,
        roster: SecureAggregationRoster? = nil, delivery: SecureAggregationShareDelivery? = nil, consistencyRequest: SecureAggregationConsistencyRequest? = nil,
        unmaskRequest: SecureAggregationUnmaskRequest? = nil, cycleClosed: Bool = false, maskedInputFormat: MaskedInputFormat? = nil
    ) {
        self.cycle = cycle
        self.device = device
        self.stage = stage
        self.next = next
        self.retryAfter = retryAfter
        self.roster = roster
        self.delivery = delivery
        self.consistencyRequest = consistencyRequest
        self.unmaskRequest = unmaskRequest
        self.cycleClosed = cycleClosed
        self.maskedInputFormat = maskedInputFormat
    }
}

/// How a device sends its masked input.
public enum MaskedInputFormat: String, Sendable, Hashable, Codable {
    /// In the JSON request, `masked_input.words` as base64 (a third larger than the words).
    case json
    /// As a ``MaskedInputEnvelope`` body (`Content-Type: application/vnd.safetensors`), 4 bytes a word.
    case safetensors
}

/// A masked input on the wire as one safetensors file (`Content-Type: application/vnd.safetensors` on
/// ``Endpoint/secureAggregation``): a single rank-1 `U32` tensor named `masked_input` holding the words
/// (little-endian, model length + 1 of them), and `__metadata__["orchard.secure_aggregation"]` holding
/// `{"device", "request_key", "worker_id"}` as JSON.
public enum MaskedInputEnvelope {
    /// The metadata key holding the request's JSON.
    public static let metadataKey = "orchard.secure_aggregation"
    /// The tensor holding the words.
    public static let tensorName = "masked_input"

    struct Header: Codable {
        var device: Int
        var requestKey: String
        var workerID: String

        enum CodingKeys: String, CodingKey, CaseIterable {
            case device
            case requestKey = "request_key"
            case workerID = "worker_id"
        }

        init(device: Int, requestKey: String, workerID: String) {
            self.device = device
            self.requestKey = requestKey
            self.workerID = workerID
        }

        init(from decoder: any Decoder) throws {
            try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: MaskedInputEnvelope.metadataKey)
            let c = try decoder.container(keyedBy: CodingKeys.self)
            device = try c.decode(Int.self, forKey: .device)
            requestKey = try c.decode(String.self, forKey: .requestKey)
            workerID = try c.decode(String.self, forKey: .workerID)
        }
    }

    /// The body for a request carrying a masked input.
    /// - Precondition: `request.maskedInput` is set.
    public static func encode(_ request: SecureAggregationRequest) -> [UInt8] {
        guard let input = request.maskedInput else { preconditionFailure("a masked-input envelope needs a masked input") }
        var body = header(request, input)
        body.append(contentsOf: SecureAggregationMaskedInput.littleEndianBytes(input.words))
        return body
    }

    /// The size of ``encode(_:)``'s body, without building it.
    /// - Precondition: `request.maskedInput` is set.
    public static func byteCount(_ request: SecureAggregationRequest) -> Int {
        guard let input = request.maskedInput else { preconditionFailure("a masked-input envelope needs a masked input") }
        return header(request, input).count + 4 * input.words.count
    }

    private static func header(_ request: SecureAggregationRequest, _ input: SecureAggregationMaskedInput) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        // Two strings and an integer always encode.
        let header = (try? encoder.encode(Header(device: input.device, requestKey: request.requestKey, workerID: request.workerID))) ?? Data()
        return Safetensors.encodeHeader(
            layout: [(name: tensorName, dtype: .uint32, shape: [input.words.count])], metadata: [metadataKey: String(decoding: header, as: UTF8.self)])
    }

    /// The request a body carries.
    /// - Throws: `FormatError` for a body that is not safetensors, has any tensor besides one rank-1 `U32`
    ///   `masked_input`, or lacks the metadata or has other keys or types in it.
    public static func decode(_ bytes: [UInt8]) throws(FormatError) -> SecureAggregationRequest {
        let index = try Safetensors.index(bytes)
        guard index.entries.count == 1, let entry = index.entries.first, entry.name == tensorName else {
            throw FormatError(.invalidHeader, "a masked input holds exactly one tensor, '\(tensorName)', not \(index.entries.map(\.name).prefix(4))")
        }
        guard entry.dtype == .uint32, entry.shape.count == 1 else {
            throw FormatError(.dtypeMismatch, "'\(tensorName)' must be a rank-1 U32 tensor, not \(entry.dtype.rawValue) of shape \(entry.shape)")
        }
        guard let json = index.metadata[metadataKey] else {
            throw FormatError(.invalidHeader, "a masked input has no __metadata__[\"\(metadataKey)\"]")
        }
        guard index.metadata.count == 1 else {
            throw FormatError(.invalidHeader, "a masked input's __metadata__ holds only \"\(metadataKey)\"")
        }
        let header: Header
        do {
            header = try WireCoding.strictDecoder().decode(Header.self, from: Data(json.utf8))
        } catch {
            throw FormatError(.invalidHeader, "__metadata__[\"\(metadataKey)\"] must be {\"device\", \"request_key\", \"worker_id\"}")
        }
        let words = bytes.withUnsafeBytes { raw in
            SecureAggregationMaskedInput.words(fromLittleEndian: Data(UnsafeRawBufferPointer(rebasing: raw[entry.byteRange])))
        }
        return SecureAggregationRequest(
            workerID: header.workerID, requestKey: header.requestKey, maskedInput: SecureAggregationMaskedInput(device: header.device, words: words))
    }
}

/// What a device does after a ``SecureAggregationReply``.
public enum SecureAggregationNextStep: String, Sendable, Hashable, Codable {
    /// Ask again after `retry_after` seconds: the current stage waits for other devices.
    case wait
    /// Send share_keys for the reply's roster.
    case shareKeys = "share_keys"
    /// Send the masked input for the reply's delivery.
    case maskedInput = "masked_input"
    /// Sign the reply's consistency request (processes with `consistency_check`).
    case consistencyCheck = "consistency_check"
    /// Send the shares the reply's unmask request asks for.
    case unmask
    /// Nothing more: the device's part in the cycle is over.
    case done
}

/// The secure-aggregation part of a process's status: the open cycle's stage and how many devices are at each step.
public struct SecureAggregationStatus: Sendable, Hashable, Codable {
    /// The stage the open cycle is at.
    public var stage: SecureAggregationStage
    /// When the stage closes at the latest, in seconds since 1970 (advertise_keys: the cycle's deadline).
    public var stageDeadline: Double
    /// Devices that advertised their keys.
    public var advertised: Int
    /// Devices that sent their shares.
    public var shared: Int
    /// Devices that sent their masked input.
    public var masked: Int
    /// Devices that signed the survivors (processes with `consistency_check`; 0 otherwise).
    public var signed: Int
    /// Devices that revealed their shares.
    public var unmasked: Int
    /// Devices declared dropped in this cycle.
    public var dropped: Int

    enum CodingKeys: String, CodingKey {
        case stage, advertised, shared, masked, signed, unmasked, dropped
        case stageDeadline = "stage_deadline"
    }

    /// Creates a status.
    public init(stage: SecureAggregationStage, stageDeadline: Double, advertised: Int, shared: Int, masked: Int, signed: Int = 0, unmasked: Int, dropped: Int) {
        self.stage = stage
        self.stageDeadline = stageDeadline
        self.advertised = advertised
        self.shared = shared
        self.masked = masked
        self.signed = signed
        self.unmasked = unmasked
        self.dropped = dropped
    }
}

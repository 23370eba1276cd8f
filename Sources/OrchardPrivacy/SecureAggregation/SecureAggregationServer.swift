public import Foundation
import Crypto

/// What the server's driver must do after an event: send a stage's message to a device, or report the end.
public enum SecureAggregationServerAction: Sendable, Hashable {
    /// Send `roster` to `device` (after advertise_keys closes).
    case sendRoster(device: Int, roster: SecureAggregationRoster)
    /// Send `delivery` to `device` (after share_keys closes).
    case deliverShares(device: Int, delivery: SecureAggregationShareDelivery)
    /// Send `request` to `device` (after masked_input closes, with `consistency_check`).
    case requestConsistency(device: Int, request: SecureAggregationConsistencyRequest)
    /// Send `request` to `device` (after masked_input closes, or consistency_check with `consistency_check`).
    case requestUnmask(device: Int, request: SecureAggregationUnmaskRequest)
    /// These devices missed the stage that just closed and are out of the cycle (their later messages are refused);
    /// devices that did not sign in consistency_check are reported with stage `consistency_check`.
    case dropped(devices: [Int], stage: SecureAggregationStage)
    /// The cycle is done: the unmasked aggregate.
    case finished(SecureAggregationResult)
    /// The cycle cannot finish: too few devices remain at some stage.
    case abandoned(reason: String)
}

/// An input to ``SecureAggregationServer/handle(_:using:)``.
public enum SecureAggregationServerEvent: Sendable, Hashable {
    /// A device's advertisement.
    case advertisement(SecureAggregationAdvertisement)
    /// A device's encrypted share bundles.
    case shareKeys(SecureAggregationShareKeys)
    /// A device's masked input.
    case maskedInput(SecureAggregationMaskedInput)
    /// A device's signature of the survivor set (consistency_check).
    case consistencySignature(SecureAggregationConsistencySignature)
    /// A device's revealed shares.
    case unmask(SecureAggregationUnmaskResponse)
    /// The stage's deadline passed, or every expected message is in.
    case closeStage
}

/// The server side of secure aggregation as a pure state machine: messages are checked and absorbed as they come;
/// ``closeStage(using:)`` (called by the driver at the stage deadline, or when all devices are in) decides who goes
/// on and returns what to send. Below the threshold at any stage the cycle is abandoned.
///
/// Threshold rule: every device still in must keep at least `threshold` neighbours still in, since those hold the
/// shares that unmask it (for the complete graph: at least threshold + 1 devices).
///
/// Actively secure (configuration `consistency_check`): advertisements must be signed by their certificate's key (the
/// devices check the authority), and between masked_input and unmask a consistency_check stage collects each
/// survivor's signature of U3; only the signers
/// (U4) are asked to unmask, each request carrying its neighbours' signatures.
///
/// Memory: the masked inputs are summed as they arrive (model length + 1 words); only the share bundles in transit
/// (participants × neighbours) are kept besides. The state is `Codable`, to be persisted between stages.
public struct SecureAggregationServer: Sendable, Codable {
    /// The cycle's configuration.
    public let configuration: SecureAggregationParameters
    /// The cycle's context string, as the devices have it.
    public let context: String
    /// The most devices the cycle admits.
    public let maximumDevices: Int
    /// The largest sample count a device may use.
    public let maximumSampleCount: Int
    /// The model's length in coordinates.
    public let modelLength: Int
    /// The current stage.
    public private(set) var stage: SecureAggregationStage = .advertiseKeys
    /// The devices declared dropped so far, ascending.
    public var dropped: [Int] { droppedDevices.sorted() }
    /// Whether a device may advertise again during advertise_keys, replacing its keys (nothing has been shared with
    /// them yet): a device that lost its secrets, e.g. when its background window ended, can still take part.
    public var replacingAdvertisements = false
    /// The aggregate, once done.
    public private(set) var result: SecureAggregationResult?
    /// Why the cycle was abandoned, if it was.
    public private(set) var abandonReason: String?

    var advertisements: [Int: SecureAggregationAdvertisement] = [:]
    /// Every advertised public key, to refuse a key used twice in O(1).
    var publicKeys: Set<Data> = []
    var graph: NeighbourGraph?
    /// Devices that sent their bundles (U2), then the bundles by receiver.
    var sharers: Set<Int> = []
    var bundles: [Int: [SecureAggregationEncryptedShare]] = [:]
    /// Devices that sent masked inputs (U3), and their running sum.
    var maskedSenders: Set<Int> = []
    var maskedSum: [UInt32]
    /// Revealed shares by owner, and the devices that revealed.
    var selfMaskShares: [Int: [ShamirShare]] = [:]
    var secretKeyShares: [Int: [ShamirShare]] = [:]
    var responders: Set<Int> = []
    var droppedDevices: Set<Int> = []
    /// consistency_check: the signatures of U3 received (nil before the stage), then the signers U4 once it closed.
    var consistencySignatures: [Int: Data]?
    var consistencySigners: Set<Int>?

    enum CodingKeys: String, CodingKey {
        case configuration, context, stage, result, advertisements, graph, sharers, bundles, responders
        case replacingAdvertisements = "replacing_advertisements"
        case publicKeys = "public_keys"
        case maximumDevices = "maximum_devices"
        case maximumSampleCount = "maximum_sample_count"
        case modelLength = "model_length"
        case abandonReason = "abandon_reason"
        case maskedSenders = "masked_senders"
        case maskedSum = "masked_sum"
        case selfMaskShares = "self_mask_shares"
        case secretKeyShares = "secret_key_shares"
        case droppedDevices = "dropped_devices"
        case consistencySignatures = "consistency_signatures"
        case consistencySigners = "consistency_signers"
    }

    /// A server for a cycle of at most `maximumDevices` devices.
    /// - Throws: `invalid_configuration` from ``SecureAggregationParameters/validate(devices:maximumSampleCount:)``,
    ///   or for a model length below 1.
    public init(configuration: SecureAggregationParameters, context: String, maximumDevices: Int, maximumSampleCount: Int, modelLength: Int)
        throws(SecureAggregationError)
    {
        try configuration.validate(devices: maximumDevices, maximumSampleCount: maximumSampleCount)
        guard modelLength >= 1 else { throw SecureAggregationError(.invalidConfiguration, "the model length must be at least 1, not \(modelLength)") }
        self.configuration = configuration
        self.context = context
        self.maximumDevices = maximumDevices
        self.maximumSampleCount = maximumSampleCount
        self.modelLength = modelLength
        maskedSum = [UInt32](repeating: 0, count: modelLength + 1)
    }

    /// Handles one event: messages return no actions, ``SecureAggregationServerEvent/closeStage`` returns the stage's.
    public mutating func handle(_ event: SecureAggregationServerEvent, using generator: inout some RandomNumberGenerator) throws(SecureAggregationError)
        -> [SecureAggregationServerAction]
    {
        switch event {
        case .advertisement(let message): try receiveAdvertisement(message)
        case .shareKeys(let message): try receiveShareKeys(message)
        case .maskedInput(let message): try addMaskedInput(device: message.device, words: message.words)
        case .consistencySignature(let message): try receiveConsistencySignature(message)
        case .unmask(let message): try receiveUnmask(message)
        case .closeStage: return try closeStage(using: &generator)
        }
        return []
    }

    /// The devices that advertised their keys, ascending.
    public var advertisedDevices: [Int] { advertisements.keys.sorted() }
    /// The devices of the roster (those that advertised when advertise_keys closed), ascending.
    public var participants: [Int] { graph?.participants ?? [] }
    /// The devices that sent their shares.
    public var sharedDevices: Set<Int> { sharers }
    /// The devices that sent their masked input.
    public var maskedDevices: Set<Int> { maskedSenders }
    /// The devices that revealed their shares.
    public var unmaskedDevices: Set<Int> { responders }
    /// The devices that signed the survivor set in consistency_check.
    public var signedDevices: Set<Int> { consistencySigners ?? Set((consistencySignatures ?? [:]).keys) }
    /// Whether the consistency_check stage is open.
    public var isCheckingConsistency: Bool { stage == .consistencyCheck }

    /// The devices whose message the current stage (after advertise_keys) still waits for, ascending: when none
    /// remain the stage can close early.
    public var awaitedDevices: [Int] {
        switch stage {
        case .shareKeys: participants.filter { !sharers.contains($0) }
        case .maskedInput: sharers.sorted().filter { !maskedSenders.contains($0) }
        case .consistencyCheck: maskedSenders.sorted().filter { consistencySignatures?[$0] == nil }
        case .unmask: maskedSenders.sorted().filter { !responders.contains($0) && consistencySigners?.contains($0) != false }
        case .advertiseKeys, .done, .abandoned: []
        }
    }

    // MARK: Messages

    /// Stage advertise_keys: records a device's public keys.
    /// - Throws: `out_of_order`; `invalid_message` for an index below 1 or keys that are not X25519 public keys or are
    ///   of low order (every agreement with one gives the all-zero secret, and its neighbours would refuse it);
    ///   `duplicate_message` for a second advertisement of a device; `duplicate_key` for a key another device uses;
    ///   `invalid_message` beyond ``maximumDevices``. With `consistency_check`: `invalid_message` for an unsigned
    ///   advertisement or a signature its certificate's key does not verify; `duplicate_key` for an identity key or
    ///   subject another device uses.
    public mutating func receiveAdvertisement(_ message: SecureAggregationAdvertisement) throws(SecureAggregationError) {
        try expect(.advertiseKeys, from: message.device)
        guard message.device >= 1 else { throw SecureAggregationError(.invalidMessage, "device indices start at 1, not \(message.device)") }
        let previous = advertisements[message.device]
        guard previous == nil || replacingAdvertisements else {
            throw SecureAggregationError(.duplicateMessage, "device \(message.device) already advertised its keys")
        }
        guard previous != nil || advertisements.count < maximumDevices else {
            throw SecureAggregationError(.invalidMessage, "the cycle admits at most \(maximumDevices) devices")
        }
        for key in [message.channelPublicKey, message.maskPublicKey] {
            guard key.count == SecureAggregationCrypto.keyByteCount else {
                throw SecureAggregationError(.invalidMessage, "device \(message.device) advertised a key of \(key.count) bytes, not 32")
            }
            guard !SecureAggregationCrypto.isLowOrder(key) else {
                throw SecureAggregationError(.invalidMessage, "device \(message.device) advertised a public key of low order")
            }
        }
        var inUse = publicKeys
        if let previous { inUse.subtract([previous.channelPublicKey, previous.maskPublicKey]) }
        guard message.channelPublicKey != message.maskPublicKey, !inUse.contains(message.channelPublicKey), !inUse.contains(message.maskPublicKey) else {
            throw SecureAggregationError(.duplicateKey, "device \(message.device) advertised a public key already in use")
        }
        if configuration.consistencyCheck {
            try message.verifySignature(context: context)
            let certificate = message.signed!.certificate
            for (device, other) in advertisements where device != message.device {
                guard let used = other.signed?.certificate, used.signingPublicKey != certificate.signingPublicKey, used.subject != certificate.subject else {
                    throw SecureAggregationError(.duplicateKey, "device \(message.device) advertised an identity device \(device) already uses")
                }
            }
        }
        if let previous { publicKeys.subtract([previous.channelPublicKey, previous.maskPublicKey]) }
        advertisements[message.device] = message
        publicKeys.formUnion([message.channelPublicKey, message.maskPublicKey])
    }

    /// Stage share_keys: records a device's bundles, one per neighbour.
    /// - Throws: `out_of_order`; `unknown_device` / `dropped_device` for a device not in the roster or dropped;
    ///   `duplicate_message` for a second message; `invalid_message` unless the bundles come from the device and go
    ///   to each of its neighbours exactly once.
    public mutating func receiveShareKeys(_ message: SecureAggregationShareKeys) throws(SecureAggregationError) {
        try expect(.shareKeys, from: message.device)
        guard let graph, graph.contains(message.device) else { throw unknown(message.device) }
        guard !sharers.contains(message.device) else {
            throw SecureAggregationError(.duplicateMessage, "device \(message.device) already sent its shares")
        }
        let receivers = message.shares.map(\.receiver)
        guard message.shares.allSatisfy({ $0.sender == message.device }), receivers.sorted() == graph.neighbours(of: message.device) else {
            throw SecureAggregationError(
                .invalidMessage, "device \(message.device) must send one bundle to each of its neighbours \(graph.neighbours(of: message.device))")
        }
        for share in message.shares { bundles[share.receiver, default: []].append(share) }
        sharers.insert(message.device)
    }

    /// Stage masked_input: adds a device's masked words to the running sum.
    /// - Throws: `out_of_order`; `unknown_device` / `dropped_device`; `duplicate_message`; `invalid_message` for
    ///   a length other than model length + 1 or a word at or above 2^modulus_bits.
    public mutating func addMaskedInput(device: Int, words: [UInt32]) throws(SecureAggregationError) {
        try expect(.maskedInput, from: device)
        guard sharers.contains(device) else { throw unknown(device) }
        guard !maskedSenders.contains(device) else {
            throw SecureAggregationError(.duplicateMessage, "device \(device) already sent its masked input")
        }
        guard words.count == modelLength + 1 else {
            throw SecureAggregationError(.invalidMessage, "device \(device) sent \(words.count) words, not \(modelLength + 1)")
        }
        let mask = configuration.modulusMask
        guard words.allSatisfy({ $0 & ~mask == 0 }) else {
            throw SecureAggregationError(.invalidMessage, "device \(device) sent a word at or above 2^\(configuration.modulusBits)")
        }
        ModularWords.add(words, into: &maskedSum, mask: mask)
        maskedSenders.insert(device)
    }

    /// Stage consistency_check: records a device's signature of U3 (the devices whose masked inputs are in the sum).
    /// - Throws: `out_of_order` outside the stage; `unknown_device` / `dropped_device` for a device not in U3;
    ///   `duplicate_message` for a second signature; `invalid_message` for a signature its certified key does not verify.
    public mutating func receiveConsistencySignature(_ message: SecureAggregationConsistencySignature) throws(SecureAggregationError) {
        try expect(.consistencyCheck, from: message.device)
        guard maskedSenders.contains(message.device) else { throw unknown(message.device) }
        guard consistencySignatures?[message.device] == nil else {
            throw SecureAggregationError(.duplicateMessage, "device \(message.device) already signed the survivors")
        }
        guard let key = advertisements[message.device]?.signed?.certificate.signingPublicKey,
            message.isValid(survivors: maskedSenders.sorted(), context: context, publicKey: key)
        else {
            throw SecureAggregationError(.invalidMessage, "device \(message.device)'s consistency signature does not verify under its certified key")
        }
        consistencySignatures?[message.device] = message.signature
    }

    /// Stage unmask: records a device's revealed shares.
    /// - Throws: `out_of_order`; `unknown_device` / `dropped_device`; `duplicate_message`; `invalid_message`
    ///   unless the shares are exactly those requested, each at the device's index.
    public mutating func receiveUnmask(_ message: SecureAggregationUnmaskResponse) throws(SecureAggregationError) {
        try expect(.unmask, from: message.device)
        guard maskedSenders.contains(message.device), consistencySigners?.contains(message.device) != false else { throw unknown(message.device) }
        guard !responders.contains(message.device) else {
            throw SecureAggregationError(.duplicateMessage, "device \(message.device) already revealed its shares")
        }
        let request = try unmaskRequest(for: message.device)
        let chunks = ShamirSecretSharing.chunkCount(byteCount: SecureAggregationCrypto.keyByteCount)
        let all = message.selfMaskShares + message.secretKeyShares
        guard message.selfMaskShares.map(\.owner) == request.survivors, message.secretKeyShares.map(\.owner) == request.dropped,
            all.allSatisfy({ $0.share.index == message.device && $0.share.values.count == chunks })
        else {
            throw SecureAggregationError(.invalidMessage, "device \(message.device) did not reveal exactly the requested shares")
        }
        for revealed in message.selfMaskShares { selfMaskShares[revealed.owner, default: []].append(revealed.share) }
        for revealed in message.secretKeyShares { secretKeyShares[revealed.owner, default: []].append(revealed.share) }
        responders.insert(message.device)
    }

    // MARK: Per-device messages (also for a driver that lets devices fetch them)

    /// The roster for `device` (from share_keys on): all participants, the graph seed, its neighbours' and its own keys.
    public func roster(for device: Int) throws(SecureAggregationError) -> SecureAggregationRoster {
        guard let graph else { throw SecureAggregationError(.outOfOrder, "the roster exists once advertise_keys has closed") }
        guard graph.contains(device) else { throw unknown(device) }
        let keys = (graph.neighbours(of: device) + [device]).sorted().compactMap { advertisements[$0] }
        return SecureAggregationRoster(participants: graph.participants, graphSeed: graph.seed, keys: keys)
    }

    /// The bundles for `device` (during masked_input): those from neighbours that completed share_keys.
    public func delivery(for device: Int) throws(SecureAggregationError) -> SecureAggregationShareDelivery {
        guard stage == .maskedInput else { throw SecureAggregationError(.outOfOrder, "deliveries exist during masked_input, not \(stage.rawValue)") }
        guard sharers.contains(device) else { throw unknown(device) }
        let shares = (bundles[device] ?? []).filter { sharers.contains($0.sender) }.sorted { $0.sender < $1.sender }
        return SecureAggregationShareDelivery(device: device, shares: shares)
    }

    /// The consistency request for `device` (during consistency_check): U3, every device whose masked input is in the sum.
    public func consistencyRequest(for device: Int) throws(SecureAggregationError) -> SecureAggregationConsistencyRequest {
        guard isCheckingConsistency else { throw SecureAggregationError(.outOfOrder, "consistency requests exist during consistency_check") }
        guard maskedSenders.contains(device) else { throw unknown(device) }
        return SecureAggregationConsistencyRequest(device: device, survivors: maskedSenders.sorted())
    }

    /// The unmask request for `device` (from unmask on): its surviving and its dropped neighbours among those that
    /// completed share_keys; with `consistency_check`, only for a signer, carrying its signing neighbours' signatures.
    public func unmaskRequest(for device: Int) throws(SecureAggregationError) -> SecureAggregationUnmaskRequest {
        guard [.unmask, .done].contains(stage), let graph else {
            throw SecureAggregationError(.outOfOrder, "unmask requests exist once masked_input (and consistency_check) have closed")
        }
        guard maskedSenders.contains(device), consistencySigners?.contains(device) != false else { throw unknown(device) }
        let neighbours = graph.neighbours(of: device).filter { sharers.contains($0) }
        var signatures: [SecureAggregationConsistencySignature]?
        if let signers = consistencySigners, let received = consistencySignatures {
            signatures = neighbours.filter { signers.contains($0) }.compactMap { peer in
                received[peer].map { SecureAggregationConsistencySignature(device: peer, signature: $0) }
            }
        }
        return SecureAggregationUnmaskRequest(
            device: device, survivors: neighbours.filter { maskedSenders.contains($0) }, dropped: neighbours.filter { !maskedSenders.contains($0) },
            signatures: signatures)
    }

    // MARK: Closing stages

    /// Closes the current stage: devices that did not send its message are dropped, the threshold is checked, and
    /// the next stage's messages (or the aggregate) are returned. `generator` draws the public seed of the neighbour
    /// ring when advertise_keys closes (give it `SystemRandomNumberGenerator`: devices must not be able to predict it).
    /// - Throws: `out_of_order` once done or abandoned.
    public mutating func closeStage(using generator: inout some RandomNumberGenerator) throws(SecureAggregationError) -> [SecureAggregationServerAction] {
        switch stage {
        case .advertiseKeys:
            return try closeAdvertisements(graphSeed: Self.drawGraphSeed(using: &generator))
        default:
            return try closeLaterStage()
        }
    }

    /// The public seed ``closeStage(using:)`` would draw for the neighbour ring, drawn by the caller (who records it,
    /// so that replaying a persisted cycle builds the same ring).
    public static func drawGraphSeed(using generator: inout some RandomNumberGenerator) -> Data {
        SecureAggregationCrypto.randomBytes(SecureAggregationCrypto.keyByteCount, using: &generator)
    }

    /// Closes advertise_keys with the given public seed of the neighbour ring (32 bytes).
    /// - Throws: `out_of_order` in any other stage; `invalid_input` for a seed of another length.
    public mutating func closeAdvertisements(graphSeed seed: Data) throws(SecureAggregationError) -> [SecureAggregationServerAction] {
        guard stage == .advertiseKeys else { throw SecureAggregationError(.outOfOrder, "advertise_keys is closed; the server is at \(stage.rawValue)") }
        guard seed.count == SecureAggregationCrypto.keyByteCount else {
            throw SecureAggregationError(.invalidInput, "the graph seed has \(seed.count) bytes, not \(SecureAggregationCrypto.keyByteCount)")
        }
        let participants = advertisements.keys.sorted()
        let graph = NeighbourGraph(participants: participants, shares: configuration.shares, seed: seed)
        self.graph = graph
        if let reason = shortfall(among: Set(participants), of: participants, graph: graph, stage: "advertise_keys") { return abandon(reason) }
        stage = .shareKeys
        var actions: [SecureAggregationServerAction] = []
        for device in participants { actions.append(.sendRoster(device: device, roster: try roster(for: device))) }
        return actions
    }

    /// Closes share_keys, masked_input, consistency_check or unmask (advertise_keys closes with ``closeAdvertisements(graphSeed:)``).
    /// - Throws: `out_of_order` at advertise_keys, once done or abandoned.
    public mutating func closeLaterStage() throws(SecureAggregationError) -> [SecureAggregationServerAction] {
        switch stage {
        case .advertiseKeys:
            throw SecureAggregationError(.outOfOrder, "advertise_keys closes with a graph seed")
        case .shareKeys:
            guard let graph else { return abandon("no roster") }
            let missing = graph.participants.filter { !sharers.contains($0) }
            var actions = drop(missing, at: .shareKeys)
            if let reason = shortfall(among: sharers, of: sharers.sorted(), graph: graph, stage: "share_keys") { return actions + abandon(reason) }
            stage = .maskedInput
            for device in sharers.sorted() { actions.append(.deliverShares(device: device, delivery: try delivery(for: device))) }
            return actions
        case .maskedInput:
            guard let graph else { return abandon("no roster") }
            bundles = [:]
            var actions = drop(sharers.sorted().filter { !maskedSenders.contains($0) }, at: .maskedInput)
            if let reason = shortfall(among: maskedSenders, of: sharers.sorted(), graph: graph, stage: "masked_input") { return actions + abandon(reason) }
            stage = configuration.consistencyCheck ? .consistencyCheck : .unmask
            if configuration.consistencyCheck {
                consistencySignatures = [:]
                for device in maskedSenders.sorted() { actions.append(.requestConsistency(device: device, request: try consistencyRequest(for: device))) }
                return actions
            }
            for device in maskedSenders.sorted() { actions.append(.requestUnmask(device: device, request: try unmaskRequest(for: device))) }
            return actions
        case .consistencyCheck:
            guard let graph else { return abandon("no roster") }
            let signers = Set((consistencySignatures ?? [:]).keys)
            consistencySigners = signers
            stage = .unmask
            // Non-signers' inputs are in the sum already; they just will not reveal. Every device to unmask (U3 for
            // self masks, U2 \ U3 for keys) must keep threshold signing neighbours.
            var actions = drop(maskedSenders.sorted().filter { !signers.contains($0) }, at: .consistencyCheck)
            if let reason = shortfall(among: signers, of: sharers.sorted(), graph: graph, stage: "consistency_check") { return actions + abandon(reason) }
            for device in signers.sorted() { actions.append(.requestUnmask(device: device, request: try unmaskRequest(for: device))) }
            return actions
        case .unmask:
            do {
                let result = try unmaskedResult()
                self.result = result
                stage = .done
                maskedSum = []
                return [.finished(result)]
            } catch {
                return abandon(error.message)
            }
        case .done, .abandoned:
            throw SecureAggregationError(.outOfOrder, "the cycle is \(stage.rawValue); no stage is open")
        }
    }

    /// The reason to abandon when one of `devices` keeps fewer than `threshold` neighbours in `live`.
    func shortfall(among live: Set<Int>, of devices: [Int], graph: NeighbourGraph, stage: String) -> String? {
        guard live.count > configuration.threshold else {
            return "after \(stage), \(live.count) devices remain, fewer than threshold + 1 = \(configuration.threshold + 1)"
        }
        for device in devices {
            let count = graph.isComplete ? live.count - (live.contains(device) ? 1 : 0) : graph.neighbours(of: device).filter { live.contains($0) }.count
            if count < configuration.threshold {
                return
                    "after \(stage), device \(device) keeps \(count) of its neighbours, fewer than the threshold \(configuration.threshold) (\(live.count) devices remain)"
            }
        }
        return nil
    }

    mutating func drop(_ devices: [Int], at stage: SecureAggregationStage) -> [SecureAggregationServerAction] {
        guard !devices.isEmpty else { return [] }
        droppedDevices.formUnion(devices)
        return [.dropped(devices: devices, stage: stage)]
    }

    mutating func abandon(_ reason: String) -> [SecureAggregationServerAction] {
        stage = .abandoned
        abandonReason = reason
        bundles = [:]
        maskedSum = []
        return [.abandoned(reason: reason)]
    }

    /// Removes the masks: each survivor's self mask (seed from its neighbours' shares), and each dropped device's
    /// pairwise masks with its surviving neighbours (its s key from its neighbours' shares, checked against its
    /// advertised public key).
    func unmaskedResult() throws(SecureAggregationError) -> SecureAggregationResult {
        guard let graph else { throw SecureAggregationError(.outOfOrder, "no roster") }
        let t = configuration.threshold, bits = configuration.modulusBits
        var sum = maskedSum
        var streams: [MaskExpansion.Stream] = []
        for device in maskedSenders.sorted() {
            let shares = selfMaskShares[device] ?? []
            guard shares.count >= t else {
                throw SecureAggregationError(
                    .belowThreshold, "only \(shares.count) shares of device \(device)'s self-mask seed were revealed, fewer than the threshold \(t)")
            }
            let seed = try ShamirSecretSharing.reconstruct(shares, threshold: t, byteCount: SecureAggregationCrypto.keyByteCount)
            streams.append(MaskExpansion.Stream(seed: Data(seed), subtracting: true))
        }
        for device in sharers.sorted() where !maskedSenders.contains(device) {
            let shares = secretKeyShares[device] ?? []
            guard shares.count >= t else {
                throw SecureAggregationError(
                    .belowThreshold, "only \(shares.count) shares of dropped device \(device)'s key were revealed, fewer than the threshold \(t)")
            }
            let key = try SecureAggregationCrypto.agreementKey(
                Data(try ShamirSecretSharing.reconstruct(shares, threshold: t, byteCount: SecureAggregationCrypto.keyByteCount)))
            guard let advertised = advertisements[device], key.publicKey.rawRepresentation == advertised.maskPublicKey else {
                throw SecureAggregationError(.reconstructionFailed, "the key reconstructed for dropped device \(device) does not match its advertised key")
            }
            for survivor in graph.neighbours(of: device) where maskedSenders.contains(survivor) {
                guard let peerKey = advertisements[survivor]?.maskPublicKey else { continue }
                let seed = try SecureAggregationCrypto.pairwiseMaskSeed(
                    privateKey: key, peerPublicKey: peerKey, device: device, peer: survivor, context: context)
                // The survivor added the mask toward a higher index and subtracted it toward a lower one: undo that.
                streams.append(MaskExpansion.Stream(seed: seed, subtracting: survivor < device))
            }
        }
        try MaskExpansion.apply(streams, to: &sum, modulusBits: bits)
        let total = Int(sum.removeLast())
        let mean = SecureAggregationQuantization.mean(
            sum, totalSampleCount: total, clippingRange: configuration.clippingRange, levels: configuration.quantizationRange)
        return SecureAggregationResult(sum: sum, totalSampleCount: total, survivors: maskedSenders.sorted(), mean: mean)
    }

    func expect(_ expected: SecureAggregationStage, from device: Int) throws(SecureAggregationError) {
        guard !droppedDevices.contains(device) else {
            throw SecureAggregationError(.droppedDevice, "device \(device) was dropped from this cycle")
        }
        guard stage == expected else {
            throw SecureAggregationError(.outOfOrder, "the server is at stage \(stage.rawValue), not \(expected.rawValue)")
        }
    }

    func unknown(_ device: Int) -> SecureAggregationError {
        if droppedDevices.contains(device) { return SecureAggregationError(.droppedDevice, "device \(device) was dropped from this cycle") }
        return SecureAggregationError(.unknownDevice, "device \(device) is not part of this stage of the cycle")
    }
}

public import Foundation
import Crypto
import OrchardSupport

/// The device side of secure aggregation as a pure state machine: each call takes the server's message for the
/// stage and returns the device's answer, or throws and leaves the state unchanged.
///
/// Stages: ``advertiseKeys()`` → ``shareKeys(_:using:)`` → ``maskedInput(_:update:sampleCount:precomputed:using:)`` →
/// ``unmask(_:)`` (repeatable). The device never reveals both the self-mask share and the s-key share of one
/// peer: it records every reveal and refuses a request that contradicts an earlier one.
///
/// Actively secure (Bonawitz et al. 2017, §6; configuration `consistency_check`): the device signs its advertisement
/// with its ``SecureAggregationIdentity``, checks its neighbours' signatures and (given a ``SecureAggregationTrust``)
/// their certificates, and after masked_input signs the survivor set in ``consistencyCheck(_:)``; it unmasks only
/// with at least `threshold` of its neighbours' signatures on that same set. The consistency_check stage reports
/// ``stage`` `consistency_check`.
///
/// The state is `Codable` so an app can persist it between stages; it holds private keys and shares, so store it
/// only where the device's secrets may live.
public struct SecureAggregationDevice: Sendable, Codable {
    /// The device's index (≥ 1).
    public let index: Int
    /// The cycle's configuration.
    public let configuration: SecureAggregationParameters
    /// The cycle's context string (e.g. task and cycle id), bound into every derived key.
    public let context: String
    /// The largest sample count any device may weight its update with.
    public let maximumSampleCount: Int
    /// The model's length in coordinates.
    public let modelLength: Int
    /// The step the device expects next.
    public private(set) var stage: SecureAggregationStage

    var channelPrivateKey: Data
    var maskPrivateKey: Data
    var selfMaskSeed: Data
    /// The public keys, computed once.
    var ownAdvertisement: SecureAggregationAdvertisement
    /// The roster's keys of the neighbours, by device.
    var neighbourKeys: [Int: SecureAggregationAdvertisement] = [:]
    /// The share-channel key with each neighbour (derived once, in share_keys).
    var channelKeys: [Int: Data] = [:]
    /// Shares held for neighbours that completed share_keys, by owner.
    var heldSelfMaskShares: [Int: ShamirShare] = [:]
    var heldSecretKeyShares: [Int: ShamirShare] = [:]
    /// Owners whose self-mask share (resp. s-key share) this device revealed.
    var revealedSelfMask: Set<Int> = []
    var revealedSecretKey: Set<Int> = []
    /// The actively-secure variant: the long-term identity, the authorities trusted, the neighbour graph (from
    /// share_keys) and the survivor set signed in consistency_check with its signature.
    var identity: SecureAggregationIdentity?
    var trust: SecureAggregationTrust?
    var graph: NeighbourGraph?
    var consistencySurvivors: [Int]?
    var consistencySignature: Data?

    enum CodingKeys: String, CodingKey {
        case index, configuration, context, stage
        case maximumSampleCount = "maximum_sample_count"
        case modelLength = "model_length"
        case channelPrivateKey = "channel_private_key"
        case maskPrivateKey = "mask_private_key"
        case selfMaskSeed = "self_mask_seed"
        case ownAdvertisement = "advertisement"
        case neighbourKeys = "neighbour_keys"
        case channelKeys = "channel_keys"
        case heldSelfMaskShares = "held_self_mask_shares"
        case heldSecretKeyShares = "held_secret_key_shares"
        case revealedSelfMask = "revealed_self_mask"
        case revealedSecretKey = "revealed_secret_key"
        case identity, trust, graph
        case consistencySurvivors = "consistency_survivors"
        case consistencySignature = "consistency_signature"
    }

    /// A device with fresh keys and self-mask seed drawn from `generator` (give it `SystemRandomNumberGenerator`);
    /// `identity` signs its messages, `trust` makes it require the actively-secure protocol.
    /// - Throws: `invalid_input` for an index below 1, a model length below 1 or a sample bound below 1; see
    ///   ``init(index:configuration:context:maximumSampleCount:modelLength:secrets:identity:trust:)`` for the rest.
    public init(
        index: Int, configuration: SecureAggregationParameters, context: String, maximumSampleCount: Int, modelLength: Int,
        identity: SecureAggregationIdentity? = nil, trust: SecureAggregationTrust? = nil, using generator: inout some RandomNumberGenerator
    ) throws(SecureAggregationError) {
        try self.init(
            index: index, configuration: configuration, context: context, maximumSampleCount: maximumSampleCount, modelLength: modelLength,
            secrets: SecureAggregationSecrets(using: &generator), identity: identity, trust: trust)
    }

    /// A device with secrets made earlier (a device that advertises its public keys before it learns its index).
    /// - Throws: `invalid_input` for an index below 1, a model length below 1 or a sample bound below 1;
    ///   `verification_failed` with a `trust` but a configuration without `consistency_check` (a malicious server
    ///   would turn it off), without an identity, or with an identity whose certificate the trust refuses;
    ///   `invalid_configuration` for `consistency_check` without an identity.
    public init(
        index: Int, configuration: SecureAggregationParameters, context: String, maximumSampleCount: Int, modelLength: Int, secrets: SecureAggregationSecrets,
        identity: SecureAggregationIdentity? = nil, trust: SecureAggregationTrust? = nil
    ) throws(SecureAggregationError) {
        guard index >= 1 else { throw SecureAggregationError(.invalidInput, "device indices start at 1, not \(index)") }
        guard modelLength >= 1, maximumSampleCount >= 1 else {
            throw SecureAggregationError(.invalidInput, "model length (\(modelLength)) and maximum sample count (\(maximumSampleCount)) must be at least 1")
        }
        self.index = index
        self.configuration = configuration
        self.context = context
        self.maximumSampleCount = maximumSampleCount
        self.modelLength = modelLength
        stage = .advertiseKeys
        channelPrivateKey = secrets.channelPrivateKey
        maskPrivateKey = secrets.maskPrivateKey
        selfMaskSeed = secrets.selfMaskSeed
        if let trust {
            guard configuration.consistencyCheck else {
                throw SecureAggregationError(.verificationFailed, "device \(index) trusts an authority and refuses a cycle without consistency_check")
            }
            guard let identity else {
                throw SecureAggregationError(.verificationFailed, "device \(index) trusts an authority but has no identity to sign with")
            }
            try identity.certificate.verify(authorityPublicKeys: trust.authorityPublicKeys, now: trust.now)
        }
        guard !configuration.consistencyCheck || identity != nil else {
            throw SecureAggregationError(.invalidConfiguration, "consistency_check needs an identity on device \(index)")
        }
        self.identity = identity
        self.trust = trust
        let keys = try secrets.publicKeys()
        let advertisement = SecureAggregationAdvertisement(device: index, channelPublicKey: keys.channel, maskPublicKey: keys.mask)
        if let identity { ownAdvertisement = try advertisement.signed(by: identity, context: context) } else { ownAdvertisement = advertisement }
    }

    /// Whether the device waits for ``consistencyCheck(_:)`` (stage consistency_check).
    public var isCheckingConsistency: Bool { stage == .consistencyCheck }

    /// The device's advertisement (its two public keys, signed when it has an identity).
    public var advertisement: SecureAggregationAdvertisement { ownAdvertisement }

    /// Stage advertise_keys: the two public keys to send.
    /// - Throws: `out_of_order` after this stage.
    public mutating func advertiseKeys() throws(SecureAggregationError) -> SecureAggregationAdvertisement {
        try expect(.advertiseKeys)
        stage = .shareKeys
        return ownAdvertisement
    }

    /// Stage share_keys: checks the roster and returns, for each neighbour, Shamir shares (threshold t) of the
    /// self-mask seed and of the s private key, sealed for that neighbour.
    /// - Throws: `out_of_order`; `invalid_message` unless the roster lists this device and exactly its neighbours in
    ///   the graph of the participants and seed; `duplicate_key` for a device listed twice or a public key used
    ///   twice; `invalid_message` when its own keys are missing or changed; `below_threshold` for fewer neighbours
    ///   than the threshold; `invalid_configuration` when the configuration does not hold for the participants.
    public mutating func shareKeys(_ roster: SecureAggregationRoster, using generator: inout some RandomNumberGenerator) throws(SecureAggregationError)
        -> SecureAggregationShareKeys
    {
        try expect(.shareKeys)
        try configuration.validate(devices: roster.participants.count, maximumSampleCount: maximumSampleCount, actualParticipants: true)
        guard Set(roster.participants).count == roster.participants.count else {
            throw SecureAggregationError(.duplicateKey, "the roster lists a participant twice")
        }
        guard roster.participants.contains(index) else {
            throw SecureAggregationError(.invalidMessage, "the roster does not list device \(index) as a participant")
        }
        var byDevice: [Int: SecureAggregationAdvertisement] = [:]
        var publicKeys = Set<Data>()
        for key in roster.keys {
            guard byDevice.updateValue(key, forKey: key.device) == nil else {
                throw SecureAggregationError(.duplicateKey, "the roster lists device \(key.device) twice")
            }
            guard publicKeys.insert(key.channelPublicKey).inserted, publicKeys.insert(key.maskPublicKey).inserted else {
                throw SecureAggregationError(.duplicateKey, "device \(key.device) advertises a public key another entry already uses")
            }
        }
        if configuration.consistencyCheck { try verifySignatures(roster.keys) }
        // The device's own entry: its keys and certificate (an ECDSA signature is randomised, so the one the driver
        // sent may differ from this value's; the keys and certificate are what matter).
        guard let own = byDevice.removeValue(forKey: index), own.channelPublicKey == ownAdvertisement.channelPublicKey,
            own.maskPublicKey == ownAdvertisement.maskPublicKey, own.signed?.certificate == ownAdvertisement.signed?.certificate
        else {
            throw SecureAggregationError(.invalidMessage, "the roster's keys for device \(index) are missing or not the ones it advertised")
        }
        let graph = NeighbourGraph(participants: roster.participants, shares: configuration.shares, seed: roster.graphSeed)
        let neighbours = graph.neighbours(of: index)
        guard Set(neighbours) == Set(byDevice.keys) else {
            throw SecureAggregationError(.invalidMessage, "the roster's keys (\(byDevice.keys.sorted())) are not device \(index)'s neighbours \(neighbours)")
        }
        guard neighbours.count >= configuration.threshold else {
            throw SecureAggregationError(
                .belowThreshold, "device \(index) has \(neighbours.count) neighbours, fewer than the threshold \(configuration.threshold)")
        }
        let t = configuration.threshold
        let seedShares = try ShamirSecretSharing.split(selfMaskSeed, threshold: t, indices: neighbours, using: &generator)
        let keyShares = try ShamirSecretSharing.split(maskPrivateKey, threshold: t, indices: neighbours, using: &generator)
        let channelKey = try SecureAggregationCrypto.agreementKey(channelPrivateKey)
        var sealed: [SecureAggregationEncryptedShare] = []
        var channelKeys: [Int: Data] = [:]
        for (k, neighbour) in neighbours.enumerated() {
            let bundle = ShareBundle(sender: index, receiver: neighbour, selfMaskShare: seedShares[k], secretKeyShare: keyShares[k])
            let key = try SecureAggregationCrypto.channelKey(
                privateKey: channelKey, peerPublicKey: byDevice[neighbour]!.channelPublicKey, device: index, peer: neighbour, context: context)
            channelKeys[neighbour] = key.withUnsafeBytes { Data($0) }
            let ciphertext = try SecureAggregationCrypto.seal(bundle.encoded, key: key, sender: index, receiver: neighbour, context: context, using: &generator)
            sealed.append(SecureAggregationEncryptedShare(sender: index, receiver: neighbour, ciphertext: ciphertext))
        }
        neighbourKeys = byDevice
        self.channelKeys = channelKeys
        if configuration.consistencyCheck { self.graph = graph }
        stage = .maskedInput
        return SecureAggregationShareKeys(device: index, shares: sealed)
    }

    /// Stage masked_input: opens and stores the bundles addressed to this device, then masks the update:
    /// n · q(update) ‖ n, plus the self mask, plus the pairwise mask with every neighbour that sent a bundle (added
    /// toward a higher index, subtracted toward a lower one), modulo 2^modulus_bits.
    /// - Throws: `out_of_order`; `invalid_message` for a bundle from a non-neighbour, twice from one sender, or
    ///   addressed elsewhere; `cryptography_failure` for a bundle that does not authenticate; `below_threshold` for
    ///   fewer bundles than the threshold; `invalid_input` for an update of the wrong length or with a NaN, or a
    ///   sample count outside 1…maximumSampleCount.
    public mutating func maskedInput(
        _ delivery: SecureAggregationShareDelivery, update: [Float], sampleCount: Int, precomputed: SecureAggregationPrecomputedMask? = nil,
        using generator: inout some RandomNumberGenerator
    ) throws(SecureAggregationError) -> SecureAggregationMaskedInput {
        try expect(.maskedInput)
        guard update.count == modelLength else {
            throw SecureAggregationError(.invalidInput, "the update has \(update.count) coordinates, the model \(modelLength)")
        }
        guard (1...maximumSampleCount).contains(sampleCount) else {
            throw SecureAggregationError(.invalidInput, "the sample count must be in 1...\(maximumSampleCount), not \(sampleCount)")
        }
        guard delivery.device == index else {
            throw SecureAggregationError(.invalidMessage, "the delivery is addressed to device \(delivery.device), not \(index)")
        }
        let maskKey = try SecureAggregationCrypto.agreementKey(maskPrivateKey)
        var seedShares: [Int: ShamirShare] = [:], keyShares: [Int: ShamirShare] = [:]
        for share in delivery.shares {
            guard share.receiver == index, let key = channelKeys[share.sender] else {
                throw SecureAggregationError(
                    .invalidMessage, "a bundle from device \(share.sender) to \(share.receiver) is not from a neighbour of device \(index) to it")
            }
            guard seedShares[share.sender] == nil else {
                throw SecureAggregationError(.invalidMessage, "device \(share.sender) sent device \(index) two bundles")
            }
            let plaintext = try SecureAggregationCrypto.open(
                share.ciphertext, key: SymmetricKey(data: key), sender: share.sender, receiver: index, context: context)
            guard let bundle = ShareBundle(plaintext), bundle.sender == share.sender, bundle.receiver == index else {
                throw SecureAggregationError(.invalidMessage, "the bundle from device \(share.sender) is malformed or names other devices")
            }
            seedShares[share.sender] = bundle.selfMaskShare
            keyShares[share.sender] = bundle.secretKeyShare
        }
        guard seedShares.count >= configuration.threshold else {
            throw SecureAggregationError(
                .belowThreshold, "device \(index) received \(seedShares.count) bundles, fewer than the threshold \(configuration.threshold)")
        }
        let mask = configuration.modulusMask
        // The rounding's coin flips need no secrecy (the rounded update is masked): a fast generator seeded once from
        // the caller's, rather than one draw of the caller's (possibly locked, system) generator per two coordinates.
        var rounding = OrchardRandom(seed: generator.next())
        let quantized = try SecureAggregationQuantization.quantize(
            update, clippingRange: configuration.clippingRange, levels: configuration.quantizationRange, using: &rounding)
        let n = UInt64(sampleCount)
        let ahead = precomputed.flatMap { $0.device == index && $0.peers == Set(neighbourKeys.keys) && $0.words.count == quantized.count + 1 ? $0 : nil }
        let masks = ahead?.words
        // The weighted levels and the sample-count word, plus (in the same pass) the masks computed while the device waited.
        var words = [UInt32](repeating: 0, count: quantized.count + 1)
        words.withUnsafeMutableBufferPointer { out in
            quantized.withUnsafeBufferPointer { levels in
                let count = levels.count
                if let masks {
                    masks.withUnsafeBufferPointer { add in
                        for i in 0..<count { out[i] = (UInt32(truncatingIfNeeded: UInt64(levels[i]) &* n) &+ add[i]) & mask }
                        out[count] = (UInt32(truncatingIfNeeded: n) &+ add[count]) & mask
                    }
                } else {
                    for i in 0..<count { out[i] = UInt32(truncatingIfNeeded: UInt64(levels[i]) &* n) & mask }
                    out[count] = UInt32(truncatingIfNeeded: n) & mask
                }
            }
        }
        var streams: [MaskExpansion.Stream] = []
        if let ahead {
            // All the masks are in, less the pairwise masks of neighbours whose bundles did not arrive (they dropped at
            // share_keys).
            for peer in ahead.peers.subtracting(seedShares.keys).sorted() {
                let seed = try SecureAggregationCrypto.pairwiseMaskSeed(
                    privateKey: maskKey, peerPublicKey: neighbourKeys[peer]!.maskPublicKey, device: index, peer: peer, context: context)
                streams.append(MaskExpansion.Stream(seed: seed, subtracting: !(peer < index)))
            }
        } else {
            streams.append(MaskExpansion.Stream(seed: selfMaskSeed, subtracting: false))
            for peer in seedShares.keys.sorted() {
                let seed = try SecureAggregationCrypto.pairwiseMaskSeed(
                    privateKey: maskKey, peerPublicKey: neighbourKeys[peer]!.maskPublicKey, device: index, peer: peer, context: context)
                streams.append(MaskExpansion.Stream(seed: seed, subtracting: peer < index))
            }
        }
        try MaskExpansion.apply(streams, to: &words, modulusBits: configuration.modulusBits)
        heldSelfMaskShares = seedShares
        heldSecretKeyShares = keyShares
        stage = configuration.consistencyCheck ? .consistencyCheck : .unmask
        return SecureAggregationMaskedInput(device: index, words: words)
    }

    /// Once the shares are sent (stage masked_input), what it takes to compute all of the device's masks ahead of
    /// its delivery — off the critical path, while it waits for the other devices; nil in any other stage. The key
    /// agreements are part of ``SecureAggregationMaskPlan/compute()``, not of this call.
    public func maskPlan() throws(SecureAggregationError) -> SecureAggregationMaskPlan? {
        guard stage == .maskedInput else { return nil }
        return SecureAggregationMaskPlan(
            device: index, maskPrivateKey: maskPrivateKey, selfMaskSeed: selfMaskSeed,
            peerKeys: neighbourKeys.keys.sorted().map { ($0, neighbourKeys[$0]!.maskPublicKey) }, context: context, length: modelLength + 1,
            modulusBits: configuration.modulusBits)
    }

    /// Stage unmask: the self-mask seed shares of `survivors` and the s-key shares of `dropped`. May be asked again;
    /// a repeated or compatible request is answered, a contradicting one refused. With consistency_check the request
    /// must carry at least `threshold` valid signatures of distinct neighbours on the survivor set this device signed
    /// (else `verification_failed`, or `out_of_order` before it signed), and its survivors and dropped devices must be
    /// exactly its sharing neighbours in and not in that set (else `inconsistent_request`).
    /// - Throws: `out_of_order`; `invalid_message` for lists that overlap, name this device as dropped, or name
    ///   devices whose bundles it does not hold; `below_threshold` for fewer survivors than the threshold;
    ///   `inconsistent_request` when a survivor's s-key share or a dropped device's self-mask share was revealed
    ///   before (the server would learn that device's input).
    public mutating func unmask(_ request: SecureAggregationUnmaskRequest) throws(SecureAggregationError) -> SecureAggregationUnmaskResponse {
        try expect(.unmask)
        guard request.device == index else {
            throw SecureAggregationError(.invalidMessage, "the unmask request is addressed to device \(request.device), not \(index)")
        }
        if configuration.consistencyCheck { try checkConsistency(request) }
        let survivors = Set(request.survivors).subtracting([index]), dropped = Set(request.dropped)
        guard survivors.count + (request.survivors.contains(index) ? 1 : 0) == request.survivors.count, dropped.count == request.dropped.count else {
            throw SecureAggregationError(.invalidMessage, "the unmask request lists a device twice")
        }
        guard survivors.isDisjoint(with: dropped) else {
            throw SecureAggregationError(
                .inconsistentRequest, "devices \(survivors.intersection(dropped).sorted()) are listed both as survivors and as dropped")
        }
        guard !dropped.contains(index) else {
            throw SecureAggregationError(.invalidMessage, "device \(index) is asked to reveal shares as though it had dropped")
        }
        let unknown = survivors.union(dropped).filter { heldSelfMaskShares[$0] == nil }
        guard unknown.isEmpty else {
            throw SecureAggregationError(.invalidMessage, "devices \(unknown.sorted()) are not neighbours of device \(index) that completed share_keys")
        }
        guard survivors.count + 1 >= configuration.threshold else {
            throw SecureAggregationError(.belowThreshold, "\(survivors.count + 1) survivors are fewer than the threshold \(configuration.threshold)")
        }
        let contradicting = survivors.intersection(revealedSecretKey).union(dropped.intersection(revealedSelfMask))
        guard contradicting.isEmpty else {
            throw SecureAggregationError(.inconsistentRequest, "device \(index) already revealed the other share of devices \(contradicting.sorted())")
        }
        revealedSelfMask.formUnion(survivors)
        revealedSecretKey.formUnion(dropped)
        return SecureAggregationUnmaskResponse(
            device: index,
            selfMaskShares: survivors.sorted().map { SecureAggregationRevealedShare(owner: $0, share: heldSelfMaskShares[$0]!) },
            secretKeyShares: dropped.sorted().map { SecureAggregationRevealedShare(owner: $0, share: heldSecretKeyShares[$0]!) })
    }

    /// Stage consistency_check (after masked_input, with `consistency_check`): checks U3, the devices whose masked
    /// inputs the server holds, and signs it; asked again, answers the same list with the same signature.
    /// - Throws: `out_of_order` outside the stage or without `consistency_check`; `invalid_message` for a request
    ///   addressed elsewhere, a list not strictly ascending, naming non-participants or neighbours that sent no shares,
    ///   or without this device; `below_threshold` when a device to unmask keeps fewer than `threshold` neighbours in
    ///   the list; `inconsistent_request` for a list other than the one already signed.
    public mutating func consistencyCheck(_ request: SecureAggregationConsistencyRequest) throws(SecureAggregationError)
        -> SecureAggregationConsistencySignature
    {
        guard configuration.consistencyCheck else { throw SecureAggregationError(.outOfOrder, "this cycle has no consistency_check stage") }
        // Asked again after signing (a reply that was lost), the device is at unmask and answers the same signature.
        if !(stage == .unmask && consistencySurvivors != nil) { try expect(.consistencyCheck) }
        guard request.device == index else {
            throw SecureAggregationError(.invalidMessage, "the consistency request is addressed to device \(request.device), not \(index)")
        }
        if let signed = consistencySurvivors, let signature = consistencySignature {
            guard signed == request.survivors else {
                throw SecureAggregationError(.inconsistentRequest, "device \(index) already signed the survivors \(signed), not \(request.survivors)")
            }
            return SecureAggregationConsistencySignature(device: index, signature: signature)
        }
        let survivors = request.survivors
        guard zip(survivors, survivors.dropFirst()).allSatisfy({ $0 < $1 }) else {
            throw SecureAggregationError(.invalidMessage, "the survivors must be strictly ascending")
        }
        guard let graph, let identity else { throw SecureAggregationError(.outOfOrder, "device \(index) has no roster") }
        let live = Set(survivors)
        guard live.isSubset(of: graph.participants) else {
            throw SecureAggregationError(.invalidMessage, "the survivors name devices outside the roster: \(live.subtracting(graph.participants).sorted())")
        }
        guard live.contains(index) else {
            throw SecureAggregationError(.invalidMessage, "the survivors do not include device \(index), which sent its masked input")
        }
        let neverShared = live.intersection(neighbourKeys.keys).subtracting(heldSelfMaskShares.keys)
        guard neverShared.isEmpty else {
            throw SecureAggregationError(.invalidMessage, "the survivors include neighbours that sent no shares: \(neverShared.sorted())")
        }
        // Every survivor (its self mask) and every neighbour that shared (its key, if it dropped) must stay unmaskable.
        let t = configuration.threshold
        for device in live.union(heldSelfMaskShares.keys).sorted() {
            let kept = graph.isComplete ? live.count - (live.contains(device) ? 1 : 0) : graph.neighbours(of: device).filter { live.contains($0) }.count
            guard kept >= t else {
                throw SecureAggregationError(
                    .belowThreshold, "device \(device) keeps \(kept) of its neighbours among the survivors, fewer than the threshold \(t)")
            }
        }
        let signature = try identity.sign(consistencySignedBytes(context: context, survivors: survivors))
        consistencySurvivors = survivors
        consistencySignature = signature
        stage = .unmask
        return SecureAggregationConsistencySignature(device: index, signature: signature)
    }

    /// With trust: every roster entry certified by a trusted authority, unexpired; always: signed by its certified
    /// key, and no identity key or subject used by two entries.
    func verifySignatures(_ keys: [SecureAggregationAdvertisement]) throws(SecureAggregationError) {
        var identityKeys = Set<Data>(), subjects = Set<String>()
        for key in keys {
            guard let signed = key.signed else {
                throw SecureAggregationError(.verificationFailed, "the roster's entry for device \(key.device) is not signed")
            }
            if let trust { try signed.certificate.verify(authorityPublicKeys: trust.authorityPublicKeys, now: trust.now) }
            guard SecureAggregationSigning.isValid(signed.signature, of: key.signedBytes(context: context), publicKey: signed.certificate.signingPublicKey)
            else {
                throw SecureAggregationError(.verificationFailed, "the roster's entry for device \(key.device) does not carry its identity key's signature")
            }
            guard identityKeys.insert(signed.certificate.signingPublicKey).inserted, subjects.insert(signed.certificate.subject).inserted else {
                throw SecureAggregationError(.duplicateKey, "the roster's entry for device \(key.device) uses an identity another entry already uses")
            }
        }
    }

    /// The unmask request's consistency part: enough neighbours signed the survivors this device signed, and the
    /// request follows from them.
    func checkConsistency(_ request: SecureAggregationUnmaskRequest) throws(SecureAggregationError) {
        guard let signed = consistencySurvivors else {
            throw SecureAggregationError(.outOfOrder, "device \(index) is at stage consistency_check, not unmask")
        }
        var signers = Set<Int>()
        for signature in request.signatures ?? [] where !signers.contains(signature.device) {
            guard let key = neighbourKeys[signature.device]?.signed?.certificate.signingPublicKey,
                signature.isValid(survivors: signed, context: context, publicKey: key)
            else { continue }
            signers.insert(signature.device)
        }
        guard signers.count >= configuration.threshold else {
            throw SecureAggregationError(
                .verificationFailed,
                "device \(index) has \(signers.count) valid neighbour signatures on its survivor set, fewer than the threshold \(configuration.threshold)")
        }
        let live = Set(signed), sharing = Set(heldSelfMaskShares.keys)
        guard Set(request.survivors).subtracting([index]) == sharing.intersection(live), Set(request.dropped) == sharing.subtracting(live) else {
            throw SecureAggregationError(.inconsistentRequest, "the unmask request's survivors and dropped devices do not follow from the signed survivor set")
        }
    }

    func expect(_ expected: SecureAggregationStage) throws(SecureAggregationError) {
        guard stage == expected else {
            throw SecureAggregationError(.outOfOrder, "device \(index) is at stage \(stage.rawValue), not \(expected.rawValue)")
        }
    }
}

/// A device's secrets for one cycle: its two X25519 private keys and its self-mask seed. Never sent; held only as long
/// as the cycle lasts.
public struct SecureAggregationSecrets: Sendable, Codable {
    let channelPrivateKey: Data
    let maskPrivateKey: Data
    let selfMaskSeed: Data

    enum CodingKeys: String, CodingKey {
        case channelPrivateKey = "channel_private_key"
        case maskPrivateKey = "mask_private_key"
        case selfMaskSeed = "self_mask_seed"
    }

    /// Fresh secrets drawn from `generator` (give it `SystemRandomNumberGenerator`).
    public init(using generator: inout some RandomNumberGenerator) {
        channelPrivateKey = SecureAggregationCrypto.generatePrivateKey(using: &generator)
        maskPrivateKey = SecureAggregationCrypto.generatePrivateKey(using: &generator)
        selfMaskSeed = SecureAggregationCrypto.randomBytes(SecureAggregationCrypto.keyByteCount, using: &generator)
    }

    /// The public keys to advertise: the share-channel key and the mask key, raw 32 bytes each.
    public func publicKeys() throws(SecureAggregationError) -> (channel: Data, mask: Data) {
        (try SecureAggregationCrypto.publicKey(ofPrivateKey: channelPrivateKey), try SecureAggregationCrypto.publicKey(ofPrivateKey: maskPrivateKey))
    }
}

/// What a device's masks are made from (its self-mask seed, and its mask key with each neighbour's public key for
/// the pairwise seeds), to derive and expand before its delivery arrives; holds secrets, so keep it in memory only.
public struct SecureAggregationMaskPlan: Sendable {
    let device: Int
    let maskPrivateKey: Data
    let selfMaskSeed: Data
    let peerKeys: [(peer: Int, publicKey: Data)]
    let context: String
    let length: Int
    let modulusBits: Int

    /// The neighbours whose pairwise masks the plan includes.
    var peers: Set<Int> { Set(peerKeys.map(\.peer)) }

    /// Derives every pairwise seed, then expands and sums every mask (a model's worth of keystream per neighbour,
    /// plus one).
    public func compute() throws(SecureAggregationError) -> SecureAggregationPrecomputedMask {
        let maskKey = try SecureAggregationCrypto.agreementKey(maskPrivateKey)
        var streams = [MaskExpansion.Stream(seed: selfMaskSeed, subtracting: false)]
        for (peer, publicKey) in peerKeys {
            let seed = try SecureAggregationCrypto.pairwiseMaskSeed(privateKey: maskKey, peerPublicKey: publicKey, device: device, peer: peer, context: context)
            streams.append(.init(seed: seed, subtracting: peer < device))
        }
        var words = [UInt32](repeating: 0, count: length)
        try MaskExpansion.apply(streams, to: &words, modulusBits: modulusBits)
        return SecureAggregationPrecomputedMask(device: device, peers: peers, words: words)
    }
}

/// A device's masks summed ahead of its delivery (``SecureAggregationMaskPlan/compute()``).
public struct SecureAggregationPrecomputedMask: Sendable {
    let device: Int
    let peers: Set<Int>
    let words: [UInt32]
}

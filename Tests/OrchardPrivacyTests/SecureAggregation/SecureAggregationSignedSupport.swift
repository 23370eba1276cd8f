import Foundation
import OrchardPrivacy
import OrchardSupport

/// A PKI for the actively-secure tests: one authority, an identity per device, and the devices' trust.
struct SignedFixture {
    static let now = Date(timeIntervalSince1970: 1_750_000_000)
    static let expiry = now.addingTimeInterval(3600)

    var authority: SecureAggregationAuthority
    var identities: [Int: SecureAggregationIdentity]
    var trust: SecureAggregationTrust

    /// Identities `device-1` … `device-n`, valid for an hour after ``now``.
    init(devices n: Int, generator: inout some RandomNumberGenerator) throws {
        authority = SecureAggregationAuthority(using: &generator)
        var identities: [Int: SecureAggregationIdentity] = [:]
        for index in 1...n {
            identities[index] = try SecureAggregationIdentity(authority: authority, subject: "device-\(index)", expiresAt: Self.expiry, using: &generator)
        }
        self.identities = identities
        trust = SecureAggregationTrust(authorityPublicKeys: [authority.publicKey], now: Self.now)
    }

    /// A trusted identity that is not one of the devices' (e.g. one the server obtained).
    func extraIdentity(subject: String, expiresAt: Date = expiry, generator: inout some RandomNumberGenerator) throws -> SecureAggregationIdentity {
        try SecureAggregationIdentity(authority: authority, subject: subject, expiresAt: expiresAt, using: &generator)
    }
}

/// Seven signed devices (threshold 4, SecAgg, consistency_check) and an honest server, driven stage by stage.
struct SignedCycle: DrivenCycle {
    static let configuration = SecureAggregationParameters(threshold: 4, clippingRange: 1, quantizationRange: 1 << 12, consistencyCheck: true)
    static let length = 16

    var generator: SplitMix64
    var pki: SignedFixture
    var devices: [SecureAggregationDevice]
    var server: SecureAggregationServer
    var actions: [SecureAggregationServerAction] = []

    init(devices count: Int = 7, seed: UInt64 = 42) throws {
        generator = SplitMix64(seed: seed)
        pki = try SignedFixture(devices: count, generator: &generator)
        var devices: [SecureAggregationDevice] = []
        for index in 1...count {
            devices.append(
                try SecureAggregationDevice(
                    index: index, configuration: Self.configuration, context: SecAggFixture.context, maximumSampleCount: SecAggFixture.maximumSampleCount,
                    modelLength: Self.length, identity: pki.identities[index], trust: pki.trust, using: &generator))
        }
        self.devices = devices
        server = try SecureAggregationServer(
            configuration: Self.configuration, context: SecAggFixture.context, maximumDevices: count,
            maximumSampleCount: SecAggFixture.maximumSampleCount, modelLength: Self.length)
    }

    /// The consistency requests of the last actions, by device.
    var consistencyRequests: [Int: SecureAggregationConsistencyRequest] {
        var requests: [Int: SecureAggregationConsistencyRequest] = [:]
        for case .requestConsistency(let device, let request) in actions { requests[device] = request }
        return requests
    }

    /// The unmask requests of the last actions, by device.
    var unmaskRequests: [Int: SecureAggregationUnmaskRequest] {
        var requests: [Int: SecureAggregationUnmaskRequest] = [:]
        for case .requestUnmask(let device, let request) in actions { requests[device] = request }
        return requests
    }

    mutating func sign(skipping: Set<Int> = []) throws {
        for (device, request) in consistencyRequests.sorted(by: { $0.key < $1.key }) where !skipping.contains(device) {
            try server.receiveConsistencySignature(try devices[device - 1].consistencyCheck(request))
        }
        actions = try server.closeStage(using: &generator)
    }

    mutating func unmask(skipping: Set<Int> = []) throws -> SecureAggregationResult? {
        for (device, request) in unmaskRequests.sorted(by: { $0.key < $1.key }) where !skipping.contains(device) {
            try server.receiveUnmask(try devices[device - 1].unmask(request))
        }
        actions = try server.closeStage(using: &generator)
        for case .finished(let result) in actions { return result }
        return nil
    }
}

/// The error code `body` throws, if any.
func secAggCode(_ body: () throws -> Void) -> SecureAggregationError.Code? {
    do { try body(); return nil } catch let error as SecureAggregationError { return error.code } catch { return nil }
}

/// A cycle driven in memory by a test: devices and a server exchanging each stage's messages directly.
protocol DrivenCycle {
    var generator: SplitMix64 { get set }
    var devices: [SecureAggregationDevice] { get set }
    var server: SecureAggregationServer { get set }
    var actions: [SecureAggregationServerAction] { get set }
    /// The model length.
    static var length: Int { get }
}

extension DrivenCycle {
    /// Closes the open stage (the generator is copied out and back: through the protocol, `self`'s members are
    /// accessors, and an `inout` member beside another member would overlap).
    mutating func close() throws {
        var random = generator
        var state = server
        actions = try state.closeStage(using: &random)
        server = state
        generator = random
    }

    /// Every device but `skipping` advertises; advertise_keys closes.
    mutating func advertise(skipping: Set<Int> = []) throws {
        for i in devices.indices where !skipping.contains(devices[i].index) { try server.receiveAdvertisement(try devices[i].advertiseKeys()) }
        try close()
    }

    /// The roster the last actions send `device`.
    func roster(_ device: Int) -> SecureAggregationRoster? {
        for case .sendRoster(device, let roster) in actions { return roster }
        return nil
    }

    /// Every rostered device but `skipping` shares; share_keys closes.
    mutating func share(skipping: Set<Int> = []) throws {
        var random = generator
        for case .sendRoster(let device, let roster) in actions where !skipping.contains(device) {
            try server.receiveShareKeys(try devices[device - 1].shareKeys(roster, using: &random))
        }
        generator = random
        try close()
    }

    /// Every device given its shares but `skipping` sends a masked input (device i weighs i); masked_input closes.
    /// Returns the deliveries, by device.
    @discardableResult
    mutating func mask(skipping: Set<Int> = []) throws -> [Int: SecureAggregationShareDelivery] {
        var deliveries: [Int: SecureAggregationShareDelivery] = [:]
        var random = generator
        for case .deliverShares(let device, let delivery) in actions {
            deliveries[device] = delivery
            guard !skipping.contains(device) else { continue }
            let update = (0..<Self.length).map { Float($0) / 20 - 0.3 }
            let masked = try devices[device - 1].maskedInput(delivery, update: update, sampleCount: device, using: &random)
            try server.addMaskedInput(device: device, words: masked.words)
        }
        generator = random
        try close()
        return deliveries
    }
}

import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// The device and server state machines step by step: transitions, and the messages each refuses.
@Suite struct SecureAggregationStageTests {
    static let configuration = SecureAggregationParameters(threshold: 4, clippingRange: 1, quantizationRange: 1 << 12)
    static let length = 16

    static func code(_ body: () throws -> Void) -> SecureAggregationError.Code? {
        do { try body(); return nil } catch let error as SecureAggregationError { return error.code } catch { return nil }
    }

    /// Seven devices and a server, driven to the stage after `through`; returns the last actions.
    struct Cycle: DrivenCycle {
        static var length: Int { SecureAggregationStageTests.length }
        var generator = SplitMix64(seed: 42)
        var devices: [SecureAggregationDevice]
        var server: SecureAggregationServer
        var actions: [SecureAggregationServerAction] = []

        init(devices count: Int = 7) throws {
            devices = try SecAggFixture.devices(
                count, configuration: SecureAggregationStageTests.configuration, length: SecureAggregationStageTests.length, generator: &generator)
            server = try SecureAggregationServer(
                configuration: SecureAggregationStageTests.configuration, context: SecAggFixture.context, maximumDevices: count,
                maximumSampleCount: SecAggFixture.maximumSampleCount, modelLength: SecureAggregationStageTests.length)
        }
    }

    @Test func deviceRefusesStagesOutOfOrder() throws {
        var cycle = try Cycle()
        var device = cycle.devices[0]
        let request = SecureAggregationUnmaskRequest(device: 1, survivors: [2, 3, 4, 5], dropped: [])
        #expect(Self.code { _ = try device.unmask(request) } == .outOfOrder)
        #expect(Self.code { _ = try device.maskedInput(.init(device: 1, shares: []), update: [], sampleCount: 1, using: &cycle.generator) } == .outOfOrder)
        _ = try device.advertiseKeys()
        #expect(device.stage == .shareKeys)
        #expect(Self.code { _ = try device.advertiseKeys() } == .outOfOrder)
    }

    @Test func deviceChecksTheRoster() throws {
        var cycle = try Cycle()
        try cycle.advertise()
        let roster = try #require(cycle.roster(1))
        #expect(roster.participants == Array(1...7) && roster.keys.map(\.device) == Array(1...7))
        var device = cycle.devices[0]
        let mine = roster.keys[0], other = roster.keys[1]
        func refusal(_ keys: [SecureAggregationAdvertisement], participants: [Int] = Array(1...7)) -> SecureAggregationError.Code? {
            var copy = device
            var generator = SplitMix64(seed: 1)
            return Self.code { _ = try copy.shareKeys(.init(participants: participants, graphSeed: roster.graphSeed, keys: keys), using: &generator) }
        }
        // A device listed twice; a key reused by another device.
        #expect(refusal(roster.keys + [other]) == .duplicateKey)
        let clone = SecureAggregationAdvertisement(device: 2, channelPublicKey: mine.channelPublicKey, maskPublicKey: other.maskPublicKey)
        #expect(refusal([mine, clone] + roster.keys.dropFirst(2)) == .duplicateKey)
        // Its own keys missing or replaced.
        #expect(refusal(Array(roster.keys.dropFirst())) == .invalidMessage)
        let forged = SecureAggregationAdvertisement(device: 1, channelPublicKey: Data(other.channelPublicKey.reversed()), maskPublicKey: mine.maskPublicKey)
        #expect(refusal([forged] + roster.keys.dropFirst()) == .invalidMessage)
        // A neighbour's keys missing; the device not a participant; too few neighbours.
        #expect(refusal(Array(roster.keys.dropLast())) == .invalidMessage)
        #expect(refusal(roster.keys, participants: Array(2...7)) == .invalidMessage)
        #expect(refusal(Array(roster.keys.prefix(4)), participants: [1, 2, 3, 4]) == .belowThreshold)
        // The device is still at share_keys, and the real roster works.
        #expect(device.stage == .shareKeys)
        var generator = SplitMix64(seed: 2)
        let message = try device.shareKeys(roster, using: &generator)
        #expect(message.shares.map(\.receiver) == [2, 3, 4, 5, 6, 7] && device.stage == .maskedInput)
    }

    @Test func deviceChecksTheDelivery() throws {
        var cycle = try Cycle()
        try cycle.advertise()
        try cycle.share()
        var delivery: SecureAggregationShareDelivery?
        for case .deliverShares(1, let d) in cycle.actions { delivery = d }
        let real = try #require(delivery)
        #expect(real.shares.map(\.sender) == [2, 3, 4, 5, 6, 7])
        let device = cycle.devices[0]
        let update = [Float](repeating: 0.1, count: Self.length)
        func refusal(_ shares: [SecureAggregationEncryptedShare], update: [Float] = update, samples: Int = 3) -> SecureAggregationError.Code? {
            var copy = device
            var generator = SplitMix64(seed: 1)
            return Self.code { _ = try copy.maskedInput(.init(device: 1, shares: shares), update: update, sampleCount: samples, using: &generator) }
        }
        var tampered = real.shares
        var bytes = tampered[2].ciphertext
        bytes[bytes.startIndex + 30] ^= 0x80
        tampered[2] = .init(sender: tampered[2].sender, receiver: 1, ciphertext: bytes)
        #expect(refusal(tampered) == .cryptographyFailure)
        // A bundle relabelled as coming from another neighbour fails authentication too.
        var relabelled = real.shares
        relabelled[0] = .init(sender: 3, receiver: 1, ciphertext: real.shares[0].ciphertext)
        relabelled[1] = .init(sender: 2, receiver: 1, ciphertext: real.shares[1].ciphertext)
        #expect(refusal(relabelled) == .cryptographyFailure)
        #expect(refusal(real.shares + [real.shares[0]]) == .invalidMessage)
        #expect(refusal([.init(sender: 9, receiver: 1, ciphertext: real.shares[0].ciphertext)]) == .invalidMessage)
        #expect(refusal(Array(real.shares.prefix(3))) == .belowThreshold)
        #expect(refusal(real.shares, update: [0]) == .invalidInput)
        #expect(refusal(real.shares, samples: 0) == .invalidInput)
        #expect(refusal(real.shares, samples: SecAggFixture.maximumSampleCount + 1) == .invalidInput)
        #expect(refusal(real.shares) == nil)
    }

    /// A device never reveals both kinds of share for one peer, whatever the server asks.
    @Test func deviceRefusesContradictingUnmaskRequests() throws {
        var cycle = try Cycle()
        try cycle.advertise()
        try cycle.share()
        _ = try cycle.mask(skipping: [7])
        var device = cycle.devices[0]
        let honest = SecureAggregationUnmaskRequest(device: 1, survivors: [2, 3, 4, 5, 6], dropped: [7])
        let first = try device.unmask(honest)
        #expect(first.selfMaskShares.map(\.owner) == [2, 3, 4, 5, 6] && first.secretKeyShares.map(\.owner) == [7])
        #expect(try device.unmask(honest) == first)  // a repeat is answered alike
        // Now claim 7 survived, or that 2 dropped.
        #expect(Self.code { _ = try device.unmask(.init(device: 1, survivors: [2, 3, 4, 5, 6, 7], dropped: [])) } == .inconsistentRequest)
        #expect(Self.code { _ = try device.unmask(.init(device: 1, survivors: [3, 4, 5, 6], dropped: [2])) } == .inconsistentRequest)
        // The same peer in both lists of one request, on a fresh copy.
        var fresh = cycle.devices[0]
        #expect(Self.code { _ = try fresh.unmask(.init(device: 1, survivors: [2, 3, 4, 5], dropped: [5])) } == .inconsistentRequest)
        #expect(Self.code { _ = try fresh.unmask(.init(device: 1, survivors: [2, 3, 4, 5], dropped: [1])) } == .invalidMessage)
        #expect(Self.code { _ = try fresh.unmask(.init(device: 1, survivors: [2, 3, 4, 5, 9], dropped: [])) } == .invalidMessage)
        #expect(Self.code { _ = try fresh.unmask(.init(device: 1, survivors: [2, 3], dropped: [4, 5, 6, 7])) } == .belowThreshold)
        // Its state after the first answer survives persistence, and with it the refusal.
        var restored = try JSONDecoder().decode(SecureAggregationDevice.self, from: JSONEncoder().encode(device))
        #expect(Self.code { _ = try restored.unmask(.init(device: 1, survivors: [2, 3, 4, 5, 6, 7], dropped: [])) } == .inconsistentRequest)
        #expect(try restored.unmask(honest) == first)
    }

    @Test func serverRefusesDuplicatesAndOutOfOrderMessages() throws {
        var cycle = try Cycle()
        let first = try cycle.devices[0].advertiseKeys()
        try cycle.server.receiveAdvertisement(first)
        #expect(Self.code { try cycle.server.receiveAdvertisement(first) } == .duplicateMessage)
        let copied = SecureAggregationAdvertisement(device: 2, channelPublicKey: first.maskPublicKey, maskPublicKey: Data(repeating: 9, count: 32))
        #expect(Self.code { try cycle.server.receiveAdvertisement(copied) } == .duplicateKey)
        #expect(
            Self.code { try cycle.server.receiveAdvertisement(.init(device: 2, channelPublicKey: Data(count: 31), maskPublicKey: Data(count: 32))) }
                == .invalidMessage)
        #expect(
            Self.code {
                try cycle.server.receiveAdvertisement(.init(device: 0, channelPublicKey: Data(count: 32), maskPublicKey: Data(repeating: 1, count: 32)))
            } == .invalidMessage)
        // Keys of low order (0, 1, a point of order 8, p − 1): every agreement with one gives the all-zero secret.
        let lowOrder = [
            Data(count: 32), Data([1] + [UInt8](repeating: 0, count: 31)),
            Data(hex: "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
            Data([0xEC] + [UInt8](repeating: 0xFF, count: 30) + [0x7F]),
        ]
        let fine = cycle.devices[1].advertisement
        for key in lowOrder {
            #expect(SecureAggregationCrypto.isLowOrder(key))
            for advertisement in [
                SecureAggregationAdvertisement(device: 2, channelPublicKey: key, maskPublicKey: fine.maskPublicKey),
                SecureAggregationAdvertisement(device: 2, channelPublicKey: fine.channelPublicKey, maskPublicKey: key),
            ] {
                #expect(Self.code { try cycle.server.receiveAdvertisement(advertisement) } == .invalidMessage)
            }
        }
        #expect(!SecureAggregationCrypto.isLowOrder(fine.channelPublicKey) && !SecureAggregationCrypto.isLowOrder(fine.maskPublicKey))
        #expect(Self.code { try cycle.server.addMaskedInput(device: 1, words: []) } == .outOfOrder)
        #expect(Self.code { try cycle.server.receiveShareKeys(.init(device: 1, shares: [])) } == .outOfOrder)
        for i in 1..<6 { try cycle.server.receiveAdvertisement(try cycle.devices[i].advertiseKeys()) }
        cycle.actions = try cycle.server.closeStage(using: &cycle.generator)
        #expect(cycle.server.stage == .shareKeys)
        // Device 7 missed advertise_keys: it is not part of the cycle.
        #expect(Self.code { try cycle.server.receiveAdvertisement(try cycle.devices[6].advertiseKeys()) } == .outOfOrder)
        #expect(Self.code { try cycle.server.receiveShareKeys(.init(device: 7, shares: [])) } == .unknownDevice)
        // Share bundles must go to each neighbour exactly once.
        let roster = try #require(cycle.roster(2))
        let message = try cycle.devices[1].shareKeys(roster, using: &cycle.generator)
        #expect(Self.code { try cycle.server.receiveShareKeys(.init(device: 2, shares: Array(message.shares.dropLast()))) } == .invalidMessage)
        #expect(Self.code { try cycle.server.receiveShareKeys(.init(device: 3, shares: message.shares)) } == .invalidMessage)
        try cycle.server.receiveShareKeys(message)
        #expect(Self.code { try cycle.server.receiveShareKeys(message) } == .duplicateMessage)
    }

    @Test func droppedDevicesCannotComeBack() throws {
        var cycle = try Cycle()
        try cycle.advertise()
        try cycle.share(skipping: [3])
        #expect(cycle.actions.first == .dropped(devices: [3], stage: .shareKeys))
        #expect(cycle.server.dropped == [3])
        // Device 3 missed share_keys: its masked input, and anything later, is refused.
        #expect(Self.code { try cycle.server.addMaskedInput(device: 3, words: [UInt32](repeating: 0, count: Self.length + 1)) } == .droppedDevice)
        #expect(Self.code { try cycle.server.receiveShareKeys(.init(device: 3, shares: [])) } == .droppedDevice)
        #expect(Self.code { try cycle.server.addMaskedInput(device: 1, words: [1, 2]) } == .invalidMessage)
        let deliveries = try cycle.mask(skipping: [5])
        #expect(deliveries[1]?.shares.map(\.sender) == [2, 4, 5, 6, 7])  // nothing from device 3
        #expect(cycle.server.dropped == [3, 5])
        #expect(Self.code { try cycle.server.addMaskedInput(device: 5, words: [UInt32](repeating: 0, count: Self.length + 1)) } == .droppedDevice)
        #expect(Self.code { try cycle.server.receiveUnmask(.init(device: 5, selfMaskShares: [], secretKeyShares: [])) } == .droppedDevice)
        var requests: [Int: SecureAggregationUnmaskRequest] = [:]
        for case .requestUnmask(let device, let request) in cycle.actions { requests[device] = request }
        #expect(requests.keys.sorted() == [1, 2, 4, 6, 7])
        #expect(requests[1] == .init(device: 1, survivors: [2, 4, 6, 7], dropped: [5]))
        // An answer that is not exactly what was asked is refused; the right one is taken once.
        let answer = try cycle.devices[0].unmask(requests[1]!)
        #expect(Self.code { try cycle.server.receiveUnmask(.init(device: 1, selfMaskShares: answer.selfMaskShares, secretKeyShares: [])) } == .invalidMessage)
        try cycle.server.receiveUnmask(answer)
        #expect(Self.code { try cycle.server.receiveUnmask(answer) } == .duplicateMessage)
        for device in [2, 4, 6, 7] { try cycle.server.receiveUnmask(try cycle.devices[device - 1].unmask(requests[device]!)) }
        let actions = try cycle.server.closeStage(using: &cycle.generator)
        guard case .finished(let result) = actions.first else {
            Issue.record("not finished: \(actions)")
            return
        }
        #expect(result.survivors == [1, 2, 4, 6, 7])
        #expect(result.totalSampleCount == 20)
        let expected = (0..<Self.length).map { Double($0) / 20 - 0.3 }.map { min(max($0, -1), 1) }
        #expect(SecAggFixture.maximumError(result.mean, expected) < Self.configuration.quantizationStep + 1e-6)
        #expect(cycle.server.stage == .done)
        #expect(Self.code { _ = try cycle.server.closeStage(using: &cycle.generator) } == .outOfOrder)
    }

    @Test func serverAbandonsBelowThreshold() throws {
        var cycle = try Cycle()
        try cycle.advertise(skipping: [1, 2, 3])  // 4 left, threshold 4 needs 5
        guard case .abandoned(let reason) = cycle.actions.first else {
            Issue.record("not abandoned: \(cycle.actions)")
            return
        }
        #expect(reason.contains("advertise_keys"))
        #expect(cycle.server.stage == .abandoned && cycle.server.abandonReason == reason)
        #expect(Self.code { try cycle.server.receiveShareKeys(.init(device: 4, shares: [])) } == .outOfOrder)
        #expect(Self.code { _ = try cycle.server.closeStage(using: &cycle.generator) } == .outOfOrder)
    }

    @Test func handleDispatchesEvents() throws {
        var cycle = try Cycle()
        for i in cycle.devices.indices {
            #expect(try cycle.server.handle(.advertisement(try cycle.devices[i].advertiseKeys()), using: &cycle.generator).isEmpty)
        }
        cycle.actions = try cycle.server.handle(.closeStage, using: &cycle.generator)
        #expect(cycle.actions.count == 7)
        #expect(cycle.server.stage == .shareKeys)
        let expected = try #require(cycle.roster(3))
        #expect(try cycle.server.roster(for: 3) == expected)
    }

    @Test func messagesUseSnakeCaseAndBase64() throws {
        var cycle = try Cycle()
        try cycle.advertise()
        let roster = try #require(cycle.roster(1))
        let json = try #require(String(data: JSONEncoder().encode(roster), encoding: .utf8))
        #expect(json.contains("\"graph_seed\"") && json.contains("\"channel_public_key\"") && json.contains("\"mask_public_key\""))
        #expect(try JSONDecoder().decode(SecureAggregationRoster.self, from: Data(json.utf8)) == roster)
        let response = SecureAggregationUnmaskResponse(
            device: 1, selfMaskShares: [.init(owner: 2, share: .init(index: 1, values: [1, 2]))], secretKeyShares: [])
        let text = try #require(String(data: JSONEncoder().encode(response), encoding: .utf8))
        #expect(text.contains("\"self_mask_shares\"") && text.contains("\"secret_key_shares\""))
    }
}

/// What the server makes of shares that do not fit together.
@Suite struct SecureAggregationReconstructionTests {
    /// A dropped device's key rebuilt from a corrupted share does not match its advertised key: the server abandons
    /// rather than publish a wrong aggregate.
    @Test func corruptedKeyShareAbandons() throws {
        var cycle = try SecureAggregationStageTests.Cycle()
        try cycle.advertise()
        try cycle.share()
        _ = try cycle.mask(skipping: [6])
        var requests: [Int: SecureAggregationUnmaskRequest] = [:]
        for case .requestUnmask(let device, let request) in cycle.actions { requests[device] = request }
        for device in requests.keys.sorted() {
            var answer = try cycle.devices[device - 1].unmask(requests[device]!)
            if device == 1 {
                let share = answer.secretKeyShares[0].share
                var values = share.values
                values[2] = (values[2] + 1) % ShamirSecretSharing.prime
                answer = .init(device: 1, selfMaskShares: answer.selfMaskShares, secretKeyShares: [.init(owner: 6, share: .init(index: 1, values: values))])
            }
            try cycle.server.receiveUnmask(answer)
        }
        let actions = try cycle.server.closeStage(using: &cycle.generator)
        guard case .abandoned(let reason) = actions.first else {
            Issue.record("not abandoned: \(actions)")
            return
        }
        #expect(reason.contains("device 6"))
        #expect(cycle.server.stage == .abandoned)
        #expect(cycle.server.result == nil)
    }
}

extension Data {
    /// Bytes from lowercase hex (test vectors).
    init(hex: String) {
        let digits = Array(hex.utf8)
        self.init((0..<digits.count / 2).map { UInt8(String(decoding: digits[2 * $0..<2 * $0 + 2], as: UTF8.self), radix: 16)! })
    }
}

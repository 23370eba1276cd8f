import Crypto
import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// An actively malicious server against signed devices: Sybils, forged or untrusted keys, inconsistent survivor sets,
/// replayed signatures, requests that contradict the signed set; and the honest server's own early refusals.
@Suite struct SecureAggregationActiveAttackTests {
    static let context = SecAggFixture.context

    /// An advertisement for `device` with fresh X25519 keys (keys the server would control).
    static func fakeAdvertisement(device: Int, generator: inout some RandomNumberGenerator) throws -> SecureAggregationAdvertisement {
        let keys = try SecureAggregationSecrets(using: &generator).publicKeys()
        return SecureAggregationAdvertisement(device: device, channelPublicKey: keys.channel, maskPublicKey: keys.mask)
    }

    /// Device 1's refusal of its roster with entry `device` replaced by `entry`.
    static func rosterRefusal(_ cycle: SignedCycle, replacing device: Int = 2, with entries: [SecureAggregationAdvertisement]) throws -> SecureAggregationError
        .Code?
    {
        let roster = try #require(cycle.roster(1))
        let replaced = entries.map(\.device)
        let keys = (roster.keys.filter { !replaced.contains($0.device) } + entries).sorted { $0.device < $1.device }
        var copy = cycle.devices[0]
        var generator = SplitMix64(seed: 1)
        return secAggCode { _ = try copy.shareKeys(.init(participants: roster.participants, graphSeed: roster.graphSeed, keys: keys), using: &generator) }
    }

    @Test func devicesRefuseForgedAndUntrustedRosterEntries() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        let honest = try #require(cycle.roster(1)?.keys.first { $0.device == 2 })
        var generator = SplitMix64(seed: 5)

        // Without a signature.
        let unsigned = SecureAggregationAdvertisement(device: 2, channelPublicKey: honest.channelPublicKey, maskPublicKey: honest.maskPublicKey)
        #expect(try Self.rosterRefusal(cycle, with: [unsigned]) == .verificationFailed)
        // Keys the server controls under device 2's certificate and signature (a forged signature).
        let fake = try Self.fakeAdvertisement(device: 2, generator: &generator)
        let stolen = SecureAggregationAdvertisement(
            device: 2, channelPublicKey: fake.channelPublicKey, maskPublicKey: fake.maskPublicKey, signed: honest.signed)
        #expect(try Self.rosterRefusal(cycle, with: [stolen]) == .verificationFailed)
        // A flipped signature bit; device 2's signed entry moved to index 3.
        var bits = try #require(honest.signed).signature
        bits[bits.startIndex] ^= 0x01
        let flipped = SecureAggregationAdvertisement(
            device: 2, channelPublicKey: honest.channelPublicKey, maskPublicKey: honest.maskPublicKey,
            signed: .init(certificate: honest.signed!.certificate, signature: bits))
        #expect(try Self.rosterRefusal(cycle, with: [flipped]) == .verificationFailed)
        let entry3 = try #require(cycle.roster(1)?.keys.first { $0.device == 3 })
        let moved = SecureAggregationAdvertisement(
            device: 3, channelPublicKey: honest.channelPublicKey, maskPublicKey: honest.maskPublicKey, signed: honest.signed)
        // Signed entries swapped between indices 2 and 3: the index is not signed (a device signs before it has one), so
        // device 1 shares with them; but HKDF binds both indices into each pair's channel key, so what it sealed for
        // "3" (device 2's keys) does not open at device 2, which is index 2: the swap only makes the exchange fail.
        let swapped = [
            moved,
            SecureAggregationAdvertisement(device: 2, channelPublicKey: entry3.channelPublicKey, maskPublicKey: entry3.maskPublicKey, signed: entry3.signed),
        ]
        #expect(try Self.rosterRefusal(cycle, replacing: 3, with: swapped) == nil)
        var deviceOne = cycle.devices[0]
        let roster = try #require(cycle.roster(1))
        let swappedKeys = (roster.keys.filter { ![2, 3].contains($0.device) } + swapped).sorted { $0.device < $1.device }
        let sealed = try deviceOne.shareKeys(.init(participants: roster.participants, graphSeed: roster.graphSeed, keys: swappedKeys), using: &generator)
        let forThree = try #require(sealed.shares.first { $0.receiver == 3 })
        var deviceTwo = cycle.devices[1]
        _ = try deviceTwo.shareKeys(try #require(cycle.roster(2)), using: &generator)
        let delivery = SecureAggregationShareDelivery(
            device: 2, shares: [SecureAggregationEncryptedShare(sender: 1, receiver: 2, ciphertext: forThree.ciphertext)])
        #expect(
            secAggCode { _ = try deviceTwo.maskedInput(delivery, update: [Float](repeating: 0, count: SignedCycle.length), sampleCount: 1, using: &generator) }
                == .cryptographyFailure)
        // Certified by an authority the device does not trust.
        let rogue = SecureAggregationAuthority(using: &generator)
        let rogueIdentity = try SecureAggregationIdentity(authority: rogue, subject: "device-2", expiresAt: SignedFixture.expiry, using: &generator)
        #expect(try Self.rosterRefusal(cycle, with: [try fake.signed(by: rogueIdentity, context: Self.context)]) == .verificationFailed)
        // Certified by the trusted authority, but expired.
        let expired = try cycle.pki.extraIdentity(subject: "device-2b", expiresAt: SignedFixture.now.addingTimeInterval(-1), generator: &generator)
        #expect(try Self.rosterRefusal(cycle, with: [try fake.signed(by: expired, context: Self.context)]) == .verificationFailed)
        // Signed for another cycle.
        #expect(
            try Self.rosterRefusal(cycle, with: [try fake.signed(by: try cycle.pki.extraIdentity(subject: "x", generator: &generator), context: "other")])
                == .verificationFailed)
        // A valid, trusted, unexpired identity the server holds still works for one entry (the PKI's promise is one per subject).
        let held = try cycle.pki.extraIdentity(subject: "server-held", generator: &generator)
        #expect(try Self.rosterRefusal(cycle, with: [try fake.signed(by: held, context: Self.context)]) == nil)
    }

    @Test func devicesRefuseSybils() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        var generator = SplitMix64(seed: 6)
        // The server holds one trusted identity and uses it for devices 2 and 3.
        let held = try cycle.pki.extraIdentity(subject: "sybil", generator: &generator)
        let two = try Self.fakeAdvertisement(device: 2, generator: &generator).signed(by: held, context: Self.context)
        let three = try Self.fakeAdvertisement(device: 3, generator: &generator).signed(by: held, context: Self.context)
        #expect(try Self.rosterRefusal(cycle, with: [two, three]) == .duplicateKey)
        // Device 2's real identity reused for a fake device 3.
        let real2 = try Self.fakeAdvertisement(device: 3, generator: &generator).signed(by: cycle.pki.identities[2]!, context: Self.context)
        #expect(try Self.rosterRefusal(cycle, replacing: 3, with: [real2]) == .duplicateKey)
        // Two keys certified for one subject.
        let again = try cycle.pki.extraIdentity(subject: "device-2", generator: &generator)
        #expect(
            try Self.rosterRefusal(
                cycle, replacing: 3, with: [try Self.fakeAdvertisement(device: 3, generator: &generator).signed(by: again, context: Self.context)])
                == .duplicateKey)
        // The honest roster passes.
        #expect(try Self.rosterRefusal(cycle, with: []) == nil)
    }

    @Test func trustHoldingDevicesRequireTheActiveProtocol() throws {
        var generator = SplitMix64(seed: 7)
        let pki = try SignedFixture(devices: 2, generator: &generator)
        func make(_ configuration: SecureAggregationParameters, identity: SecureAggregationIdentity?, trust: SecureAggregationTrust?) -> SecureAggregationError
            .Code?
        {
            secAggCode {
                _ = try SecureAggregationDevice(
                    index: 1, configuration: configuration, context: Self.context, maximumSampleCount: 10, modelLength: 4, identity: identity, trust: trust,
                    using: &generator)
            }
        }
        let plain = SecureAggregationParameters(threshold: 2)
        let checked = SecureAggregationParameters(threshold: 2, consistencyCheck: true)
        #expect(make(plain, identity: pki.identities[1], trust: pki.trust) == .verificationFailed)
        #expect(make(checked, identity: nil, trust: pki.trust) == .verificationFailed)
        #expect(make(checked, identity: nil, trust: nil) == .invalidConfiguration)
        // Its own certificate must hold under its trust.
        let later = SecureAggregationTrust(authorityPublicKeys: pki.trust.authorityPublicKeys, now: SignedFixture.expiry)
        #expect(make(checked, identity: pki.identities[1], trust: later) == .verificationFailed)
        #expect(make(checked, identity: pki.identities[1], trust: pki.trust) == nil)
        // Without a trust and without consistency_check, an identity only signs the advertisement.
        #expect(make(plain, identity: pki.identities[1], trust: nil) == nil)
        #expect(make(plain, identity: nil, trust: nil) == nil)
    }

    /// The server splits the devices: 1…4 are told U3 = 1…7, 5…7 are told U3 = {1, 2, 3, 5, 6, 7} (so that 5…7 would
    /// reveal device 4's key while 1…4 reveal its self mask). Each device sees fewer than threshold signatures on its
    /// own list, whatever signatures the server hands it.
    @Test func devicesRefuseInconsistentSurvivorSets() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        try cycle.share()
        try cycle.mask()
        let full = Array(1...7), partial = [1, 2, 3, 5, 6, 7]
        var signatures: [SecureAggregationConsistencySignature] = []
        for device in 1...7 {
            let list = device <= 4 ? full : partial
            signatures.append(try cycle.devices[device - 1].consistencyCheck(.init(device: device, survivors: list)))
        }
        for device in 1...7 {
            let others = full.filter { $0 != device }
            let request =
                device <= 4
                ? SecureAggregationUnmaskRequest(device: device, survivors: others, dropped: [], signatures: signatures)
                : SecureAggregationUnmaskRequest(device: device, survivors: others.filter { $0 != 4 }, dropped: [4], signatures: signatures)
            var copy = cycle.devices[device - 1]
            #expect(secAggCode { _ = try copy.unmask(request) } == .verificationFailed, "device \(device)")
        }
        // A device signs only one list.
        #expect(secAggCode { _ = try cycle.devices[0].consistencyCheck(.init(device: 1, survivors: partial)) } == .inconsistentRequest)
        let again = try cycle.devices[0].consistencyCheck(.init(device: 1, survivors: full))
        #expect(again == signatures[0])
    }

    @Test func devicesRefuseReplayedSignatures() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        try cycle.share()
        try cycle.mask()
        try cycle.sign()
        let honest = try #require(cycle.unmaskRequests[1])
        #expect(honest.signatures?.map(\.device) == [2, 3, 4, 5, 6, 7])
        func refusal(_ signatures: [SecureAggregationConsistencySignature]?, survivors: [Int]? = nil, dropped: [Int]? = nil) -> SecureAggregationError.Code? {
            var copy = cycle.devices[0]
            let request = SecureAggregationUnmaskRequest(
                device: 1, survivors: survivors ?? honest.survivors, dropped: dropped ?? honest.dropped, signatures: signatures)
            return secAggCode { _ = try copy.unmask(request) }
        }
        let identities = cycle.pki.identities
        // Neighbours' genuine signatures, but on another list, or on this list in another cycle.
        let otherList = try (2...7).map {
            try SecureAggregationConsistencySignature(device: $0, signing: Array(2...7), context: Self.context, identity: identities[$0]!)
        }
        #expect(refusal(otherList) == .verificationFailed)
        let otherCycle = try (2...7).map {
            try SecureAggregationConsistencySignature(device: $0, signing: Array(1...7), context: "task-7/cycle-2", identity: identities[$0]!)
        }
        #expect(refusal(otherCycle) == .verificationFailed)
        // One neighbour's signature repeated, signatures relabelled, the device's own, or none at all.
        let first = honest.signatures![0]
        #expect(refusal(Array(repeating: first, count: 6)) == .verificationFailed)
        #expect(refusal(honest.signatures!.map { .init(device: $0.device == 7 ? 2 : $0.device + 1, signature: $0.signature) }) == .verificationFailed)
        let own = try SecureAggregationConsistencySignature(device: 1, signing: Array(1...7), context: Self.context, identity: identities[1]!)
        #expect(refusal(Array(honest.signatures!.prefix(3)) + [own]) == .verificationFailed)
        #expect(refusal(nil) == .verificationFailed)
        #expect(refusal([]) == .verificationFailed)
        // Threshold genuine signatures suffice; the honest request is answered.
        #expect(refusal(Array(honest.signatures!.prefix(4))) == nil)
        #expect(refusal(honest.signatures) == nil)
    }

    @Test func devicesRefuseRequestsThatContradictTheSignedSet() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        try cycle.share()
        try cycle.mask()
        #expect(cycle.devices[0].isCheckingConsistency)
        // Unmask before signing is out of order.
        var early = cycle.devices[0]
        #expect(secAggCode { _ = try early.unmask(.init(device: 1, survivors: Array(2...7), dropped: [], signatures: [])) } == .outOfOrder)
        try cycle.sign()
        let honest = try #require(cycle.unmaskRequests[1])
        func refusal(survivors: [Int], dropped: [Int]) -> SecureAggregationError.Code? {
            var copy = cycle.devices[0]
            return secAggCode { _ = try copy.unmask(.init(device: 1, survivors: survivors, dropped: dropped, signatures: honest.signatures)) }
        }
        // Device 7 signed as a survivor: asking for its key share, or leaving it out, contradicts the signed U3.
        #expect(refusal(survivors: Array(2...6), dropped: [7]) == .inconsistentRequest)
        #expect(refusal(survivors: Array(2...6), dropped: []) == .inconsistentRequest)
        #expect(refusal(survivors: honest.survivors, dropped: honest.dropped) == nil)
    }

    @Test func devicesCheckTheConsistencyRequest() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        try cycle.share(skipping: [6])
        try cycle.mask()
        func refusal(_ survivors: [Int], device: Int = 1) -> SecureAggregationError.Code? {
            var copy = cycle.devices[0]
            return secAggCode { _ = try copy.consistencyCheck(.init(device: device, survivors: survivors)) }
        }
        #expect(refusal([1, 2, 3, 4, 5, 7]) == nil)
        #expect(refusal([1, 2, 3, 4, 5, 7], device: 2) == .invalidMessage)
        #expect(refusal([1, 3, 2, 4, 5, 7]) == .invalidMessage)  // not ascending
        #expect(refusal([1, 2, 2, 3, 4, 5, 7]) == .invalidMessage)  // a device twice
        #expect(refusal([1, 2, 3, 4, 5, 7, 8]) == .invalidMessage)  // not a participant
        #expect(refusal([2, 3, 4, 5, 7]) == .invalidMessage)  // without the device itself
        #expect(refusal([1, 2, 3, 4, 5, 6, 7]) == .invalidMessage)  // device 6 sent no shares
        #expect(refusal([1, 2, 3, 4]) == .belowThreshold)  // 3 neighbours left for device 1
        // A cycle without consistency_check has no such stage.
        var plain = try SecureAggregationStageTests.Cycle()
        #expect(secAggCode { _ = try plain.devices[0].consistencyCheck(.init(device: 1, survivors: [1])) } == .outOfOrder)
    }

    @Test func serverRefusesBadAdvertisements() throws {
        var cycle = try SignedCycle()
        var generator = SplitMix64(seed: 8)
        let one = try cycle.devices[0].advertiseKeys()
        try cycle.server.receiveAdvertisement(one)
        let two = try cycle.devices[1].advertiseKeys()
        // Unsigned; signed by a key other than the certificate's; signed for another cycle.
        let unsigned = SecureAggregationAdvertisement(device: 2, channelPublicKey: two.channelPublicKey, maskPublicKey: two.maskPublicKey)
        #expect(secAggCode { try cycle.server.receiveAdvertisement(unsigned) } == .invalidMessage)
        let fake = try Self.fakeAdvertisement(device: 2, generator: &generator)
        let forged = SecureAggregationAdvertisement(device: 2, channelPublicKey: fake.channelPublicKey, maskPublicKey: fake.maskPublicKey, signed: two.signed)
        #expect(secAggCode { try cycle.server.receiveAdvertisement(forged) } == .invalidMessage)
        let elsewhere = try two.signed(by: cycle.pki.identities[2]!, context: "other")
        #expect(secAggCode { try cycle.server.receiveAdvertisement(elsewhere) } == .invalidMessage)
        // Device 1's identity (or its subject) reused by device 2.
        let reused = try fake.signed(by: cycle.pki.identities[1]!, context: Self.context)
        #expect(secAggCode { try cycle.server.receiveAdvertisement(reused) } == .duplicateKey)
        let sameSubject = try fake.signed(by: try cycle.pki.extraIdentity(subject: "device-1", generator: &generator), context: Self.context)
        #expect(secAggCode { try cycle.server.receiveAdvertisement(sameSubject) } == .duplicateKey)
        // A certificate subject over 256 bytes (the devices would refuse the certificate; the server refuses it early).
        let longSubject = SecureAggregationAdvertisement(
            device: 2, channelPublicKey: two.channelPublicKey, maskPublicKey: two.maskPublicKey,
            signed: .init(
                certificate: .init(
                    signingPublicKey: two.signed!.certificate.signingPublicKey, subject: String(repeating: "x", count: 257),
                    expiresAt: two.signed!.certificate.expiresAt, signature: two.signed!.certificate.signature),
                signature: two.signed!.signature))
        #expect(secAggCode { try cycle.server.receiveAdvertisement(longSubject) } == .invalidMessage)
        // Nothing was recorded; the honest advertisement goes in.
        #expect(cycle.server.advertisedDevices == [1])
        try cycle.server.receiveAdvertisement(two)
        #expect(cycle.server.advertisedDevices == [1, 2])
    }

    @Test func serverChecksConsistencySignatures() throws {
        var cycle = try SignedCycle()
        try cycle.advertise()
        try cycle.share()
        try cycle.mask(skipping: [7])
        let requests = cycle.consistencyRequests
        #expect(requests.keys.sorted() == Array(1...6) && requests[1]?.survivors == Array(1...6))
        // Unmask before consistency_check closes is out of order.
        #expect(secAggCode { _ = try cycle.server.unmaskRequest(for: 1) } == .outOfOrder)
        let one = try cycle.devices[0].consistencyCheck(requests[1]!)
        try cycle.server.receiveConsistencySignature(one)
        #expect(secAggCode { try cycle.server.receiveConsistencySignature(one) } == .duplicateMessage)
        // Device 7 is not in U3 (dropped at masked_input); device 9 is unknown.
        let seven = try SecureAggregationConsistencySignature(device: 7, signing: Array(1...6), context: Self.context, identity: cycle.pki.identities[7]!)
        #expect(secAggCode { try cycle.server.receiveConsistencySignature(seven) } == .droppedDevice)
        #expect(secAggCode { try cycle.server.receiveConsistencySignature(.init(device: 9, signature: one.signature)) } == .unknownDevice)
        // A signature on another list, by another key, or device 1's signature presented as device 2's.
        let wrongList = try SecureAggregationConsistencySignature(device: 2, signing: Array(1...7), context: Self.context, identity: cycle.pki.identities[2]!)
        #expect(secAggCode { try cycle.server.receiveConsistencySignature(wrongList) } == .invalidMessage)
        let wrongKey = try SecureAggregationConsistencySignature(device: 2, signing: Array(1...6), context: Self.context, identity: cycle.pki.identities[3]!)
        #expect(secAggCode { try cycle.server.receiveConsistencySignature(wrongKey) } == .invalidMessage)
        #expect(secAggCode { try cycle.server.receiveConsistencySignature(.init(device: 2, signature: one.signature)) } == .invalidMessage)
        // The dispatcher takes signatures too; then the stage closes and only signers are asked to unmask.
        for device in 2...5 {
            #expect(
                try cycle.server.handle(.consistencySignature(try cycle.devices[device - 1].consistencyCheck(requests[device]!)), using: &cycle.generator)
                    .isEmpty)
        }
        cycle.actions = try cycle.server.closeStage(using: &cycle.generator)
        #expect(cycle.server.dropped == [6, 7] && cycle.server.awaitedDevices == Array(1...5))
        #expect(cycle.unmaskRequests.keys.sorted() == Array(1...5))
        #expect(cycle.unmaskRequests[1]?.signatures?.map(\.device) == [2, 3, 4, 5])
        #expect(secAggCode { try cycle.server.receiveConsistencySignature(try cycle.devices[5].consistencyCheck(requests[6]!)) } == .droppedDevice)
        // Device 6 (input in the sum, did not sign) may not unmask; the signers finish with all six inputs.
        #expect(secAggCode { _ = try cycle.server.unmaskRequest(for: 6) } == .droppedDevice)
        let result = try #require(try cycle.unmask())
        #expect(result.survivors == Array(1...6) && result.totalSampleCount == 21)
    }
}

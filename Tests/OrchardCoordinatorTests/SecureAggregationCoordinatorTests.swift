import Foundation
import OrchardCoordinator
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Testing

/// Secure aggregation settings for the tiny fixture: threshold 2 of a complete graph, the default quantisation.
enum SecureFixture {
    static let settings = SecureAggregationConfig(parameters: SecureAggregationParameters(threshold: 2), stageTimeout: 30)

    /// The fixture's process under secure aggregation: goal `goal`, no over-selection.
    static func host(goal: Int, minimum: Int, settings: SecureAggregationConfig = settings) -> HostProcessRequest {
        var request = Fixture.host(goal: goal, minimum: minimum, overSelection: 1)
        request.serverConfig.maximumSampleCount = 100
        request.serverConfig.secureAggregation = settings
        return request
    }

    /// A diff's values in the coordinator's flat order (tensors by name).
    static func flat(_ diff: [TensorRecord]) -> [Float] {
        diff.sorted { $0.name < $1.name }.flatMap(\.values)
    }

    /// The quantisation step 2c/(Q − 1) of the default settings: the aggregate's error bound per coordinate.
    static var step: Float { Float(settings.parameters.quantizationStep) }
}

/// A device driven by hand over HTTP with the protocol's device state machine.
struct SecureTestDevice {
    let auth: AuthenticateResponse
    let assignment: CycleAssignment
    let update: [Float]
    let samples: Int
    let parameters: SecureAggregationParameters
    var secrets: SecureAggregationSecrets
    var machine: SecureAggregationDevice?
    var generator: SplitMix64
    var index: Int?
    /// Sends the masked input as JSON even when the coordinator offers safetensors (a protocol-2.3 device).
    var jsonOnly = false
    /// The device's certified identity and the authorities it trusts (processes with `consistency_check`).
    var identity: SecureAggregationIdentity?
    var trust: SecureAggregationTrust?

    init(
        auth: AuthenticateResponse, assignment: CycleAssignment, scale: Float, samples: Int, seed: UInt64,
        parameters: SecureAggregationParameters = SecureFixture.settings.parameters
    ) {
        self.parameters = parameters
        self.auth = auth
        self.assignment = assignment
        update = SecureFixture.flat(Fixture.diff(scale))
        self.samples = samples
        generator = SplitMix64(seed: seed)
        secrets = SecureAggregationSecrets(using: &generator)
    }

    func request(
        advertise: SecureAggregationPublicKeys? = nil, shareKeys: SecureAggregationShareKeys? = nil, masked: SecureAggregationMaskedInput? = nil,
        unmask: SecureAggregationUnmaskResponse? = nil
    ) -> SecureAggregationRequest {
        SecureAggregationRequest(
            workerID: auth.workerID, requestKey: assignment.requestKey, advertiseKeys: advertise, shareKeys: shareKeys, maskedInput: masked, unmask: unmask)
    }

    func send(_ request: SecureAggregationRequest, on http: HTTP) async throws -> HTTPResult {
        if request.maskedInput != nil, request.maskedInputFormat == .safetensors {
            return try await http.send(
                "POST", Endpoint.secureAggregation, body: MaskedInputEnvelope.encode(request), token: auth.sessionToken,
                headers: ["Content-Type": MediaType.safetensors])
        }
        return try await http.json("POST", Endpoint.secureAggregation, request, token: auth.sessionToken)
    }

    /// Advertises the device's keys; keeps its index.
    mutating func advertise(on http: HTTP) async throws -> SecureAggregationReply {
        let keys = try secrets.publicKeys()
        let context = SecureAggregationPlan.context(processID: assignment.processID, cycle: assignment.cycle)
        let signed = try identity?.advertisementSignature(context: context, channelPublicKey: keys.channel, maskPublicKey: keys.mask)
        let result = try await send(
            request(advertise: SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask, signed: signed)), on: http)
        #expect(result.status == 200, "\(String(decoding: result.body, as: UTF8.self))")
        let reply = try result.decode(SecureAggregationReply.self)
        index = reply.device
        machine = try SecureAggregationDevice(
            index: reply.device, configuration: parameters,
            context: context, maximumSampleCount: 100, modelLength: update.count, secrets: secrets, identity: identity, trust: trust)
        _ = try machine!.advertiseKeys()
        return reply
    }

    /// The message answering `reply`'s next step, or nil when it says wait or done.
    mutating func answer(_ reply: SecureAggregationReply) throws -> SecureAggregationRequest? {
        switch reply.next {
        case .shareKeys: return request(shareKeys: try machine!.shareKeys(try #require(reply.roster), using: &generator))
        case .maskedInput:
            var message = request(masked: try machine!.maskedInput(try #require(reply.delivery), update: update, sampleCount: samples, using: &generator))
            message.maskedInputFormat = jsonOnly ? .json : try #require(reply.maskedInputFormat, "a 2.4 coordinator offers safetensors")
            return message
        case .consistencyCheck:
            var message = request()
            message.consistencyCheck = try machine!.consistencyCheck(try #require(reply.consistencyRequest))
            return message
        case .unmask: return request(unmask: try machine!.unmask(try #require(reply.unmaskRequest)))
        case .wait, .done: return nil
        }
    }

    /// Polls, and sends the answer to what the poll says; returns the reply to the answer (or to the poll).
    mutating func step(on http: HTTP) async throws -> SecureAggregationReply {
        let polled = try await send(request(), on: http)
        #expect(polled.status == 200, "\(String(decoding: polled.body, as: UTF8.self))")
        let reply = try polled.decode(SecureAggregationReply.self)
        guard let message = try answer(reply) else { return reply }
        let answered = try await send(message, on: http)
        #expect(answered.status == 200, "\(String(decoding: answered.body, as: UTF8.self))")
        return try answered.decode(SecureAggregationReply.self)
    }
}

@Suite(.serialized) struct SecureAggregationCoordinatorTests {
    static let inputs: [(scale: Float, samples: Int)] = [(0.1, 3), (-0.3, 1), (0.2, 7), (0.5, 2), (-0.4, 4), (0.3, 5)]

    /// Hosts, authenticates and admits `count` devices with the fixture's inputs.
    static func fleet(_ harness: Harness, count: Int, goal: Int, minimum: Int, threshold: Int = 2) async throws -> (ProcessStatus, [SecureTestDevice]) {
        var settings = SecureFixture.settings
        settings.parameters.threshold = threshold
        let hosted = try await harness.host(SecureFixture.host(goal: goal, minimum: minimum, settings: settings))
        var devices: [SecureTestDevice] = []
        for i in 0..<count {
            let auth = try await harness.device()
            let assignment = try await harness.join(auth)
            devices.append(
                SecureTestDevice(
                    auth: auth, assignment: assignment, scale: inputs[i].scale, samples: inputs[i].samples, seed: UInt64(100 + i),
                    parameters: settings.parameters))
        }
        return (hosted, devices)
    }

    @Test func theCheckpointIsTheWeightedMeanWithinOneQuantisationStep() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var (hosted, devices) = try await Self.fleet(harness, count: 4, goal: 4, minimum: 3)
            // Two devices send their masked input as safetensors, two as base64 JSON (as protocol-2.3 devices do).
            devices[1].jsonOnly = true
            devices[3].jsonOnly = true
            for i in devices.indices {
                let reply = try await devices[i].advertise(on: harness.http)
                #expect(reply.device == i + 1)
                #expect(reply.next == (i < 3 ? .wait : .shareKeys), "the fourth advertisement reaches the goal and closes advertise_keys")
            }
            // A device not admitted to the cycle cannot join it now.
            let late = try await harness.requestCycle(try await harness.device())
            guard case .rejected = late else { Issue.record("admitted after advertise_keys closed: \(late)"); return }
            var status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .shareKeys)
            #expect(status.currentCycle?.secureAggregation?.advertised == 4)
            // share_keys, masked_input, unmask: each closes as the last device answers.
            for stage in [SecureAggregationStage.shareKeys, .maskedInput, .unmask] {
                for i in devices.indices {
                    let reply = try await devices[i].step(on: harness.http)
                    let last = i == devices.count - 1
                    if stage == .unmask {
                        #expect(reply.next == .done)
                        #expect(reply.cycleClosed == last)
                    } else {
                        #expect(reply.next == (last ? (stage == .shareKeys ? .maskedInput : .unmask) : .wait))
                    }
                }
            }
            status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1)
            #expect(status.currentCycle?.number == 2)
            #expect(status.currentCycle?.secureAggregation?.stage == .advertiseKeys)
            let checkpoint = try await harness.checkpoint(hosted.processID)
            let expected = Fixture.expectedAfterFedAvg(Array(Self.inputs.prefix(4)))
            expectClose(checkpoint, expected, tolerance: SecureFixture.step)
            #expect(checkpoint["embed.weight"] == expected["embed.weight"], "the frozen layer does not move by the rounding noise")
        }
    }

    @Test func dropoutsAtEachStageAreToleratedAndNeverComeBack() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            // Threshold 3 of 5 neighbours: one dropout at share_keys and one at masked_input leave every survivor 3.
            var (hosted, devices) = try await Self.fleet(harness, count: 6, goal: 6, minimum: 4, threshold: 3)
            for i in devices.indices { _ = try await devices[i].advertise(on: harness.http) }
            // Device 6 never shares; share_keys closes at its timeout.
            for i in 0..<5 { _ = try await devices[i].step(on: harness.http) }
            harness.clock.advance(by: .seconds(31))
            await harness.coordinator.tick()
            var status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .maskedInput)
            #expect(status.currentCycle?.secureAggregation?.dropped == 1)
            let back = try await devices[5].send(devices[5].request(), on: harness.http)
            #expect(back.status == 409)
            #expect(back.errorCode == "dropped_device")
            // Device 5 sends no masked input: the others' inputs are unmasked with its key reconstructed.
            for i in 0..<4 { _ = try await devices[i].step(on: harness.http) }
            harness.clock.advance(by: .seconds(31))
            await harness.coordinator.tick()
            status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .unmask)
            for i in 0..<4 {
                let reply = try await devices[i].step(on: harness.http)
                #expect(reply.next == .done)
            }
            status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1)
            expectClose(
                try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(Array(Self.inputs.prefix(4))), tolerance: SecureFixture.step)
        }
    }

    @Test func advertiseKeysClosesAStageTimeoutAfterTheMinimumAdvertised() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var (hosted, devices) = try await Self.fleet(harness, count: 4, goal: 4, minimum: 3)
            for i in 0..<2 { _ = try await devices[i].advertise(on: harness.http) }
            harness.clock.advance(by: .seconds(31))
            await harness.coordinator.tick()
            #expect(
                try await harness.status(hosted.processID).currentCycle?.secureAggregation?.stage == .advertiseKeys,
                "below the minimum, the goal or the cycle's deadline closes it")
            let third = try await devices[2].advertise(on: harness.http)
            #expect(third.next == .wait)
            #expect(third.retryAfter ?? 0 <= 30)
            harness.clock.advance(by: .seconds(30))
            await harness.coordinator.tick()
            let status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .shareKeys)
            #expect(status.currentCycle?.secureAggregation?.advertised == 3)
            let late = try await devices[3].send(
                devices[3].request(
                    advertise: SecureAggregationPublicKeys(channelPublicKey: Data(repeating: 9, count: 32), maskPublicKey: Data(repeating: 8, count: 32))),
                on: harness.http)
            #expect(late.status == 409)
            #expect(late.errorCode == "stage_closed")
            for stage in 0..<3 {
                for i in 0..<3 { _ = try await devices[i].step(on: harness.http) }
                _ = stage
            }
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(
                try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(Array(Self.inputs.prefix(3))), tolerance: SecureFixture.step)
        }
    }

    @Test func aWaitingDeviceComesBackLaterTheLongerItHasWaitedNeverPastTheStageClose() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            // Stage timeout 30 s: polls start at 5 s (a sixth) and grow to at most 10 s (a third).
            var (_, devices) = try await Self.fleet(harness, count: 4, goal: 4, minimum: 3)
            func expectWait(_ reply: SecureAggregationReply, _ seconds: Double, _ comment: Comment) {
                #expect(reply.next == .wait, comment)
                #expect(abs((reply.retryAfter ?? -1) - seconds) < 0.01, "\(comment): retry_after \(reply.retryAfter ?? -1), not \(seconds)")
            }
            expectWait(try await devices[0].advertise(on: harness.http), 5, "just advertised")
            harness.clock.advance(by: .seconds(7))
            expectWait(try await devices[0].step(on: harness.http), 7, "waited 7 s for advertise_keys")
            harness.clock.advance(by: .seconds(20))
            expectWait(try await devices[0].step(on: harness.http), 10, "waited 27 s: a third of the stage timeout")
            for i in 1...2 { expectWait(try await devices[i].advertise(on: harness.http), 5, "device \(i + 1) just advertised") }
            // The minimum advertised: advertise_keys closes 30 s from now.
            harness.clock.advance(by: .seconds(28))
            expectWait(try await devices[0].step(on: harness.http), 2.001, "2 s before advertise_keys closes")
            harness.clock.advance(by: .seconds(2))
            await harness.coordinator.tick()
            for i in 0...1 { expectWait(try await devices[i].step(on: harness.http), 5, "device \(i + 1) shared as share_keys opened") }
            harness.clock.advance(by: .seconds(7))
            expectWait(try await devices[0].step(on: harness.http), 7, "share_keys open for 7 s")
            let dropped = try await devices[3].send(devices[3].request(), on: harness.http)
            #expect(dropped.status == 409, "the fourth device never advertised")
        }
    }

    @Test func belowTheThresholdTheCycleIsAbandonedAndTheNextOpens() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var (hosted, devices) = try await Self.fleet(harness, count: 3, goal: 3, minimum: 3)
            for i in devices.indices { _ = try await devices[i].advertise(on: harness.http) }
            // Only device 1 shares: 1 device cannot be unmasked with threshold 2.
            _ = try await devices[0].step(on: harness.http)
            harness.clock.advance(by: .seconds(31))
            await harness.coordinator.tick()
            let status = try await harness.status(hosted.processID)
            #expect(status.cyclesAbandoned == 1)
            #expect(status.latestCheckpoint == 0)
            #expect(status.currentCycle?.number == 2)
            let stale = try await devices[0].send(devices[0].request(), on: harness.http)
            #expect(stale.status == 409)
            #expect(stale.errorCode == "stage_closed")
        }
    }

    @Test func aRestartBetweenStagesLosesNothingAcknowledgedAndCountsNothingTwice() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var (hosted, devices) = try await Self.fleet(harness, count: 4, goal: 4, minimum: 3)
            for i in devices.indices { _ = try await devices[i].advertise(on: harness.http) }
            for i in devices.indices { _ = try await devices[i].step(on: harness.http) }
            // Two masked inputs acknowledged, then the coordinator restarts.
            var acknowledged: [SecureAggregationRequest] = []
            for i in 0..<2 {
                let polled = try await devices[i].send(devices[i].request(), on: harness.http).decode(SecureAggregationReply.self)
                let message = try #require(try devices[i].answer(polled))
                #expect(try await devices[i].send(message, on: harness.http).status == 200)
                acknowledged.append(message)
            }
            try await harness.restart()
            let resumed = try await harness.status(hosted.processID)
            #expect(resumed.currentCycle?.secureAggregation?.stage == .maskedInput)
            #expect(resumed.currentCycle?.secureAggregation?.masked == 2)
            // The same masked input again is refused: it is in the sum once.
            let again = try await devices[0].send(acknowledged[0], on: harness.http)
            #expect(again.status == 409)
            #expect(again.errorCode == "duplicate_message")
            for i in 2..<4 { _ = try await devices[i].step(on: harness.http) }
            for i in devices.indices { _ = try await devices[i].step(on: harness.http) }
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(
                try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(Array(Self.inputs.prefix(4))), tolerance: SecureFixture.step)
        }
    }

    @Test func badRequestsAreRefusedWithClearCodes() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var (_, devices) = try await Self.fleet(harness, count: 3, goal: 3, minimum: 3)
            // A plain report to a secure-aggregation process.
            let plain = try await harness.report(devices[0].auth, devices[0].assignment, diff: Fixture.diff(0.1), samples: 3)
            #expect(plain.status == 409)
            #expect(plain.errorCode == "aggregation_mode_mismatch")
            // A stage message before advertising.
            let early = try await devices[0].send(
                devices[0].request(unmask: SecureAggregationUnmaskResponse(device: 1, selfMaskShares: [], secretKeyShares: [])), on: harness.http)
            #expect(early.status == 409)
            #expect(early.errorCode == "stage_closed")
            for i in devices.indices { _ = try await devices[i].advertise(on: harness.http) }
            // Two messages in one request.
            let keys = try devices[0].secrets.publicKeys()
            let advertise = SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask)
            let two = try await devices[0].send(
                devices[0].request(advertise: advertise, unmask: SecureAggregationUnmaskResponse(device: 1, selfMaskShares: [], secretKeyShares: [])),
                on: harness.http)
            #expect(two.status == 400)
            // Advertising after advertise_keys closed.
            let late = try await devices[0].send(devices[0].request(advertise: advertise), on: harness.http)
            #expect(late.status == 409)
            #expect(late.errorCode == "stage_closed")
            // Another worker's session, and another device's index.
            var forged = devices[0].request()
            forged.workerID = devices[1].auth.workerID
            #expect(try await devices[0].send(forged, on: harness.http).status == 403)
            let polled = try await devices[0].send(devices[0].request(), on: harness.http).decode(SecureAggregationReply.self)
            var message = try #require(try devices[0].answer(polled)).shareKeys!
            let impostor = SecureAggregationShareKeys(device: 2, shares: message.shares)
            let posed = try await devices[0].send(devices[0].request(shareKeys: impostor), on: harness.http)
            #expect(posed.status == 403)
            // Bundles that do not go to the device's neighbours.
            message = SecureAggregationShareKeys(device: 1, shares: Array(message.shares.prefix(1)))
            let short = try await devices[0].send(devices[0].request(shareKeys: message), on: harness.http)
            #expect(short.status == 422)
            #expect(short.errorCode == "invalid_secure_aggregation_message")
            // Malformed JSON and base64.
            let garbage = try await harness.http.send(
                "POST", Endpoint.secureAggregation, body: Array(#"{"worker_id": 3}"#.utf8), token: devices[0].auth.sessionToken)
            #expect(garbage.status == 400)
            let words =
                #"{"worker_id":"\#(devices[0].auth.workerID)","request_key":"\#(devices[0].assignment.requestKey)","masked_input":{"device":1,"words":"!!"}}"#
            let badWords = try await harness.http.send("POST", Endpoint.secureAggregation, body: Array(words.utf8), token: devices[0].auth.sessionToken)
            #expect(badWords.status == 400)
            // No session; a session of another process with this cycle's request key; a forged token.
            #expect(try await harness.http.json("POST", Endpoint.secureAggregation, devices[0].request()).status == 401)
            var other = SecureFixture.host(goal: 3, minimum: 3)
            other.name = "other"
            _ = try await harness.host(other)
            let stranger = try await harness.device(name: "other")
            var crossed = devices[0].request()
            crossed.workerID = stranger.workerID
            let cross = try await harness.http.json("POST", Endpoint.secureAggregation, crossed, token: stranger.sessionToken)
            #expect(cross.status == 403)
            #expect(cross.errorCode == "session_process_mismatch")
            let forgedToken = try await harness.http.json("POST", Endpoint.secureAggregation, devices[0].request(), token: devices[0].auth.sessionToken + "x")
            #expect(forgedToken.status == 401)
            // A body larger than a message needs an upload place: with every place taken, 503 and nothing read.
            var padded = Array(try WireCoding.encoder().encode(devices[0].request()))
            padded += Array(repeating: UInt8(ascii: " "), count: harness.configuration.maximumMessageBytes)
            let places = harness.configuration.maximumUploadsInFlight
            for place in 0..<places { try harness.coordinator.takeUploadPlace(workerID: "holder-\(place)") }
            let busy = try await harness.http.send(
                "POST", Endpoint.secureAggregation, body: padded, token: devices[0].auth.sessionToken, headers: ["Content-Type": MediaType.json])
            #expect(busy.status == 503)
            #expect(busy.errorCode == "too_many_uploads")
            for place in 0..<places { harness.coordinator.endUpload(workerID: "holder-\(place)") }
            let served = try await harness.http.send(
                "POST", Endpoint.secureAggregation, body: padded, token: devices[0].auth.sessionToken, headers: ["Content-Type": MediaType.json])
            #expect(served.status == 200, "\(String(decoding: served.body, as: UTF8.self))")
            #expect(harness.coordinator.uploadsInFlight == 0)
        }
    }

    @Test func aSignedCycleChecksConsistencyDropsANonSignerAndSurvivesARestart() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var settings = SecureFixture.settings
            settings.parameters.consistencyCheck = true
            let hosted = try await harness.host(SecureFixture.host(goal: 4, minimum: 3, settings: settings))
            var generator = SplitMix64(seed: 42)
            let authority = SecureAggregationAuthority(using: &generator)
            let trust = SecureAggregationTrust(authorityPublicKeys: [authority.publicKey], now: harness.clock.date)
            var devices: [SecureTestDevice] = []
            for i in 0..<4 {
                let auth = try await harness.device()
                var device = SecureTestDevice(
                    auth: auth, assignment: try await harness.join(auth), scale: Self.inputs[i].scale, samples: Self.inputs[i].samples, seed: UInt64(200 + i),
                    parameters: settings.parameters)
                device.identity = try SecureAggregationIdentity(
                    authority: authority, subject: "device-\(i)", expiresAt: harness.clock.date.addingTimeInterval(86_400), using: &generator)
                device.trust = trust
                devices.append(device)
            }
            // Unsigned keys, and keys signed for another cycle, are refused; nothing is counted.
            let keys = try devices[0].secrets.publicKeys()
            let unsigned = try await devices[0].send(
                devices[0].request(advertise: SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask)), on: harness.http)
            #expect(unsigned.status == 422)
            #expect(unsigned.errorCode == "invalid_secure_aggregation_message")
            let identity = try #require(devices[0].identity)
            let elsewhere = try identity.advertisementSignature(
                context: "orchard/secure-aggregation/other/1", channelPublicKey: keys.channel, maskPublicKey: keys.mask)
            let replayed = try await devices[0].send(
                devices[0].request(advertise: SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask, signed: elsewhere)),
                on: harness.http)
            #expect(replayed.status == 422)
            #expect(try await harness.status(hosted.processID).currentCycle?.secureAggregation?.advertised == 0)
            for i in devices.indices { _ = try await devices[i].advertise(on: harness.http) }
            for _ in 0..<2 { for i in devices.indices { _ = try await devices[i].step(on: harness.http) } }
            var status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .consistencyCheck)
            #expect(status.currentCycle?.secureAggregation?.masked == 4)
            // Device 1 signs; a signature of another survivor list and a second signature are refused.
            let polled = try await devices[0].send(devices[0].request(), on: harness.http).decode(SecureAggregationReply.self)
            #expect(polled.next == .consistencyCheck)
            #expect(polled.consistencyRequest?.survivors == [1, 2, 3, 4])
            var forged = devices[0].request()
            forged.consistencyCheck = try SecureAggregationConsistencySignature(
                device: 1, signing: [1, 2, 3], context: SecureAggregationPlan.context(processID: hosted.processID, cycle: 1), identity: identity)
            let wrong = try await devices[0].send(forged, on: harness.http)
            #expect(wrong.status == 422)
            #expect(wrong.errorCode == "invalid_secure_aggregation_message")
            let signature = try #require(try devices[0].answer(polled))
            #expect(try await devices[0].send(signature, on: harness.http).status == 200)
            let twice = try await devices[0].send(signature, on: harness.http)
            #expect(twice.status == 409)
            #expect(twice.errorCode == "duplicate_message")
            // Device 2's signature sent by device 1's worker: another device's index.
            var posing = devices[0].request()
            posing.consistencyCheck = try SecureAggregationConsistencySignature(
                device: 2, signing: [1, 2, 3, 4], context: SecureAggregationPlan.context(processID: hosted.processID, cycle: 1), identity: identity)
            #expect(try await devices[0].send(posing, on: harness.http).status == 403)
            // A restart keeps the acknowledged signature and the stage.
            try await harness.restart()
            status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .consistencyCheck)
            #expect(status.currentCycle?.secureAggregation?.signed == 1)
            // Devices 2 and 3 sign; device 4 does not and is dropped when the stage times out.
            for i in 1..<3 { _ = try await devices[i].step(on: harness.http) }
            harness.clock.advance(by: .seconds(31))
            await harness.coordinator.tick()
            status = try await harness.status(hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .unmask)
            #expect(status.currentCycle?.secureAggregation?.dropped == 1)
            let late = try await devices[3].send(devices[3].request(), on: harness.http)
            #expect(late.status == 409)
            #expect(late.errorCode == "dropped_device")
            // Each signer's unmask request carries its signing neighbours' signatures; its input and the non-signer's are
            // in the aggregate.
            let unmask = try await devices[0].send(devices[0].request(), on: harness.http).decode(SecureAggregationReply.self)
            #expect(unmask.next == .unmask)
            #expect(unmask.unmaskRequest?.signatures?.map(\.device) == [2, 3])
            for i in 0..<3 { _ = try await devices[i].step(on: harness.http) }
            status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1)
            expectClose(
                try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(Array(Self.inputs.prefix(4))), tolerance: SecureFixture.step)
        }
    }

    @Test func overSelectedDevicesBeyondTheGoalAreTurnedAwayAndTheThresholdFollowsTheGoal() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            // Goal 4, six admitted: a roster holds at most 4, so threshold 2 (above half of 3 neighbours) is enough.
            var request = SecureFixture.host(goal: 4, minimum: 3)
            request.serverConfig.overSelection = 1.5
            let hosted = try await harness.host(request)
            var devices: [SecureTestDevice] = []
            for i in 0..<6 {
                let auth = try await harness.device()
                devices.append(
                    SecureTestDevice(
                        auth: auth, assignment: try await harness.join(auth), scale: Self.inputs[i].scale, samples: Self.inputs[i].samples,
                        seed: UInt64(300 + i)))
            }
            for i in 0..<4 { _ = try await devices[i].advertise(on: harness.http) }
            #expect(try await harness.status(hosted.processID).currentCycle?.secureAggregation?.stage == .shareKeys)
            let keys = try devices[4].secrets.publicKeys()
            let late = try await devices[4].send(
                devices[4].request(advertise: SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask)), on: harness.http)
            #expect(late.status == 409)
            #expect(late.errorCode == "stage_closed")
            for _ in 0..<3 { for i in 0..<4 { _ = try await devices[i].step(on: harness.http) } }
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(
                try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(Array(Self.inputs.prefix(4))), tolerance: SecureFixture.step)
            // The rule still holds against the goal: threshold 2 of a goal of 6 (5 neighbours) is refused.
            var tooLow = SecureFixture.host(goal: 6, minimum: 3)
            tooLow.name = "too-low"
            let refused = try await harness.http.json("POST", Endpoint.processes, tooLow, token: Harness.adminToken)
            #expect(refused.status == 400)
            #expect(String(decoding: refused.body, as: UTF8.self).contains("goal_count = 6"))
        }
    }

    @Test func aBinaryMaskedInputIsCheckedAsTheJSONOneIs() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var (hosted, devices) = try await Self.fleet(harness, count: 3, goal: 3, minimum: 3)
            for i in devices.indices { _ = try await devices[i].advertise(on: harness.http) }
            for i in devices.indices { _ = try await devices[i].step(on: harness.http) }
            let polled = try await devices[0].send(devices[0].request(), on: harness.http).decode(SecureAggregationReply.self)
            #expect(polled.next == .maskedInput)
            #expect(polled.maskedInputFormat == .safetensors)
            let message = try #require(try devices[0].answer(polled))
            let body = MaskedInputEnvelope.encode(message)
            let token = devices[0].auth.sessionToken
            func post(_ bytes: [UInt8], token: String? = nil) async throws -> HTTPResult {
                try await harness.http.send(
                    "POST", Endpoint.secureAggregation, body: bytes, token: token ?? devices[0].auth.sessionToken,
                    headers: ["Content-Type": MediaType.safetensors])
            }
            func envelope(_ layout: [(name: String, dtype: DType, shape: [Int])], metadata: [String: String], words: Int) -> [UInt8] {
                Safetensors.encodeHeader(layout: layout, metadata: metadata) + Array(repeating: 0, count: words * 4)
            }
            let header = #"{"device":1,"request_key":"\#(devices[0].assignment.requestKey)","worker_id":"\#(devices[0].auth.workerID)"}"#
            let length = message.maskedInput!.words.count
            let bad: [(String, [UInt8], Int, String)] = [
                ("empty body", [], 400, "malformed_safetensors"),
                ("truncated", Array(body.dropLast(4)), 400, "malformed_safetensors"),
                ("JSON sent as safetensors", Array(try WireCoding.encoder().encode(message)), 400, "malformed_safetensors"),
                (
                    "F32 words", envelope([("masked_input", .float32, [length])], metadata: [MaskedInputEnvelope.metadataKey: header], words: length), 400,
                    "malformed_safetensors"
                ),
                (
                    "rank 2", envelope([("masked_input", .uint32, [1, length])], metadata: [MaskedInputEnvelope.metadataKey: header], words: length), 400,
                    "malformed_safetensors"
                ),
                (
                    "another tensor name", envelope([("words", .uint32, [length])], metadata: [MaskedInputEnvelope.metadataKey: header], words: length), 400,
                    "malformed_safetensors"
                ),
                (
                    "two tensors",
                    envelope(
                        [("masked_input", .uint32, [length]), ("z", .uint32, [1])], metadata: [MaskedInputEnvelope.metadataKey: header], words: length + 1),
                    400, "malformed_safetensors"
                ),
                ("no metadata", envelope([("masked_input", .uint32, [length])], metadata: [:], words: length), 400, "malformed_safetensors"),
                (
                    "an unknown metadata key",
                    envelope(
                        [("masked_input", .uint32, [length])], metadata: [MaskedInputEnvelope.metadataKey: String(header.dropLast()) + #","extra":1}"#],
                        words: length), 400, "malformed_safetensors"
                ),
                (
                    "another metadata pair",
                    envelope([("masked_input", .uint32, [length])], metadata: [MaskedInputEnvelope.metadataKey: header, "x": "y"], words: length), 400,
                    "malformed_safetensors"
                ),
                (
                    "one word short",
                    envelope([("masked_input", .uint32, [length - 1])], metadata: [MaskedInputEnvelope.metadataKey: header], words: length - 1), 422,
                    "invalid_secure_aggregation_message"
                ),
            ]
            for (name, bytes, status, code) in bad {
                let result = try await post(bytes)
                #expect(result.status == status, "\(name): \(String(decoding: result.body, as: UTF8.self))")
                #expect(result.errorCode == code, "\(name)")
            }
            // Another worker's session, another device's index, and a body over the limit.
            var crossed = message
            crossed.workerID = devices[1].auth.workerID
            #expect(try await post(MaskedInputEnvelope.encode(crossed)).status == 403)
            let posed = try await post(body, token: devices[1].auth.sessionToken)
            #expect(posed.status == 403)
            var impostor = message
            impostor.maskedInput = SecureAggregationMaskedInput(device: 2, words: message.maskedInput!.words)
            #expect(try await post(MaskedInputEnvelope.encode(impostor)).status == 403)
            let huge = try await post(
                body + Array(repeating: 0, count: harness.configuration.maximumReportBytes + harness.configuration.maximumMessageBytes + 1 - body.count),
                token: token)
            #expect(huge.status == 413)
            #expect(huge.errorCode == "payload_too_large")
            // Nothing above changed the cycle: the real input is taken once, and again is a duplicate.
            #expect(try await harness.status(hosted.processID).currentCycle?.secureAggregation?.masked == 0)
            #expect(try await post(body).status == 200)
            let again = try await post(body)
            #expect(again.status == 409)
            #expect(again.errorCode == "duplicate_message")
            for i in 1..<3 { _ = try await devices[i].step(on: harness.http) }
            for i in devices.indices { _ = try await devices[i].step(on: harness.http) }
            #expect(try await harness.status(hosted.processID).latestCheckpoint == 1)
            expectClose(
                try await harness.checkpoint(hosted.processID), Fixture.expectedAfterFedAvg(Array(Self.inputs.prefix(3))), tolerance: SecureFixture.step)
        }
    }

    @Test func aPlainProcessRefusesSecureAggregationAndBadSettingsAreRefusedAtHosting() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host()
            let auth = try await harness.device()
            let assignment = try await harness.join(auth)
            let device = SecureTestDevice(auth: auth, assignment: assignment, scale: 0.1, samples: 1, seed: 1)
            let refused = try await device.send(device.request(), on: harness.http)
            #expect(refused.status == 409)
            #expect(refused.errorCode == "aggregation_mode_mismatch")

            func hostingFailure(_ change: (inout HostProcessRequest) -> Void) async throws -> String {
                var request = SecureFixture.host(goal: 4, minimum: 3)
                request.name = "secure"
                change(&request)
                let result = try await harness.http.json("POST", Endpoint.processes, request, token: Harness.adminToken)
                #expect(result.status == 400)
                return (try? result.decode(ErrorBody.self))?.error.message ?? ""
            }
            #expect(try await hostingFailure { $0.serverConfig.maximumSampleCount = 1_000_000 }.contains("wrap"))
            #expect(try await hostingFailure { $0.serverConfig.secureAggregation?.parameters.threshold = 4 }.contains("threshold"))
            #expect(try await hostingFailure { $0.serverConfig.updateNormBound = 1 }.contains("update_norm_bound"))
            #expect(try await hostingFailure { $0.serverConfig.minimumReports = 2 }.contains("minimum_reports"))
            #expect(try await hostingFailure { $0.serverConfig.secureAggregation?.stageTimeout = 0 }.contains("stage_timeout"))
            #expect(try await hostingFailure { $0.serverConfig.secureAggregation?.parameters.shares = 5 }.contains("shares"))

            // A device of protocol 2.2 would send its update in the clear.
            var secure = SecureFixture.host(goal: 4, minimum: 3)
            secure.name = "secure"
            _ = try await harness.host(secure)
            var old = AuthenticateRequest(processName: "secure", processVersion: SemanticVersion(1))
            old.protocolVersion = SemanticVersion(2, 2, 0)
            let outdated = try await harness.http.json("POST", Endpoint.authenticate, old)
            #expect(outdated.status == 400)
            #expect(outdated.errorCode == "unsupported_version")
            // A 2.3 device cannot sign: a process with consistency_check refuses it at authentication, and takes a 2.4 one.
            var signed = SecureFixture.host(goal: 4, minimum: 3)
            signed.name = "signed"
            signed.serverConfig.secureAggregation?.parameters.consistencyCheck = true
            _ = try await harness.host(signed)
            var unsigned = AuthenticateRequest(processName: "signed", processVersion: SemanticVersion(1))
            unsigned.protocolVersion = SemanticVersion(2, 3, 0)
            let unsignedDevice = try await harness.http.json("POST", Endpoint.authenticate, unsigned)
            #expect(unsignedDevice.status == 400)
            #expect(unsignedDevice.errorCode == "unsupported_version")
            #expect(
                try await harness.http.json("POST", Endpoint.authenticate, AuthenticateRequest(processName: "signed", processVersion: SemanticVersion(1)))
                    .status == 200)
        }
    }

    /// Distributed differential privacy: the plan tells each device its share of the noise, the coordinator releases
    /// the unmasked sum over goal_count (fixed denominator) and charges the accountant, and a cycle with fewer
    /// survivors than minimum_reports (too little noise) is not published.
    /// Five devices, all needed to publish (minimum_reports 5), threshold 3 of 4 neighbours.
    static func distributedHost() -> HostProcessRequest {
        var settings = SecureFixture.settings
        settings.parameters.threshold = 3
        return SecureFixture.host(goal: 5, minimum: 5, settings: settings)
    }

    @Test func distributedPrivacyReleasesTheNoisedSumAndRefusesTooFewSurvivors() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Self.distributedHost()
            request.serverConfig.privacy = PrivacyConfig(mode: .distributed, clippingNorm: 1, noiseMultiplier: 1, population: 1000)
            let hosted = try await harness.host(request)
            let parameters = try #require(request.serverConfig.secureAggregation?.parameters)
            var devices: [SecureTestDevice] = []
            for i in 0..<5 {
                let auth = try await harness.device()
                let assignment = try await harness.join(auth)
                // Under privacy every device weighs 1 (the SDK sets the sample count of a noised update to 1).
                devices.append(
                    SecureTestDevice(auth: auth, assignment: assignment, scale: Self.inputs[i].scale, samples: 1, seed: UInt64(40 + i), parameters: parameters))
            }
            let planResult = try await harness.http.send(
                "GET", Endpoint.plan(devices[0].assignment.planID) + "?request_key=\(devices[0].assignment.requestKey)", token: devices[0].auth.sessionToken)
            let plan = try planResult.decode(TrainingPlan.self)
            #expect(plan.localPrivacy?.clippingNorm == 1)
            #expect(abs((plan.localPrivacy?.noiseMultiplier ?? 0) - 1 / 5.0.squareRoot()) < 1e-12, "z / sqrt(minimum_reports)")
            #expect(plan.secureAggregation?.stageTimeout == 30, "the device waits as long as the process's stages")

            for i in devices.indices { _ = try await devices[i].advertise(on: harness.http) }
            for stage in 0..<3 {
                for i in devices.indices { _ = try await devices[i].step(on: harness.http) }
                _ = stage
            }
            let status = try await harness.status(hosted.processID)
            #expect(status.latestCheckpoint == 1)
            let privacy = try #require(status.privacy)
            let expected = try PrivacyAccountant.epsilon(samplingRate: 5.0 / 1000, noiseMultiplier: 1, steps: 1, delta: 1e-5).epsilon
            #expect(privacy.releases == 1 && abs(privacy.epsilon - expected) < 1e-9)
            // initial + Σ x_i / goal_count for the trainable tensors.
            let checkpoint = try await harness.checkpoint(hosted.processID)
            let diffs = (0..<5).map { Fixture.diff(Self.inputs[$0].scale) }
            for tensor in Fixture.weights where !tensor.name.hasPrefix("embed.") {
                let got = try #require(checkpoint[tensor.name])
                for j in tensor.values.indices {
                    let sum = diffs.reduce(Float(0)) { $0 + $1.first { $0.name == tensor.name }!.values[j] }
                    #expect(abs(got[j] - (tensor.values[j] + sum / 5)) <= SecureFixture.step, "\(tensor.name)[\(j)]")
                }
            }
            #expect(checkpoint["embed.weight"] == Fixture.weights[0].values)

            // Cycle 2: four of five masked updates arrive (enough to unmask with threshold 3), fewer than minimum_reports:
            // nothing is published.
            var next: [SecureTestDevice] = []
            for i in 0..<5 {
                let assignment = try await harness.join(devices[i].auth)
                next.append(
                    SecureTestDevice(auth: devices[i].auth, assignment: assignment, scale: 0.1, samples: 1, seed: UInt64(60 + i), parameters: parameters))
            }
            for i in next.indices { _ = try await next[i].advertise(on: harness.http) }
            for i in next.indices { _ = try await next[i].step(on: harness.http) }
            for i in 0..<4 { _ = try await next[i].step(on: harness.http) }
            harness.clock.advance(by: .seconds(31))
            await harness.coordinator.tick()
            #expect(try await harness.status(hosted.processID).currentCycle?.secureAggregation?.stage == .unmask)
            for i in 0..<4 { _ = try await next[i].step(on: harness.http) }
            let after = try await harness.status(hosted.processID)
            #expect(after.cyclesAbandoned == 1)
            #expect(after.latestCheckpoint == 1)
            #expect(after.privacy?.releases == 1, "an unpublished cycle costs nothing")
        }
    }

    @Test func privacyModesAreCheckedAgainstSecureAggregationAtHosting() async throws {
        let harness = try await Harness.start()
        func failure(_ change: (inout HostProcessRequest) -> Void) async throws -> String {
            var request = Self.distributedHost()
            request.serverConfig.privacy = PrivacyConfig(mode: .distributed, clippingNorm: 1, noiseMultiplier: 1, population: 1000)
            change(&request)
            let result = try await harness.http.json("POST", Endpoint.processes, request, token: Harness.adminToken)
            #expect(result.status == 400)
            return (try? result.decode(ErrorBody.self))?.error.message ?? ""
        }
        try await harness.stopping { () async throws in
            #expect(try await failure { $0.serverConfig.privacy?.mode = .central }.contains("mode central"))
            #expect(try await failure { $0.serverConfig.secureAggregation = nil }.contains("needs server_config.secure_aggregation"))
            #expect(try await failure { $0.serverConfig.secureAggregation?.parameters.clippingRange = 2 }.contains("clipping_range"))
            #expect(
                try await failure {
                    $0.serverConfig.privacy?.clippingNorm = nil
                    $0.serverConfig.privacy?.adaptiveClipping = PrivacyConfig.AdaptiveClipping()
                }.contains("adaptive_clipping"))
        }
    }
}

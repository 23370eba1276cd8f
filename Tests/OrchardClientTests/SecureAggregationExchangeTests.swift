import Foundation
@testable import OrchardClient
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import Testing

/// The device's side of secure aggregation as a pure state machine, against an in-memory coordinator built on
/// OrchardPrivacy's server: no I/O, no clock.
@Suite("Secure aggregation exchange")
struct SecureAggregationExchangeTests {
    typealias Action = SecureAggregationExchange.Action

    static let length = 6

    /// `count` exchanges with their updates and sample counts.
    static func devices(_ count: Int, counts: [Int]? = nil, plan: SecureAggregationPlan = SecureFixture.plan()) throws -> (
        exchanges: [SecureAggregationExchange], updates: [[Float]], counts: [Int]
    ) {
        let counts = counts ?? (0..<count).map { 10 * ($0 + 1) }
        let updates = (0..<count).map { SecureFixture.update(device: $0, length: length) }
        let exchanges = try (0..<count).map { i in try SecureFixture.exchange(device: i, plan: plan, update: updates[i], sampleCount: counts[i]) }
        return (exchanges, updates, counts)
    }

    static func coordinator(goal: Int, plan: SecureAggregationPlan = SecureFixture.plan()) throws -> FakeSecureCoordinator {
        try FakeSecureCoordinator(configuration: plan.parameters, goal: goal, maximumSampleCount: plan.maximumSampleCount, modelLength: length)
    }

    static let reported = Action.finished(.reported(ReportReceipt(cycle: SecureFixture.cycle, reportsReceived: nil, retryAfter: nil, fromEarlierWindow: false)))

    /// The requests device `worker` sent, in order.
    static func requests(of worker: String, in coordinator: FakeSecureCoordinator) -> [SecureAggregationRequest] {
        coordinator.log.filter { $0.worker == worker }.map(\.request)
    }

    /// A short name per request.
    static func kind(_ request: SecureAggregationRequest) -> String {
        if request.advertiseKeys != nil { return "advertise_keys" }
        if request.shareKeys != nil { return "share_keys" }
        if request.maskedInput != nil { return "masked_input" }
        if request.consistencyCheck != nil { return "consistency_check" }
        if request.unmask != nil { return "unmask" }
        return "poll"
    }

    // MARK: Happy path

    @Test("three devices reach done; the coordinator's mean is the weighted mean within one quantisation step")
    func happyPath() throws {
        let (exchanges, updates, counts) = try Self.devices(3)
        var driver = LockstepDriver(exchanges: exchanges, coordinator: try Self.coordinator(goal: 3))
        driver.run()
        for i in 0..<3 {
            #expect(driver.terminal(i) == Self.reported, "device \(i): \(driver.actions[i])")
            let kinds = Self.requests(of: "w\(i)", in: driver.coordinator).map(Self.kind).filter { $0 != "poll" }
            #expect(kinds == ["advertise_keys", "share_keys", "masked_input", "unmask"])
            #expect(driver.exchanges[i].deviceIndex == i + 1)
        }
        let result = try #require(driver.coordinator.server.result)
        #expect(result.totalSampleCount == counts.reduce(0, +))
        #expect(result.survivors == [1, 2, 3])
        let expected = SecureFixture.weightedMean(updates, counts: counts)
        let step = SecureFixture.plan().parameters.quantizationStep
        for k in 0..<Self.length {
            let error = abs(Double(result.mean[k]) - expected[k])
            #expect(error <= step + 1e-6, "coordinate \(k): \(result.mean[k]) vs \(expected[k])")
        }
    }

    @Test("with consistency_check, certified devices sign their keys and the survivors, and the mean is the weighted mean")
    func signedHappyPath() throws {
        var generator = SplitMix64(seed: 77)
        let authority = SecureAggregationAuthority(using: &generator)
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let trust = SecureAggregationTrust(authorityPublicKeys: [authority.publicKey], now: now)
        var plan = SecureFixture.plan()
        plan.parameters.consistencyCheck = true
        let counts = [10, 20, 30]
        let updates = (0..<3).map { SecureFixture.update(device: $0, length: Self.length) }
        let exchanges = try (0..<3).map { i in
            let identity = try SecureAggregationIdentity(authority: authority, subject: "d\(i)", expiresAt: now.addingTimeInterval(3600), using: &generator)
            return try SecureFixture.exchange(device: i, plan: plan, update: updates[i], sampleCount: counts[i], identity: identity, trust: trust)
        }
        var driver = LockstepDriver(exchanges: exchanges, coordinator: try Self.coordinator(goal: 3, plan: plan))
        driver.run()
        for i in 0..<3 {
            #expect(driver.terminal(i) == Self.reported, "device \(i): \(driver.actions[i])")
            let kinds = Self.requests(of: "w\(i)", in: driver.coordinator).map(Self.kind).filter { $0 != "poll" }
            #expect(kinds == ["advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask"])
            #expect(Self.requests(of: "w\(i)", in: driver.coordinator).first?.advertiseKeys?.signed?.certificate.subject == "d\(i)")
        }
        let result = try #require(driver.coordinator.server.result)
        let expected = SecureFixture.weightedMean(updates, counts: counts)
        for k in 0..<Self.length { #expect(abs(Double(result.mean[k]) - expected[k]) <= plan.parameters.quantizationStep + 1e-6) }
    }

    @Test("a device that trusts an authority refuses a plan without consistency_check, and a signed plan needs an identity")
    func signedPolicyIsTheDevicesNotTheCoordinators() throws {
        var generator = SplitMix64(seed: 78)
        let authority = SecureAggregationAuthority(using: &generator)
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let identity = try SecureAggregationIdentity(authority: authority, subject: "d0", expiresAt: now.addingTimeInterval(3600), using: &generator)
        let trust = SecureAggregationTrust(authorityPublicKeys: [authority.publicKey], now: now)
        let update = SecureFixture.update(device: 0, length: Self.length)
        #expect(throws: OrchardClientError.self) { try SecureFixture.exchange(device: 0, update: update, sampleCount: 5, identity: identity, trust: trust) }
        var signed = SecureFixture.plan()
        signed.parameters.consistencyCheck = true
        #expect(throws: OrchardClientError.self) { try SecureFixture.exchange(device: 0, plan: signed, update: update, sampleCount: 5) }
        // A coordinator that certifies its own Sybil: the trusting device refuses the roster and sends nothing more.
        let rogue = SecureAggregationAuthority(using: &generator)
        var exchanges = [try SecureFixture.exchange(device: 0, plan: signed, update: update, sampleCount: 5, identity: identity, trust: trust)]
        for i in 1..<3 {
            let sybil = try SecureAggregationIdentity(authority: rogue, subject: "sybil-\(i)", expiresAt: now.addingTimeInterval(3600), using: &generator)
            exchanges.append(
                try SecureFixture.exchange(
                    device: i, plan: signed, update: SecureFixture.update(device: i, length: Self.length), sampleCount: 5, identity: sybil))
        }
        var driver = LockstepDriver(exchanges: exchanges, coordinator: try Self.coordinator(goal: 3, plan: signed))
        driver.run()
        guard case .failed(let error)? = driver.actions[0].last else { Issue.record("device 0 did not fail: \(driver.actions[0])"); return }
        #expect(error.message.contains("verification_failed") || error.message.contains("certif"), "\(error)")
        #expect(Self.requests(of: "w0", in: driver.coordinator).compactMap(\.shareKeys).isEmpty)
    }

    @Test("the first request advertises two 32-byte public keys with the worker and request key; polls carry nothing")
    func firstRequest() throws {
        var exchange = try SecureFixture.exchange(device: 0, update: [0.5, -0.5], sampleCount: 3)
        guard case .send(let request) = exchange.start() else {
            Issue.record("the exchange must start with a request")
            return
        }
        let keys = try #require(request.advertiseKeys)
        #expect(keys.channelPublicKey.count == 32 && keys.maskPublicKey.count == 32 && keys.channelPublicKey != keys.maskPublicKey)
        #expect(request.workerID == "w0" && request.requestKey == "k0" && request.messageCount == 1)
        var generator = OrchardRandom(seed: 1)
        let waiting = SecureAggregationReply(cycle: SecureFixture.cycle, device: 4, stage: .advertiseKeys, next: .wait, retryAfter: 2)
        #expect(exchange.replied(waiting, using: &generator) == .wait(seconds: 2))
        #expect(exchange.deviceIndex == 4)
        #expect(exchange.waitElapsed() == .send(SecureAggregationRequest(workerID: "w0", requestKey: "k0")))
    }

    @Test("equal seeds give equal keys (reproducible simulations); different seeds different ones")
    func seededSecrets() throws {
        var a = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1, seed: 5)
        var b = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1, seed: 5)
        var c = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1, seed: 6)
        let (first, second, third) = (a.start(), b.start(), c.start())
        #expect(first == second)
        #expect(first != third)
    }

    // MARK: Lost answers and drops

    @Test(
        "a message sent again after its answer was lost gets duplicate_message, or stage_closed once its stage closed; the device polls and goes on",
        arguments: [false, true]
    )
    func duplicateMessage(repeatsAsCoordinator: Bool) throws {
        let (exchanges, _, _) = try Self.devices(3)
        var coordinator = try Self.coordinator(goal: 3)
        coordinator.repeatsAsCoordinator = repeatsAsCoordinator
        var driver = LockstepDriver(exchanges: exchanges, coordinator: coordinator)
        var lost: Set<String> = []
        driver.run { i, request, _ in
            // Device 1 loses the answers of its first advertise_keys and of its first share_keys.
            let kind = Self.kind(request)
            guard i == 1, kind == "advertise_keys" || kind == "share_keys", lost.insert(kind).inserted else { return .deliver }
            return .loseAnswer
        }
        for i in 0..<3 { #expect(driver.terminal(i) == Self.reported, "device \(i): \(driver.actions[i])") }
        let kinds = Self.requests(of: "w1", in: driver.coordinator).map(Self.kind)
        // The lost advertise_keys is sent again (duplicate), then a poll learns the index.
        #expect(Array(kinds.prefix(3)) == ["advertise_keys", "advertise_keys", "poll"])
        let share = try #require(kinds.firstIndex(of: "share_keys"))
        #expect(Array(kinds[share...].prefix(3)) == ["share_keys", "share_keys", "poll"])
        let backoffs = driver.actions[1].filter { if case .backoff = $0 { true } else { false } }
        #expect(backoffs.count == 2)
        #expect(driver.coordinator.server.result?.survivors == [1, 2, 3])
        // Both repeats come after their stage closed (the third device's message closes it in the same round).
        let codes = driver.coordinator.errors.filter { $0.worker == "w1" }.map(\.code)
        #expect(codes == (repeatsAsCoordinator ? [.stageClosed, .stageClosed] : [.duplicateMessage, .duplicateMessage]))
    }

    @Test("a device the coordinator dropped (too slow at share_keys) finishes rejected with dropped_device; the others finish")
    func droppedDevice() throws {
        let (exchanges, updates, counts) = try Self.devices(4)
        var driver = LockstepDriver(exchanges: exchanges, coordinator: try Self.coordinator(goal: 4))
        driver.run { i, request, coordinator in
            i == 3 && request.shareKeys != nil && coordinator.server.stage == .shareKeys ? .hold : .deliver
        }
        guard case .finished(.rejected(_, let reason))? = driver.terminal(3) else {
            Issue.record("device 3 should be rejected, got \(driver.actions[3])")
            return
        }
        #expect(reason == "dropped_device")
        for i in 0..<3 { #expect(driver.terminal(i) == Self.reported, "device \(i): \(driver.actions[i])") }
        let result = try #require(driver.coordinator.server.result)
        #expect(result.survivors == [1, 2, 3])
        let expected = SecureFixture.weightedMean(Array(updates.prefix(3)), counts: Array(counts.prefix(3)))
        let step = SecureFixture.plan().parameters.quantizationStep
        for k in 0..<Self.length { #expect(abs(Double(result.mean[k]) - expected[k]) <= step + 1e-6) }
    }

    @Test("stage_closed ends the device's part as rejected; after a retried message it first polls to learn whether it is still in")
    func stageClosed() throws {
        var generator = OrchardRandom(seed: 2)
        var fresh = try SecureFixture.exchange(device: 0, update: [1, 2], sampleCount: 1)
        _ = fresh.start()
        let closed = FakeSecureCoordinator.error(409, .stageClosed, "advertise_keys closed")
        #expect(
            fresh.requestFailed(closed, random: 0)
                == .finished(.rejected(retryAfter: SecureAggregationExchange.defaultRejectionRetryAfter, reason: "stage_closed")))
        #expect(fresh.isOver)

        var retried = try SecureFixture.exchange(device: 0, update: [1, 2], sampleCount: 1)
        guard case .send(let advertise) = retried.start() else { return }
        let backoff = retried.requestFailed(OrchardClientError(.network, "answer lost"), random: 0)
        #expect(backoff == .backoff(retry: 1, seconds: 0.5, error: OrchardClientError(.network, "answer lost")))
        #expect(retried.waitElapsed() == .send(advertise))
        #expect(retried.requestFailed(closed, random: 0) == .send(SecureAggregationRequest(workerID: "w0", requestKey: "k0")))
        let next = retried.replied(
            SecureAggregationReply(cycle: SecureFixture.cycle, device: 2, stage: .advertiseKeys, next: .wait, retryAfter: 3), using: &generator)
        #expect(next == .wait(seconds: 3))
    }

    @Test("done after an abandoned cycle, or before the masked input went out, is a rejection, not a report")
    func doneWithoutContribution() throws {
        var generator = OrchardRandom(seed: 3)
        var abandoned = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1)
        _ = abandoned.start()
        let reply = SecureAggregationReply(cycle: SecureFixture.cycle, device: 1, stage: .abandoned, next: .done, cycleClosed: true)
        guard case .finished(.rejected(_, let reason)) = abandoned.replied(reply, using: &generator) else {
            Issue.record("an abandoned cycle must reject")
            return
        }
        #expect(reason == "secure_aggregation_abandoned")

        var early = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1)
        _ = early.start()
        let done = SecureAggregationReply(cycle: SecureFixture.cycle, device: 1, stage: .done, next: .done, cycleClosed: true)
        guard case .finished(.rejected(_, let excluded)) = early.replied(done, using: &generator) else {
            Issue.record("done before masked input must reject")
            return
        }
        #expect(excluded == "secure_aggregation_excluded")
    }

    // MARK: A malicious or broken coordinator

    @Test("a roster with the device's own key changed fails the device, which sends nothing more")
    func tamperedRoster() throws {
        let (exchanges, _, _) = try Self.devices(3)
        var coordinator = try Self.coordinator(goal: 3)
        var keyGenerator = OrchardRandom(seed: 77)
        let forged = try SecureAggregationCrypto.publicKey(ofPrivateKey: SecureAggregationCrypto.generatePrivateKey(using: &keyGenerator))
        coordinator.tamperRoster = { device, roster in
            guard device == 1 else { return roster }
            let keys = roster.keys.map { key in
                key.device == device ? SecureAggregationAdvertisement(device: device, channelPublicKey: key.channelPublicKey, maskPublicKey: forged) : key
            }
            return SecureAggregationRoster(participants: roster.participants, graphSeed: roster.graphSeed, keys: keys)
        }
        var driver = LockstepDriver(exchanges: exchanges, coordinator: coordinator)
        driver.run()
        guard case .failed(let error)? = driver.terminal(0) else {
            Issue.record("device 0 (index 1) should fail, got \(driver.actions[0])")
            return
        }
        #expect(error.code == .serverError)
        #expect(error.message.contains("share_keys") && error.message.contains("invalid_message"))
        #expect(error.httpStatus == nil && !error.isTransient)
        // Nothing after the roster: its last request is the poll (or advertisement) the roster answered.
        let kinds = Self.requests(of: "w0", in: driver.coordinator).map(Self.kind)
        #expect(!kinds.contains("share_keys") && !kinds.contains("masked_input") && !kinds.contains("unmask"))
        // The failed exchange keeps answering with its failure, never with a request.
        var generator = OrchardRandom(seed: 4)
        var failed = driver.exchanges[0]
        #expect(
            failed.replied(SecureAggregationReply(cycle: SecureFixture.cycle, device: 1, stage: .shareKeys, next: .wait), using: &generator) == .failed(error))
        #expect(failed.requestFailed(OrchardClientError(.network, "x"), random: 0) == .failed(error))
    }

    @Test("replies that do not fit (another cycle, another index, a step without its input) fail the exchange")
    func malformedReplies() throws {
        var generator = OrchardRandom(seed: 5)
        func started() throws -> SecureAggregationExchange {
            var exchange = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1)
            _ = exchange.start()
            return exchange
        }
        func failure(_ action: Action) -> OrchardClientError? {
            if case .failed(let error) = action { return error }
            return nil
        }
        var otherCycle = try started()
        let a = failure(otherCycle.replied(SecureAggregationReply(cycle: 8, device: 1, stage: .advertiseKeys, next: .wait), using: &generator))
        #expect(a?.code == .serverError && a?.message.contains("cycle 8") == true)

        var noRoster = try started()
        let b = failure(noRoster.replied(SecureAggregationReply(cycle: SecureFixture.cycle, device: 1, stage: .shareKeys, next: .shareKeys), using: &generator))
        #expect(b?.message.contains("roster") == true)

        var badIndex = try started()
        let c = failure(badIndex.replied(SecureAggregationReply(cycle: SecureFixture.cycle, device: 0, stage: .advertiseKeys, next: .wait), using: &generator))
        #expect(c?.code == .serverError)

        var moved = try started()
        _ = moved.replied(SecureAggregationReply(cycle: SecureFixture.cycle, device: 2, stage: .advertiseKeys, next: .wait, retryAfter: 1), using: &generator)
        _ = moved.waitElapsed()
        let d = failure(moved.replied(SecureAggregationReply(cycle: SecureFixture.cycle, device: 3, stage: .advertiseKeys, next: .wait), using: &generator))
        #expect(d?.message.contains("index 2") == true)
    }

    @Test("an error that is neither transient nor one of secure aggregation's fails the exchange")
    func otherErrors() throws {
        var exchange = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1)
        _ = exchange.start()
        let mismatch = FakeSecureCoordinator.error(409, .aggregationModeMismatch, "plain process")
        #expect(exchange.requestFailed(mismatch, random: 0) == .failed(mismatch))
        var cancelled = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1)
        _ = cancelled.start()
        #expect(cancelled.requestFailed(OrchardClientError(.cancelled, "stop"), random: 0) == .failed(OrchardClientError(.cancelled, "stop")))
    }

    // MARK: Waiting and retries

    @Test("waiting longer than the limit gives up: rejected with secure_aggregation_timeout")
    func waitBound() throws {
        var generator = OrchardRandom(seed: 6)
        var exchange = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1, waitLimit: 35)
        _ = exchange.start()
        let wait = SecureAggregationReply(cycle: SecureFixture.cycle, device: 1, stage: .advertiseKeys, next: .wait, retryAfter: 10)
        var waits: [Double] = []
        var last = exchange.replied(wait, using: &generator)
        while case .wait(let seconds) = last {
            waits.append(seconds)
            #expect(exchange.waitElapsed() == .send(SecureAggregationRequest(workerID: "w0", requestKey: "k0")))
            last = exchange.replied(wait, using: &generator)
        }
        #expect(waits == [10, 10, 10, 5])
        #expect(last == .finished(.rejected(retryAfter: 10, reason: "secure_aggregation_timeout")))
        #expect(exchange.waited == 35)
    }

    @Test("the wait limit is report_within plus the margin, capped by the maximum")
    func waitLimit() {
        #expect(SecureAggregationWaitLimit().seconds(reportWithin: 600) == 600 + SecureAggregationWaitLimit.defaultMargin)
        #expect(SecureAggregationWaitLimit(margin: 30).seconds(reportWithin: 100) == 130)
        #expect(SecureAggregationWaitLimit(margin: 30, maximum: 50).seconds(reportWithin: 100) == 50)
        #expect(SecureAggregationWaitLimit(margin: 30).seconds(reportWithin: -5) == 30)
        // A process with long stages gets three of them plus a minute; a short stage timeout keeps the configured margin.
        #expect(SecureAggregationWaitLimit(margin: 30).seconds(reportWithin: 100, stageTimeout: 300) == 100 + 3 * 300 + 60)
        #expect(SecureAggregationWaitLimit(margin: 300).seconds(reportWithin: 100, stageTimeout: 10) == 400)
        #expect(SecureAggregationWaitLimit(margin: 30, maximum: 500).seconds(reportWithin: 100, stageTimeout: 300) == 500)
    }

    @Test("transient failures are retried with the policy's backoff or the coordinator's Retry-After, then fail")
    func transientRetries() throws {
        let policy = RequestRetryPolicy(maximumAttempts: 3, initialDelay: .seconds(1), maximumDelay: .seconds(30), jitter: 0)
        var exchange = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1, retry: policy)
        guard case .send(let advertise) = exchange.start() else { return }
        let network = OrchardClientError(.network, "connection reset")
        #expect(exchange.requestFailed(network, random: 0.9) == .backoff(retry: 1, seconds: 1, error: network))
        #expect(exchange.waitElapsed() == .send(advertise))
        let busy = OrchardClientError.server(status: 503, body: nil, retryAfter: 7)
        #expect(exchange.requestFailed(busy, random: 0.9) == .backoff(retry: 2, seconds: 7, error: busy))
        #expect(exchange.waitElapsed() == .send(advertise))
        #expect(exchange.requestFailed(network, random: 0.9) == .failed(network))
        #expect(exchange.waited == 8)
    }

    @Test("a transient failure is retried and the exchange goes on; attempts start again with the next request")
    func retryThenSucceed() throws {
        let (exchanges, _, _) = try Self.devices(3)
        var driver = LockstepDriver(exchanges: exchanges, coordinator: try Self.coordinator(goal: 3))
        var failures = 0
        driver.run { i, request, _ in
            // Device 2's masked input fails twice before it arrives (policy: 3 attempts).
            guard i == 2, request.maskedInput != nil, failures < 2 else { return .deliver }
            failures += 1
            return .fail(OrchardClientError(.network, "injected: connection reset"))
        }
        for i in 0..<3 { #expect(driver.terminal(i) == Self.reported, "device \(i): \(driver.actions[i])") }
        let backoffs = driver.actions[2].compactMap { action -> Int? in if case .backoff(let retry, _, _) = action { retry } else { nil } }
        #expect(backoffs == [1, 2])
        #expect(Self.requests(of: "w2", in: driver.coordinator).filter { $0.maskedInput != nil }.count == 1)

        var generator = OrchardRandom(seed: 8)
        var exchange = try SecureFixture.exchange(device: 0, update: [1], sampleCount: 1)
        guard case .send(let advertise) = exchange.start() else { return }
        let throttled = OrchardClientError.server(status: 429, body: ErrorBody(code: .rateLimited, message: "slow down"), retryAfter: 2)
        #expect(exchange.requestFailed(throttled, random: 0) == .backoff(retry: 1, seconds: 2, error: throttled))
        #expect(exchange.waitElapsed() == .send(advertise))
        let wait = SecureAggregationReply(cycle: SecureFixture.cycle, device: 1, stage: .advertiseKeys, next: .wait, retryAfter: 1)
        #expect(exchange.replied(wait, using: &generator) == .wait(seconds: 1))
        let poll = exchange.waitElapsed()
        // A fresh request: two more failures are retried again before the third fails.
        let network = OrchardClientError(.network, "reset")
        #expect(exchange.requestFailed(network, random: 0) == .backoff(retry: 1, seconds: 0.5, error: network))
        #expect(exchange.waitElapsed() == poll)
        #expect(exchange.requestFailed(network, random: 0) == .backoff(retry: 2, seconds: 1, error: network))
        #expect(exchange.waitElapsed() == poll)
        #expect(exchange.requestFailed(network, random: 0) == .failed(network))
    }

    // MARK: The update

    @Test("the update is every tensor, frozen ones included, concatenated in tensor name order")
    func flattening() {
        let tensors = [
            TensorRecord(name: "out.weight", shape: [2], values: [5, 6]),
            TensorRecord(name: "hidden.bias", shape: [1], values: [1]),
            TensorRecord(name: "frozen.weight", shape: [2], values: [0, 0]),
            TensorRecord(name: "hidden.weight", shape: [2], values: [2, 3]),
        ]
        #expect(SecureAggregationExchange.flatten(tensors) == [0, 0, 1, 2, 3, 5, 6])
    }

    @Test("a sample count above the plan's maximum (or below 1) is refused before anything is sent")
    func sampleCountBound() throws {
        for count in [0, 101] {
            do {
                _ = try SecureFixture.exchange(device: 0, plan: SecureFixture.plan(maximumSampleCount: 100), update: [1, 2], sampleCount: count)
                Issue.record("sample count \(count) was accepted")
            } catch {
                #expect(error.code == .training)
                #expect(error.message.contains("\(count)") && error.message.contains("100"))
            }
        }
        do {
            _ = try SecureFixture.exchange(device: 0, update: [1, .nan], sampleCount: 1)
            Issue.record("a NaN update was accepted")
        } catch {
            #expect(error.code == .training)
        }
        _ = try SecureFixture.exchange(device: 0, plan: SecureFixture.plan(maximumSampleCount: 100), update: [1, 2], sampleCount: 100)
    }
}

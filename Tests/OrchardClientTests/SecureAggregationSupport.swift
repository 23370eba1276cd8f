import Foundation
@testable import OrchardClient
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import Synchronization
import Testing

/// An in-memory coordinator for one cycle's secure aggregation: an OrchardPrivacy ``SecureAggregationServer`` behind
/// the wire protocol's request and reply, answering as the coordinator does (indices assigned on advertise_keys,
/// `wait` until a stage opens for the device, errors as the wire's 409/422 codes).
struct FakeSecureCoordinator {
    var server: SecureAggregationServer
    let cycle: Int
    /// Advertisements that close advertise_keys.
    let goal: Int
    /// The `retry_after` of `wait` replies.
    var retryAfter: Double = 0.5
    /// Closes a stage as soon as every device still in has sent its message.
    var autoClose = true
    /// How a message the device already delivered is answered when it comes again: `duplicate_message` whatever the
    /// stage (false), or as Orchard's coordinator does (true): a repeated advertisement replaces the keys while
    /// advertise_keys is open, and a message of a stage that has closed gets `stage_closed`.
    var repeatsAsCoordinator = false
    /// Changes the roster a device receives (a malicious coordinator).
    var tamperRoster: (@Sendable (Int, SecureAggregationRoster) -> SecureAggregationRoster)?
    private(set) var indices: [String: Int] = [:]
    private(set) var shared: Set<Int> = []
    private(set) var masked: Set<Int> = []
    private(set) var signed: Set<Int> = []
    private(set) var unmasked: Set<Int> = []
    /// Every request, in arrival order.
    private(set) var log: [(worker: String, request: SecureAggregationRequest)] = []
    private(set) var closedStages: [SecureAggregationStage] = []
    /// The error codes answered, in order.
    private(set) var errors: [(worker: String, code: WireErrorCode)] = []
    private var random = SplitMix64(state: 99)

    init(configuration: SecureAggregationParameters, processID: String = "p", cycle: Int = 7, goal: Int, maximumSampleCount: Int, modelLength: Int) throws {
        server = try SecureAggregationServer(
            configuration: configuration, context: SecureAggregationPlan.context(processID: processID, cycle: cycle), maximumDevices: goal,
            maximumSampleCount: maximumSampleCount, modelLength: modelLength
        )
        self.cycle = cycle
        self.goal = goal
    }

    /// Handles one request as the coordinator's endpoint would.
    mutating func handle(_ request: SecureAggregationRequest) throws(OrchardClientError) -> SecureAggregationReply {
        log.append((request.workerID, request))
        do {
            return try process(request)
        } catch {
            errors.append((request.workerID, error.serverCode ?? WireErrorCode("none")))
            throw error
        }
    }

    private mutating func process(_ request: SecureAggregationRequest) throws(OrchardClientError) -> SecureAggregationReply {
        server.replacingAdvertisements = repeatsAsCoordinator
        let known = indices[request.workerID]
        guard request.messageCount <= 1 else { throw Self.error(422, .invalidSecureAggregationMessage, "more than one message") }
        if let keys = request.advertiseKeys {
            if known != nil && !repeatsAsCoordinator { throw Self.error(409, .duplicateMessage, "worker already advertised") }
            let index = known ?? indices.count + 1
            try absorb { () throws(SecureAggregationError) in
                try server.receiveAdvertisement(
                    SecureAggregationAdvertisement(
                        device: index, channelPublicKey: keys.channelPublicKey, maskPublicKey: keys.maskPublicKey, signed: keys.signed))
            }
            indices[request.workerID] = index
        }
        guard let index = indices[request.workerID] else { throw Self.error(409, .stageClosed, "worker \(request.workerID) did not advertise") }
        if let message = request.shareKeys {
            guard repeatsAsCoordinator || !shared.contains(index) else { throw Self.error(409, .duplicateMessage, "shares already received") }
            try absorb { () throws(SecureAggregationError) in try server.receiveShareKeys(message) }
            shared.insert(index)
        }
        if let message = request.maskedInput {
            guard repeatsAsCoordinator || !masked.contains(index) else { throw Self.error(409, .duplicateMessage, "masked input already received") }
            try absorb { () throws(SecureAggregationError) in try server.addMaskedInput(device: index, words: message.words) }
            masked.insert(index)
        }
        if let message = request.consistencyCheck {
            guard repeatsAsCoordinator || !signed.contains(index) else { throw Self.error(409, .duplicateMessage, "survivors already signed") }
            try absorb { () throws(SecureAggregationError) in try server.receiveConsistencySignature(message) }
            signed.insert(index)
        }
        if let message = request.unmask {
            guard repeatsAsCoordinator || !unmasked.contains(index) else { throw Self.error(409, .duplicateMessage, "shares already revealed") }
            try absorb { () throws(SecureAggregationError) in try server.receiveUnmask(message) }
            unmasked.insert(index)
        }
        if autoClose && stageComplete { closeStage() }
        return try reply(for: index)
    }

    /// Whether every device still in sent the open stage's message.
    var stageComplete: Bool {
        let live = Set(indices.values).subtracting(server.dropped)
        switch server.stage {
        case .advertiseKeys: return indices.count >= goal
        case .shareKeys: return live.isSubset(of: shared)
        case .maskedInput: return live.intersection(shared).isSubset(of: masked)
        case .consistencyCheck: return live.intersection(masked).isSubset(of: signed)
        case .unmask: return live.intersection(masked).isSubset(of: unmasked)
        case .done, .abandoned: return false
        }
    }

    /// Closes the open stage (its deadline passed, or every message is in).
    mutating func closeStage() {
        guard server.stage != .done && server.stage != .abandoned else { return }
        closedStages.append(server.stage)
        do {
            _ = try server.closeStage(using: &random)
        } catch {
            Issue.record("closing \(server.stage): \(error)")
        }
    }

    /// Where `index` stands.
    func reply(for index: Int) throws(OrchardClientError) -> SecureAggregationReply {
        if server.dropped.contains(index) { throw Self.error(409, .droppedDevice, "device \(index) was dropped") }
        func reply(_ next: SecureAggregationNextStep) -> SecureAggregationReply {
            SecureAggregationReply(cycle: cycle, device: index, stage: server.stage, next: next, retryAfter: next == .wait ? retryAfter : nil)
        }
        do throws(SecureAggregationError) {
            switch server.stage {
            case .advertiseKeys:
                return reply(.wait)
            case .shareKeys:
                if shared.contains(index) { return reply(.wait) }
                var answer = reply(.shareKeys)
                let roster = try server.roster(for: index)
                answer.roster = tamperRoster?(index, roster) ?? roster
                return answer
            case .maskedInput:
                if masked.contains(index) { return reply(.wait) }
                var answer = reply(.maskedInput)
                answer.delivery = try server.delivery(for: index)
                return answer
            case .consistencyCheck:
                if signed.contains(index) { return reply(.wait) }
                var answer = reply(.consistencyCheck)
                answer.consistencyRequest = try server.consistencyRequest(for: index)
                return answer
            case .unmask:
                if unmasked.contains(index) { return reply(.done) }
                var answer = reply(.unmask)
                answer.unmaskRequest = try server.unmaskRequest(for: index)
                return answer
            case .done, .abandoned:
                return SecureAggregationReply(cycle: cycle, device: index, stage: server.stage, next: .done, cycleClosed: true)
            }
        } catch {
            throw Self.mapped(error)
        }
    }

    private func absorb(_ body: () throws(SecureAggregationError) -> Void) throws(OrchardClientError) {
        do {
            try body()
        } catch {
            throw Self.mapped(error)
        }
    }

    static func mapped(_ error: SecureAggregationError) -> OrchardClientError {
        switch error.code {
        case .duplicateMessage: Self.error(409, .duplicateMessage, error.message)
        case .droppedDevice: Self.error(409, .droppedDevice, error.message)
        case .outOfOrder, .unknownDevice: Self.error(409, .stageClosed, error.message)
        default: Self.error(422, .invalidSecureAggregationMessage, error.message)
        }
    }

    static func error(_ status: Int, _ code: WireErrorCode, _ message: String) -> OrchardClientError {
        OrchardClientError.server(status: status, body: ErrorBody(code: code, message: message))
    }
}

/// What a test does with a request a device is about to send.
enum Delivery {
    /// Deliver it and hand the reply back.
    case deliver
    /// Keep it unsent for now (the device is slow).
    case hold
    /// Deliver it, then fail as if its answer was lost.
    case loseAnswer
    /// Fail with this error without delivering it.
    case fail(OrchardClientError)
}

/// Runs exchanges in lockstep against a fake coordinator: each round, every device performs its action (waits elapse
/// at once). A round in which no stage message was absorbed counts toward the stage deadline, which closes the stage
/// after `patience` such rounds.
struct LockstepDriver {
    var exchanges: [SecureAggregationExchange]
    var coordinator: FakeSecureCoordinator
    /// Every action of each device, in order.
    var actions: [[SecureAggregationExchange.Action]]
    var generators: [OrchardRandom]
    var patience = 3

    init(exchanges: [SecureAggregationExchange], coordinator: FakeSecureCoordinator) {
        self.exchanges = exchanges
        self.coordinator = coordinator
        actions = exchanges.indices.map { _ in [] }
        generators = exchanges.indices.map { OrchardRandom(seed: 1000 + UInt64($0)) }
    }

    /// Runs until every exchange is over (or `rounds` run out); `route` decides what happens to each request.
    mutating func run(rounds: Int = 500, route: (Int, SecureAggregationRequest, FakeSecureCoordinator) -> Delivery = { _, _, _ in .deliver }) {
        var current = exchanges.indices.map { exchanges[$0].start() }
        for i in current.indices { actions[i].append(current[i]) }
        var idle = 0
        for _ in 0..<rounds {
            if exchanges.allSatisfy(\.isOver) { return }
            var progressed = false
            for i in exchanges.indices {
                let next: SecureAggregationExchange.Action
                switch current[i] {
                case .send(let request):
                    let delivery = route(i, request, coordinator)
                    if case .hold = delivery { continue }
                    if case .fail(let error) = delivery {
                        current[i] = exchanges[i].requestFailed(error, random: 0.5)
                        actions[i].append(current[i])
                        continue
                    }
                    let before = coordinator.log.count
                    let stage = coordinator.server.stage
                    do throws(OrchardClientError) {
                        let reply = try coordinator.handle(request)
                        if case .loseAnswer = delivery { throw OrchardClientError(.network, "injected: answer lost") }
                        next = exchanges[i].replied(reply, using: &generators[i])
                    } catch {
                        next = exchanges[i].requestFailed(error, random: 0.5)
                    }
                    if (coordinator.log.count > before && request.messageCount > 0) || coordinator.server.stage != stage { progressed = true }
                case .wait, .backoff:
                    next = exchanges[i].waitElapsed()
                case .finished, .failed:
                    continue
                }
                current[i] = next
                actions[i].append(next)
            }
            idle = progressed ? 0 : idle + 1
            if idle >= patience {
                coordinator.closeStage()
                idle = 0
            }
        }
    }

    /// The terminal action of device `i`.
    func terminal(_ i: Int) -> SecureAggregationExchange.Action? {
        guard let last = actions[i].last else { return nil }
        switch last {
        case .finished, .failed: return last
        default: return nil
        }
    }
}

/// Helpers for the secure-aggregation tests.
enum SecureFixture {
    static let processID = "p"
    static let cycle = 7

    static func plan(threshold: Int = 2, maximumSampleCount: Int = 100) -> SecureAggregationPlan {
        SecureAggregationPlan(parameters: SecureAggregationParameters(threshold: threshold, clippingRange: 4), maximumSampleCount: maximumSampleCount)
    }

    /// A deterministic update of `length` values in -1…1.
    static func update(device: Int, length: Int) -> [Float] {
        (0..<length).map { k in Float(sin(Double(device * 31 + k) * 0.7)) }
    }

    static func exchange(
        device: Int, plan: SecureAggregationPlan = plan(), update: [Float], sampleCount: Int,
        retry: RequestRetryPolicy = RequestRetryPolicy(maximumAttempts: 3, jitter: 0),
        waitLimit: Double = 1000, seed: UInt64? = nil, identity: SecureAggregationIdentity? = nil, trust: SecureAggregationTrust? = nil
    ) throws(OrchardClientError) -> SecureAggregationExchange {
        var generator = OrchardRandom(seed: seed ?? UInt64(device) &* 7919)
        return try SecureAggregationExchange(
            plan: plan, processID: processID, cycle: cycle, workerID: "w\(device)", requestKey: "k\(device)", update: update, sampleCount: sampleCount,
            retry: retry, waitLimit: waitLimit, identity: identity, trust: trust, using: &generator
        )
    }

    /// Σ nᵢ xᵢ / Σ nᵢ per coordinate.
    static func weightedMean(_ updates: [[Float]], counts: [Int]) -> [Double] {
        let total = Double(counts.reduce(0, +))
        return (0..<updates[0].count).map { k in
            var sum = 0.0
            for (update, count) in zip(updates, counts) { sum += Double(update[k]) * Double(count) }
            return sum / total
        }
    }
}

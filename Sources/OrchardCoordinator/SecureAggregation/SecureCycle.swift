public import Foundation
public import OrchardPrivacy
public import OrchardProtocol

/// One persisted step of a cycle's secure aggregation, in the order it was applied. Replaying a cycle's events
/// into a fresh `SecureCycle` rebuilds the state the coordinator had acknowledged, so a crash loses nothing a
/// device was told was received and counts nothing twice.
public enum SecureCycleEvent: Sendable, Hashable, Codable {
    /// A worker advertised its keys at `at` and was given (or kept, when replacing them during advertise_keys) an index.
    case advertise(worker: String, device: Int, keys: SecureAggregationPublicKeys, at: Date)
    /// advertise_keys closed with this public seed of the neighbour ring.
    case closeAdvertisements(graphSeed: Data, at: Date)
    /// A device's encrypted share bundles.
    case shareKeys(SecureAggregationShareKeys)
    /// A device's masked input (its words are stored beside the event).
    case maskedInput(device: Int)
    /// A device's signature of the survivors (consistency_check).
    case consistencySignature(SecureAggregationConsistencySignature)
    /// A device's revealed shares.
    case unmask(SecureAggregationUnmaskResponse)
    /// The current later stage (share_keys, masked_input, consistency_check or unmask) closed.
    case closeStage(at: Date)
}

/// A cycle's secure aggregation as the coordinator runs it: the protocol's server state machine
/// (``OrchardPrivacy/SecureAggregationServer``), the index each worker was given, and the stage deadlines. Pure:
/// the coordinator builds an event, applies it to a copy to check it, persists it, and keeps the copy.
struct SecureCycle: Sendable {
    /// The process's settings.
    let settings: SecureAggregationConfig
    /// The protocol state.
    private(set) var server: SecureAggregationServer
    /// Each advertised worker's index.
    private(set) var indexOf: [String: Int] = [:]
    /// When the current stage after advertise_keys opened.
    private(set) var stageOpenedAt: Date?
    /// Advertisements after which advertise_keys closes `stageTimeout` later rather than at the goal (the process's
    /// minimum reports), and when that many had advertised.
    let minimumAdvertisements: Int
    private(set) var minimumReachedAt: Date?
    /// When each device last advertised (the start of its wait for advertise_keys to close).
    private(set) var advertisedAt: [Int: Date] = [:]
    /// Events applied so far (the next event's sequence number).
    private(set) var sequence = 0

    /// A fresh cycle's secure aggregation. advertise_keys closes at `goalCount` advertisements, so the roster holds at
    /// most that many devices, however many the cycle admitted (over-selection).
    /// - Throws: `invalid_configuration` when the settings do not hold for `goalCount` devices.
    init(settings: SecureAggregationConfig, context: String, goalCount: Int, minimumAdvertisements: Int, maximumSampleCount: Int, modelLength: Int)
        throws(SecureAggregationError)
    {
        self.settings = settings
        self.minimumAdvertisements = minimumAdvertisements
        server = try SecureAggregationServer(
            configuration: settings.parameters, context: context, maximumDevices: goalCount, maximumSampleCount: maximumSampleCount, modelLength: modelLength)
        server.replacingAdvertisements = true
    }

    /// The stage the protocol is at.
    var stage: SecureAggregationStage { server.stage }

    /// When the current stage closes at the latest: a later stage `stageTimeout` after it opened; advertise_keys
    /// `stageTimeout` after the minimum number of devices advertised (nil before: the cycle's goal and deadline
    /// close it); nil once done or abandoned.
    var stageDeadline: Date? {
        switch stage {
        case .advertiseKeys: minimumReachedAt?.addingTimeInterval(settings.stageTimeout)
        case .shareKeys, .maskedInput, .consistencyCheck, .unmask: stageOpenedAt?.addingTimeInterval(settings.stageTimeout)
        case .done, .abandoned: nil
        }
    }

    /// Whether every device the current later stage waits for has answered.
    var stageComplete: Bool { [.shareKeys, .maskedInput, .consistencyCheck, .unmask].contains(stage) && server.awaitedDevices.isEmpty }

    /// The event for `worker` advertising `keys`: its index is kept when it advertised before (its keys are
    /// replaced: nothing was shared with them yet), otherwise it is the next free one.
    func advertisement(worker: String, keys: SecureAggregationPublicKeys, at date: Date) -> SecureCycleEvent {
        .advertise(worker: worker, device: indexOf[worker] ?? (indexOf.count + 1), keys: keys, at: date)
    }

    /// Applies an event; `words` carries a masked input's words. Returns the protocol's actions for a close.
    /// - Throws: the protocol's refusal (the state is then unchanged only if the caller applied the event to a copy).
    mutating func apply(_ event: SecureCycleEvent, words: [UInt32]? = nil) throws(SecureAggregationError) -> [SecureAggregationServerAction] {
        var actions: [SecureAggregationServerAction] = []
        switch event {
        case .advertise(let worker, let device, let keys, let date):
            if let existing = indexOf[worker], existing != device {
                throw SecureAggregationError(.invalidMessage, "worker \(worker) holds index \(existing), not \(device)")
            }
            try server.receiveAdvertisement(
                SecureAggregationAdvertisement(device: device, channelPublicKey: keys.channelPublicKey, maskPublicKey: keys.maskPublicKey, signed: keys.signed))
            indexOf[worker] = device
            advertisedAt[device] = date
            if minimumReachedAt == nil && indexOf.count >= minimumAdvertisements { minimumReachedAt = date }
        case .closeAdvertisements(let seed, let date):
            actions = try server.closeAdvertisements(graphSeed: seed)
            stageOpenedAt = date
        case .shareKeys(let message):
            try server.receiveShareKeys(message)
        case .maskedInput(let device):
            guard let words else { throw SecureAggregationError(.invalidMessage, "the masked input of device \(device) has no words") }
            try server.addMaskedInput(device: device, words: words)
        case .consistencySignature(let message):
            try server.receiveConsistencySignature(message)
        case .unmask(let message):
            try server.receiveUnmask(message)
        case .closeStage(let date):
            actions = try server.closeLaterStage()
            stageOpenedAt = date
        }
        sequence += 1
        return actions
    }

    /// The status shown in the process's cycle.
    func status(cycleDeadline: Date) -> SecureAggregationStatus {
        SecureAggregationStatus(
            stage: stage,
            stageDeadline: (stage == .advertiseKeys ? min(stageDeadline ?? cycleDeadline, cycleDeadline) : stageDeadline ?? cycleDeadline)
                .timeIntervalSince1970, advertised: server.advertisedDevices.count,
            shared: server.sharedDevices.count, masked: server.maskedDevices.count, signed: server.signedDevices.count,
            unmasked: server.unmaskedDevices.count, dropped: server.dropped.count
        )
    }

    /// Seconds a device waiting at `now` is told to wait before asking again: `pollInterval` at first, then as long
    /// as it has waited so far (its advertisement during advertise_keys, the stage's opening after), so the polls of
    /// a long wait space out geometrically; at most a third of the stage timeout, so a device learns of a close with
    /// two thirds of the next stage left; and never past the moment the current stage closes at the latest
    /// (`cycleDeadline` while advertise_keys has no deadline of its own).
    func pollDelay(device: Int, now: Date, pollInterval: Double, cycleDeadline: Date) -> Double {
        let since = stage == .advertiseKeys ? advertisedAt[device] : stageOpenedAt
        let waited = since.map { max(0, now.timeIntervalSince($0)) } ?? 0
        let delay = max(pollInterval, min(waited, settings.stageTimeout / 3))
        let closes = stageDeadline ?? cycleDeadline
        return max(0.001, min(delay, closes.timeIntervalSince(now) + 0.001))
    }

    /// What `device` does next in `cycle`: its stage's input when that stage is open and it has not answered, a
    /// wait otherwise, done once its part is over.
    /// - Throws: `dropped_device` for a device declared dropped; `stage_closed` when the cycle's secure aggregation
    ///   was abandoned or the device is not in the roster.
    func reply(device: Int, cycle: Int, pollInterval: Double) throws(CoordinatorError) -> SecureAggregationReply {
        func wait() -> SecureAggregationReply {
            SecureAggregationReply(cycle: cycle, device: device, stage: stage, next: .wait, retryAfter: pollInterval)
        }
        if server.dropped.contains(device) {
            throw CoordinatorError(.droppedDevice, "device \(device) missed a stage of cycle \(cycle)'s secure aggregation and was dropped from it")
        }
        do throws(SecureAggregationError) {
            switch stage {
            case .advertiseKeys:
                return wait()
            case .shareKeys:
                guard server.participants.contains(device) else { throw SecureAggregationError(.unknownDevice, "device \(device) is not in the roster") }
                if server.sharedDevices.contains(device) { return wait() }
                return SecureAggregationReply(cycle: cycle, device: device, stage: stage, next: .shareKeys, roster: try server.roster(for: device))
            case .maskedInput:
                guard server.sharedDevices.contains(device) else { throw SecureAggregationError(.unknownDevice, "device \(device) sent no shares") }
                if server.maskedDevices.contains(device) { return wait() }
                return SecureAggregationReply(
                    cycle: cycle, device: device, stage: stage, next: .maskedInput, delivery: try server.delivery(for: device), maskedInputFormat: .safetensors)
            case .consistencyCheck:
                guard server.maskedDevices.contains(device) else { throw SecureAggregationError(.unknownDevice, "device \(device) sent no masked input") }
                if server.signedDevices.contains(device) { return wait() }
                return SecureAggregationReply(
                    cycle: cycle, device: device, stage: stage, next: .consistencyCheck, consistencyRequest: try server.consistencyRequest(for: device))
            case .unmask:
                guard server.maskedDevices.contains(device) else { throw SecureAggregationError(.unknownDevice, "device \(device) sent no masked input") }
                if server.unmaskedDevices.contains(device) { return SecureAggregationReply(cycle: cycle, device: device, stage: stage, next: .done) }
                return SecureAggregationReply(cycle: cycle, device: device, stage: stage, next: .unmask, unmaskRequest: try server.unmaskRequest(for: device))
            case .done:
                return SecureAggregationReply(cycle: cycle, device: device, stage: stage, next: .done)
            case .abandoned:
                throw SecureAggregationError(.outOfOrder, "the secure aggregation was abandoned: \(server.abandonReason ?? "too few devices")")
            }
        } catch {
            throw CoordinatorError(.stageClosed, "device \(device) has no step in cycle \(cycle)'s secure aggregation at \(stage.rawValue): \(error.message)")
        }
    }
}

extension CoordinatorError {
    /// The wire error for a refusal of the secure-aggregation protocol.
    init(_ error: SecureAggregationError) {
        switch error.code {
        case .droppedDevice: self.init(.droppedDevice, error.message)
        case .duplicateMessage: self.init(.duplicateMessage, error.message)
        case .outOfOrder, .unknownDevice: self.init(.stageClosed, error.message)
        default: self.init(.invalidSecureAggregationMessage, error.message)
        }
    }
}

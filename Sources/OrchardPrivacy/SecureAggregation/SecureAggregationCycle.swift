import Foundation

/// An in-memory run of one secure-aggregation cycle: devices and server exchange messages directly, and chosen
/// devices drop out at chosen stages. For tests and the simulator; a real deployment drives the same state machines
/// over the network.
public enum SecureAggregationCycle {
    /// Which devices go silent at which stage (a device listed at a stage sends nothing from that stage on).
    public struct Dropouts: Sendable, Hashable {
        /// Devices that never advertise.
        public var advertiseKeys: Set<Int>
        /// Devices that advertise but send no shares.
        public var shareKeys: Set<Int>
        /// Devices that share but send no masked input.
        public var maskedInput: Set<Int>
        /// Devices that send a masked input but do not sign the survivor set (with `consistency_check`).
        public var consistencyCheck: Set<Int>
        /// Devices that send a masked input but do not answer the unmask request.
        public var unmask: Set<Int>

        /// Creates a dropout plan.
        public init(advertiseKeys: Set<Int> = [], shareKeys: Set<Int> = [], maskedInput: Set<Int> = [], consistencyCheck: Set<Int> = [], unmask: Set<Int> = [])
        {
            self.advertiseKeys = advertiseKeys
            self.shareKeys = shareKeys
            self.maskedInput = maskedInput
            self.consistencyCheck = consistencyCheck
            self.unmask = unmask
        }
    }

    /// A device's contribution: its update and its sample count.
    public struct Input: Sendable, Hashable {
        /// The update, one value per model coordinate.
        public var update: [Float]
        /// The weight n_i.
        public var sampleCount: Int

        /// Creates an input.
        public init(update: [Float], sampleCount: Int) {
            self.update = update
            self.sampleCount = sampleCount
        }
    }

    /// How a cycle ended.
    public enum Outcome: Sendable, Hashable {
        /// The unmasked aggregate.
        case finished(SecureAggregationResult)
        /// The server's reason for giving up.
        case abandoned(String)
    }

    /// Runs a cycle over `inputs` (by device index ≥ 1), dropping devices per `dropouts`. `identities` (by device)
    /// sign the devices' messages and `trust` makes every device check its neighbours' certificates (the
    /// actively-secure variant, with `consistency_check`). `inspect` sees the server after each stage closes and may
    /// replace it (e.g. with a decoded copy of its persisted state).
    /// - Throws: any refusal by a device or the server (an honest run has none).
    public static func run(
        configuration: SecureAggregationParameters, context: String, inputs: [Int: Input], maximumSampleCount: Int,
        dropouts: Dropouts = Dropouts(), identities: [Int: SecureAggregationIdentity]? = nil, trust: SecureAggregationTrust? = nil,
        using generator: inout some RandomNumberGenerator, inspect: (inout SecureAggregationServer) throws -> Void = { _ in }
    ) throws -> Outcome {
        let modelLength = inputs.values.first?.update.count ?? 0
        var server = try SecureAggregationServer(
            configuration: configuration, context: context, maximumDevices: inputs.count, maximumSampleCount: maximumSampleCount, modelLength: modelLength)
        var devices: [Int: SecureAggregationDevice] = [:]
        for index in inputs.keys.sorted() {
            devices[index] = try SecureAggregationDevice(
                index: index, configuration: configuration, context: context, maximumSampleCount: maximumSampleCount, modelLength: modelLength,
                identity: identities?[index], trust: trust, using: &generator)
        }
        var silent = dropouts.advertiseKeys
        for index in devices.keys.sorted() where !silent.contains(index) {
            try server.receiveAdvertisement(try devices[index]!.advertiseKeys())
        }
        var actions = try server.closeStage(using: &generator)
        try inspect(&server)
        if let reason = server.abandonReason { return .abandoned(reason) }
        silent.formUnion(dropouts.shareKeys)
        for case .sendRoster(let index, let roster) in actions where !silent.contains(index) {
            try server.receiveShareKeys(try devices[index]!.shareKeys(roster, using: &generator))
        }
        actions = try server.closeStage(using: &generator)
        try inspect(&server)
        if let reason = server.abandonReason { return .abandoned(reason) }
        silent.formUnion(dropouts.maskedInput)
        for case .deliverShares(let index, let delivery) in actions where !silent.contains(index) {
            let input = inputs[index]!
            let masked = try devices[index]!.maskedInput(delivery, update: input.update, sampleCount: input.sampleCount, using: &generator)
            try server.addMaskedInput(device: masked.device, words: masked.words)
        }
        actions = try server.closeStage(using: &generator)
        try inspect(&server)
        if let reason = server.abandonReason { return .abandoned(reason) }
        if configuration.consistencyCheck {
            silent.formUnion(dropouts.consistencyCheck)
            for case .requestConsistency(let index, let request) in actions where !silent.contains(index) {
                try server.receiveConsistencySignature(try devices[index]!.consistencyCheck(request))
            }
            actions = try server.closeStage(using: &generator)
            try inspect(&server)
            if let reason = server.abandonReason { return .abandoned(reason) }
        }
        silent.formUnion(dropouts.unmask)
        for case .requestUnmask(let index, let request) in actions where !silent.contains(index) {
            try server.receiveUnmask(try devices[index]!.unmask(request))
        }
        actions = try server.closeStage(using: &generator)
        for action in actions {
            switch action {
            case .finished(let result): return .finished(result)
            case .abandoned(let reason): return .abandoned(reason)
            default: continue
            }
        }
        return .abandoned(server.abandonReason ?? "the cycle did not finish")
    }
}

/// The former name of ``SecureAggregationCycle`` (a coordinator's aggregation is a cycle; see the glossary).
@available(*, deprecated, renamed: "SecureAggregationCycle")
public typealias SecureAggregationRound = SecureAggregationCycle

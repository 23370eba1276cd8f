import Foundation
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport

/// The cost of one secure-aggregation cycle against the plain protocol's, for the same devices and update size:
/// client CPU per device, server CPU per cycle, and bytes per device each way, with the wire encoding included (the
/// plain report as safetensors, the secure steps as the JSON the endpoint carries). The model download, the same in
/// both, is left out; so is the store (the coordinator persists a plain report's diff and a masked input alike).
public enum SecureAggregationBenchmark {
    /// What to measure.
    public struct Options: Sendable {
        /// Devices in the cycle.
        public var devices: Int
        /// Coordinates of the update.
        public var parameters: Int
        /// Neighbours per device (SecAgg+), or nil for every other device (SecAgg).
        public var shares: Int?
        /// Shares needed to unmask; nil for just above half the neighbours.
        public var threshold: Int?
        /// Probability that a device goes away before each stage after advertise_keys.
        public var dropout: Double
        /// Seed of the updates, the dropouts and the devices' secrets.
        public var seed: UInt64

        /// Creates options.
        public init(devices: Int, parameters: Int, shares: Int? = nil, threshold: Int? = nil, dropout: Double = 0, seed: UInt64 = 1) {
            self.devices = devices
            self.parameters = parameters
            self.shares = shares
            self.threshold = threshold
            self.dropout = dropout
            self.seed = seed
        }
    }

    /// One JSON line of results; every `ratio` is secure / plain; the secure client figures are per device that sent
    /// its masked input.
    public struct Result: Sendable, Encodable {
        public var devices: Int
        public var parameters: Int
        public var neighbours: Int
        public var threshold: Int
        public var dropout: Double
        /// Devices whose input is in the aggregate.
        public var survivors: Int
        /// Whether the secure cycle produced its aggregate (false: abandoned below the threshold).
        public var finished: Bool
        /// The largest difference between the secure and the plain weighted mean (within 2c/(Q − 1)); nil when abandoned.
        public var maximumError: Double?
        /// The stage at which the cycle was abandoned, if it was.
        public var abandonedAt: String?
        public var plainClientMs: Double
        public var secureClientMs: Double
        public var clientRatio: Double
        public var plainServerMs: Double
        public var secureServerMs: Double
        public var serverRatio: Double
        public var plainBytesUp: Double
        public var secureBytesUp: Double
        public var bytesUpRatio: Double
        public var plainBytesDown: Double
        public var secureBytesDown: Double
        public var bytesDownRatio: Double
        /// The model's bytes (4 per parameter), downloaded in both protocols and left out of the figures above.
        public var modelBytes: Int
    }

    /// Runs the plain and the secure cycle once each.
    /// - Throws: `SecureAggregationError` for settings the protocol refuses, or a refusal of an honest message (a bug).
    public static func run(_ options: Options) throws -> Result {
        let n = options.devices, d = options.parameters
        var random = OrchardRandom(seed: options.seed)
        let updates = (0..<n).map { _ in (0..<d).map { _ in (random.nextFloat() - 0.5) * 0.02 } }
        let samples = (0..<n).map { _ in 1 + Int(random.next() % 50) }
        let metadata = (0..<n).map { ReportMetadata(workerID: "w_\($0)", requestKey: "k_\($0)", sampleCount: samples[$0]) }

        // Plain: each device encodes its report; the server decodes each and adds it to the weighted sum.
        var plainClient = Duration.zero, plainServer = Duration.zero, plainUp = 0, plainDown = 0
        var plainSum = [Double](repeating: 0, count: d)
        let answer = try WireCoding.encoder().encode(ReportResponse(cycle: 1, reportsReceived: n, retryAfter: 0))
        for i in 0..<n {
            let clock = ContinuousClock()
            var body: [UInt8] = []
            plainClient += clock.measure {
                body = ReportEnvelope.encode(diff: [TensorRecord(name: "w", shape: [d], values: updates[i])], metadata: metadata[i])
            }
            plainUp += body.count
            plainDown += answer.count
            plainServer += try clock.measure {
                let archive = try Safetensors.decode(body)
                let weight = Double(samples[i])
                for (j, value) in archive.tensors[0].values.enumerated() { plainSum[j] += weight * Double(value) }
            }
        }
        _ = plainSum

        // Secure: the four stages, each message encoded and decoded as the endpoint carries it.
        let neighbours = min(options.shares ?? (n - 1), n - 1)
        let parameters = SecureAggregationParameters(shares: options.shares, threshold: options.threshold ?? max(2, neighbours / 2 + 1))
        let context = "bench/\(options.seed)"
        var server = try SecureAggregationServer(configuration: parameters, context: context, maximumDevices: n, maximumSampleCount: 50, modelLength: d)
        var client = [Duration](repeating: .zero, count: n), up = [Int](repeating: 0, count: n), down = [Int](repeating: 0, count: n)
        var serverTime = Duration.zero
        let encoder = WireCoding.encoder(), decoder = WireCoding.decoder()
        let clock = ContinuousClock()
        var secrets: [SecureAggregationSecrets] = []
        var devices: [SecureAggregationDevice?] = []
        var crypto = SystemRandomNumberGenerator()
        var live = Set(1...n)
        func exchange<Message: Codable, Reply: Codable>(_ device: Int, _ message: Message, reply: Reply?, _ handle: (Message) throws -> Void) throws {
            let bytes = try encoder.encode(message)
            up[device - 1] += bytes.count
            if let reply { down[device - 1] += try encoder.encode(reply).count }
            serverTime += try clock.measure { try handle(try decoder.decode(Message.self, from: bytes)) }
        }
        for index in 1...n {
            var made: SecureAggregationSecrets?
            client[index - 1] += clock.measure { made = SecureAggregationSecrets(using: &crypto) }
            let keys = try made!.publicKeys()
            secrets.append(made!)
            devices.append(
                try SecureAggregationDevice(index: index, configuration: parameters, context: context, maximumSampleCount: 50, modelLength: d, secrets: made!))
            _ = try devices[index - 1]!.advertiseKeys()
            let advertisement = SecureAggregationAdvertisement(device: index, channelPublicKey: keys.channel, maskPublicKey: keys.mask)
            try exchange(index, advertisement, reply: Optional<SecureAggregationReply>.none) { try server.receiveAdvertisement($0) }
        }
        var actions: [SecureAggregationServerAction] = []
        func close() throws -> Bool {
            guard server.stage != .abandoned else { return false }
            serverTime += try clock.measure { actions = try server.closeStage(using: &crypto) }
            return server.stage != .abandoned
        }
        var abandonedAt: String?
        func proceed() throws -> Bool {
            let stage = server.stage
            if try close() { return true }
            abandonedAt = stage.rawValue
            return false
        }
        var open = try proceed()
        func drop() {
            for device in live.sorted() where random.nextDouble() < options.dropout { live.remove(device) }
        }
        drop()
        for case .sendRoster(let index, let roster) in actions where live.contains(index) {
            var message: SecureAggregationShareKeys?
            client[index - 1] += try clock.measure { message = try devices[index - 1]!.shareKeys(roster, using: &crypto) }
            try exchange(index, message!, reply: roster) { try server.receiveShareKeys($0) }
        }
        if open { open = try proceed() }
        drop()
        for case .deliverShares(let index, let delivery) in actions where live.contains(index) {
            var message: SecureAggregationMaskedInput?
            client[index - 1] += try clock.measure {
                message = try devices[index - 1]!.maskedInput(delivery, update: updates[index - 1], sampleCount: samples[index - 1], using: &crypto)
            }
            // As a 2.4 device sends it: a safetensors body (MaskedInputEnvelope), 4 bytes a word.
            let body = MaskedInputEnvelope.encode(SecureAggregationRequest(workerID: "w_\(index)", requestKey: "k_\(index)", maskedInput: message!))
            up[index - 1] += body.count
            down[index - 1] += try encoder.encode(delivery).count
            serverTime += try clock.measure {
                let input = try MaskedInputEnvelope.decode(body).maskedInput!
                try server.addMaskedInput(device: input.device, words: input.words)
            }
        }
        if open { open = try proceed() }
        drop()
        for case .requestUnmask(let index, let request) in actions where live.contains(index) {
            var message: SecureAggregationUnmaskResponse?
            client[index - 1] += try clock.measure { message = try devices[index - 1]!.unmask(request) }
            try exchange(index, message!, reply: request) { try server.receiveUnmask($0) }
        }
        if open { _ = try proceed() }

        var maximumError: Double?
        if let result = server.result {
            // The plain mean of the survivors, to compare with.
            var sum = [Double](repeating: 0, count: d)
            var weight = 0.0
            for device in result.survivors {
                weight += Double(samples[device - 1])
                for j in 0..<d { sum[j] += Double(samples[device - 1]) * Double(updates[device - 1][j]) }
            }
            maximumError = zip(result.mean, sum).map { abs(Double($0) - $1 / weight) }.max() ?? 0
        }
        func ms(_ duration: Duration) -> Double { Double(duration.components.seconds) * 1e3 + Double(duration.components.attoseconds) * 1e-15 }
        // Per device that went through every stage it was asked to (sent its masked input), as a plain device reports.
        let complete = server.maskedDevices.isEmpty ? Array(1...n) : server.maskedDevices.sorted()
        let m = Double(complete.count)
        let secureClient = complete.map { ms(client[$0 - 1]) }.reduce(0, +) / m
        let plainClientMs = ms(plainClient) / Double(n), plainServerMs = ms(plainServer)
        let secureUp = Double(complete.map { up[$0 - 1] }.reduce(0, +)) / m, secureDown = Double(complete.map { down[$0 - 1] }.reduce(0, +)) / m
        return Result(
            devices: n, parameters: d, neighbours: neighbours, threshold: parameters.threshold, dropout: options.dropout,
            survivors: server.result?.survivors.count ?? 0, finished: server.result != nil, maximumError: maximumError, abandonedAt: abandonedAt,
            plainClientMs: plainClientMs, secureClientMs: secureClient, clientRatio: secureClient / plainClientMs,
            plainServerMs: plainServerMs, secureServerMs: ms(serverTime), serverRatio: ms(serverTime) / plainServerMs,
            plainBytesUp: Double(plainUp) / Double(n), secureBytesUp: secureUp, bytesUpRatio: secureUp / (Double(plainUp) / Double(n)),
            plainBytesDown: Double(plainDown) / Double(n), secureBytesDown: secureDown, bytesDownRatio: secureDown / (Double(plainDown) / Double(n)),
            modelBytes: 4 * d
        )
    }
}

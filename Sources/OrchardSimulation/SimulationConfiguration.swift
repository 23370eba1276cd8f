public import Foundation
public import OrchardData
public import OrchardProtocol
import OrchardPrivacy

/// Which data the fleet trains on.
public struct DatasetChoice: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable {
        case housing
        case fashionMNIST
        case idx(String)
        case kingJamesBible
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// The seed's Boston housing table (embedded).
    public static let housing = DatasetChoice(.housing)
    /// Fashion-MNIST from `/usr/share/datasets/fashion-mnist` (Debian package `dataset-fashion-mnist`).
    public static let fashionMNIST = DatasetChoice(.fashionMNIST)
    /// An MNIST-layout IDX directory: `train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`, `t10k-…`.
    public static func idx(_ directory: String) -> DatasetChoice { DatasetChoice(.idx(directory)) }
    /// The King James Bible as next-character prediction, partitioned by chapter or book (Debian's `bible-kjv`).
    public static let kingJamesBible = DatasetChoice(.kingJamesBible)

    /// Parses `housing`, `fashion-mnist`, `kjv` or `idx:PATH`.
    public init(parsing text: String) throws(SimulationError) {
        switch text.lowercased() {
        case "housing": self = .housing
        case "fashion-mnist", "fashionmnist": self = .fashionMNIST
        case "kjv": self = .kingJamesBible
        default:
            guard text.hasPrefix("idx:"), text.count > 4 else {
                throw SimulationError(.invalidOption, "dataset must be housing, fashion-mnist, kjv or idx:PATH, not '\(text)'")
            }
            self = .idx(String(text.dropFirst(4)))
        }
    }

    /// The directory of an image dataset, nil for housing.
    public var imageDirectory: String? {
        switch kind {
        case .housing, .kingJamesBible: nil
        case .fashionMNIST: "/usr/share/datasets/fashion-mnist"
        case .idx(let path): path
        }
    }

    /// Whether the data is text (next-character prediction).
    public var isText: Bool { kind == .kingJamesBible }

    /// `housing`, `fashion-mnist` or `idx:PATH`.
    public var description: String {
        switch kind {
        case .housing: "housing"
        case .fashionMNIST: "fashion-mnist"
        case .idx(let path): "idx:\(path)"
        case .kingJamesBible: "kjv"
        }
    }
}

/// Which model the devices train.
public struct ModelChoice: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable {
        case housing, mlp2nn, cnn
        case charLSTM = "char-lstm"
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// The seed's housing regressor on top of the frozen, centrally pretrained embeddings.
    public static let housing = ModelChoice(.housing)
    /// McMahan et al.'s 2NN: 784-200-200-10 with ReLU.
    public static let mlp2nn = ModelChoice(.mlp2nn)
    /// McMahan et al.'s CNN: two 5×5 convolutions (32, 64 channels) with 2×2 max pooling, 512 dense, 10 outputs.
    public static let cnn = ModelChoice(.cnn)
    /// A next-character model: embedding, a CIFG LSTM over the sequence, a per-step softmax (``ModelZoo/charLSTM(vocabularySize:length:embedding:units:learningRate:)``).
    public static let charLSTM = ModelChoice(.charLSTM)

    /// Parses `housing`, `mlp2nn`, `cnn` or `char-lstm`.
    public init(parsing text: String) throws(SimulationError) {
        guard let kind = Kind(rawValue: text.lowercased()) else {
            throw SimulationError(.invalidOption, "model must be housing, mlp2nn, cnn or char-lstm, not '\(text)'")
        }
        self.kind = kind
    }

    /// The name.
    public var description: String { kind.rawValue }
}

/// How the devices reach the coordinator.
public struct TransportChoice: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable { case http, memory }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Real HTTP on a loopback port.
    public static let http = TransportChoice(.http)
    /// Direct calls into the coordinator's core (deterministic for a seed).
    public static let memory = TransportChoice(.memory)

    /// Parses `http` or `memory`.
    public init(parsing text: String) throws(SimulationError) {
        guard let kind = Kind(rawValue: text.lowercased()) else {
            throw SimulationError(.invalidOption, "transport must be http or memory, not '\(text)'")
        }
        self.kind = kind
    }

    /// The name.
    public var description: String { kind.rawValue }
}

/// What the simulator does with the devices that check in after the round's cycle is full.
public struct TurnedAwayChoice: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable {
        case modeled
        case fullStack = "full-stack"
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Counted as turned away without running: admission is first come and a cycle's assignments only grow, so once
    /// one check-in is turned away as `cycle_full`, every later one would be. A round costs what its participants do.
    /// The devices not run keep their state as it was (no session, no scheduler history of the short turned-away task),
    /// so where that state matters — windows so short that the scheduler's estimate of the task decides whether it runs
    /// — later rounds can differ from `full-stack`'s, in the same distribution.
    public static let modeled = TurnedAwayChoice(.modeled)
    /// Every eligible device runs its scheduler and job and checks in at the coordinator, which turns it away (the load
    /// a real coordinator sees; a round's cost grows with the population).
    public static let fullStack = TurnedAwayChoice(.fullStack)

    /// Parses `modeled` or `full-stack`.
    public init(parsing text: String) throws(SimulationError) {
        guard let kind = Kind(rawValue: text.lowercased()) else {
            throw SimulationError(.invalidOption, "turned-away must be modeled or full-stack, not '\(text)'")
        }
        self.kind = kind
    }

    /// The name.
    public var description: String { kind.rawValue }
}

extension Availability {
    /// Parses `always`, `diurnal`, `realistic` or `trace:FILE` (reading the file).
    public init(parsing text: String) throws(SimulationError) {
        switch text.lowercased() {
        case "always": self = .always
        case "diurnal": self = .diurnal
        case "realistic": self = .realistic
        default:
            guard text.hasPrefix("trace:"), text.count > 6 else {
                throw SimulationError(.invalidOption, "availability must be always, diurnal, realistic or trace:FILE, not '\(text)'")
            }
            self = .trace(try AvailabilityTrace.read(contentsOf: URL(fileURLWithPath: String(text.dropFirst(6)))))
        }
    }
}

extension PartitionStrategy {
    /// Parses `iid`, `shards` (two label shards per client), `dirichlet:α` or `sampled:N` (N samples drawn per device, for
    /// populations larger than the dataset).
    public init(parsing text: String) throws(SimulationError) {
        let lower = text.lowercased()
        if lower == "iid" {
            self = .iid
        } else if lower == "shards" {
            self = .labelShards(perClient: 2)
        } else if lower.hasPrefix("dirichlet:"), let alpha = Double(lower.dropFirst(10)), alpha > 0, alpha.isFinite {
            self = .dirichlet(alpha: alpha)
        } else if lower.hasPrefix("sampled:"), let perClient = Int(lower.dropFirst(8)), perClient > 0 {
            self = .sampled(perClient: perClient)
        } else {
            throw SimulationError(.invalidOption, "partition must be iid, shards, dirichlet:α with α > 0 or sampled:N with N > 0, not '\(text)'")
        }
    }
}

extension AggregatorConfig.Kind {
    /// Parses `fedavg`, `fedavgm`, `fedadam` or `fedyogi`.
    public init(parsing text: String) throws(SimulationError) {
        switch text.lowercased() {
        case "fedavg": self = .fedAvg
        case "fedavgm": self = .fedAvgM
        case "fedadam": self = .fedAdam
        case "fedyogi": self = .fedYogi
        default: throw SimulationError(.invalidOption, "aggregator must be fedavg, fedavgm, fedadam or fedyogi, not '\(text)'")
        }
    }
}

/// A whole scenario: data, model, fleet, training hyper-parameters, coordinator and output. Every field has a
/// default; ``housing`` is what `orchard simulate` runs without arguments.
public struct SimulationConfiguration: Sendable {
    /// The data.
    public var dataset: DatasetChoice
    /// The model.
    public var model: ModelChoice
    /// Number of virtual devices.
    public var clients: Int
    /// Devices whose reports close a round, as a fraction of the fleet (the goal is ⌈fraction × clients⌉).
    public var fraction: Double
    /// Devices admitted per round as a multiple of the goal.
    public var overSelection: Double
    /// Local epochs per round (the hosted process's `client_config.local_epochs`).
    public var localEpochs: Int
    /// Local batch size (the hosted process's `client_config.batch_size`).
    public var batchSize: Int
    /// Local learning rate (the hosted process's `client_config.learning_rate`).
    public var learningRate: Double
    /// FedProx's μ (the hosted process's `client_config.proximal_mu`); 0 trains plain FedAvg.
    public var proximalMu: Double = 0
    /// Rounds.
    public var rounds: Int
    /// The global model is evaluated on the test set after every `evaluateEvery`-th round and after the last.
    public var evaluateEvery: Int
    /// How samples are dealt to devices.
    public var partition: PartitionStrategy
    /// How a text dataset is dealt to devices (its own partition; `partition` does not apply to text).
    public var textPartition = TextPartition.chapter
    /// Characters per sequence of a text dataset.
    public var sequenceLength = 80
    /// The server optimizer.
    public var aggregator: AggregatorConfig
    /// Device eligibility over virtual time.
    public var availability: Availability
    /// Probability that an assigned device goes away before reporting.
    public var dropout: Double
    /// Background budget per task, virtual seconds.
    public var windowSeconds: Double
    /// The least background window `orchard simulate --secure-aggregation` gives its devices unless told otherwise:
    /// the protocol's four exchanges come after the training, and a window must hold both.
    public static let secureWindowSeconds: Double = 60
    /// Virtual seconds a round stays open.
    public var cycleSeconds: Double
    /// Median virtual seconds per optimizer update on a device.
    public var secondsPerUpdate: Double
    /// Per-device compute and link speeds from a trace (`--device-speeds`), if any; nil draws them from the seed.
    public var deviceSpeeds: DeviceSpeeds? = nil
    /// How devices reach the coordinator.
    public var transport: TransportChoice
    /// What happens to devices that check in after the round's cycle is full (default: modeled).
    public var turnedAway = TurnedAwayChoice.modeled
    /// The seed of every random choice.
    public var seed: UInt64
    /// Where the report goes; nil writes into a new temporary directory.
    public var output: URL?
    /// Differential privacy for the hosted process, if any (`--dp-*`, `--population`).
    public var privacy: PrivacyConfig?
    /// Secure aggregation for the hosted process, if any (`--secure-aggregation`, `--sa-*`); `dropout` then also
    /// applies before each stage after advertise_keys (going away before advertising is the usual dropout during the
    /// download and training).
    public var secureAggregation: SecureAggregationConfig?
    /// A robust rule the hosted process aggregates by instead of the weighted mean (`--robust-aggregation`), if any.
    public var robustAggregation: RobustAggregationConfig?
    /// Buffered asynchronous aggregation (FedBuff) instead of synchronous cycles, if set: a round is one release of
    /// `buffer_size` reports.
    public var buffered: BufferedAggregationConfig?
    /// The run ends after the round in progress once this many virtual hours have passed (nil: after `rounds`).
    public var virtualHours: Double?
    /// Virtual seconds between the background windows the OS grants each eligible device (nil: one at each round's
    /// opening); see ``FleetConditions/windowInterval``.
    public var windowInterval: Double?
    /// Devices that send poison instead of their honest update (`--attackers`, `--attack`, `--attack-scale`), if any.
    public var attack: AttackConfiguration?
    /// The fraction of its samples each device holds out for federated evaluation (`--holdout-fraction`); 0 holds none.
    public var holdoutFraction: Double = 0
    /// Federated evaluation of the hosted process (`--evaluation-goal`, `--evaluation-every`), if any: devices run the
    /// round's starting checkpoint on their held-out samples.
    public var federatedEvaluation: FederatedEvaluationConfig?
    /// Where decompressed copies of gzip-compressed image datasets are kept between runs (`IDXCache.standard(environment:)`
    /// by default; nil decompresses on every run).
    public var datasetCache: IDXCache? = IDXCache.standard()

    /// Creates a configuration (the housing scenario's values by default).
    public init(
        dataset: DatasetChoice = .housing, model: ModelChoice = .housing, clients: Int = 20, fraction: Double = 0.5,
        overSelection: Double = 1.3, localEpochs: Int = 5, batchSize: Int = 8, learningRate: Double = 0.01, rounds: Int = 30, evaluateEvery: Int = 1,
        partition: PartitionStrategy = .iid, aggregator: AggregatorConfig = AggregatorConfig(), availability: Availability = .diurnal,
        dropout: Double = 0.08, windowSeconds: Double = 10, cycleSeconds: Double = 300, secondsPerUpdate: Double = 0.5,
        transport: TransportChoice = .http, seed: UInt64 = 1, output: URL? = nil, privacy: PrivacyConfig? = nil
    ) {
        self.privacy = privacy
        self.dataset = dataset
        self.model = model
        self.clients = clients
        self.fraction = fraction
        self.overSelection = overSelection
        self.localEpochs = localEpochs
        self.batchSize = batchSize
        self.learningRate = learningRate
        self.rounds = rounds
        self.evaluateEvery = evaluateEvery
        self.partition = partition
        self.aggregator = aggregator
        self.availability = availability
        self.dropout = dropout
        self.windowSeconds = windowSeconds
        self.cycleSeconds = cycleSeconds
        self.secondsPerUpdate = secondsPerUpdate
        self.transport = transport
        self.seed = seed
        self.output = output
    }

    /// The seed's scenario: central pretraining of the housing embeddings, then federated training of the device
    /// model across 20 devices with a diurnal availability trace, 8 % dropout and short background windows.
    public static let housing = SimulationConfiguration()

    /// Defaults for image classification (McMahan et al.'s FedAvg setup): 100 devices, C = 0.1, E = 1, B = 10,
    /// SGD lr 0.05, always available, no dropout, no over-selection.
    public static func images(_ dataset: DatasetChoice, model: ModelChoice = .mlp2nn) -> SimulationConfiguration {
        SimulationConfiguration(
            dataset: dataset, model: model, clients: 100, fraction: 0.1, overSelection: 1, localEpochs: 1, batchSize: 10,
            learningRate: 0.05, rounds: 100, availability: .always, dropout: 0, windowSeconds: 60, cycleSeconds: 600,
            secondsPerUpdate: 0.05
        )
    }

    /// Defaults for next-character prediction on the King James Bible (LEAF's Shakespeare setup in spirit): one device
    /// per chapter (1,189; per book, 66), 12 a round (C = 0.01; per book 10, C = 0.15), E = 5, B = 10, SGD lr 6 (per book
    /// 3: a book's device takes many more steps; the loss is a mean over the characters of a sequence, so its gradients are small), 80-character sequences, the
    /// char-lstm model, always available.
    public static func text(partition: TextPartition = .chapter) -> SimulationConfiguration {
        var configuration = SimulationConfiguration(
            dataset: .kingJamesBible, model: .charLSTM, clients: partition == .chapter ? KingJamesBible.chapters : KingJamesBible.books,
            fraction: partition == .chapter ? 0.01 : 0.15, overSelection: 1, localEpochs: 5, batchSize: 10, learningRate: partition == .chapter ? 6 : 3,
            rounds: 20,
            availability: .always, dropout: 0, windowSeconds: 600, cycleSeconds: 3600, secondsPerUpdate: 0.05)
        configuration.textPartition = partition
        return configuration
    }

    /// The most devices one simulation holds (each costs a few bytes until it takes part).
    public static let maximumClients = 100_000_000

    /// Reports that close a round.
    public var goal: Int {
        // Defined for any fraction and device count (``validate()`` names the bad ones): NaN or out of (0, 1] is 1.
        guard fraction > 0 && fraction <= 1, clients > 0 else { return 1 }
        let reports = (fraction * Double(clients) - 1e-9).rounded(.up)
        return reports < Double(clients) ? max(1, Int(reports)) : clients
    }

    /// Devices admitted to a round: the goal with the over-selection (the goal itself for an unusable over-selection,
    /// which ``validate()`` names).
    public var capacity: Int {
        guard overSelection >= 1 && overSelection <= WireLimits.maximumOverSelection else { return goal }
        let admitted = (Double(goal) * overSelection).rounded(.up)
        return admitted < Double(Int.max / 2) ? Int(admitted) : Int.max / 2
    }

    /// The client config of the process the simulator hosts: what the coordinator sends its devices, which they
    /// resolve over the architecture's training section like any device.
    public var clientConfig: ClientConfig {
        ClientConfig(
            batchSize: batchSize, learningRate: learningRate, localEpochs: localEpochs, proximalMu: proximalMu > 0 ? proximalMu : nil,
            holdoutFraction: holdoutFraction > 0 ? holdoutFraction : nil)
    }

    /// Throws an error whose message starts with the first invalid or inconsistent field's property name.
    public func validate() throws(SimulationError) {
        func fail(_ message: String) -> SimulationError { SimulationError(.invalidOption, message) }
        if !(1...Self.maximumClients).contains(clients) { throw fail("clients must be in 1...\(Self.maximumClients), not \(clients)") }
        if !(fraction > 0 && fraction <= 1) { throw fail("fraction must be in (0, 1], not \(fraction)") }
        if !(overSelection >= 1 && overSelection <= WireLimits.maximumOverSelection) {
            throw fail("overSelection must be in 1...\(WireLimits.maximumOverSelection), not \(overSelection)")
        }
        if localEpochs < 1 { throw fail("localEpochs must be at least 1, not \(localEpochs)") }
        if !(proximalMu >= 0) || !proximalMu.isFinite { throw fail("proximalMu must be a non-negative number, not \(proximalMu)") }
        if batchSize < 1 { throw fail("batchSize must be at least 1, not \(batchSize)") }
        if !(learningRate > 0) || !learningRate.isFinite { throw fail("learningRate must be a positive number, not \(learningRate)") }
        if !(aggregator.serverLearningRate > 0) || !aggregator.serverLearningRate.isFinite {
            throw fail("aggregator.serverLearningRate must be a positive number, not \(aggregator.serverLearningRate)")
        }
        if rounds < 1 { throw fail("rounds must be at least 1, not \(rounds)") }
        if evaluateEvery < 1 { throw fail("evaluateEvery must be at least 1, not \(evaluateEvery)") }
        if !(0...1 ~= dropout) { throw fail("dropout must be a probability in [0, 1], not \(dropout)") }
        // At most a year (the protocol's longest duration): a device's window becomes a `Duration` and a count of updates.
        let year = WireLimits.maximumSeconds
        if !(windowSeconds > 0 && windowSeconds <= year) {
            throw fail("windowSeconds must be a positive number of seconds up to \(Int(year)), not \(windowSeconds)")
        }
        if !(cycleSeconds > 0 && cycleSeconds <= year) {
            throw fail("cycleSeconds must be a positive number of seconds up to \(Int(year)), not \(cycleSeconds)")
        }
        if !(secondsPerUpdate > 0) || !secondsPerUpdate.isFinite { throw fail("secondsPerUpdate must be a positive number, not \(secondsPerUpdate)") }
        if let privacy, secureAggregation != nil, privacy.mode == .central {
            throw fail("privacy.mode central cannot be used with secureAggregation: the coordinator never sees an update; use distributed or local")
        }
        if let privacy, secureAggregation == nil, privacy.mode == .distributed {
            throw fail("privacy.mode distributed needs secureAggregation")
        }
        if let privacy, let failure = privacy.validationFailure(goalCount: goal, capacity: capacity) {
            throw fail("privacy: " + failure.replacingOccurrences(of: "server_config.privacy.", with: ""))
        }
        if let attack {
            if !(attack.fraction > 0 && attack.fraction < 1) { throw fail("attack.fraction must be in (0, 1), not \(attack.fraction)") }
            if !(attack.scale > 0) || !attack.scale.isFinite { throw fail("attack.scale must be a positive number, not \(attack.scale)") }
            if attack.kind == .labelFlip && dataset == .housing {
                throw fail("attack.kind label-flip needs a classifier: the housing model predicts prices, which have no labels to flip")
            }
            if attack.kind == .labelFlip && dataset.isText {
                throw fail("attack.kind label-flip needs one label per sample; a next-character model has one per position")
            }
            if attack.attackers(clients: clients, seed: seed).isEmpty {
                throw fail("attack.fraction \(attack.fraction) of \(clients) devices rounds to no attacker")
            }
        }
        if !(0...0.9 ~= holdoutFraction) { throw fail("holdoutFraction must be in [0, 0.9], not \(holdoutFraction)") }
        if let federatedEvaluation {
            if let failure = federatedEvaluation.validationFailure() {
                throw fail("federatedEvaluation: " + failure.replacingOccurrences(of: "server_config.evaluation.", with: ""))
            }
            if holdoutFraction <= 0 { throw fail("federatedEvaluation needs holdoutFraction above 0: devices evaluate on the samples they hold out") }
            if secureAggregation != nil {
                throw fail("federatedEvaluation cannot be used with secureAggregation: each device's metrics would reach the coordinator in the clear")
            }
        }
        if let buffered {
            if let failure = buffered.validationFailure() { throw fail(failure.replacingOccurrences(of: "server_config.buffered.", with: "buffered.")) }
            if secureAggregation != nil {
                throw fail("buffered cannot be used with secureAggregation: masking needs a fixed cohort online through every stage")
            }
            if robustAggregation != nil {
                throw fail("buffered cannot be used with robustAggregation: a buffer mixes updates from different checkpoints")
            }
        }
        if let virtualHours, !(virtualHours > 0 && virtualHours.isFinite) { throw fail("virtualHours must be a positive number, not \(virtualHours)") }
        if let windowInterval, !(windowInterval >= 1 && windowInterval <= Availability.day) {
            throw fail("windowInterval must be a number of seconds in 1...86400, not \(windowInterval)")
        }
        if let robustAggregation {
            if secureAggregation != nil {
                throw fail("robustAggregation cannot be used with secureAggregation: the coordinator never sees a single update, only their sum")
            }
            if privacy != nil {
                throw fail("robustAggregation cannot be used with privacy: the noise is calibrated to one device's influence on a clipped mean")
            }
            if minimumReports > goal {
                throw fail(
                    "robustAggregation \(robustAggregation.summary) needs at least \(minimumReports) reports a round; the goal (fraction × clients) is \(goal)")
            }
        }
        if dataset.isText && !(2...1000).contains(sequenceLength) {
            throw fail("sequenceLength must be in 2...1000, not \(sequenceLength)")
        }
        let fits =
            dataset == .housing ? model == .housing : dataset.isText ? model == .charLSTM : (model == .mlp2nn || model == .cnn)
        if !fits {
            throw SimulationError(
                .incompatible,
                "model \(model) does not fit dataset \(dataset): housing data goes with the housing model, images with mlp2nn or cnn, text (kjv) with char-lstm"
            )
        }
    }

    /// The settings as strings, for the summary and the report.
    public var settings: SimulationSettings {
        SimulationSettings(
            [
                "dataset": dataset.description, "model": model.description, "clients": String(clients), "fraction": String(fraction),
                "goal": String(goal), "over_selection": String(overSelection), "local_epochs": String(localEpochs), "proximal_mu": String(proximalMu),
                "batch_size": String(batchSize), "lr": String(learningRate), "rounds": String(rounds), "eval_every": String(evaluateEvery),
                "partition": dataset.isText ? "natural(\(textPartition))" : partition.description,
                "aggregator": aggregator.kind.description, "server_lr": String(aggregator.serverLearningRate), "availability": availability.description,
                "dropout": String(dropout),
                "window_seconds": String(windowSeconds), "cycle_seconds": String(cycleSeconds),
                "seconds_per_update": String(secondsPerUpdate), "transport": transport.description, "seed": String(seed),
                // Buffered rounds run every check-in through the whole stack, whatever was asked.
                "turned_away": (buffered == nil ? turnedAway : .fullStack).description,
            ].merging(privacySettings, uniquingKeysWith: { first, _ in first })
                .merging(robustSettings, uniquingKeysWith: { first, _ in first }).merging(secureSettings, uniquingKeysWith: { first, _ in first }))
    }

    private var robustSettings: [String: String] {
        var settings: [String: String] = [:]
        if let robustAggregation { settings["robust_aggregation"] = robustAggregation.summary }
        if let buffered {
            settings["aggregation"] = "buffered"
            settings["buffer_size"] = String(buffered.bufferSize)
            settings["max_concurrency"] = String(buffered.maxConcurrency)
            settings["max_staleness"] = String(buffered.maxStaleness)
            settings["staleness_exponent"] = String(buffered.stalenessExponent)
        }
        if let virtualHours { settings["virtual_hours"] = String(virtualHours) }
        if let windowInterval { settings["window_interval"] = String(windowInterval) }
        if let attack { settings["attack"] = attack.summary }
        if holdoutFraction > 0 { settings["holdout_fraction"] = String(holdoutFraction) }
        if dataset.isText { settings["sequence_length"] = String(sequenceLength) }
        if let deviceSpeeds { settings["device_speeds"] = deviceSpeeds.source ?? "trace" }
        if let federatedEvaluation {
            settings["evaluation_goal"] = String(federatedEvaluation.goal)
            settings["evaluation_every"] = String(federatedEvaluation.every)
        }
        return settings
    }

    private var secureSettings: [String: String] {
        guard let secure = secureAggregation else { return [:] }
        var settings = [
            "secure_aggregation": secure.parameters.shares == nil ? "secagg" : "secagg+", "sa_threshold": String(secure.parameters.threshold),
            "sa_clipping_range": String(secure.parameters.clippingRange), "sa_quantization_range": String(secure.parameters.quantizationRange),
            "sa_stage_timeout": String(secure.stageTimeout),
        ]
        if let shares = secure.parameters.shares { settings["sa_shares"] = String(shares) }
        return settings
    }

    /// The minimum reports of the hosted process: half the goal, above the secure-aggregation threshold, and as many
    /// as the robust rule needs (Multi-Krum: f + 3, and f + m when m is given).
    public var minimumReports: Int {
        let robust = robustAggregation.map { max($0.leastReports, ($0.byzantine ?? 0) + ($0.selected ?? 0)) } ?? 1
        return max(1, goal / 2, (secureAggregation?.parameters.threshold ?? 0) + 1, robust)
    }

    private var privacySettings: [String: String] {
        guard let privacy else { return [:] }
        var settings = [
            "dp_mode": privacy.mode.description, "dp_noise_multiplier": String(privacy.noiseMultiplier), "dp_delta": String(privacy.delta),
            "population": String(privacy.population),
        ]
        if let clip = privacy.clippingNorm { settings["dp_clip"] = String(clip) }
        if let adaptive = privacy.adaptiveClipping {
            settings["dp_adaptive_quantile"] = String(adaptive.targetQuantile)
            settings["dp_clip_initial"] = String(adaptive.initialNorm)
        }
        return settings
    }

    /// The fleet conditions these settings imply.
    public var conditions: FleetConditions {
        var conditions = FleetConditions(
            availability: availability, dropout: dropout, windowSeconds: windowSeconds, medianSecondsPerUpdate: secondsPerUpdate, deviceSpeeds: deviceSpeeds)
        conditions.secureStages = secureAggregation != nil
        conditions.windowInterval = windowInterval
        return conditions
    }
}

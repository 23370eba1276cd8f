import ArgumentParser
import OrchardHTTPClient
import OrchardClient
import OrchardSupport
import Foundation
import OrchardData
import OrchardPrivacy
import OrchardProtocol
import OrchardSimulation
import UnixSignals

/// `orchard simulate`: a fleet of virtual devices against an in-process coordinator on virtual time, or (with
/// `--coordinator URL --shard i/n`) a shard of a fleet against a coordinator that runs elsewhere, in real time.
struct SimulateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulate",
        abstract: "Run a fleet of virtual devices against a real coordinator and write a report.",
        discussion: """
            Without options, runs the housing scenario: central pretraining of the embeddings, then federated training \
            of the device model across 20 devices with a diurnal availability trace, dropouts and short background \
            windows. Image datasets default to McMahan et al.'s FedAvg setup (100 devices, C=0.1, E=1, B=10, lr 0.05). \
            --dataset kjv is next-character prediction on the King James Bible (apt-get install bible-kjv), one device \
            per chapter (--text-partition book: per book), with the char-lstm model (12 devices a round, E=5, B=10, lr 6; per book 10 a round, lr 3).
            Trace files (--availability trace:FILE) are CSV with a device,start,end header or JSON Lines \
            {"device":0,"start":0,"end":3600}; times are virtual seconds, end may be inf (CSV) or omitted (JSONL). \
            --availability realistic spreads the devices' time zones over the whole day and makes a fifth of them rare \
            (charging on about one night in ten). --device-speeds FILE takes each device's compute and link speed from \
            FedScale's device-capacity trace as JSON {"1":{"computation":153.0,"communication":2210.0},...} or CSV \
            with a client_id,computation,communication header (ms per sample, kbit/s); device i takes entry i mod n by \
            client id; its update time is the scenario's median seconds per update times its computation over the trace's median.
            With --coordinator URL the devices run against that coordinator (e.g. orchard serve) in REAL time — its \
            deadlines run on its own wall clock, so virtual time cannot drive it — with the admin token from \
            ORCHARD_ADMIN_TOKEN. --shard i/n runs the devices d with d mod n = i-1, so several machines simulate one \
            fleet: start every shard with the same options; shard 1 hosts the process (or uses an existing one of that \
            name), the others wait for it; each stops once the process has aggregated --rounds cycles. --transport, \
            --window-seconds and --availability other than always are virtual-time options and are refused there; \
            --cycle-seconds and --sa-stage-timeout are then real seconds, and --dropout still applies.
            """
    )

    @Option(help: "The data; idx:PATH is an MNIST-layout directory; kjv is the King James Bible, one character predicting the next.")
    var dataset: DatasetChoice = .housing
    @Option(help: "The model (default: housing for housing data, mlp2nn for images, char-lstm for text).")
    var model: ModelChoice?
    @Option(name: .customLong("text-partition"), help: "How a text dataset is dealt to devices: one device per chapter or per book.")
    var textPartition: TextPartition?
    @Option(name: .customLong("sequence-length"), parsing: .unconditional, help: "Characters per sequence of a text dataset (default 80).")
    var sequenceLength: Int?
    @Option(parsing: .unconditional, help: "Number of virtual devices.")
    var devices: Int?
    /// `--clients`, the option's name before the glossary's word for it (kept, hidden, for a release).
    @Option(name: .customLong("clients"), parsing: .unconditional, help: .hidden)
    var clientsAlias: Int?
    /// The number of devices, by either name.
    var clients: Int? { devices ?? clientsAlias }
    @Option(parsing: .unconditional, help: "Reports that close a round, as a fraction of the devices.")
    var fraction: Double?
    @Option(name: .customLong("over-selection"), parsing: .unconditional, help: "Devices admitted per round, as a multiple of the goal.")
    var overSelection: Double?
    @Option(name: .customLong("local-epochs"), parsing: .unconditional, help: "Local epochs per round.")
    var localEpochs: Int?

    @Option(
        name: .customLong("proximal-mu"), parsing: .unconditional,
        help: "FedProx's μ: devices add μ/2·‖w − w_received‖² to their local objective (client_config.proximal_mu; 0: plain FedAvg).")
    var proximalMu: Double?
    @Option(name: .customLong("batch-size"), parsing: .unconditional, help: "Local batch size.")
    var batchSize: Int?
    @Option(name: .customLong("lr"), parsing: .unconditional, help: "Local learning rate (SGD for images, Adam for housing).")
    var learningRate: Double?
    @Option(parsing: .unconditional, help: "Rounds to run.")
    var rounds: Int?
    @Option(name: .customLong("eval-every"), parsing: .unconditional, help: "Evaluate the global model on the test set after every N-th round (and the last).")
    var evaluateEvery: Int?
    @Option(
        help:
            "How samples are dealt to devices: iid, two label shards per device, Dirichlet(α) label skew, or N samples drawn by each device (a population larger than the dataset)."
    )
    var partition: PartitionStrategy?
    @Option(help: "The server optimizer.")
    var aggregator: AggregatorConfig.Kind?
    @Option(
        name: .customLong("server-lr"), parsing: .unconditional,
        help: "The server optimizer's learning rate (server_config.aggregator.server_learning_rate; default 1).")
    var serverLearningRate: Double?
    @Option(
        help:
            "When devices are eligible; realistic spreads time zones over the day with a tail of rarely available devices; trace:FILE reads windows from a CSV or JSON Lines file."
    )
    var availability: AvailabilityArgument?
    @Option(
        name: .customLong("device-speeds"),
        help: ArgumentHelp(
            "Each device's compute and link speed from a FedScale device-capacity trace: JSON {client_id: {\"computation\": ms per sample, \"communication\": kbit/s}} or CSV with a client_id,computation,communication header (read when the command runs).",
            valueName: "file"))
    var deviceSpeeds: String?
    @Option(parsing: .unconditional, help: "Probability that an assigned device goes away before reporting.")
    var dropout: Double?
    @Option(
        name: .customLong("window-seconds"), parsing: .unconditional,
        help:
            "Background budget per task, in virtual seconds (the housing scenario's default 10 becomes 60 with --secure-aggregation: its exchanges after training do not fit in 10)."
    )
    var windowSeconds: Double?
    @Option(name: .customLong("cycle-seconds"), parsing: .unconditional, help: "Virtual seconds a round stays open.")
    var cycleSeconds: Double?
    @Option(help: "How devices reach the coordinator: http (loopback port) or memory (direct calls; deterministic for a seed).")
    var transport: TransportChoice?
    @Option(
        name: .customLong("turned-away"),
        help:
            "Devices that check in once the round's cycle is full: modeled (counted as turned away without running their stack; a round costs what its participants do) or full-stack (every eligible device runs its scheduler and job and is turned away by the coordinator)."
    )
    var turnedAway: TurnedAwayChoice?
    @Option(
        name: .customLong("dp-noise-multiplier"), parsing: .unconditional,
        help: "Differential privacy: the noise's standard deviation as a multiple of the clipping bound (turns DP-FedAvg on).")
    var dpNoiseMultiplier: Double?
    @Option(
        name: .customLong("dp-clip"), parsing: .unconditional,
        help: "Differential privacy: the L2 clipping bound C of each update (the initial bound with --dp-adaptive-quantile; default 1).")
    var dpClip: Double?
    @Option(
        name: .customLong("dp-adaptive-quantile"), parsing: .unconditional,
        help: "Differential privacy: let the clipping bound follow this quantile of the update norms (Andrew et al. 2021).")
    var dpAdaptiveQuantile: Double?
    @Option(
        name: .customLong("dp-mode"),
        help:
            "Differential privacy: central (the coordinator clips and noises), local (each device does), or distributed (with --secure-aggregation: each device clips and adds its share of the noise)."
    )
    var dpMode: PrivacyModeArgument?
    @Option(name: .customLong("dp-delta"), parsing: .unconditional, help: "Differential privacy: δ of the (ε, δ) guarantee (default 1e-5).")
    var dpDelta: Double?
    @Option(
        parsing: .unconditional,
        help: "Differential privacy: the device population the sampling rate is computed from (default: --devices; e.g. 1000000 for the cross-device setting).")
    var population: Int?
    @Flag(
        name: .customLong("secure-aggregation"),
        help:
            "Secure aggregation: the coordinator learns only each round's sum (--dropout then also applies before each of its later stages: share_keys, masked_input, unmask)."
    )
    var secureAggregation = false
    @Option(
        name: .customLong("sa-shares"), parsing: .unconditional,
        help: "Secure aggregation: neighbours per device, even (SecAgg+); default every other device (SecAgg).")
    var saShares: Int?
    @Option(
        name: .customLong("sa-threshold"), parsing: .unconditional,
        help: "Secure aggregation: shares needed to unmask (default: just above half the neighbours).")
    var saThreshold: Int?
    @Option(
        name: .customLong("sa-clipping-range"), parsing: .unconditional,
        help: "Secure aggregation: each coordinate of an update is clipped to ± this (default 8).")
    var saClippingRange: Float?
    @Option(name: .customLong("sa-quantization-range"), parsing: .unconditional, help: "Secure aggregation: quantisation levels (default 65536).")
    var saQuantizationRange: UInt32?
    @Option(
        name: .customLong("sa-stage-timeout"), parsing: .unconditional,
        help:
            "Secure aggregation: virtual seconds a stage waits for late devices (default: a sixth of --window-seconds; with --coordinator, real seconds, default a sixth of --cycle-seconds)."
    )
    var saStageTimeout: Double?
    @Flag(
        name: .customLong("sa-consistency-check"),
        help:
            "Secure aggregation against an actively malicious coordinator: devices sign their keys with identities a simulated authority certified, and sign the survivors in a consistency_check stage before revealing shares (--dropout applies to it too)."
    )
    var saConsistencyCheck = false
    @Option(
        name: .customLong("robust-aggregation"),
        help: ArgumentHelp(
            "Aggregate each round by a robust rule instead of the weighted mean: the coordinate-wise median, the mean after cutting a fraction β from each end, or Multi-Krum with f reports assumed bad (m averaged; default n - f).",
            valueName: "median|trimmed-mean:β|multi-krum:f[:m]"))
    var robustAggregation: RobustAggregationConfig?
    @Option(
        help:
            "How rounds are aggregated: synchronous cycles (default), or buffered asynchronous aggregation (FedBuff), where the coordinator releases a model every --buffer-size reports and a round is a --cycle-seconds span of virtual time holding as many releases as its reports fill."
    )
    var aggregation: AggregationMode?
    @Option(name: .customLong("buffer-size"), help: "With --aggregation buffered: reports per release (default: the goal, fraction × devices).")
    var bufferSize: Int?
    @Option(name: .customLong("max-concurrency"), help: "With --aggregation buffered: devices training at once (default 4 × the buffer size).")
    var maxConcurrency: Int?
    @Option(name: .customLong("max-staleness"), help: "With --aggregation buffered: the stalest report accepted, in releases (default 20).")
    var maxStaleness: Int?
    @Option(
        name: .customLong("staleness-exponent"), parsing: .unconditional, help: "With --aggregation buffered: a in the weight (1 + staleness)^-a (default 0.5)."
    )
    var stalenessExponent: Double?
    @Option(
        name: .customLong("virtual-hours"), parsing: .unconditional, help: "End the run after the round in progress once this many virtual hours have passed.")
    var virtualHours: Double?
    @Option(
        name: .customLong("window-interval"), parsing: .unconditional,
        help:
            "Virtual seconds between the background windows the OS grants each eligible device (one at a seeded moment of each interval, whatever the coordinator does); default: a window for every eligible device when a round opens."
    )
    var windowInterval: Double?
    @Option(parsing: .unconditional, help: "The fraction of the devices that send poison instead of their honest update (through the real client and wire).")
    var attackers: Double?
    @Option(help: "With --attackers: what they send (default sign-flip).")
    var attack: AttackKind?
    @Option(
        name: .customLong("attack-scale"), parsing: .unconditional,
        help: "With --attackers: the factor of sign-flip and scaled (default 10), the standard deviation of gaussian (default 1); label-flip takes none.")
    var attackScale: Double?
    @Option(
        name: .customLong("holdout-fraction"), parsing: .unconditional,
        help: "The fraction of its samples each device holds out for federated evaluation and never trains on (client_config.holdout_fraction).")
    var holdoutFraction: Double?
    @Option(
        name: .customLong("evaluation-goal"), parsing: .unconditional,
        help:
            "Federated evaluation: device results aggregated per checkpoint (server_config.evaluation.goal); each round's starting checkpoint is evaluated on the devices' held-out samples (needs --holdout-fraction)."
    )
    var evaluationGoal: Int?
    @Option(
        name: .customLong("evaluation-every"), parsing: .unconditional,
        help: "With --evaluation-goal: evaluate checkpoints whose number is a multiple of this (default 1).")
    var evaluationEvery: Int?
    @Option(parsing: .unconditional, help: "Seed of every random choice.")
    var seed: UInt64?
    @Option(help: "Directory for metrics.jsonl, summary.json and report.html (default: a new temporary directory).")
    var output: String?
    @Option(
        help: ArgumentHelp(
            "Run against the coordinator at this http(s) URL in real time instead of an in-process one on virtual time (admin token from ORCHARD_ADMIN_TOKEN); several instances sharing one store separated by commas spread the devices over them (device d to instance d mod n; the first hosts and watches).",
            valueName: "url[,url…]"))
    var coordinator: String?
    @Option(
        help: ArgumentHelp(
            "With --coordinator: run shard i of n of the fleet (devices d with d mod n = i-1); shard 1 hosts the process (default 1/1).", valueName: "i/n"))
    var shard: String?
    @Option(
        name: .customLong("ca-cert"),
        help: ArgumentHelp("With --coordinator: trust only the CA certificates in this PEM file for an https coordinator.", valueName: "pem"))
    var caCert: String?
    @Option(parsing: .unconditional, help: "With --coordinator: most local trainings at the same time (default: twice the cores).")
    var concurrency: Int?
    @Option(
        name: .customLong("host-timeout"), parsing: .unconditional,
        help: "With --coordinator: seconds shards 2…n wait for shard 1 to host the process, and the longest silence of the coordinator tolerated (default 300)."
    )
    var hostTimeout: Double?
    @Option(
        help: "With --coordinator: the process's name (default simulation-<model>, version 1.0); an existing process of that name is used, not hosted again.")
    var process: String?

    /// The option behind each configuration field.
    static let flags = [
        "dataset": "--dataset", "model": "--model", "clients": "--devices", "fraction": "--fraction", "overSelection": "--over-selection",
        "localEpochs": "--local-epochs", "proximalMu": "--proximal-mu", "batchSize": "--batch-size", "learningRate": "--lr", "rounds": "--rounds",
        "evaluateEvery": "--eval-every", "dropout": "--dropout", "windowSeconds": "--window-seconds", "cycleSeconds": "--cycle-seconds",
    ]

    /// The options behind the fields the library's checks of a configuration name.
    static let libraryFieldFlags = [
        ("privacy.mode distributed needs secureAggregation", "--dp-mode distributed needs --secure-aggregation"),
        ("secure_aggregation: threshold", "--sa-threshold"), ("secure_aggregation: shares", "--sa-shares"),
        ("secure_aggregation: clipping_range", "--sa-clipping-range"), ("secure_aggregation: quantization_range", "--sa-quantization-range"),
        ("secure_aggregation: stage_timeout", "--sa-stage-timeout"), ("robustAggregation", "--robust-aggregation"),
        ("secureAggregation", "--secure-aggregation"),
        ("attack.fraction", "--attackers"), ("attack.scale", "--attack-scale"), ("attack.kind", "--attack"),
        ("holdoutFraction", "--holdout-fraction"), ("federatedEvaluation: every", "--evaluation-every"),
        ("federatedEvaluation: goal", "--evaluation-goal"), ("federatedEvaluation", "--evaluation-goal"),
        ("virtualHours", "--virtual-hours"), ("windowInterval", "--window-interval"), ("buffered.buffer_size", "--buffer-size"),
        ("buffered.max_concurrency", "--max-concurrency"), ("buffered.staleness_exponent", "--staleness-exponent"),
        ("buffered.max_staleness", "--max-staleness"), ("buffered cannot", "--aggregation buffered cannot"),
        ("aggregator.serverLearningRate", "--server-lr"),
    ]

    /// The option behind each `server_config.privacy` field, longest names first.
    static let privacyFlags = [
        ("server_config.privacy.adaptive_clipping.target_quantile", "--dp-adaptive-quantile"),
        ("server_config.privacy.adaptive_clipping.initial_norm", "--dp-clip"), ("server_config.privacy.clipping_norm", "--dp-clip"),
        ("server_config.privacy.noise_multiplier", "--dp-noise-multiplier"), ("server_config.privacy.delta", "--dp-delta"),
        ("server_config.privacy.population", "--population"), ("goal_count × over_selection", "the goal (--fraction × --devices) × --over-selection"),
        ("server_config.privacy.adaptive_clipping.count_stddev", "the count noise"),
    ]

    /// The scenario the options describe: the dataset's defaults with every given option applied.
    func makeConfiguration() throws(SimulationError) -> SimulationConfiguration {
        var c: SimulationConfiguration =
            dataset.isText ? .text(partition: textPartition ?? .chapter) : dataset.imageDirectory == nil ? .housing : .images(dataset)
        if dataset.isText {
            if partition != nil {
                throw SimulationError(
                    .invalidOption, "--partition does not apply to \(dataset), which is dealt by its own chapters or books: use --text-partition")
            }
            if let sequenceLength { c.sequenceLength = sequenceLength }
        } else if let stray = [("--text-partition", textPartition != nil), ("--sequence-length", sequenceLength != nil)].first(where: { $0.1 }) {
            throw SimulationError(.invalidOption, "\(stray.0) needs a text dataset (--dataset kjv)")
        }
        if coordinator != nil {
            // Virtual-time options have no meaning against a coordinator that runs on its own wall clock.
            if turnedAway != nil {
                throw SimulationError(
                    .invalidOption, "--turned-away cannot be used with --coordinator: against an external coordinator every device runs its stack in real time")
            }
            if transport != nil {
                throw SimulationError(.invalidOption, "--transport cannot be used with --coordinator: the devices reach that coordinator over HTTP(S)")
            }
            if windowSeconds != nil {
                throw SimulationError(
                    .invalidOption,
                    "--window-seconds cannot be used with --coordinator: background windows are virtual time; against an external coordinator devices run in real time and each cycle runs to its end"
                )
            }
            if let availability, availability.description != "always" {
                throw SimulationError(
                    .invalidOption,
                    "--availability \(availability) cannot be used with --coordinator: availability is played on virtual time, and an external coordinator runs on its own wall clock (every device is available)"
                )
            }
            c.availability = .always
            if deviceSpeeds != nil {
                throw SimulationError(
                    .invalidOption,
                    "--device-speeds cannot be used with --coordinator: device speeds are played on virtual time, and against an external coordinator devices run at this machine's speed"
                )
            }
        } else if let stray = [
            ("--shard", shard != nil), ("--ca-cert", caCert != nil), ("--concurrency", concurrency != nil),
            ("--host-timeout", hostTimeout != nil), ("--process", process != nil),
        ].first(where: { $0.1 }) {
            throw SimulationError(.invalidOption, "\(stray.0) needs --coordinator (it is about running against a coordinator elsewhere)")
        }
        if let model { c.model = model }
        if devices != nil, clientsAlias != nil {
            throw SimulationError(.invalidOption, "--clients is the old name of --devices: give one of them")
        }
        if let clients { c.clients = clients }
        if let fraction { c.fraction = fraction }
        if let overSelection { c.overSelection = overSelection }
        if let localEpochs { c.localEpochs = localEpochs }
        if let proximalMu { c.proximalMu = proximalMu }
        if let batchSize { c.batchSize = batchSize }
        if let learningRate { c.learningRate = learningRate }
        if let rounds { c.rounds = rounds }
        if let evaluateEvery { c.evaluateEvery = evaluateEvery }
        if let partition { c.partition = partition }
        if let aggregator { c.aggregator.kind = aggregator }
        if let serverLearningRate { c.aggregator.serverLearningRate = serverLearningRate }
        if let availability { c.availability = try availability.availability() }
        if let deviceSpeeds { c.deviceSpeeds = try DeviceSpeedTrace.read(contentsOf: URL(fileURLWithPath: deviceSpeeds)) }
        if let dropout { c.dropout = dropout }
        if let windowSeconds {
            c.windowSeconds = windowSeconds
        } else if secureAggregation && coordinator == nil {
            c.windowSeconds = max(c.windowSeconds, SimulationConfiguration.secureWindowSeconds)
        }
        if let cycleSeconds { c.cycleSeconds = cycleSeconds }
        if let transport { c.transport = transport }
        if let turnedAway { c.turnedAway = turnedAway }
        if let seed { c.seed = seed }
        if let output { c.output = URL(fileURLWithPath: output) }
        c.robustAggregation = robustAggregation
        if aggregation == .buffered {
            let defaults = BufferedAggregationConfig()
            let size = bufferSize ?? c.goal
            // The default concurrency is four buffers, within the protocol's limit (a huge --buffer-size is refused by it).
            let concurrency = size.multipliedReportingOverflow(by: 4)
            c.buffered = BufferedAggregationConfig(
                bufferSize: size,
                maxConcurrency: maxConcurrency
                    ?? (concurrency.overflow ? Int.max : min(concurrency.partialValue, BufferedAggregationConfig.maximumConcurrency)),
                stalenessExponent: stalenessExponent ?? defaults.stalenessExponent,
                maxStaleness: maxStaleness ?? defaults.maxStaleness)
        } else if let stray = [
            ("--buffer-size", bufferSize != nil), ("--max-concurrency", maxConcurrency != nil), ("--max-staleness", maxStaleness != nil),
            ("--staleness-exponent", stalenessExponent != nil),
        ].first(where: \.1) {
            throw SimulationError(.invalidOption, "\(stray.0) needs --aggregation buffered")
        }
        c.virtualHours = virtualHours
        c.windowInterval = windowInterval
        c.attack = try attackConfiguration()
        if let holdoutFraction { c.holdoutFraction = holdoutFraction }
        if let evaluationGoal {
            c.federatedEvaluation = FederatedEvaluationConfig(every: evaluationEvery ?? 1, goal: evaluationGoal)
        } else if evaluationEvery != nil {
            throw SimulationError(.invalidOption, "--evaluation-every needs --evaluation-goal (the device results aggregated per checkpoint)")
        }
        c.privacy = try privacy(clients: c.clients)
        c.secureAggregation = try secure(goal: c.goal, windowSeconds: coordinator == nil ? c.windowSeconds : c.cycleSeconds)
        if let privacy = c.privacy, var failure = privacy.validationFailure(goalCount: c.goal, capacity: c.capacity) {
            for (field, flag) in Self.privacyFlags { failure = failure.replacingOccurrences(of: field, with: flag) }
            throw SimulationError(.invalidOption, failure)
        }
        do throws(SimulationError) { try c.validate() } catch {
            // The library names its own fields; say the options the user typed.
            var message = error.message
            for (field, flag) in Self.libraryFieldFlags { message = message.replacingOccurrences(of: field, with: flag) }
            throw SimulationError(error.code, message)
        }
        return c
    }

    /// The secure aggregation the `--sa-*` options ask for; nil without `--secure-aggregation`.
    func secure(goal: Int, windowSeconds: Double) throws(SimulationError) -> SecureAggregationConfig? {
        guard secureAggregation else {
            let stray = [
                ("--sa-shares", saShares != nil), ("--sa-threshold", saThreshold != nil), ("--sa-clipping-range", saClippingRange != nil),
                ("--sa-quantization-range", saQuantizationRange != nil), ("--sa-stage-timeout", saStageTimeout != nil),
                ("--sa-consistency-check", saConsistencyCheck),
            ].first { $0.1 }
            if let stray { throw SimulationError(.invalidOption, "\(stray.0) needs --secure-aggregation") }
            return nil
        }
        // advertise_keys closes at the goal: a roster holds at most `goal` devices, however many were over-selected.
        let neighbours = min(saShares ?? (goal - 1), goal - 1)
        if let saThreshold, saThreshold < 2 {
            throw SimulationError(
                .invalidOption, "--sa-threshold must be at least 2, not \(saThreshold): with 1, a single neighbour's share would reveal a device's secrets")
        }
        if let saThreshold, saThreshold > neighbours {
            throw SimulationError(
                .invalidOption,
                "--sa-threshold \(saThreshold) is more than the \(neighbours) neighbours a device has (a cycle's goal of \(goal) devices, --fraction × --devices, less itself\(saShares == nil ? "" : ", or --sa-shares")): at most \(neighbours)"
            )
        }
        var parameters = SecureAggregationParameters(shares: saShares, threshold: saThreshold ?? max(2, neighbours / 2 + 1))
        if let saClippingRange { parameters.clippingRange = saClippingRange }
        if let saQuantizationRange { parameters.quantizationRange = saQuantizationRange }
        parameters.consistencyCheck = saConsistencyCheck
        return SecureAggregationConfig(parameters: parameters, stageTimeout: saStageTimeout ?? windowSeconds / 6)
    }

    /// The attack the `--attack*` options ask for; nil without `--attackers`.
    func attackConfiguration() throws(SimulationError) -> AttackConfiguration? {
        guard let attackers else {
            if attack != nil || attackScale != nil {
                throw SimulationError(
                    .invalidOption, "\(attack != nil ? "--attack" : "--attack-scale") needs --attackers (the fraction of the devices that attack)")
            }
            return nil
        }
        let kind = attack ?? .signFlip
        if kind == .labelFlip && attackScale != nil {
            throw SimulationError(.invalidOption, "--attack-scale does not apply to --attack label-flip (its devices train honestly on flipped labels)")
        }
        return AttackConfiguration(fraction: attackers, kind: kind, scale: attackScale)
    }

    /// The differential privacy the `--dp-*` options ask for; nil without `--dp-noise-multiplier`.
    func privacy(clients: Int) throws(SimulationError) -> PrivacyConfig? {
        guard let noise = dpNoiseMultiplier else {
            let stray = [
                ("--dp-clip", dpClip != nil), ("--dp-adaptive-quantile", dpAdaptiveQuantile != nil), ("--dp-mode", dpMode != nil),
                ("--dp-delta", dpDelta != nil), ("--population", population != nil),
            ].first { $0.1 }
            if let stray { throw SimulationError(.invalidOption, "\(stray.0) needs --dp-noise-multiplier (which turns differential privacy on)") }
            return nil
        }
        var config = PrivacyConfig(
            mode: dpMode?.mode ?? .central, clippingNorm: dpClip ?? 1, noiseMultiplier: noise, delta: dpDelta ?? 1e-5,
            population: population ?? clients
        )
        if let quantile = dpAdaptiveQuantile {
            config.clippingNorm = nil
            config.adaptiveClipping = PrivacyConfig.AdaptiveClipping(targetQuantile: quantile, initialNorm: dpClip ?? 1)
        }
        return config
    }

    /// Option values are checked here, so a bad one is reported with `simulate`'s usage.
    func validate() throws {
        let configuration: SimulationConfiguration
        do { configuration = try makeConfiguration() } catch { throw ValidationError(namingOption(error.message, Self.flags)) }
        if let coordinator {
            let external = try externalCoordinator(coordinator)
            do throws(SimulationError) { try ExternalFleet.validate(configuration, external) } catch {
                throw ValidationError(namingOption(error.message, Self.externalFlags))
            }
        }
    }

    func run() async throws {
        let configuration: SimulationConfiguration
        do { configuration = try makeConfiguration() } catch { throw ValidationError(namingOption(error.message, Self.flags)) }
        let progress = ProgressDisplay.standardError()
        // The fleet allocates and frees a model, a report and a diff of the model's size per participant.
        Allocator.keepLargeBuffersOnHeap()
        // Ctrl-C (or SIGTERM) stops after the round in progress (against an external coordinator: at once, its devices
        // stopped): the rounds run are reported and the run's scratch files removed; a second one removes the scratch
        // files and quits at once.
        let stop = SimulationStop()
        let signals = await UnixSignalsSequence(trapping: .sigint, .sigterm)
        let external = coordinator != nil
        let watcher = Task {
            for await _ in signals {
                guard stop.request() else {
                    stop.removeRegisteredScratch()
                    Foundation.exit(130)
                }
                if external && !stop.isRunning {
                    // Still setting up (preparing data, waiting for shard 1 to host): nothing to finish, quit now.
                    progress.note("interrupted before the devices started")
                    stop.removeRegisteredScratch()
                    Foundation.exit(130)
                }
                progress.note(
                    external
                        ? "interrupted: stopping this shard's devices, then writing the summary (interrupt again to quit at once)"
                        : "interrupted: finishing the round in progress, then writing the report (interrupt again to quit at once)")
            }
        }
        defer { watcher.cancel() }
        if let coordinator {
            try await runExternal(configuration, coordinator: coordinator, progress: progress, stop: stop)
            return
        }
        let result = try await SimulationRunner.run(configuration, progress: progress, clock: SystemClock(), stop: stop)
        print(Self.table(result.summary))
        if let shortfall = result.summary.shortfall { print("note: \(shortfall)") }
        print("report: \(result.directory.appendingPathComponent("report.html").path)")
        print("metrics: \(result.directory.appendingPathComponent("metrics.jsonl").path)")
        if let planned = result.summary.plannedRounds {
            print("note: stopped after \(result.summary.rounds) of \(planned) rounds")
            throw ExitCode(130)
        }
    }

    /// The option behind each field of ``ExternalCoordinator`` and the external checks.
    static let externalFlags = [
        "coordinator": "--coordinator", "shard": "--shard", "concurrency": "--concurrency", "hostTimeout": "--host-timeout",
        "clients": "--devices", "CA certificate file": "--ca-cert",
    ]

    /// A shard against `--coordinator`.
    func runExternal(_ configuration: SimulationConfiguration, coordinator url: String, progress: ProgressDisplay, stop: SimulationStop) async throws {
        let external = try externalCoordinator(url)
        let result = try await Self.validated { () async throws(SimulationError) in
            try await ExternalFleet.run(
                configuration, coordinator: external, environment: ProcessInfo.processInfo.environment, progress: progress, clock: SystemClock(),
                stop: stop)
        }
        print(Self.table(result.summary))
        print("summary: \(result.directory.appendingPathComponent("summary.json").path)")
        print("metrics: \(result.directory.appendingPathComponent("metrics.jsonl").path)")
        if let planned = result.summary.plannedRounds, stop.isRequested {
            print("note: stopped with \(result.summary.aggregatedRounds) of \(planned) rounds aggregated")
            throw ExitCode(130)
        }
    }

    /// The `--coordinator`, `--shard`, `--ca-cert`, `--concurrency`, `--host-timeout` and `--process` settings.
    func externalCoordinator(_ url: String) throws -> ExternalCoordinator {
        // Several instances of one coordinator, separated by commas: the devices are spread over them.
        let urls = url.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        var external = ExternalCoordinator(url: urls[0])
        external.additionalURLs = Array(urls.dropFirst())
        if let shard {
            do throws(SimulationError) { external.shard = try FleetShard(parsing: shard) } catch {
                throw ValidationError(namingOption(error.message, Self.externalFlags))
            }
        }
        if let caCert {
            do throws(ConnectionError) { external.trustRoots = try TrustRoots.certificateFile(caCert) } catch {
                throw ValidationError(namingOption(error.message, Self.externalFlags))
            }
        }
        if let concurrency { external.concurrency = concurrency }
        if let hostTimeout {
            guard hostTimeout <= WireLimits.maximumSeconds else {
                throw ValidationError("--host-timeout must be at most \(Int(WireLimits.maximumSeconds)) seconds, not \(hostTimeout)")
            }
            external.hostTimeout = try positiveSeconds(hostTimeout, option: "--host-timeout")
        }
        external.processName = process
        return external
    }

    /// `body`'s result; an invalid option becomes a usage error naming the option.
    static func validated<T>(_ body: () async throws(SimulationError) -> T) async throws -> T {
        do { return try await body() } catch {
            if error.code == .invalidOption { throw ValidationError(namingOption(error.message, externalFlags)) }
            throw error
        }
    }

    /// A shard's summary as an aligned two-column table.
    static func table(_ s: ShardSummary) -> String {
        func f(_ v: Double, _ digits: Int = 4) -> String { v.isFinite ? String(format: "%.\(digits)f", v) : v.isNaN ? "NaN" : v > 0 ? "inf" : "-inf" }
        var rows: [(String, String)] = [
            ("coordinator / shard", "\(s.settings["coordinator"] ?? "?") / \(s.shard)"),
            ("process", "\(s.processID) (\(s.hosted ? "hosted by this shard" : "hosted before or by shard 1"))"),
            ("devices in this shard", "\(s.devices) of \(s.settings["clients"] ?? "?")"),
            ("cycles aggregated / abandoned", "\(s.aggregatedRounds) / \(s.abandonedRounds) (\(s.rounds) observed)"),
            ("wall time", "\(f(s.wallSeconds, 2)) s devices + \(f(s.setupSeconds, 2)) s setup"),
            ("check-ins / admitted", "\(s.checkIns) / \(s.admitted)"),
            ("reported / late / dropped", "\(s.reported) / \(s.late) / \(s.dropped)"),
            (
                "rejected",
                "\(s.rejected)"
                    + (s.rejections.isEmpty ? "" : " (" + s.rejections.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ") + ")")
            ),
            ("failed", "\(s.failed)" + (s.lastError.map { " (last: \($0))" } ?? "")),
        ]
        if let initial = s.initial, let final = s.final {
            if let a = final.accuracy {
                rows.append(("test accuracy", "\(f(initial.accuracy ?? 0)) → \(f(a)) (best \(s.bestAccuracy.map { f($0) } ?? "none finite"))"))
            }
            if let r = final.rmse { rows.append(("test RMSE", "\(f(initial.rmse ?? 0)) → \(f(r)) (best \(s.bestRMSE.map { f($0) } ?? "none finite"))")) }
        }
        if let epsilon = s.epsilon { rows.append(("privacy spent", "ε = \(f(epsilon, 3))")) }
        return aligned(rows)
    }

    /// Rows as an aligned two-column table.
    static func aligned(_ rows: [(String, String)]) -> String {
        let width = rows.map(\.0.count).max() ?? 0
        return rows.map { $0.0.padding(toLength: width, withPad: " ", startingAt: 0) + "  " + $0.1 }.joined(separator: "\n")
    }

    /// The summary as an aligned two-column table.
    static func table(_ s: SimulationSummary) -> String {
        func f(_ v: Double, _ digits: Int = 4) -> String { v.isFinite ? String(format: "%.\(digits)f", v) : v.isNaN ? "NaN" : v > 0 ? "inf" : "-inf" }
        var rows: [(String, String)] = [
            ("dataset / model", "\(s.settings["dataset"] ?? "?") / \(s.settings["model"] ?? "?")"),
            ("devices / goal per round", "\(s.settings["clients"] ?? "?") / \(s.settings["goal"] ?? "?")"),
            ("rounds (aggregated)", "\(s.rounds) (\(s.aggregatedRounds))"),
            ("wall time", "\(f(s.wallSeconds, 2)) s rounds + \(f(s.setupSeconds, 2)) s setup"),
            ("virtual time", "\(f(s.virtualSeconds / 3600, 2)) h"),
            ("check-ins / modeled turned away", "\(s.checkIns) / \(s.turnedAwayModeled)"),
            ("selected / aggregated", "\(s.selected) / \(s.participants)"),
            ("dropouts / late", "\(s.dropouts) / \(s.late)"),
            ("expired windows / resumed", "\(s.expirations) / \(s.resumed)"),
            ("MB up / down", "\(f(Double(s.bytesUp) / 1e6, 1)) / \(f(Double(s.bytesDown) / 1e6, 1))"),
            ("test loss", "\(f(s.initial.loss)) → \(f(s.final.loss))"),
        ]
        if let a = s.final.accuracy {
            rows.append(("test accuracy", "\(f(s.initial.accuracy ?? 0)) → \(f(a)) (best \(s.bestAccuracy.map { f($0) } ?? "none finite"))"))
        }
        if let p = s.final.perplexity { rows.append(("test perplexity", "\(f(s.initial.perplexity ?? 0, 2)) → \(f(p, 2))")) }
        if let steps = s.secureAggregation {
            let signed = steps.signed.map { ", signed \($0)" } ?? ""
            rows.append(
                (
                    "secure aggregation steps",
                    "advertised \(steps.advertised), shared \(steps.shared), masked \(steps.masked)\(signed), unmasked \(steps.unmasked)"
                ))
        }
        if let epsilon = s.epsilon { rows.append(("privacy spent", "ε = \(f(epsilon, 3)) at δ = \(s.settings["dp_delta"] ?? "?")")) }
        if let r = s.final.rmse { rows.append(("test RMSE", "\(f(s.initial.rmse ?? 0)) → \(f(r)) (best \(s.bestRMSE.map { f($0) } ?? "none finite"))")) }
        if let federated = s.federatedEvaluation {
            let metric = federated.metrics["accuracy"].map { "accuracy \(f($0))" } ?? federated.metrics["rmse"].map { "RMSE \(f($0))" } ?? ""
            rows.append(
                (
                    "federated evaluation",
                    "checkpoint \(federated.checkpoint): \(metric), loss \(f(federated.metrics["loss"] ?? .nan)) on \(federated.samples) held-out samples"
                ))
        }
        return aligned(rows)
    }
}

/// `--dp-mode`: where differential privacy's noise is added.
enum PrivacyModeArgument: String, ExpressibleByArgument, CaseIterable {
    case central, local, distributed

    var mode: PrivacyConfig.Mode {
        switch self {
        case .central: .central
        case .local: .local
        case .distributed: .distributed
        }
    }
}

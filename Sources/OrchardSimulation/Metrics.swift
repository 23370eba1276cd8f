public import OrchardProtocol
/// What one round of the simulation did: one line of `metrics.jsonl`, keys in snake_case.
public struct RoundMetrics: Sendable, Hashable, Codable {
    /// The round (1-based).
    public var round: Int
    /// Real seconds the round took on this machine, from its opening to its aggregation (its test evaluation runs
    /// while the next round does).
    public var wallSeconds: Double
    /// Virtual time the round opened.
    public var virtualStart: Double
    /// Virtual time it closed.
    public var virtualEnd: Double
    /// Fraction of the fleet eligible when the round opened.
    public var availableFraction: Double
    /// Devices the coordinator assigned to the round.
    public var selected: Int
    /// Devices whose updates were aggregated.
    public var participants: Int
    /// Assigned devices that went away before reporting.
    public var dropouts: Int
    /// Of the dropouts, devices whose local training diverged (produced NaN or infinity, so nothing was sent); nil when none.
    public var diverged: Int?
    /// Assigned devices that had not reported when the cycle closed (deadline, or the goal already met).
    public var late: Int
    /// Background windows that expired mid-training.
    public var expirations: Int
    /// Trainings that resumed from a checkpoint in a later window.
    public var resumed: Int
    /// Bytes devices uploaded (reports).
    public var bytesUp: Int
    /// Bytes devices downloaded (models).
    public var bytesDown: Int
    /// Whether the cycle produced a new checkpoint (false: abandoned for too few reports).
    public var aggregated: Bool
    /// Test loss of the global model after the round; nil when the round was not evaluated (`--eval-every`).
    public var testLoss: Double?
    /// Test accuracy, for classifiers.
    public var testAccuracy: Double?
    /// Test root-mean-squared error, for regressors.
    public var testRMSE: Double?
    /// Test perplexity per position that is not padding, for sequence models.
    public var testPerplexity: Double?
    /// ε spent after the round under differential privacy (at the process's δ), nil without it.
    public var epsilon: Double?
    /// The privacy clipping bound of the next round (it moves with adaptive clipping), nil without privacy.
    public var clippingNorm: Double?
    /// Under secure aggregation: how many devices completed each stage, nil without it.
    public var secureAggregation: SecureStageCounts?
    /// Devices whose stack ran and asked the coordinator for the round's cycle (admitted or turned away).
    public var checkIns: Int
    /// Eligible devices the round reached after its cycle was full, counted as turned away without running their stack
    /// (``TurnedAwayChoice/modeled``; 0 with `full-stack`).
    public var turnedAwayModeled: Int
    /// The federated evaluation of the checkpoint the round trained from (devices' held-out samples), once the coordinator
    /// finalized it; nil without federated evaluation, or when it was not final by the round's end.
    public var federatedEvaluation: CheckpointEvaluation?
    /// Buffered aggregation: the mean staleness of the reports the round's releases folded (nil without a release).
    public var staleness: Double?
    /// Buffered aggregation: buffers published during the round (a buffered round is a span of virtual time).
    public var releases: Int?
    /// Buffered aggregation: devices admitted and training (not yet reported or expired) when the round ended.
    public var inFlight: Int?

    /// Creates a record.
    public init(
        round: Int, wallSeconds: Double, virtualStart: Double, virtualEnd: Double, availableFraction: Double, selected: Int,
        participants: Int, dropouts: Int, late: Int, expirations: Int, resumed: Int, bytesUp: Int, bytesDown: Int,
        aggregated: Bool, testLoss: Double?, testAccuracy: Double?, testRMSE: Double?, epsilon: Double? = nil, clippingNorm: Double? = nil,
        checkIns: Int = 0, turnedAwayModeled: Int = 0
    ) {
        self.checkIns = checkIns
        self.turnedAwayModeled = turnedAwayModeled
        self.epsilon = epsilon
        self.clippingNorm = clippingNorm
        self.round = round
        self.wallSeconds = wallSeconds
        self.virtualStart = virtualStart
        self.virtualEnd = virtualEnd
        self.availableFraction = availableFraction
        self.selected = selected
        self.participants = participants
        self.dropouts = dropouts
        self.late = late
        self.expirations = expirations
        self.resumed = resumed
        self.bytesUp = bytesUp
        self.bytesDown = bytesDown
        self.aggregated = aggregated
        self.testLoss = testLoss
        self.testAccuracy = testAccuracy
        self.testRMSE = testRMSE
    }

    private enum CodingKeys: String, CodingKey {
        case round, selected, participants, dropouts, diverged, late, expirations, resumed, aggregated, epsilon
        case clippingNorm = "clipping_norm"
        case secureAggregation = "secure_aggregation"
        case wallSeconds = "wall_seconds", virtualStart = "virtual_start", virtualEnd = "virtual_end"
        case availableFraction = "available_fraction", bytesUp = "bytes_up", bytesDown = "bytes_down"
        case testLoss = "test_loss", testAccuracy = "test_accuracy", testRMSE = "test_rmse", testPerplexity = "test_perplexity"
        case checkIns = "check_ins", turnedAwayModeled = "turned_away_modeled"
        case federatedEvaluation = "federated_evaluation"
        case staleness, releases, inFlight = "in_flight"
    }

    /// The same record without its wall time (the part that is deterministic for a seed).
    public var withoutTiming: RoundMetrics {
        var copy = self
        copy.wallSeconds = 0
        copy.federatedEvaluation?.evaluatedAt = 0
        return copy
    }
}

/// Devices that completed each stage of a round's secure aggregation (a device that went away or whose window ended
/// before a stage's message does not count in it or the later ones).
public struct SecureStageCounts: Sendable, Hashable, Codable {
    /// Devices that advertised their keys.
    public var advertised: Int
    /// Devices that sent their shares.
    public var shared: Int
    /// Devices that sent their masked input (their update is in the aggregate when the round aggregated).
    public var masked: Int
    /// Devices that signed the survivors (with `consistency_check`; nil without).
    public var signed: Int?
    /// Devices that revealed their shares.
    public var unmasked: Int

    /// Creates counts.
    public init(advertised: Int, shared: Int, masked: Int, signed: Int? = nil, unmasked: Int) {
        self.advertised = advertised
        self.shared = shared
        self.masked = masked
        self.signed = signed
        self.unmasked = unmasked
    }
}

/// The model quality after a round.
public struct Evaluation: Sendable, Hashable, Codable {
    /// Mean loss on the test set.
    public var loss: Double
    /// Accuracy, for classifiers.
    public var accuracy: Double?
    /// Root-mean-squared error, for regressors.
    public var rmse: Double?
    /// Perplexity per position that is not padding, for sequence models.
    public var perplexity: Double?

    /// Creates an evaluation.
    public init(loss: Double, accuracy: Double? = nil, rmse: Double? = nil, perplexity: Double? = nil) {
        self.loss = loss
        self.accuracy = accuracy
        self.rmse = rmse
        self.perplexity = perplexity
    }
}

extension SimulationSummary {
    /// Why some rounds produced no checkpoint, and what to change; nil when every round did.
    public var shortfall: String? {
        guard aggregatedRounds < rounds else { return nil }
        func plural(_ n: Int, _ word: String) -> String { "\(n) \(word)\(n == 1 ? "" : "s")" }
        var causes: [String] = []
        let goal = settings["goal"].flatMap { Int($0) }
        if let goal, selected < goal * rounds {
            causes.append(
                "\(plural(selected, "device")) were admitted over \(plural(rounds, "round")) against a goal of \(goal) a round: more devices (--clients) or wider availability (--availability)"
            )
        }
        if late > 0 {
            causes.append(
                "\(plural(late, "admitted device")) did not report before the deadline (\(plural(expirations, "background window")) ended mid-task): longer windows (--window-seconds) or cycles (--cycle-seconds), or less data per device (more --clients)"
            )
        }
        let wentAway = dropouts - (diverged ?? 0)
        if wentAway > 0 { causes.append("\(plural(wentAway, "device")) went away before reporting (--dropout)") }
        if let diverged {
            causes.append(
                "\(plural(diverged, "device")) sent nothing because local training from the global model diverged (NaN or infinity): the model was driven out of range (an attack, or too high a learning rate)"
            )
        }
        if causes.isEmpty { causes.append("see each round's counts in metrics.jsonl") }
        return "\(rounds - aggregatedRounds) of \(plural(rounds, "round")) produced no checkpoint: " + causes.joined(separator: "; ")
    }
}

/// The whole run, as written to `summary.json` (keys in snake_case).
public struct SimulationSummary: Sendable, Hashable, Codable {
    /// The scenario's settings (what the command line said, defaults filled in).
    public var settings: SimulationSettings
    /// Rounds run.
    public var rounds: Int
    /// Rounds that produced a checkpoint.
    public var aggregatedRounds: Int
    /// Real seconds for the federated rounds.
    public var wallSeconds: Double
    /// Real seconds spent before the rounds (loading data, central pretraining, starting the coordinator).
    public var setupSeconds: Double
    /// Virtual seconds the fleet lived through.
    public var virtualSeconds: Double
    /// Total devices assigned.
    public var selected: Int
    /// Total updates aggregated.
    public var participants: Int
    /// Total dropouts.
    public var dropouts: Int
    /// Of those, devices whose local training diverged (NaN or infinity); nil when none did.
    public var diverged: Int?
    /// Total late devices.
    public var late: Int
    /// Total expired background windows.
    public var expirations: Int
    /// Total resumed trainings.
    public var resumed: Int
    /// Total bytes up.
    public var bytesUp: Int
    /// Total bytes down.
    public var bytesDown: Int
    /// Evaluation of the initial global model (before round 1).
    public var initial: Evaluation
    /// Evaluation after the last round (the last round is always evaluated).
    public var final: Evaluation
    /// Best test accuracy over the rounds, for classifiers.
    public var bestAccuracy: Double?
    /// Best test RMSE over the rounds, for regressors.
    public var bestRMSE: Double?
    /// ε spent by the last round under differential privacy, nil without it.
    public var epsilon: Double?
    /// Under secure aggregation: the devices at each stage, summed over the rounds.
    public var secureAggregation: SecureStageCounts?
    /// Total check-ins of devices whose stack ran.
    public var checkIns: Int
    /// Total devices counted as turned away without running their stack (reached after their round's cycle was full).
    public var turnedAwayModeled: Int
    /// Set when the run was stopped before its last round (Ctrl-C): the rounds it had been asked for; nil when it ran
    /// them all.
    public var plannedRounds: Int?
    /// The same model trained centrally on all the training rows, evaluated on the same test set (the housing
    /// scenario's central pretraining): the reference the federated curve is read against. Nil when not trained.
    public var centralRMSE: Double?
    /// The latest federated evaluation (devices' held-out samples) the rounds recorded, nil without federated evaluation.
    public var federatedEvaluation: CheckpointEvaluation?

    private enum CodingKeys: String, CodingKey {
        case plannedRounds = "planned_rounds", centralRMSE = "central_rmse", federatedEvaluation = "federated_evaluation"
        case settings, rounds, selected, participants, dropouts, diverged, late, expirations, resumed, initial, `final`, epsilon
        case checkIns = "check_ins", turnedAwayModeled = "turned_away_modeled"
        case secureAggregation = "secure_aggregation"
        case aggregatedRounds = "aggregated_rounds", wallSeconds = "wall_seconds", setupSeconds = "setup_seconds"
        case virtualSeconds = "virtual_seconds", bytesUp = "bytes_up", bytesDown = "bytes_down"
        case bestAccuracy = "best_accuracy", bestRMSE = "best_rmse"
    }

    /// Summarises round records.
    public init(settings: SimulationSettings, initial: Evaluation, rounds records: [RoundMetrics], setupSeconds: Double) {
        self.settings = settings
        rounds = records.count
        aggregatedRounds = records.count { $0.aggregated }
        wallSeconds = records.reduce(0) { $0 + $1.wallSeconds }
        self.setupSeconds = setupSeconds
        virtualSeconds = records.last?.virtualEnd ?? 0
        selected = records.reduce(0) { $0 + $1.selected }
        participants = records.reduce(0) { $0 + $1.participants }
        dropouts = records.reduce(0) { $0 + $1.dropouts }
        let diverged = records.reduce(0) { $0 + ($1.diverged ?? 0) }
        self.diverged = diverged > 0 ? diverged : nil
        late = records.reduce(0) { $0 + $1.late }
        expirations = records.reduce(0) { $0 + $1.expirations }
        resumed = records.reduce(0) { $0 + $1.resumed }
        bytesUp = records.reduce(0) { $0 + $1.bytesUp }
        bytesDown = records.reduce(0) { $0 + $1.bytesDown }
        checkIns = records.reduce(0) { $0 + $1.checkIns }
        turnedAwayModeled = records.reduce(0) { $0 + $1.turnedAwayModeled }
        self.initial = initial
        final =
            records.last(where: { $0.testLoss != nil }).map {
                Evaluation(loss: $0.testLoss ?? 0, accuracy: $0.testAccuracy, rmse: $0.testRMSE, perplexity: $0.testPerplexity)
            } ?? initial
        bestAccuracy = records.compactMap(\.testAccuracy).filter(\.isFinite).max()
        bestRMSE = records.compactMap(\.testRMSE).filter(\.isFinite).min()
        epsilon = records.last(where: { $0.epsilon != nil })?.epsilon
        federatedEvaluation = records.last(where: { $0.federatedEvaluation != nil })?.federatedEvaluation
        let steps = records.compactMap(\.secureAggregation)
        secureAggregation =
            steps.isEmpty
            ? nil
            : SecureStageCounts(
                advertised: steps.reduce(0) { $0 + $1.advertised }, shared: steps.reduce(0) { $0 + $1.shared },
                masked: steps.reduce(0) { $0 + $1.masked }, signed: steps.contains { $0.signed != nil } ? steps.reduce(0) { $0 + ($1.signed ?? 0) } : nil,
                unmasked: steps.reduce(0) { $0 + $1.unmasked })
    }
}

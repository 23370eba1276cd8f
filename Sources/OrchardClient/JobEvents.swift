/// A stage of a job's cycle.
public struct JobPhase: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable {
        case checkingConditions, authenticating, uploadingPendingReport, measuringLinkSpeed, requestingCycle, downloadingPlan
        case downloadingModel, training, reporting, secureAggregation, evaluating, reportingEvaluation, finished
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Reading the device's power and network state.
    public static let checkingConditions = JobPhase(.checkingConditions)
    /// Proving the device's identity.
    public static let authenticating = JobPhase(.authenticating)
    /// Uploading a report an earlier window could not deliver.
    public static let uploadingPendingReport = JobPhase(.uploadingPendingReport)
    /// Timing a download and an upload against the coordinator, for a process that gates cycles on link speed.
    public static let measuringLinkSpeed = JobPhase(.measuringLinkSpeed)
    /// Asking to join the current cycle.
    public static let requestingCycle = JobPhase(.requestingCycle)
    /// Fetching the training plan.
    public static let downloadingPlan = JobPhase(.downloadingPlan)
    /// Fetching (or resuming the download of) the model.
    public static let downloadingModel = JobPhase(.downloadingModel)
    /// Training locally.
    public static let training = JobPhase(.training)
    /// Uploading the diff.
    public static let reporting = JobPhase(.reporting)
    /// Sending the diff masked, through the cycle's secure aggregation (processes that use it), instead of a report.
    public static let secureAggregation = JobPhase(.secureAggregation)
    /// Evaluating the latest checkpoint on the held-out split (an evaluation task).
    public static let evaluating = JobPhase(.evaluating)
    /// Sending the evaluation's metrics.
    public static let reportingEvaluation = JobPhase(.reportingEvaluation)
    /// The cycle ended (see ``JobEvent/finished(_:)``).
    public static let finished = JobPhase(.finished)

    public var description: String { kind.rawValue }
}

/// Something observable that happened during a job's cycle.
public enum JobEvent: Sendable, Hashable {
    /// The cycle entered a phase.
    case phase(JobPhase)
    /// Model bytes held so far, of the total when known.
    case downloaded(bytes: Int, of: Int?)
    /// Training resumed from a checkpoint saved by an earlier, interrupted run.
    case resumedTraining
    /// A batch of local training finished.
    case trained(TrainingStep)
    /// A call failed transiently and will be retried after a backoff.
    case retrying(attempt: Int, error: OrchardClientError)
    /// An evaluation task's result was accepted (the window may go on to train).
    case evaluated(EvaluationReceipt)
    /// The cycle ended with this outcome.
    case finished(CycleOutcome)
}

/// The receipt of an accepted report.
public struct ReportReceipt: Sendable, Hashable {
    /// The cycle the report counted toward.
    public var cycle: Int
    /// Reports accepted in that cycle so far, when the coordinator said.
    public var reportsReceived: Int?
    /// Seconds until the device should ask for its next cycle, when the coordinator said.
    public var retryAfter: Double?
    /// Whether the report was produced in an earlier window and kept on disk until now.
    public var fromEarlierWindow: Bool

    /// Creates a receipt.
    public init(cycle: Int, reportsReceived: Int?, retryAfter: Double?, fromEarlierWindow: Bool) {
        self.cycle = cycle
        self.reportsReceived = reportsReceived
        self.retryAfter = retryAfter
        self.fromEarlierWindow = fromEarlierWindow
    }
}

/// The receipt of an accepted evaluation result.
public struct EvaluationReceipt: Sendable, Hashable {
    /// The checkpoint evaluated.
    public var checkpoint: Int
    /// Held-out samples evaluated.
    public var samples: Int
    /// The metrics sent (`loss`, and `accuracy` or `rmse`/`mae`).
    public var metrics: [String: Double]
    /// Results the coordinator holds for the checkpoint, this one included, when it said.
    public var resultsReceived: Int?

    /// Creates a receipt.
    public init(checkpoint: Int, samples: Int, metrics: [String: Double], resultsReceived: Int?) {
        self.checkpoint = checkpoint
        self.samples = samples
        self.metrics = metrics
        self.resultsReceived = resultsReceived
    }
}

/// How one attempt at a cycle ended (errors are thrown as ``OrchardClientError``).
public enum CycleOutcome: Sendable, Hashable {
    /// A report was accepted.
    case reported(ReportReceipt)
    /// The coordinator turned the device away; ask again after `retryAfter` seconds.
    case rejected(retryAfter: Double, reason: String)
    /// The device's conditions do not allow a cycle now; the strings name the unmet requirements.
    case conditionsNotMet([String])
    /// The window ran an evaluation task and no training, as it asked for evaluation only (a window that goes on to ask
    /// for training ends with that request's outcome, and its evaluation is a ``JobEvent/evaluated(_:)`` event).
    case evaluated(EvaluationReceipt)

    /// Seconds after which the device should try again, when the coordinator said.
    public var retryAfter: Double? {
        switch self {
        case .reported(let receipt): receipt.retryAfter
        case .rejected(let retryAfter, _): retryAfter
        case .conditionsNotMet, .evaluated: nil
        }
    }
}

public import CoreMetrics
import OrchardProtocol

/// The coordinator's metrics, created through an injected swift-metrics factory (Prometheus in `orchard serve`).
public struct CoordinatorMetrics: Sendable {
    let checkinsAccepted: Counter
    /// Evaluation tasks handed out (`orchard_evaluation_tasks_total`).
    let evaluationTasksAssigned: Counter
    /// Evaluation results stored (`orchard_evaluation_results_total`).
    let evaluationResults: Counter
    let checkinsRejected: Counter
    let reportsAccepted: Counter
    let reportsRefused: Counter
    let reportBytes: Counter
    let reportsClipped: Counter
    let uploadsRefusedBusy: Counter
    let uploadsInFlight: Gauge
    let cyclesAbandonedNonFinite: Counter
    let cyclesAggregated: Counter
    let cyclesAbandoned: Counter
    let aggregationSeconds: Timer
    let reportCommitSeconds: Timer
    let openCycleAssigned: Gauge
    let openCycleReported: Gauge
    let authenticationsLimited: Counter
    let speedTestsLimited: Counter
    let processLookupsFound: Counter
    let processLookupsMissing: Counter
    let processLookupsCached: Counter
    let processLookupsLimited: Counter
    /// Buffered processes: each accepted report's staleness (`orchard_report_staleness`).
    let reportStaleness: Recorder
    let factory: any MetricsFactory

    /// Creates the metrics with `factory`.
    public init(factory: any MetricsFactory) {
        self.factory = factory
        checkinsAccepted = Counter(label: "orchard_checkins_total", dimensions: [("result", "accepted")], factory: factory)
        evaluationTasksAssigned = Counter(label: "orchard_evaluation_tasks_total", factory: factory)
        evaluationResults = Counter(label: "orchard_evaluation_results_total", factory: factory)
        checkinsRejected = Counter(label: "orchard_checkins_total", dimensions: [("result", "rejected")], factory: factory)
        reportsAccepted = Counter(label: "orchard_reports_total", dimensions: [("result", "accepted")], factory: factory)
        reportsRefused = Counter(label: "orchard_reports_total", dimensions: [("result", "refused")], factory: factory)
        reportBytes = Counter(label: "orchard_report_bytes_total", factory: factory)
        reportsClipped = Counter(label: "orchard_reports_clipped_total", factory: factory)
        uploadsRefusedBusy = Counter(label: "orchard_reports_total", dimensions: [("result", "busy")], factory: factory)
        uploadsInFlight = Gauge(label: "orchard_uploads_in_flight", factory: factory)
        cyclesAbandonedNonFinite = Counter(label: "orchard_cycles_abandoned_total", dimensions: [("reason", "non_finite")], factory: factory)
        cyclesAggregated = Counter(label: "orchard_cycles_total", dimensions: [("outcome", "aggregated")], factory: factory)
        cyclesAbandoned = Counter(label: "orchard_cycles_total", dimensions: [("outcome", "abandoned")], factory: factory)
        aggregationSeconds = Timer(label: "orchard_aggregation_duration_seconds", factory: factory)
        reportCommitSeconds = Timer(label: "orchard_report_commit_duration_seconds", factory: factory)
        openCycleAssigned = Gauge(label: "orchard_open_cycle_assigned", factory: factory)
        openCycleReported = Gauge(label: "orchard_open_cycle_reported", factory: factory)
        authenticationsLimited = Counter(label: "orchard_rate_limited_total", dimensions: [("endpoint", "authenticate")], factory: factory)
        speedTestsLimited = Counter(label: "orchard_rate_limited_total", dimensions: [("endpoint", "speed_test")], factory: factory)
        processLookupsFound = Counter(label: "orchard_process_lookups_total", dimensions: [("result", "found")], factory: factory)
        processLookupsMissing = Counter(label: "orchard_process_lookups_total", dimensions: [("result", "missing")], factory: factory)
        processLookupsCached = Counter(label: "orchard_process_lookups_total", dimensions: [("result", "cached_missing")], factory: factory)
        processLookupsLimited = Counter(label: "orchard_process_lookups_total", dimensions: [("result", "limited")], factory: factory)
        reportStaleness = Recorder(label: "orchard_report_staleness", aggregate: true, factory: factory)
    }

    /// Publishes a process's privacy spend: `orchard_privacy_epsilon`, `orchard_privacy_releases` and
    /// `orchard_privacy_clipping_norm`, labelled with the process's name and version.
    func recordPrivacy(process: StoredProcess, ledger: PrivacyLedger) {
        let dimensions = [("process", process.name), ("version", process.version.description)]
        Gauge(label: "orchard_privacy_epsilon", dimensions: dimensions, factory: factory).record(ledger.epsilon)
        Gauge(label: "orchard_privacy_releases", dimensions: dimensions, factory: factory).record(ledger.releases)
        Gauge(label: "orchard_privacy_clipping_norm", dimensions: dimensions, factory: factory).record(ledger.clippingNorm)
    }

    /// Metrics that go nowhere.
    public static var discarding: CoordinatorMetrics { CoordinatorMetrics(factory: NOOPMetricsHandler.instance) }
}

/// A robust aggregation rule (`server_config.robust_aggregation`): the cycle's update is a statistic of its reports
/// that a minority of poisoned reports cannot move far, instead of their sample-weighted mean.
///
/// - `median`: the coordinate-wise median of the reports (Yin et al. 2018), each report counting once.
/// - `trimmed_mean`: per coordinate, the ⌊β·n⌋ largest and ⌊β·n⌋ smallest values are cut and the rest averaged, each
///   report counting once (`trim` is β).
/// - `multi_krum`: each report is scored by the sum of its squared distances to its n − f − 2 nearest other reports;
///   the `selected` (m) lowest-scoring ones are averaged, each once (Blanchard et al. 2017; `byzantine` is f, and m
///   defaults to n − f).
///
/// The rules need every report of a cycle, so the coordinator keeps the reports' diffs until the cycle closes
/// rather than folding them into a running sum. They cannot be combined with secure aggregation (the coordinator
/// never sees one update) or with differential privacy (its noise is calibrated to a clipped mean).
public struct RobustAggregationConfig: Sendable, Hashable, Codable {
    /// The statistic.
    public struct Rule: Sendable, Hashable, Codable, CustomStringConvertible {
        private enum Value: String, Sendable, Hashable, CaseIterable {
            case median
            case trimmedMean = "trimmed_mean"
            case multiKrum = "multi_krum"
        }
        private let value: Value
        private init(_ value: Value) { self.value = value }

        /// The coordinate-wise median.
        public static let median = Rule(.median)
        /// The coordinate-wise trimmed mean.
        public static let trimmedMean = Rule(.trimmedMean)
        /// Multi-Krum.
        public static let multiKrum = Rule(.multiKrum)

        public var description: String { value.rawValue }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            let raw = try container.decode(String.self)
            guard let value = Value(rawValue: raw) else {
                throw DecodingError.dataCorruptedError(
                    in: container, debugDescription: "robust_aggregation.rule '\(raw)' is not one of median, trimmed_mean, multi_krum")
            }
            self.value = value
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(value.rawValue)
        }
    }

    /// The statistic.
    public var rule: Rule
    /// `trimmed_mean`: the fraction β of the reports cut from each end of every coordinate, in (0, 0.5).
    public var trim: Double?
    /// `multi_krum`: f, the number of reports assumed Byzantine.
    public var byzantine: Int?
    /// `multi_krum`: m, the number of reports averaged (n − f when absent).
    public var selected: Int?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case rule, trim, byzantine, selected
    }

    /// Creates a rule's configuration.
    public init(rule: Rule, trim: Double? = nil, byzantine: Int? = nil, selected: Int? = nil) {
        self.rule = rule
        self.trim = trim
        self.byzantine = byzantine
        self.selected = selected
    }

    /// The coordinate-wise median.
    public static let median = RobustAggregationConfig(rule: .median)
    /// The coordinate-wise mean after cutting the fraction `trim` of the values from each end.
    public static func trimmedMean(trim: Double) -> RobustAggregationConfig { RobustAggregationConfig(rule: .trimmedMean, trim: trim) }
    /// Multi-Krum with `byzantine` reports assumed bad and `selected` averaged (n − f when nil).
    public static func multiKrum(byzantine: Int, selected: Int? = nil) -> RobustAggregationConfig {
        RobustAggregationConfig(rule: .multiKrum, byzantine: byzantine, selected: selected)
    }

    public init(from decoder: any Decoder) throws {
        try decoder.refuseUnknownKeys(Set(CodingKeys.allCases.map(\.rawValue)), in: "server_config.robust_aggregation")
        let c = try decoder.container(keyedBy: CodingKeys.self)
        rule = try c.decode(Rule.self, forKey: .rule)
        trim = try c.decodeIfPresent(Double.self, forKey: .trim)
        byzantine = try c.decodeIfPresent(Int.self, forKey: .byzantine)
        selected = try c.decodeIfPresent(Int.self, forKey: .selected)
    }

    /// The reports a cycle needs at least for the rule to be defined (Multi-Krum scores need n − f − 2 ≥ 1 neighbours).
    public var leastReports: Int {
        rule == .multiKrum ? (byzantine ?? 0) + 3 : 1
    }

    /// The most devices a cycle of a process with a rule may admit (`goal_count` × `over_selection`): a rule holds
    /// every report of a cycle at its close, and Multi-Krum's distances grow with the square of their number.
    public static let maximumReports = 1000

    /// Describes the first invalid field for a process whose cycles aggregate at least `minimumReports` reports and
    /// admit at most `capacity` devices, or nil.
    public func validationFailure(minimumReports: Int, capacity: Int = 1) -> String? {
        let prefix = "server_config.robust_aggregation"
        if capacity > Self.maximumReports {
            return
                "\(prefix) takes at most \(Self.maximumReports) devices a cycle (goal_count × over_selection = \(capacity)): a rule holds every report of a cycle at its close"
        }
        switch rule {
        case .median:
            if trim != nil || byzantine != nil || selected != nil {
                return "\(prefix): median takes no trim, byzantine or selected"
            }
        case .trimmedMean:
            guard let trim else { return "\(prefix).trim is required for trimmed_mean (the fraction cut from each end, in (0, 0.5))" }
            if !(trim > 0 && trim < 0.5) { return "\(prefix).trim must be in (0, 0.5), not \(trim)" }
            if byzantine != nil || selected != nil { return "\(prefix): trimmed_mean takes no byzantine or selected" }
        default:
            if trim != nil { return "\(prefix): multi_krum takes no trim" }
            guard let byzantine else { return "\(prefix).byzantine (f, the reports assumed bad) is required for multi_krum" }
            if byzantine < 0 { return "\(prefix).byzantine must not be negative, not \(byzantine)" }
            if minimumReports < byzantine + 3 {
                return
                    "server_config.minimum_reports must be at least robust_aggregation.byzantine + 3 = \(byzantine + 3) for multi_krum (each score sums the distances to n - f - 2 neighbours), not \(minimumReports)"
            }
            if let selected, !(1...(minimumReports - byzantine)).contains(selected) {
                return
                    "\(prefix).selected must be in 1...minimum_reports - byzantine = \(minimumReports - byzantine) (at most n - f reports can be averaged), not \(selected)"
            }
        }
        return nil
    }

    /// A short name for logs, summaries and reports: `median`, `trimmed_mean(0.1)`, `multi_krum(f=2)`, `multi_krum(f=2,m=10)`.
    public var summary: String {
        switch rule {
        case .median: return "median"
        case .trimmedMean: return "trimmed_mean(\(trim ?? 0))"
        default: return "multi_krum(f=\(byzantine ?? 0)" + (selected.map { ",m=\($0)" } ?? "") + ")"
        }
    }
}

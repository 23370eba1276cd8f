import Foundation

/// The ranges the coordinator enforces on names and configurations, stated the same way in `openapi.json`.
public enum WireLimits {
    /// The longest process name, in Unicode scalars (JSON Schema's `maxLength` counts the same).
    public static let maximumNameLength = 200
    /// The largest `client_config.batch_size` (a device preallocates its training buffers for one batch).
    public static let maximumBatchSize = 65_536
    /// The largest `client_config.local_epochs`.
    public static let maximumLocalEpochs = 10_000
    /// The largest `server_config.goal_count`.
    public static let maximumGoalCount = 1_000_000
    /// The largest `server_config.over_selection`.
    public static let maximumOverSelection = 100.0
    /// The longest `server_config.cycle_length` and `pace_steering_window`, in seconds (365 days).
    public static let maximumSeconds = 31_536_000.0

    /// Describes why `name` is not a valid name (1…``maximumNameLength`` Unicode scalars; no control, format or line
    /// and paragraph separator characters — bidi overrides and zero-width characters could make one name look like
    /// another; no whitespace at either end), or nil when it is; `field` names it in the message.
    public static func nameFailure(_ name: String, field: String) -> String? {
        let scalars = name.unicodeScalars
        guard !scalars.isEmpty, scalars.count <= maximumNameLength else {
            return "\(field) must be 1 to \(maximumNameLength) characters, not \(scalars.count)"
        }
        let hidden: Set<Unicode.GeneralCategory> = [.control, .format, .lineSeparator, .paragraphSeparator, .surrogate, .privateUse, .unassigned]
        if scalars.contains(where: { hidden.contains($0.properties.generalCategory) }) {
            return "\(field) must not contain control, format or invisible characters"
        }
        if let first = scalars.first, let last = scalars.last, first.properties.isWhitespace || last.properties.isWhitespace {
            return "\(field) must not begin or end with whitespace"
        }
        return nil
    }

    /// The most metrics one report (training or evaluation) may carry.
    public static let maximumMetrics = 16
    /// The largest magnitude a reported metric may have: one device's values stay far from overflowing a sum.
    public static let maximumMetricMagnitude = 1e12

    /// Describes why a report's metrics are unusable — more than ``maximumMetrics``, a name ``nameFailure(_:field:)``
    /// refuses, a value not finite or of magnitude over ``maximumMetricMagnitude`` — or nil.
    public static func metricsFailure(_ metrics: [String: Double]) -> String? {
        if metrics.count > maximumMetrics { return "at most \(maximumMetrics) metrics, not \(metrics.count)" }
        for (name, value) in metrics.sorted(by: { $0.key < $1.key }) {
            if let failure = nameFailure(name, field: "metric name") { return failure }
            if !value.isFinite || abs(value) > maximumMetricMagnitude {
                return "metric '\(name)' must be a finite number of magnitude at most \(maximumMetricMagnitude), not \(value)"
            }
        }
        return nil
    }
}

extension CodingUserInfoKey {
    /// Set to `true` in a decoder's `userInfo` to make ``HostProcessRequest`` and the server configuration refuse
    /// keys they do not know (the coordinator decodes admin requests this way; responses stay lenient for older
    /// clients).
    public static let orchardRejectUnknownKeys = CodingUserInfoKey(rawValue: "orchard.rejectUnknownKeys")!
}

extension Decoder {
    /// Whether this decode refuses unknown keys (see ``CodingUserInfoKey/orchardRejectUnknownKeys``).
    var rejectsUnknownKeys: Bool { userInfo[.orchardRejectUnknownKeys] as? Bool == true }

    /// Throws a `DecodingError` naming the first key of the current object that is not in `known`, when this
    /// decode refuses unknown keys.
    func refuseUnknownKeys(_ known: Set<String>, in owner: String) throws {
        guard rejectsUnknownKeys else { return }
        let container = try self.container(keyedBy: AnyKey.self)
        guard let unknown = container.allKeys.map(\.stringValue).sorted().first(where: { !known.contains($0) }) else { return }
        throw DecodingError.dataCorruptedError(
            forKey: AnyKey(unknown), in: container,
            debugDescription: "\(owner) has unknown key '\(unknown)' (known keys: \(known.sorted().joined(separator: ", ")))"
        )
    }
}

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

    /// Describes why `name` is not a valid process name (1…``maximumNameLength`` Unicode scalars, no control
    /// characters), or nil when it is; `field` names it in the message.
    public static func nameFailure(_ name: String, field: String) -> String? {
        let scalars = name.unicodeScalars
        guard !scalars.isEmpty, scalars.count <= maximumNameLength else {
            return "\(field) must be 1 to \(maximumNameLength) characters, not \(scalars.count)"
        }
        if scalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            return "\(field) must not contain control characters"
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

public import Foundation

/// The one writer of the one-line JSON results that `orchard bench …`, `orchard serve` and `orchard agent` print.
///
/// A line is a JSON object with snake_case keys in sorted order, so lines of the same kind compare as text:
/// camelCase property names are converted (`samplesPerSecond` → `samples_per_second`); a type whose names would
/// convert badly (`peakRSSMiB`) gives explicit snake_case coding keys, which pass through unchanged.
public enum JSONLine {
    /// `value` encoded as one line of JSON, without the newline.
    public static func encode(_ value: some Encodable) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.nonConformingFloatEncodingStrategy = nonFinite
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    /// NaN and ±infinity as the strings `"NaN"`, `"Infinity"` and `"-Infinity"` (JSON has no number for them, and a
    /// diverged run's line must still be written), as the simulator's files write them.
    public static let nonFinite = JSONEncoder.NonConformingFloatEncodingStrategy.convertToString(
        positiveInfinity: "Infinity", negativeInfinity: "-Infinity", nan: "NaN")

    /// `value` for a JSON object: itself when finite, else its string under ``nonFinite``.
    public static func jsonValue(_ value: Double) -> Any { value.isFinite ? value : value.isNaN ? "NaN" : value > 0 ? "Infinity" : "-Infinity" }

    /// Writes `value` and a newline to `handle` (standard output by default) in one write, so lines written from
    /// different tasks never interleave.
    public static func write(_ value: some Encodable, to handle: FileHandle = .standardOutput) throws {
        try handle.write(contentsOf: Data((try encode(value) + "\n").utf8))
    }
}

import Foundation

/// How an axis's values are written: a unit is chosen from the largest magnitude, and ticks are 1-2-5 steps in it.
public enum ValueFormat: Sendable, Hashable {
    /// Plain numbers (beyond 10⁵ or below 10⁻³ in powers of 10³).
    case plain
    /// Whole numbers (devices, rounds, cycles): ticks never fall between two.
    case count
    /// Bytes, shown in B, kB, MB, GB, TB or PB (powers of 1000).
    case bytes
    /// Fractions (0…1), shown as 0–100 %.
    case percent
    /// Durations in seconds, shown in ms, s, min, h or d.
    case seconds
    /// Plain numbers in a named unit (e.g. "ε", "h").
    case unit(String)

    /// The unit values of magnitudes up to `magnitude` are shown in.
    public func displayUnit(for magnitude: Double) -> DisplayUnit {
        let m = magnitude.isFinite ? abs(magnitude) : 0
        switch self {
        case .percent:
            // Fractions far beyond 1 (nonsense as percentages) would overflow ×100: shown as plain numbers.
            guard m < 1e300 else { return ValueFormat.plain.displayUnit(for: m) }
            return DisplayUnit(divisor: 0.01, symbol: "%", integral: false)
        case .bytes:
            let prefixes = ["B", "kB", "MB", "GB", "TB", "PB"]
            var index = 0
            while index < prefixes.count - 1, m >= pow(1000, Double(index + 1)) { index += 1 }
            return DisplayUnit(divisor: pow(1000, Double(index)), symbol: prefixes[index], integral: index == 0)
        case .seconds:
            let units: [(Double, String)] = [(0.001, "ms"), (1, "s"), (60, "min"), (3600, "h"), (86400, "d")]
            let index = m == 0 ? 1 : m < 1 ? 0 : m < 120 ? 1 : m < 3600 ? 2 : m < 172_800 ? 3 : 4
            return DisplayUnit(divisor: units[index].0, symbol: units[index].1, integral: false)
        case .plain, .count, .unit:
            let named: String = if case .unit(let name) = self { name } else { "" }
            let integral = self == .count
            guard m >= 1e5 || (m > 0 && m < 1e-3 && !integral) else { return DisplayUnit(divisor: 1, symbol: named, integral: integral) }
            let exponent = 3 * (log10(m) / 3).rounded(.down)
            let power = "×10" + superscript(Int(exponent))
            return DisplayUnit(divisor: pow(10, exponent), symbol: named.isEmpty ? power : "\(power) \(named)", integral: false)
        }
    }

    /// One value with its unit: 4084360 bytes is "4.1 MB", 0.8523 as a percentage is "85.2 %", 5400 seconds "1.5 h".
    public func format(_ value: Double) -> String {
        guard value.isFinite else { return "–" }
        let unit = displayUnit(for: value)
        let scaled = value / unit.divisor
        let number: String
        switch self {
        case .count: number = unit.divisor == 1 ? String(format: "%.0f", scaled) : significant(scaled)
        case .bytes where unit.integral: number = String(format: "%.0f", scaled)
        case .bytes, .percent, .seconds: number = trimmed(String(format: "%.\(abs(scaled) >= 100 ? 0 : 1)f", scaled))
        case .plain, .unit: number = significant(scaled)
        }
        return unit.symbol.isEmpty ? number : "\(number) \(unit.symbol)"
    }

    /// Whether ticks must be whole numbers.
    var isIntegral: Bool { self == .count }

    /// Whether values are amounts (bytes, counts), whose axis starts from 0 unless told otherwise; nil: when sensible.
    var isAmount: Bool? { self == .bytes || self == .count ? true : nil }
}

/// A unit values are shown in: each value divided by ``divisor``, labelled ``symbol``.
public struct DisplayUnit: Sendable, Hashable {
    /// What a value is divided by (1e6 for MB).
    public let divisor: Double
    /// The unit's symbol ("MB", "%", "×10⁶"); empty for none.
    public let symbol: String
    /// Whether ticks in this unit must be whole numbers (bytes in B, counts).
    public let integral: Bool

    /// Creates a unit.
    public init(divisor: Double, symbol: String, integral: Bool) {
        self.divisor = divisor
        self.symbol = symbol
        self.integral = integral
    }
}

/// A tick's label: `value` with the decimals its 1-2-5 `step` needs (0.25 never occurs: 0.2 needs one).
func tickLabel(_ value: Double, step: Double) -> String {
    guard value.isFinite else { return "–" }
    let decimals = step.isFinite && step > 0 ? Int(max(0, min(12, -log10(step).rounded(.down)))) : 0
    let text = String(format: "%.\(decimals)f", value)
    return text.hasPrefix("-") && Double(text) == 0 ? String(text.dropFirst()) : text
}

/// `value` to three significant digits, without trailing zeros.
private func significant(_ value: Double) -> String {
    guard value != 0 else { return "0" }
    let decimals = max(0, min(12, 2 - Int(log10(abs(value)).rounded(.down))))
    return trimmed(String(format: "%.\(decimals)f", value))
}

/// "4.10" → "4.1", "3.0" → "3".
private func trimmed(_ text: String) -> String {
    guard text.contains(".") else { return text }
    var text = Substring(text)
    while text.hasSuffix("0") { text = text.dropLast() }
    if text.hasSuffix(".") { text = text.dropLast() }
    return text == "-0" ? "0" : String(text)
}

/// Superscript digits: -6 is "⁻⁶".
private func superscript(_ number: Int) -> String {
    let digits: [Character] = ["⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"]
    return (number < 0 ? "⁻" : "") + String(abs(number)).map { digits[Int(String($0))!] }
}

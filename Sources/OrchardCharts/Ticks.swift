import Foundation

/// The 1-2-5 step (1, 2 or 5 × 10ⁿ) that cuts `span` into at most `maxCount` − 1 intervals; a whole number ≥ 1 when
/// `integral`.
public func niceStep(span: Double, maxCount: Int = 6, integral: Bool = false) -> Double {
    guard span.isFinite, span > 0 else { return 1 }
    let raw = span / Double(max(1, maxCount - 1))
    let magnitude = pow(10, log10(raw).rounded(.down))
    var step = raw
    for factor in [1.0, 2, 5, 10] where magnitude * factor >= raw * (1 - 1e-12) {
        step = magnitude * factor
        break
    }
    if !step.isFinite || step <= 0 { step = raw }
    return integral ? max(1, step.rounded(.up)) : step
}

/// The ticks of a 1-2-5 step that fall in `lower`…`upper` (at most `maxCount`, whole numbers when `integral`): 0…8.3
/// gives 0, 2, 4, 6, 8. One tick when the range is a point; none when it is not finite.
public func niceTicks(from lower: Double, to upper: Double, maxCount: Int = 6, integral: Bool = false) -> [Double] {
    guard lower.isFinite, upper.isFinite else { return [] }
    var (lo, hi) = lower <= upper ? (lower, upper) : (upper, lower)
    if integral {
        (lo, hi) = (lo.rounded(.up), hi.rounded(.down))
        guard lo <= hi else { return [] }
    }
    guard lo < hi else { return [lo] }
    var step = stepFor(lo, hi, maxCount: maxCount, integral: integral)
    var ticks = multiples(of: step, from: lo, to: hi)
    // A step wider than the range may miss it (1…4 in steps of 5): the next smaller 1-2-5 step lands in it.
    while ticks.isEmpty, step > (integral ? 1 : 0) {
        let mantissa = step / pow(10, log10(step).rounded(.down))
        step *= mantissa < 3 ? 0.5 : 0.4
        if integral { step = max(1, step.rounded()) }
        ticks = multiples(of: step, from: lo, to: hi)
    }
    return ticks
}

/// A value axis's extent: the data's range (with 0 when asked, or when sensible) widened to whole steps of 1-2-5, and its
/// ticks. 0…8.3 becomes 0…10 with ticks 0, 2, 4, 6, 8, 10.
public struct NiceScale: Sendable, Hashable {
    /// The lowest value shown (a tick).
    public let lower: Double
    /// The highest value shown (a tick).
    public let upper: Double
    /// The distance between ticks.
    public let step: Double

    /// The scale of `values` (non-finite ones are ignored; none gives 0…1). `includesZero` nil: 0 is included when
    /// every value has one sign and the smallest magnitude is at most half the largest, or the values are all within
    /// 1 % of each other (a zoom would only show noise).
    public init(covering values: some Sequence<Double>, includesZero: Bool? = nil, maxCount: Int = 6, integral: Bool = false) {
        let finite = values.filter(\.isFinite)
        var lo = finite.min() ?? 0, hi = finite.max() ?? 1
        let flat = hi / 2 - lo / 2 <= 0.005 * max(abs(lo), abs(hi))
        let zero = includesZero ?? (flat || (lo >= 0 && lo <= hi / 2) || (hi <= 0 && hi >= lo / 2))
        if zero { (lo, hi) = (min(lo, 0), max(hi, 0)) }
        if lo == hi { (lo, hi) = lo == 0 ? (0, 1) : (lo - abs(lo) / 2, hi + abs(hi) / 2) }
        let step = stepFor(lo, hi, maxCount: maxCount, integral: integral)
        var lower = (lo / step + 1e-9).rounded(.down) * step, upper = (hi / step - 1e-9).rounded(.up) * step
        lower = lower.isFinite ? clean(lower, step: step) : lo
        upper = upper.isFinite ? clean(upper, step: step) : hi
        self.init(lower: lower, upper: upper, step: step)
    }

    /// A scale over a fixed range, with 1-2-5 ticks inside it.
    public init(fixed range: ClosedRange<Double>, maxCount: Int = 6, integral: Bool = false) {
        var (lo, hi) = (range.lowerBound, range.upperBound)
        if !lo.isFinite || !hi.isFinite { (lo, hi) = (0, 1) }
        if lo == hi { (lo, hi) = (lo - 1, hi + 1) }
        self.init(lower: lo, upper: hi, step: stepFor(lo, hi, maxCount: maxCount, integral: integral))
    }

    private init(lower: Double, upper: Double, step: Double) {
        self.lower = lower
        self.upper = upper
        self.step = step
    }

    /// The ticks from ``lower`` to ``upper``.
    public var ticks: [Double] { multiples(of: step, from: lower, to: upper) }

    /// Where `value` falls between ``lower`` (0) and ``upper`` (1); finite for every finite value.
    public func fraction(_ value: Double) -> Double {
        let span = upper / 2 - lower / 2
        guard span > 0, value.isFinite else { return 0 }
        return (value / 2 - lower / 2) / span
    }
}

/// The step for `lo` < `hi`, even when their difference overflows.
private func stepFor(_ lo: Double, _ hi: Double, maxCount: Int, integral: Bool) -> Double {
    let span = hi - lo
    if span.isFinite { return niceStep(span: span, maxCount: maxCount, integral: integral) }
    return 2 * niceStep(span: hi / 2 - lo / 2, maxCount: maxCount, integral: integral)
}

/// The multiples of `step` in `lo`…`hi`, rounded to the step's decimals (0.1 × 3 is 0.3, not 0.30000000000000004).
private func multiples(of step: Double, from lo: Double, to hi: Double) -> [Double] {
    // A billionth of a step of tolerance: 0.3 / 0.1 is 2.9999999999999996.
    let first = (lo / step - 1e-9).rounded(.up), last = (hi / step + 1e-9).rounded(.down)
    guard first.isFinite, last.isFinite, first <= last, last - first < 10_000 else { return lo == hi ? [lo] : [] }
    return stride(from: first, through: last, by: 1).map { clean($0 * step, step: step) }
}

/// `value` rounded to the decimals of `step`, without a negative zero.
func clean(_ value: Double, step: Double) -> Double {
    guard value.isFinite, step.isFinite, step > 0 else { return value }
    let decimals = -log10(step).rounded(.down)
    var result = value
    if decimals > 0, decimals < 300 {
        let scale = pow(10, decimals)
        let rounded = (value * scale).rounded() / scale
        if rounded.isFinite { result = rounded }
    }
    return result == 0 ? 0 : result
}

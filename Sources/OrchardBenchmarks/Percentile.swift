/// Latency percentiles as the benchmarks report them.
public enum Percentile {
    /// The nearest-rank percentile: the smallest value with at least `fraction` of the values at or below it
    /// (`fraction` 0.5 is the median, 0.99 the p99, 1 the maximum, 0 the minimum); nil for no values.
    public static func nearestRank(_ fraction: Double, of values: [Double]) -> Double? {
        precondition((0...1).contains(fraction), "a percentile is a fraction in [0, 1]")
        guard !values.isEmpty else { return nil }
        let sorted = values.sorted()
        let rank = Int((Double(sorted.count) * fraction).rounded(.up))
        return sorted[min(sorted.count - 1, max(0, rank - 1))]
    }
}

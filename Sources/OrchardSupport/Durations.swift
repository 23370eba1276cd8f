extension Duration {
    /// The duration as fractional seconds.
    public var inSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) * 1e-18
    }

    /// The duration as a number of seconds for a message: `30` for whole seconds, `0.25` otherwise.
    public var secondsText: String {
        components.attoseconds == 0 ? String(components.seconds) : String(inSeconds)
    }

    /// The duration as whole nanoseconds (truncated toward zero; saturating at ±292 years, which Int64 holds).
    public var inNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow else { return seconds < 0 ? .min : .max }
        let (sum, carry) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
        return carry ? (seconds < 0 ? .min : .max) : sum
    }
}

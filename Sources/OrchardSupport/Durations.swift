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

    /// The duration as whole nanoseconds (truncated toward zero).
    public var inNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

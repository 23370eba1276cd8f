import OrchardSupport

/// A virtual device's clock is a ``OrchardSupport/ManualClock`` that only the device's own work moves (a transfer,
/// a stretch of training, waiting for the next background window), so a day of a device's life takes as long as
/// its computation. The device's ``OrchardScheduler/BackgroundScheduler`` times its runs on it: a sleep until an
/// instant ends when the device's work moves the clock there (or when the sleeping task is cancelled).
extension ManualClock {
    /// Virtual time zero: the same date on every device's clock and on the coordinator's.
    static let simulationEpoch = WallInstant(sinceEpoch: .seconds(1_700_000_000))

    /// A clock at virtual time zero.
    static func virtual(seconds: Double = 0) -> ManualClock {
        ManualClock(start: simulationEpoch.advanced(by: .seconds(seconds)))
    }

    /// The current virtual time in seconds.
    var seconds: Double { Self.simulationEpoch.duration(to: now).inSeconds }

    /// Moves the clock forward to `seconds` of virtual time (never back) and wakes the sleepers whose deadline has come.
    func advance(to seconds: Double) {
        advance(to: Self.simulationEpoch.advanced(by: .seconds(seconds)))
    }
}

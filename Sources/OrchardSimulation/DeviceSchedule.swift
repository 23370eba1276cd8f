import Foundation
import OrchardML

/// A device's hardware and network, drawn once per device from the simulation seed.
public struct DeviceProfile: Sendable, Hashable, Codable {
    /// Virtual seconds one optimizer update takes in a background window (phones throttle background work).
    public var secondsPerUpdate: Double
    /// Download speed in bytes per virtual second.
    public var downloadBytesPerSecond: Double
    /// Upload speed in bytes per virtual second.
    public var uploadBytesPerSecond: Double

    /// Creates a profile.
    public init(secondsPerUpdate: Double, downloadBytesPerSecond: Double, uploadBytesPerSecond: Double) {
        self.secondsPerUpdate = secondsPerUpdate
        self.downloadBytesPerSecond = downloadBytesPerSecond
        self.uploadBytesPerSecond = uploadBytesPerSecond
    }

    /// A seeded profile: update time log-normal around `medianSecondsPerUpdate` (log-σ `spread`), links of
    /// 2–40 Mbit/s down and a quarter of that up.
    public static func sample(device: Int, seed: UInt64, medianSecondsPerUpdate: Double, spread: Double = 0.5) -> DeviceProfile {
        var random = OrchardRandom.derived(seed: seed ^ 0x5EED_DE71CE, stream: UInt64(device))
        // Box–Muller for one standard normal draw.
        let u1 = max(random.nextDouble(), 1e-12), u2 = random.nextDouble()
        let normal = (-2 * log(u1)).squareRoot() * cos(2 * Double.pi * u2)
        let mbps = 2 + random.nextDouble() * 38
        return DeviceProfile(
            secondsPerUpdate: medianSecondsPerUpdate * exp(spread * normal),
            downloadBytesPerSecond: mbps * 125_000, uploadBytesPerSecond: mbps * 125_000 / 4
        )
    }
}

/// How the fleet behaves around the training itself.
public struct FleetConditions: Sendable, Hashable {
    /// When devices are eligible.
    public var availability: Availability
    /// Probability that an assigned device goes away (app killed, network lost) before it reports.
    public var dropout: Double
    /// The background budget: virtual seconds the OS grants one background task before expiring it.
    public var windowSeconds: Double
    /// Virtual seconds between an expired background task and the next one the OS grants (uniform in the range),
    /// for a device that stays eligible.
    public var resumeDelay: ClosedRange<Double>
    /// Virtual seconds over which eligible devices' check-ins are spread at the start of a round.
    public var checkInSpread: Double
    /// Median virtual seconds per optimizer update on a device.
    public var medianSecondsPerUpdate: Double
    /// Log-normal σ of the update time across devices (0: every device equally fast).
    public var speedSpread: Double

    /// Creates conditions; every field has a default.
    public init(
        availability: Availability = .always, dropout: Double = 0, windowSeconds: Double = 30,
        resumeDelay: ClosedRange<Double> = 30...180, checkInSpread: Double = 20, medianSecondsPerUpdate: Double = 0.5,
        speedSpread: Double = 0.5
    ) {
        self.availability = availability
        self.dropout = dropout
        self.windowSeconds = windowSeconds
        self.resumeDelay = resumeDelay
        self.checkInSpread = checkInSpread
        self.medianSecondsPerUpdate = medianSecondsPerUpdate
        self.speedSpread = speedSpread
    }
}

/// One stretch of training inside one background window.
public struct TrainingSegment: Sendable, Hashable, Codable {
    /// Virtual time the stretch starts.
    public var start: Double
    /// Virtual time it ends (the window's expiry, or the end of training).
    public var end: Double
    /// Optimizer updates it performs.
    public var updates: Int
}

/// What a device's round looks like on the virtual clock: a pure function of the seed, the availability, the
/// device's profile and the amount of work, planned before any computation runs.
public struct DeviceSchedule: Sendable, Hashable {
    /// How the device's participation ends.
    public enum Outcome: Sendable, Hashable {
        /// It uploads its update at this virtual time.
        case reports(at: Double)
        /// It goes away at this virtual time and never reports.
        case dropsOut(at: Double)
        /// It is still training (or waiting for a window) at the deadline.
        case missesDeadline
    }

    /// The device.
    public var device: Int
    /// When it checked in and was assigned.
    public var checkIn: Double
    /// Training stretches, one per background window used (the ones it finishes within the deadline).
    public var segments: [TrainingSegment]
    /// Virtual times at which a background window expired while training was unfinished.
    public var expirations: [Double]
    /// Virtual times at which training resumed from a checkpoint in a later window.
    public var resumptions: [Double]
    /// The outcome.
    public var outcome: Outcome

    /// Plans a device's round.
    /// - Parameters:
    ///   - device: The device.
    ///   - checkIn: The virtual time it checked in (it must be eligible then).
    ///   - updates: Optimizer updates its local training takes.
    ///   - downloadBytes: Size of the model it downloads.
    ///   - uploadBytes: Size of the update it uploads.
    ///   - deadline: The cycle's deadline.
    ///   - round: The round number (the dropout and resume draws depend on it).
    ///   - profile: The device's profile.
    ///   - conditions: Fleet conditions.
    ///   - seed: The simulation seed.
    public static func plan(
        device: Int, checkIn: Double, updates: Int, downloadBytes: Int, uploadBytes: Int, deadline: Double, round: Int,
        profile: DeviceProfile, conditions: FleetConditions, seed: UInt64
    ) -> DeviceSchedule {
        var random = OrchardRandom.derived(seed: seed ^ 0xD0_0D1E, stream: UInt64(device) << 32 | UInt64(UInt32(truncatingIfNeeded: round)))
        var schedule = DeviceSchedule(device: device, checkIn: checkIn, segments: [], expirations: [], resumptions: [], outcome: .missesDeadline)
        let dropsOut = random.nextDouble() < conditions.dropout
        let dropoutPoint = random.nextDouble()
        let download = Double(downloadBytes) / profile.downloadBytesPerSecond
        let upload = Double(uploadBytes) / profile.uploadBytesPerSecond
        if dropsOut {
            // It goes away somewhere between check-in and the moment its work would be done without interruptions.
            let span = download + Double(updates) * profile.secondsPerUpdate + upload
            schedule.outcome = .dropsOut(at: checkIn + dropoutPoint * span)
            return schedule
        }
        guard var window = conditions.availability.window(for: device, atOrAfter: checkIn, seed: seed) else { return schedule }
        var time = checkIn
        var windowEnd = min(max(time, window.start) + conditions.windowSeconds, window.end)
        time += download
        var remaining = updates
        while time < deadline {
            let capacity = Int(((windowEnd - time) / profile.secondsPerUpdate).rounded(.down))
            if capacity >= remaining {
                let end = time + Double(remaining) * profile.secondsPerUpdate
                if remaining > 0 { schedule.segments.append(TrainingSegment(start: time, end: end, updates: remaining)) }
                let reportTime = end + upload
                if reportTime <= deadline { schedule.outcome = .reports(at: reportTime) }
                return schedule
            }
            if capacity > 0 {
                schedule.segments.append(TrainingSegment(start: time, end: windowEnd, updates: capacity))
                remaining -= capacity
            }
            schedule.expirations.append(windowEnd)
            // The next background task: after the OS's delay, inside an eligibility window.
            let delay = conditions.resumeDelay.lowerBound + random.nextDouble() * (conditions.resumeDelay.upperBound - conditions.resumeDelay.lowerBound)
            guard let next = conditions.availability.window(for: device, atOrAfter: windowEnd + delay, seed: seed) else { return schedule }
            window = next
            time = max(windowEnd + delay, window.start)
            windowEnd = min(time + conditions.windowSeconds, window.end)
            if time < deadline { schedule.resumptions.append(time) }
        }
        // The deadline came first: only stretches that started before it count.
        schedule.segments.removeAll { $0.start >= deadline }
        return schedule
    }

    /// Updates per stretch, in order (what the device's trainer runs between checkpoints).
    public var updatesPerWindow: [Int] { segments.map(\.updates) }
}

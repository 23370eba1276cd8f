import OrchardSupport
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

    /// A seeded profile: update time log-normal around `medianSecondsPerUpdate` (log-σ `spread`), a download
    /// speed uniform in `megabitsPerSecond` and a quarter of that up.
    public static func sample(
        device: Int, seed: UInt64, medianSecondsPerUpdate: Double, spread: Double = 0.5, megabitsPerSecond: ClosedRange<Double> = 2...40
    ) -> DeviceProfile {
        var random = OrchardRandom.derived(seed: seed ^ 0x5EED_DE71CE, stream: UInt64(device))
        // Box–Muller for one standard normal draw.
        let u1 = max(random.nextDouble(), 1e-12), u2 = random.nextDouble()
        let normal = (-2 * log(u1)).squareRoot() * cos(2 * Double.pi * u2)
        let mbps = megabitsPerSecond.lowerBound + random.nextDouble() * (megabitsPerSecond.upperBound - megabitsPerSecond.lowerBound)
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
    /// Download speeds across devices, in Mbit/s (uniform in the range; uploads are a quarter of the download).
    public var megabitsPerSecond: ClosedRange<Double>
    /// Whether devices report through secure aggregation's stages. Each stage's message then draws its own `dropout`,
    /// so the dropout of the task itself falls during the download and the training only, not during an upload.
    public var secureStages = false
    /// Per-device speeds from a trace; when set, each device's update time and link speed come from it instead of the
    /// log-normal and uniform draws (`speedSpread` and `megabitsPerSecond` then do not apply; see ``DeviceSpeeds``).
    public var deviceSpeeds: DeviceSpeeds?
    /// Virtual seconds between the background windows the OS grants an eligible device: one at a seeded moment of each
    /// interval, whatever the coordinator is doing. Nil: every eligible device is granted a window when a round opens
    /// (spread over ``checkInSpread``), the round-based stand-in for perfect pace steering.
    public var windowInterval: Double?

    /// Creates conditions; every field has a default.
    public init(
        availability: Availability = .always, dropout: Double = 0, windowSeconds: Double = 30,
        resumeDelay: ClosedRange<Double> = 30...180, checkInSpread: Double = 20, medianSecondsPerUpdate: Double = 0.5,
        speedSpread: Double = 0.5, megabitsPerSecond: ClosedRange<Double> = 2...40, deviceSpeeds: DeviceSpeeds? = nil
    ) {
        self.deviceSpeeds = deviceSpeeds
        self.megabitsPerSecond = megabitsPerSecond
        self.availability = availability
        self.dropout = dropout
        self.windowSeconds = windowSeconds
        self.resumeDelay = resumeDelay
        self.checkInSpread = checkInSpread
        self.medianSecondsPerUpdate = medianSecondsPerUpdate
        self.speedSpread = speedSpread
    }

    /// With ``windowInterval``: the first background window the OS grants `device` at or after `time` while it is
    /// eligible, looking up to two virtual days ahead (nil: none).
    public func grantedWindow(device: Int, atOrAfter time: Double, seed: UInt64) -> Double? {
        guard let interval = windowInterval, interval > 0 else { return nil }
        var slot = Int((time / interval).rounded(.down))
        let last = slot + Int((2 * Availability.day / interval).rounded(.up)) + 1
        while slot <= last {
            let grant = (Double(slot) + OrchardRandomAccess.uniform(seed: seed, a: UInt64(device), b: UInt64(max(0, slot)), salt: 0x6A_A47)) * interval
            if grant >= time && availability.isAvailable(device, at: grant, seed: seed) { return grant }
            slot += 1
        }
        return nil
    }

    /// Device `device`'s profile: from ``deviceSpeeds`` when set, else seeded draws (``DeviceProfile/sample(device:seed:medianSecondsPerUpdate:spread:megabitsPerSecond:)``).
    public func profile(device: Int, seed: UInt64) -> DeviceProfile {
        if let deviceSpeeds { return deviceSpeeds.profile(device: device, medianSecondsPerUpdate: medianSecondsPerUpdate) }
        return DeviceProfile.sample(
            device: device, seed: seed, medianSecondsPerUpdate: medianSecondsPerUpdate, spread: speedSpread, megabitsPerSecond: megabitsPerSecond)
    }
}

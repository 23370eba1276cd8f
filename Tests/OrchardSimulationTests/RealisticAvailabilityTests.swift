import Foundation
import Testing
@testable import OrchardSimulation

@Suite struct RealisticAvailabilityTests {
    static let hour = 3600.0

    /// The available fraction of `devices` at each hour of virtual day 1 (day 0 is the first evening's warm-up).
    static func hourlyFractions(_ availability: Availability, devices: Int, seed: UInt64) -> [Double] {
        (24..<48).map { availability.availableFraction(devices: devices, at: Double($0) * hour, seed: seed) }
    }

    /// The virtual days (of the first `days`) on which a window of `device` opens.
    static func activeDays(_ availability: Availability, device: Int, days: Int, seed: UInt64) -> Set<Int> {
        var result = Set<Int>()
        var t = 0.0
        while t < Double(days) * Availability.day, let window = availability.window(for: device, atOrAfter: t, seed: seed) {
            if window.start < Double(days) * Availability.day { result.insert(Int(window.start / Availability.day)) }
            t = window.end + 1
        }
        return result
    }

    @Test func parsesAndNamesRealistic() throws {
        #expect(try Availability(parsing: "realistic") == .realistic)
        #expect(try Availability(parsing: "Realistic") == .realistic)
        #expect(Availability.realistic.description == "realistic")
        #expect(Availability.realistic != .diurnal)
    }

    @Test func timeZonesSpreadTheFleetOverTheWholeDayUnlikeDiurnal() {
        let devices = 1000
        let realistic = Self.hourlyFractions(.realistic, devices: devices, seed: 11)
        let diurnal = Self.hourlyFractions(.diurnal, devices: devices, seed: 11)
        let (low, high) = (realistic.min()!, realistic.max()!)
        // A fleet over the world's time zones: some devices are always charging somewhere, and no hour dominates.
        #expect(low > 0.1, "\(realistic)")
        #expect(high - low < 0.08, "\(realistic)")
        // The diurnal fleet (phases within ±3 h) swings from its night peak to almost nobody by day.
        #expect(diurnal.max()! - diurnal.min()! > 0.5, "\(diurnal)")
        #expect(diurnal.min()! < 0.15)
    }

    @Test func windowsOpenAtEveryHourOfTheDay() {
        // Over 300 devices' first week, the windows' opening hours (in simulation time) cover all 24 hours.
        var hours = Set<Int>()
        for device in 0..<300 {
            var t = 0.0
            while t < 7 * Availability.day, let window = Availability.realistic.window(for: device, atOrAfter: t, seed: 3) {
                hours.insert(Int(window.start.truncatingRemainder(dividingBy: Availability.day) / Self.hour))
                t = window.end + 1
            }
        }
        #expect(hours.count == 24)
    }

    @Test func aFifthOfTheFleetIsRarelyAvailable() {
        let devices = 1000, days = 30
        let active = (0..<devices).map { Self.activeDays(.realistic, device: $0, days: days, seed: 5).count }
        let rare = Double(active.count { Double($0) < 0.25 * Double(days) }) / Double(devices)
        #expect(rare > 0.16 && rare < 0.24, "\(rare)")
        // The others charge on most nights.
        #expect(Double(active.count { $0 >= days / 2 }) / Double(devices) > 0.7)
        // Diurnal has no such tail.
        let diurnal = (0..<devices).map { Self.activeDays(.diurnal, device: $0, days: days, seed: 5).count }
        #expect(diurnal.count { Double($0) < 0.25 * Double(days) } == 0)
    }

    @Test func aRareDeviceStillGetsItsNextWindow() {
        // A rare device can go weeks without a window; the lookup must find it rather than report "never again".
        for device in 0..<300 {
            #expect(Availability.realistic.window(for: device, atOrAfter: 0, seed: 9) != nil)
            #expect(Availability.realistic.window(for: device, atOrAfter: 40 * Availability.day, seed: 9) != nil)
        }
    }

    @Test func isDeterministicPerSeed() {
        let times = stride(from: 0.0, to: 3 * Availability.day, by: 1800).map { $0 }
        for device in 0..<40 {
            let a = times.map { Availability.realistic.window(for: device, atOrAfter: $0, seed: 21) }
            let b = times.map { Availability.realistic.window(for: device, atOrAfter: $0, seed: 21) }
            #expect(a == b)
        }
        #expect(Self.hourlyFractions(.realistic, devices: 400, seed: 21) == Self.hourlyFractions(.realistic, devices: 400, seed: 21))
        #expect(Self.hourlyFractions(.realistic, devices: 400, seed: 21) != Self.hourlyFractions(.realistic, devices: 400, seed: 22))
    }

    @Test func windowLookupIsConsistent() {
        for device in 0..<60 {
            var t = 0.0
            var previous: AvailabilityWindow?
            while t < 10 * Availability.day {
                guard let w = Availability.realistic.window(for: device, atOrAfter: t, seed: 7) else {
                    Issue.record("device \(device) has no window after \(t)")
                    break
                }
                #expect(w.end > t && w.start < w.end && w.start >= 0)
                #expect(Availability.realistic.isAvailable(device, at: max(t, w.start), seed: 7))
                if let previous { #expect(w.start >= previous.end, "device \(device): \(previous) then \(w)") }
                if w.start > t { #expect(!Availability.realistic.isAvailable(device, at: (t + w.start) / 2, seed: 7)) }
                previous = w
                t = w.end + 1
            }
        }
    }

    /// `diurnal`'s windows are pinned: `realistic` is a kind of its own, drawn from streams of its own.
    @Test func diurnalIsUnchanged() {
        let windows = (0..<3).flatMap { device in (0..<3).flatMap { Availability.diurnalWindows(device: device, day: $0, seed: 42) } }
        let pinned: [AvailabilityWindow] = Self.pinnedDiurnal
        #expect(windows.count == pinned.count)
        for (a, b) in zip(windows, pinned) {
            #expect(a.device == b.device && abs(a.start - b.start) < 1e-6 && abs(a.end - b.end) < 1e-6, "\(a) vs \(b)")
        }
        #expect(Availability.diurnal.availableFraction(devices: 400, at: 9 * Self.hour, seed: 42) == Self.pinnedDiurnalNight)
    }

    /// Devices 0–2's diurnal windows on days 0–2 for seed 42, and the night fraction, as the code before `realistic` drew them.
    static let pinnedDiurnal: [AvailabilityWindow] = [
        AvailabilityWindow(device: 0, start: 16325.01012844048, end: 43950.95595009629),
        AvailabilityWindow(device: 0, start: 103776.88792299577, end: 134289.04387484732),
        AvailabilityWindow(device: 1, start: 20773.745273740875, end: 49043.61684462609),
        AvailabilityWindow(device: 1, start: 106728.46982752981, end: 133599.26544623915),
        AvailabilityWindow(device: 1, start: 195614.20872989105, end: 222887.24758678916),
        AvailabilityWindow(device: 2, start: 96348.43053983152, end: 120230.98123730313),
        AvailabilityWindow(device: 2, start: 161940.71984918692, end: 165733.1376648737),
        AvailabilityWindow(device: 2, start: 184012.20395582897, end: 208572.58154645527),
    ]
    static let pinnedDiurnalNight = 0.7875
}

/// Background windows the OS grants on its own schedule (`--window-interval`).
@Suite struct GrantedWindowTests {
    @Test func oneGrantAnIntervalAtASeededMomentWhileTheDeviceIsEligible() throws {
        var conditions = FleetConditions(availability: .realistic)
        #expect(conditions.grantedWindow(device: 3, atOrAfter: 0, seed: 1) == nil, "no interval: windows come with the rounds")
        conditions.windowInterval = 1200
        for device in 0..<50 {
            var time = 0.0
            var grants: [Double] = []
            while let grant = conditions.grantedWindow(device: device, atOrAfter: time, seed: 7), grant < 2 * Availability.day {
                #expect(grant >= time)
                #expect(conditions.availability.isAvailable(device, at: grant, seed: 7))
                grants.append(grant)
                time = grant + 0.001
            }
            // At most one grant in each interval, and the same ones for the same seed.
            #expect(Set(grants.map { Int($0 / 1200) }).count == grants.count)
            #expect(grants.first == conditions.grantedWindow(device: device, atOrAfter: 0, seed: 7))
        }
        // Over a day, an always-eligible device is granted a window in every interval.
        var always = FleetConditions(availability: .always)
        always.windowInterval = 600
        var count = 0, time = 0.0
        while let grant = always.grantedWindow(device: 0, atOrAfter: time, seed: 1), grant < Availability.day {
            count += 1
            time = grant + 0.001
        }
        #expect(count == 144)
    }
}

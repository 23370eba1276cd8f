import OrchardSupport
public import Foundation
import OrchardML

/// A span of virtual time during which a device may run background work (charging, on Wi-Fi, idle).
public struct AvailabilityWindow: Sendable, Hashable, Codable {
    /// The device's index in the fleet (0-based).
    public var device: Int
    /// Virtual seconds since the start of the simulation at which the window opens.
    public var start: Double
    /// Virtual seconds at which it closes (`.infinity` for never).
    public var end: Double

    /// Creates a window.
    public init(device: Int, start: Double, end: Double) {
        self.device = device
        self.start = start
        self.end = end
    }
}

/// When each device of the fleet is eligible for background work.
///
/// `always` keeps every device eligible; `diurnal` models phones that charge on Wi-Fi mostly at night (each
/// device with its own seeded time-zone phase, bed time, wake time, nights it forgets to charge and an occasional
/// daytime top-up); `realistic` is that routine for a fleet spread over the world's time zones, with a long tail of
/// rarely available devices; `trace` replays windows read from a file (see ``AvailabilityTrace``).
public struct Availability: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable {
        case always
        case diurnal
        case realistic
        case trace([Int: [AvailabilityWindow]])
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Every device is eligible all the time.
    public static let always = Availability(.always)
    /// Devices are eligible mostly at night, on a 24-hour virtual day.
    public static let diurnal = Availability(.diurnal)
    /// The diurnal routine with time zones spread over the whole day and a seeded 20 % of devices that charge on rare nights.
    public static let realistic = Availability(.realistic)
    /// Devices are eligible exactly in the given windows (a device without windows never is).
    public static func trace(_ windows: [AvailabilityWindow]) -> Availability {
        Availability(.trace(Dictionary(grouping: windows, by: \.device).mapValues { $0.sorted { $0.start < $1.start } }))
    }

    /// `always`, `diurnal`, `realistic` or `trace`.
    public var description: String {
        switch kind {
        case .always: "always"
        case .diurnal: "diurnal"
        case .realistic: "realistic"
        case .trace: "trace"
        }
    }

    /// Seconds in a virtual day.
    public static let day: Double = 86_400

    /// The window that contains `time` for `device`, or else the next one to open after it; nil when the device is
    /// never eligible again.
    /// - Parameters:
    ///   - device: The device index.
    ///   - time: Virtual seconds since the start.
    ///   - seed: The simulation seed (diurnal habits are derived from it).
    public func window(for device: Int, atOrAfter time: Double, seed: UInt64) -> AvailabilityWindow? {
        switch kind {
        case .always:
            return AvailabilityWindow(device: device, start: 0, end: .infinity)
        case .trace(let byDevice):
            return byDevice[device]?.first { $0.end > time }
        case .diurnal:
            return Self.firstWindow(after: time, days: 30) { Self.diurnalWindows(device: device, day: $0, seed: seed) }
        case .realistic:
            // A rare device may go weeks without a window: look a year ahead (0.9^366 ≈ 2e-17 of a rare device has none).
            return Self.firstWindow(after: time, days: 366) { Self.realisticWindows(device: device, day: $0, seed: seed) }
        }
    }

    /// The first of the windows `windowsOfDay` gives (day by day, from the day before `time`'s, up to `days` ahead) that
    /// is still open at `time`.
    private static func firstWindow(after time: Double, days: Int, _ windowsOfDay: (Int) -> [AvailabilityWindow]) -> AvailabilityWindow? {
        let today = Int((time / Self.day).rounded(.down))
        for day in (today - 1)..<(today + days) {
            if let window = windowsOfDay(day).first(where: { $0.end > time }) { return window }
        }
        return nil
    }

    /// Whether `device` is eligible at `time`.
    public func isAvailable(_ device: Int, at time: Double, seed: UInt64) -> Bool {
        guard let window = window(for: device, atOrAfter: time, seed: seed) else { return false }
        return window.start <= time
    }

    /// The fraction of `devices` eligible at `time`.
    public func availableFraction(devices: Int, at time: Double, seed: UInt64) -> Double {
        guard devices > 0 else { return 0 }
        return Double((0..<devices).count { isAvailable($0, at: time, seed: seed) }) / Double(devices)
    }

    /// A device's diurnal windows that start on virtual day `day` (day 0 starts at time 0, which is 18:00 local
    /// time for a device with no phase shift, so a run starts in the evening and reaches the night peak).
    static func diurnalWindows(device: Int, day: Int, seed: UInt64) -> [AvailabilityWindow] {
        let hour = 3600.0
        // Per-device habits: a phase (time zone and routine) within ±3 h and a habitual bed time.
        var habits = OrchardRandom.derived(seed: seed ^ 0xA5A5_D1A1, stream: UInt64(device))
        let phase = (habits.nextDouble() * 2 - 1) * 3 * hour
        let bedtime = 4 * hour + habits.nextDouble() * 2.5 * hour  // 22:00–00:30 relative to the 18:00 origin
        let sleep = 6.5 * hour + habits.nextDouble() * 2 * hour
        let chargesNightly = 0.75 + habits.nextDouble() * 0.2
        // Per-night variation.
        var night = OrchardRandom.derived(seed: seed ^ 0x0D1A_7A1E, stream: UInt64(device) << 24 | UInt64(UInt32(truncatingIfNeeded: day + 1000)))
        let origin = Double(day) * Self.day + phase
        var windows: [AvailabilityWindow] = []
        if night.nextDouble() < chargesNightly {
            let start = origin + bedtime + (night.nextDouble() - 0.5) * hour
            let end = start + sleep + (night.nextDouble() - 0.5) * hour
            windows.append(AvailabilityWindow(device: device, start: max(start, 0), end: end))
        }
        // An occasional daytime top-up on office Wi-Fi (roughly 11:00–17:00 local, 20–90 minutes).
        if night.nextDouble() < 0.25 {
            let start = origin + 17 * hour + night.nextDouble() * 6 * hour
            let end = start + (20 + night.nextDouble() * 70) * 60
            windows.append(AvailabilityWindow(device: device, start: max(start, 0), end: end))
        }
        return windows.filter { $0.end > 0 }.sorted { $0.start < $1.start }
    }

    /// The fraction of a `realistic` fleet's devices that are rare (charge on about one night in ten, never by day).
    public static let realisticRareFraction = 0.2

    /// A device's `realistic` windows that start on virtual day `day`: the diurnal routine with the device's time zone
    /// drawn in whole hours uniformly over [−12 h, +12 h) plus a personal jitter within ±1 h, so the fleet's night
    /// peaks are spread over the whole day; a seeded ``realisticRareFraction`` of the devices are rare, charging on
    /// Wi-Fi on about 10 % of nights and never topping up by day. Within a device, a day's windows end before the next
    /// day's open (a night lasts at most 16 h past the device's 18:00, a top-up ends by 18:30 the next day).
    static func realisticWindows(device: Int, day: Int, seed: UInt64) -> [AvailabilityWindow] {
        let hour = 3600.0
        var habits = OrchardRandom.derived(seed: seed ^ 0x7E41_15E1_C0DE, stream: UInt64(device))
        let zone = Double(min(Int(habits.nextDouble() * 24), 23) - 12) * hour
        let phase = zone + (habits.nextDouble() * 2 - 1) * hour
        let bedtime = 4 * hour + habits.nextDouble() * 2.5 * hour  // 22:00–00:30 local
        let sleep = 6.5 * hour + habits.nextDouble() * 2 * hour
        let rare = habits.nextDouble() < realisticRareFraction
        let chargesNightly = rare ? 0.1 : 0.75 + habits.nextDouble() * 0.2
        let topUps = rare ? 0 : 0.25
        var night = OrchardRandom.derived(seed: seed ^ 0x2EA1_1571_C0DE, stream: UInt64(device) << 24 | UInt64(UInt32(truncatingIfNeeded: day + 1000)))
        let origin = Double(day) * Self.day + phase
        var windows: [AvailabilityWindow] = []
        if night.nextDouble() < chargesNightly {
            let start = origin + bedtime + (night.nextDouble() - 0.5) * hour
            let end = start + sleep + (night.nextDouble() - 0.5) * hour
            windows.append(AvailabilityWindow(device: device, start: max(start, 0), end: end))
        }
        if night.nextDouble() < topUps {
            let start = origin + 17 * hour + night.nextDouble() * 6 * hour
            let end = start + (20 + night.nextDouble() * 70) * 60
            windows.append(AvailabilityWindow(device: device, start: max(start, 0), end: end))
        }
        return windows.filter { $0.end > 0 }.sorted { $0.start < $1.start }
    }
}

/// Reads availability traces: CSV with a `device,start,end` header, or JSON Lines with one
/// `{"device": 3, "start": 0, "end": 5400}` object a line. Times are virtual seconds since the start of the
/// simulation; `end` may be `inf` (CSV) or omitted (JSONL) for a window that never closes; blank lines and lines
/// starting with `#` are ignored.
public enum AvailabilityTrace {
    /// Parses a trace file; the format follows the extension (`.jsonl`/`.ndjson` for JSON Lines, anything else CSV).
    public static func read(contentsOf url: URL) throws(SimulationError) -> [AvailabilityWindow] {
        let text: String
        do { text = try String(contentsOf: url, encoding: .utf8) } catch {
            throw SimulationError(.unreadable, "cannot read the availability trace \(url.path): \(FileAccessError(error).message)")
        }
        let ext = url.pathExtension.lowercased()
        return try (ext == "jsonl" || ext == "ndjson") ? parseJSONLines(text) : parseCSV(text)
    }

    /// Parses CSV text with a `device,start,end` header.
    public static func parseCSV(_ text: String) throws(SimulationError) -> [AvailabilityWindow] {
        var windows: [AvailabilityWindow] = []
        var header: [String]?
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard let columns = header else {
                guard ["device", "start", "end"].allSatisfy(fields.contains) else {
                    throw SimulationError(.invalidTrace, "line \(index + 1): the header must name the columns device, start and end, not \(fields)")
                }
                header = fields
                continue
            }
            guard fields.count == columns.count else {
                throw SimulationError(.invalidTrace, "line \(index + 1): \(fields.count) fields, the header has \(columns.count)")
            }
            func value(_ name: String) -> String { fields[columns.firstIndex(of: name)!] }
            guard let device = Int(value("device")), device >= 0 else {
                throw SimulationError(.invalidTrace, "line \(index + 1): device '\(value("device"))' is not a non-negative integer")
            }
            guard let start = Double(value("start")), start.isFinite, start >= 0 else {
                throw SimulationError(.invalidTrace, "line \(index + 1): start '\(value("start"))' is not a non-negative number of seconds")
            }
            let endText = value("end").lowercased()
            guard let end = (endText == "inf" || endText.isEmpty) ? Double.infinity : Double(endText), end > start else {
                throw SimulationError(.invalidTrace, "line \(index + 1): end '\(value("end"))' must be a number greater than start \(start), or inf")
            }
            windows.append(AvailabilityWindow(device: device, start: start, end: end))
        }
        guard header != nil else { throw SimulationError(.invalidTrace, "the trace is empty (a CSV trace needs a device,start,end header)") }
        return try validated(windows)
    }

    /// Parses JSON Lines text.
    public static func parseJSONLines(_ text: String) throws(SimulationError) -> [AvailabilityWindow] {
        struct Line: Decodable {
            var device: Int
            var start: Double
            var end: Double?
        }
        var windows: [AvailabilityWindow] = []
        let decoder = JSONDecoder()
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let parsed: Line
            do { parsed = try decoder.decode(Line.self, from: Data(line.utf8)) } catch {
                throw SimulationError(.invalidTrace, "line \(index + 1): expected {\"device\": Int, \"start\": seconds, \"end\": seconds}: \(error)")
            }
            let end = parsed.end ?? .infinity
            guard parsed.device >= 0, parsed.start.isFinite, parsed.start >= 0, end > parsed.start else {
                throw SimulationError(.invalidTrace, "line \(index + 1): needs device ≥ 0 and 0 ≤ start < end, got \(parsed.device), \(parsed.start), \(end)")
            }
            windows.append(AvailabilityWindow(device: parsed.device, start: parsed.start, end: end))
        }
        return try validated(windows)
    }

    private static func validated(_ windows: [AvailabilityWindow]) throws(SimulationError) -> [AvailabilityWindow] {
        for (device, list) in Dictionary(grouping: windows, by: \.device) {
            let sorted = list.sorted { $0.start < $1.start }
            for (a, b) in zip(sorted, sorted.dropFirst()) where b.start < a.end {
                throw SimulationError(.invalidTrace, "device \(device) has overlapping windows [\(a.start), \(a.end)) and [\(b.start), \(b.end))")
            }
        }
        return windows
    }
}

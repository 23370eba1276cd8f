import Synchronization
import Foundation

/// Reads device conditions from a Linux machine's sysfs and procfs; every missing file means "unknown".
///
/// - Power: `/sys/class/power_supply/*` — `type` `Mains`/`USB` with `online`, `Battery` with `status` and
///   `capacity`. An existing but empty directory means no battery (a mains-powered VM or edge box).
/// - Network: the default route from `/proc/net/route` (then `/proc/net/ipv6_route`), that interface's
///   `operstate`, and its kind from `wireless`/`phy80211`, `uevent` `DEVTYPE=wwan`, its name, or `type`.
/// - CPU idleness: `/proc/stat`'s aggregate line; idle + iowait over total since the previous reading
///   (the first reading covers the time since boot).
/// - Thermal: `/sys/class/thermal/thermal_zone*/temp` (millidegrees) and `type`.
public final class LinuxConditionsProvider: DeviceConditionsProvider {
    /// Where to read and what counts as metered.
    public struct Configuration: Sendable, Hashable {
        /// The sysfs mount point.
        public var sysfsRoot: String
        /// The procfs mount point.
        public var procfsRoot: String
        /// Interfaces always counted as metered (a phone hotspot on `wlan1`, a USB modem on `usb0`, …).
        public var meteredInterfaces: Set<String>
        /// Whether cellular interfaces count as metered.
        public var cellularIsMetered: Bool

        /// Creates a configuration reading the real `/sys` and `/proc`.
        public init(sysfsRoot: String = "/sys", procfsRoot: String = "/proc", meteredInterfaces: Set<String> = [], cellularIsMetered: Bool = true) {
            self.sysfsRoot = sysfsRoot
            self.procfsRoot = procfsRoot
            self.meteredInterfaces = meteredInterfaces
            self.cellularIsMetered = cellularIsMetered
        }
    }

    /// Cumulative CPU counters from `/proc/stat`.
    struct CPUSample: Sendable, Hashable {
        var idle: UInt64
        var total: UInt64
    }

    /// Where this provider reads.
    public let configuration: Configuration
    /// The sample idleness is measured from, and the idleness of the last window long enough to mean something.
    private let previousCPU = Mutex<(baseline: CPUSample?, last: Double?)>((nil, nil))

    /// The fewest CPU ticks (all cores together, `USER_HZ` each a second) an idleness reading spans: a reading taken a
    /// moment after another (the service loop's, then the window's own) repeats the last full window's instead of
    /// measuring one tick or none.
    static let minimumIdleWindowTicks: UInt64 = 200

    /// Creates a provider.
    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
    }

    public func currentConditions() async -> DeviceConditions {
        read()
    }

    /// Reads every condition now.
    public func read() -> DeviceConditions {
        var conditions = DeviceConditions()
        readPower(into: &conditions)
        readNetwork(into: &conditions)
        conditions.cpuIdleFraction = readCPUIdle()
        conditions.thermalZones = readThermal()
        return conditions
    }

    // MARK: Files

    private func text(_ path: String) -> String? {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else { return nil }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private func entries(_ directory: String) -> [String]? {
        (try? FileManager.default.contentsOfDirectory(atPath: directory))?.sorted()
    }

    // MARK: Power

    private func readPower(into conditions: inout DeviceConditions) {
        let root = configuration.sysfsRoot + "/class/power_supply"
        guard let supplies = entries(root) else { return }
        var onlineAny: Bool?
        var batteries = 0
        for supply in supplies {
            let base = root + "/" + supply
            switch text(base + "/type") {
            case "Mains", "USB", "USB_C", "USB_PD", "Wireless":
                if let online = text(base + "/online").flatMap(Int.init) {
                    onlineAny = (onlineAny ?? false) || online != 0
                }
            case "Battery":
                // A device-scoped battery (a mouse, a stylus) is not the system's.
                if text(base + "/scope") == "Device" { continue }
                batteries += 1
                if let capacity = text(base + "/capacity").flatMap(Double.init), (0...100).contains(capacity) {
                    conditions.batteryLevel = min(conditions.batteryLevel ?? 1, capacity / 100)
                }
                switch text(base + "/status") {
                case "Charging", "Full":
                    conditions.batteryCharging = true
                    onlineAny = true
                case "Discharging":
                    conditions.batteryCharging = conditions.batteryCharging ?? false
                case "Not charging":
                    // Plugged in but held (charge threshold reached): on external power, not charging.
                    conditions.batteryCharging = conditions.batteryCharging ?? false
                    onlineAny = true
                default:
                    break
                }
            default:
                continue
            }
        }
        conditions.hasBattery = batteries > 0
        conditions.onExternalPower = onlineAny
    }

    // MARK: Network

    private func defaultRouteInterface() -> String? {
        if let table = text(configuration.procfsRoot + "/net/route") {
            for line in table.split(separator: "\n").dropFirst() {
                let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
                guard fields.count >= 8, fields[1] == "00000000", fields[7] == "00000000",
                    let flags = UInt32(fields[3], radix: 16), flags & 0x1 != 0
                else { continue }
                return String(fields[0])
            }
        }
        if let table = text(configuration.procfsRoot + "/net/ipv6_route") {
            for line in table.split(separator: "\n") {
                let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                guard fields.count >= 10, fields[0] == String(repeating: "0", count: 32), fields[1] == "00",
                    fields[9] != "lo", let flags = UInt32(fields[8], radix: 16), flags & 0x1 != 0
                else { continue }
                return String(fields[9])
            }
        }
        return nil
    }

    private func interfaceKind(_ name: String) -> InterfaceKind? {
        let base = configuration.sysfsRoot + "/class/net/" + name
        let files = FileManager.default
        guard files.fileExists(atPath: base) else { return nil }
        if files.fileExists(atPath: base + "/wireless") || files.fileExists(atPath: base + "/phy80211") { return .wifi }
        if let uevent = text(base + "/uevent"), uevent.split(separator: "\n").contains("DEVTYPE=wwan") { return .cellular }
        if ["wwan", "rmnet", "ccmni", "ww"].contains(where: { name.hasPrefix($0) }) { return .cellular }
        if let type = text(base + "/type").flatMap(Int.init) {
            return type == 1 ? .ethernet : .other
        }
        return nil
    }

    private func readNetwork(into conditions: inout DeviceConditions) {
        let haveRoutes =
            FileManager.default.fileExists(atPath: configuration.procfsRoot + "/net/route")
            || FileManager.default.fileExists(atPath: configuration.procfsRoot + "/net/ipv6_route")
        guard haveRoutes else { return }
        guard let name = defaultRouteInterface() else {
            conditions.networkConnected = false
            return
        }
        conditions.networkInterface = name
        let state = text(configuration.sysfsRoot + "/class/net/" + name + "/operstate")
        switch state {
        case "down", "lowerlayerdown", "notpresent": conditions.networkConnected = false
        case "up", "unknown", "dormant": conditions.networkConnected = true
        default: conditions.networkConnected = nil
        }
        let kind = interfaceKind(name)
        conditions.networkInterfaceKind = kind
        if configuration.meteredInterfaces.contains(name) {
            conditions.networkMetered = true
        } else if let kind {
            conditions.networkMetered = kind == .cellular && configuration.cellularIsMetered
        }
    }

    // MARK: CPU

    static func parseCPU(_ stat: String) -> CPUSample? {
        guard let line = stat.split(separator: "\n").first(where: { $0.hasPrefix("cpu ") }) else { return nil }
        let values = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().compactMap { UInt64($0) }
        guard values.count >= 4 else { return nil }
        // user nice system idle iowait irq softirq steal (guest time is already counted in user).
        let counted = values.prefix(8)
        let idle = values[3] + (values.count > 4 ? values[4] : 0)
        return CPUSample(idle: idle, total: counted.reduce(0, +))
    }

    private func readCPUIdle() -> Double? {
        guard let stat = text(configuration.procfsRoot + "/stat"), let sample = Self.parseCPU(stat) else { return nil }
        return previousCPU.withLock { state -> Double? in
            // The first reading measures from boot.
            let base = state.baseline ?? CPUSample(idle: 0, total: 0)
            guard sample.total > base.total, sample.idle >= base.idle else {
                // The counters went back (another machine's file, a reset): measure from here on.
                state = (sample, nil)
                return nil
            }
            if state.baseline != nil, sample.total - base.total < Self.minimumIdleWindowTicks, let last = state.last { return last }
            let fraction = min(1, max(0, Double(sample.idle - base.idle) / Double(sample.total - base.total)))
            state = (sample, fraction)
            return fraction
        }
    }

    // MARK: Thermal

    private func readThermal() -> [ThermalZoneReading] {
        let root = configuration.sysfsRoot + "/class/thermal"
        guard let zones = entries(root) else { return [] }
        return zones.filter { $0.hasPrefix("thermal_zone") }.compactMap { zone in
            guard let milli = text(root + "/" + zone + "/temp").flatMap(Double.init) else { return nil }
            return ThermalZoneReading(zone: zone, type: text(root + "/" + zone + "/type"), celsius: milli / 1000)
        }
    }
}

import Synchronization
import Foundation

/// The kind of network interface carrying the default route.
public struct InterfaceKind: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable, Codable { case ethernet, wifi, cellular, other }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Wired Ethernet.
    public static let ethernet = InterfaceKind(.ethernet)
    /// Wi-Fi (an interface with a `wireless` or `phy80211` entry).
    public static let wifi = InterfaceKind(.wifi)
    /// A cellular modem (`DEVTYPE=wwan`, or a `wwan*`/`rmnet*` name); metered by default.
    public static let cellular = InterfaceKind(.cellular)
    /// Anything else (tunnels, bridges, PPP).
    public static let other = InterfaceKind(.other)

    /// The kind's name.
    public var description: String { kind.rawValue }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        self.kind = Kind(rawValue: name) ?? .other
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(kind.rawValue)
    }
}

/// One thermal zone's reading.
public struct ThermalZoneReading: Sendable, Hashable, Codable {
    /// The zone's name (`thermal_zone0`).
    public var zone: String
    /// The zone's type as the kernel reports it (`x86_pkg_temp`, `cpu-thermal`, …).
    public var type: String?
    /// The temperature in degrees Celsius.
    public var celsius: Double

    /// Creates a reading.
    public init(zone: String, type: String? = nil, celsius: Double) {
        self.zone = zone
        self.type = type
        self.celsius = celsius
    }
}

/// The system's thermal pressure as Apple platforms report it (`ProcessInfo.ThermalState`), lowest first.
public enum ThermalPressure: Int, Sendable, Hashable, Codable, Comparable, CustomStringConvertible {
    /// Within normal limits.
    case nominal = 0
    /// Slightly elevated.
    case fair = 1
    /// High: the system is reducing performance (Apple asks apps to reduce CPU and I/O work).
    case serious = 2
    /// Critical: the system is cooling down (Apple asks apps to stop all optional work).
    case critical = 3

    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }

    /// The state's name.
    public var description: String {
        switch self {
        case .nominal: "nominal"
        case .fair: "fair"
        case .serious: "serious"
        case .critical: "critical"
        }
    }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        guard let state = [Self.nominal, .fair, .serious, .critical].first(where: { $0.description == name }) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "unknown thermal pressure '\(name)'"))
        }
        self = state
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(description)
    }
}

/// What a device reports about itself; `nil` means unknown (see ``ConditionRules`` for how unknowns count).
public struct DeviceConditions: Sendable, Hashable, Codable {
    /// Whether external power (mains, USB, a charging battery) is connected.
    public var onExternalPower: Bool?
    /// Whether the device has a battery; `false` means mains-powered (servers, VMs, most edge boxes).
    public var hasBattery: Bool?
    /// The battery's charge, 0…1.
    public var batteryLevel: Double?
    /// Whether the battery is charging or full.
    public var batteryCharging: Bool?
    /// Whether there is a default route on an interface that is up.
    public var networkConnected: Bool?
    /// The interface carrying the default route.
    public var networkInterface: String?
    /// That interface's kind.
    public var networkInterfaceKind: InterfaceKind?
    /// Whether that interface is metered (cellular, or configured as metered).
    public var networkMetered: Bool?
    /// The fraction of CPU time spent idle (0…1) since the previous reading.
    public var cpuIdleFraction: Double?
    /// Every readable thermal zone.
    public var thermalZones: [ThermalZoneReading]
    /// The system's thermal pressure, where the platform reports one instead of (or besides) temperatures.
    public var thermalPressure: ThermalPressure?
    /// Whether the user turned on Low Power Mode (iOS, macOS): optional work waits.
    public var lowPowerMode: Bool?

    /// Creates conditions; every field defaults to unknown.
    public init(
        onExternalPower: Bool? = nil,
        hasBattery: Bool? = nil,
        batteryLevel: Double? = nil,
        batteryCharging: Bool? = nil,
        networkConnected: Bool? = nil,
        networkInterface: String? = nil,
        networkInterfaceKind: InterfaceKind? = nil,
        networkMetered: Bool? = nil,
        cpuIdleFraction: Double? = nil,
        thermalZones: [ThermalZoneReading] = [],
        thermalPressure: ThermalPressure? = nil,
        lowPowerMode: Bool? = nil
    ) {
        self.thermalPressure = thermalPressure
        self.lowPowerMode = lowPowerMode
        self.onExternalPower = onExternalPower
        self.hasBattery = hasBattery
        self.batteryLevel = batteryLevel
        self.batteryCharging = batteryCharging
        self.networkConnected = networkConnected
        self.networkInterface = networkInterface
        self.networkInterfaceKind = networkInterfaceKind
        self.networkMetered = networkMetered
        self.cpuIdleFraction = cpuIdleFraction
        self.thermalZones = thermalZones
    }

    /// Everything unknown.
    public static let unknown = DeviceConditions()

    /// A phone on its charger, on Wi-Fi, idle and cool: every constraint is met.
    public static let ideal = DeviceConditions(
        onExternalPower: true, hasBattery: true, batteryLevel: 1, batteryCharging: true,
        networkConnected: true, networkInterface: "wlan0", networkInterfaceKind: .wifi, networkMetered: false,
        cpuIdleFraction: 1, thermalZones: [ThermalZoneReading(zone: "thermal_zone0", type: "battery", celsius: 30)]
    )

    /// The hottest zone's temperature, if any zone was readable.
    public var maxTemperatureCelsius: Double? { thermalZones.map(\.celsius).max() }
}

/// A named constraint, for reporting which ones are unmet.
public struct ConstraintName: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable, Codable {
        case externalPower, networkConnectivity, unmeteredNetwork, deviceIdle, batteryNotLow, thermalHeadroom, lowPowerMode
    }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// `requiresExternalPower`.
    public static let externalPower = ConstraintName(.externalPower)
    /// `requiresNetworkConnectivity`.
    public static let networkConnectivity = ConstraintName(.networkConnectivity)
    /// `requiresUnmeteredNetwork`.
    public static let unmeteredNetwork = ConstraintName(.unmeteredNetwork)
    /// `requiresDeviceIdle`.
    public static let deviceIdle = ConstraintName(.deviceIdle)
    /// `requiresBatteryNotLow`.
    public static let batteryNotLow = ConstraintName(.batteryNotLow)
    /// The device-wide thermal ceiling every processing task observes.
    public static let thermalHeadroom = ConstraintName(.thermalHeadroom)
    /// Low Power Mode is off: every processing task waits while the user saves power.
    public static let lowPowerMode = ConstraintName(.lowPowerMode)

    /// The constraint's name.
    public var description: String { kind.rawValue }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        guard let kind = Kind(rawValue: name) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "unknown constraint '\(name)'"))
        }
        self.kind = kind
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(kind.rawValue)
    }
}

/// One constraint that is not met, and whether because the input was unknown.
public struct UnmetConstraint: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The constraint.
    public var constraint: ConstraintName
    /// `true` when the reading was unknown and ``ConditionRules/unknownSatisfies`` is `false`.
    public var becauseUnknown: Bool

    /// Creates an entry.
    public init(_ constraint: ConstraintName, becauseUnknown: Bool = false) {
        self.constraint = constraint
        self.becauseUnknown = becauseUnknown
    }

    public var description: String { becauseUnknown ? "\(constraint) (unknown)" : "\(constraint)" }
}

/// Thresholds and the rule for unknown readings, used to decide whether constraints hold.
///
/// The "unknown" rule:
/// 1. A device with no battery (`hasBattery == false`) is mains-powered: external power and battery-not-low
///    hold even though no power supply reported itself online.
/// 2. Any other unknown reading a required constraint depends on fails that constraint (the task waits),
///    unless `unknownSatisfies` is `true`. The failure is reported as `becauseUnknown`, never hidden.
/// 3. The thermal ceiling (a temperature, or the platform's thermal pressure) and Low Power Mode are
///    device-protection rules, not requests: an unknown reading does not block.
public struct ConditionRules: Sendable, Hashable, Codable {
    /// The CPU idle fraction at or above which the device counts as idle.
    public var idleThreshold: Double
    /// The battery level at or below which, when not charging, the battery counts as low (Android: 15 %).
    public var lowBatteryLevel: Double
    /// Processing tasks neither start nor continue while the hottest zone is at or above this temperature.
    public var thermalCeilingCelsius: Double
    /// Processing tasks neither start nor continue while the thermal pressure is at or above this (Apple asks
    /// apps to cut work at `serious`).
    public var thermalPressureCeiling: ThermalPressure
    /// Whether an unknown reading satisfies the constraint that needs it (default: it does not).
    public var unknownSatisfies: Bool

    /// Creates rules with the documented defaults.
    public init(
        idleThreshold: Double = 0.8, lowBatteryLevel: Double = 0.15, thermalCeilingCelsius: Double = 85, thermalPressureCeiling: ThermalPressure = .serious,
        unknownSatisfies: Bool = false
    ) {
        self.thermalPressureCeiling = thermalPressureCeiling
        self.idleThreshold = idleThreshold
        self.lowBatteryLevel = lowBatteryLevel
        self.thermalCeilingCelsius = thermalCeilingCelsius
        self.unknownSatisfies = unknownSatisfies
    }

    /// The constraints of `constraints` (and, for processing tasks, the thermal ceiling) that `conditions` do not meet.
    public func unmet(_ constraints: TaskConstraints, kind: TaskKind = .processing, in conditions: DeviceConditions) -> [UnmetConstraint] {
        var unmet: [UnmetConstraint] = []
        func check(_ name: ConstraintName, _ value: Bool?) {
            switch value {
            case .some(true): break
            case .some(false): unmet.append(UnmetConstraint(name))
            case .none: if !unknownSatisfies { unmet.append(UnmetConstraint(name, becauseUnknown: true)) }
            }
        }
        let mainsPowered = conditions.hasBattery == false
        if constraints.requiresExternalPower {
            check(.externalPower, mainsPowered ? true : conditions.onExternalPower)
        }
        if constraints.requiresNetworkConnectivity || constraints.requiresUnmeteredNetwork {
            check(.networkConnectivity, conditions.networkConnected)
        }
        if constraints.requiresUnmeteredNetwork, conditions.networkConnected != false {
            check(.unmeteredNetwork, conditions.networkMetered.map { !$0 })
        }
        if constraints.requiresDeviceIdle {
            check(.deviceIdle, conditions.cpuIdleFraction.map { $0 >= idleThreshold })
        }
        if constraints.requiresBatteryNotLow {
            let notLow: Bool?
            if mainsPowered || conditions.batteryCharging == true || conditions.onExternalPower == true {
                notLow = true
            } else {
                notLow = conditions.batteryLevel.map { $0 > lowBatteryLevel }
            }
            check(.batteryNotLow, notLow)
        }
        if kind == .processing {
            let hot = conditions.maxTemperatureCelsius.map { $0 >= thermalCeilingCelsius } ?? false
            let pressed = conditions.thermalPressure.map { $0 >= thermalPressureCeiling } ?? false
            if hot || pressed { unmet.append(UnmetConstraint(.thermalHeadroom)) }
            if conditions.lowPowerMode == true { unmet.append(UnmetConstraint(.lowPowerMode)) }
        }
        return unmet
    }

    /// Whether `conditions` meet every constraint.
    public func allows(_ constraints: TaskConstraints, kind: TaskKind = .processing, in conditions: DeviceConditions) -> Bool {
        unmet(constraints, kind: kind, in: conditions).isEmpty
    }
}

/// A source of device conditions: the Linux provider reads the machine; the scripted one is set by code.
public protocol DeviceConditionsProvider: Sendable {
    /// The conditions now.
    func currentConditions() async -> DeviceConditions
}

/// Conditions set by code: for tests and for the simulator's virtual devices.
public final class ScriptedConditionsProvider: DeviceConditionsProvider {
    private let state: Mutex<(conditions: DeviceConditions, reads: Int)>

    /// Creates a provider reporting `conditions` until changed.
    public init(_ conditions: DeviceConditions = .ideal) {
        state = Mutex((conditions, 0))
    }

    /// Replaces the conditions.
    public func set(_ conditions: DeviceConditions) {
        state.withLock { $0.conditions = conditions }
    }

    /// Changes the conditions in place.
    public func update(_ change: (inout DeviceConditions) -> Void) {
        state.withLock { change(&$0.conditions) }
    }

    /// How many times the conditions were read.
    public var readCount: Int { state.withLock { $0.reads } }

    public func currentConditions() async -> DeviceConditions {
        state.withLock { s in
            s.reads += 1
            return s.conditions
        }
    }
}

// Device conditions on Apple platforms: ProcessInfo's thermal state and Low Power Mode, UIKit's battery state and
// level (iOS, iPadOS, visionOS), and Network's path (expensive and constrained networks). One branch for iOS and Linux:
// on Linux, Package.swift aliases the shims to `Network` and `UIKit`. The battery is read where UIKit has it (not macOS
// or tvOS: no battery API there).
import Network
#if canImport(UIKit) && !os(tvOS) && !os(watchOS)
import UIKit
#endif
import Foundation
public import OrchardScheduler
import Synchronization

/// What Apple's APIs report, as plain values; ``conditions`` is Orchard's reading of them. Kept apart from the
/// provider so the mapping is tested without any system API.
public struct AppleSystemReading: Sendable, Hashable {
    /// `UIDevice.BatteryState`.
    public enum Battery: Sendable, Hashable {
        case unknown, unplugged, charging, full
    }

    /// `NWPath`, reduced to what the rules read.
    public struct Network: Sendable, Hashable {
        /// `status == .satisfied`.
        public var satisfied: Bool
        /// `isExpensive`: cellular, or a personal hotspot.
        public var expensive: Bool
        /// `isConstrained`: Low Data Mode.
        public var constrained: Bool
        /// The type of the path's preferred interface.
        public var interfaceKind: InterfaceKind?
        /// That interface's name.
        public var interfaceName: String?

        /// Creates a reading.
        public init(satisfied: Bool, expensive: Bool = false, constrained: Bool = false, interfaceKind: InterfaceKind? = nil, interfaceName: String? = nil) {
            self.satisfied = satisfied
            self.expensive = expensive
            self.constrained = constrained
            self.interfaceKind = interfaceKind
            self.interfaceName = interfaceName
        }
    }

    /// `ProcessInfo.thermalState`.
    public var thermalPressure: ThermalPressure
    /// `ProcessInfo.isLowPowerModeEnabled`.
    public var lowPowerMode: Bool
    /// The battery's state; `nil` on a platform without a battery API (macOS, tvOS).
    public var battery: Battery?
    /// The battery's charge 0…1; `nil` when unknown (`UIDevice.batteryLevel` is -1).
    public var batteryLevel: Double?
    /// The network path; `nil` before the first path arrived.
    public var network: Network?

    /// Creates a reading.
    public init(thermalPressure: ThermalPressure, lowPowerMode: Bool, battery: Battery? = nil, batteryLevel: Double? = nil, network: Network? = nil) {
        self.thermalPressure = thermalPressure
        self.lowPowerMode = lowPowerMode
        self.battery = battery
        self.batteryLevel = batteryLevel
        self.network = network
    }

    /// The reading as ``DeviceConditions``: a charging or full battery is on external power; an expensive or
    /// constrained path is metered; whatever the APIs do not say stays unknown.
    public var conditions: DeviceConditions {
        var conditions = DeviceConditions(thermalPressure: thermalPressure, lowPowerMode: lowPowerMode)
        if let battery {
            conditions.hasBattery = true
            switch battery {
            case .unknown: break
            case .unplugged: (conditions.onExternalPower, conditions.batteryCharging) = (false, false)
            case .charging, .full: (conditions.onExternalPower, conditions.batteryCharging) = (true, true)
            }
            conditions.batteryLevel = batteryLevel.flatMap { (0...1).contains($0) ? $0 : nil }
        }
        if let network {
            conditions.networkConnected = network.satisfied
            if network.satisfied {
                conditions.networkMetered = network.expensive || network.constrained
                conditions.networkInterfaceKind = network.interfaceKind
                conditions.networkInterface = network.interfaceName
            }
        }
        return conditions
    }
}

/// ``DeviceConditionsProvider`` for Apple platforms. It watches the network path with an `NWPathMonitor` from
/// creation until it is released, and reads the thermal state, Low Power Mode and (where UIKit has them) the battery
/// state and level each time it is asked; it turns on `UIDevice.isBatteryMonitoringEnabled`.
public final class AppleConditionsProvider: DeviceConditionsProvider {
    private let monitor: NWPathMonitor
    private let queue = DispatchQueue(label: "dev.orchard.conditions.network")
    private let latest = Latest()

    /// The last path the monitor delivered.
    private final class Latest: Sendable {
        let network = Mutex<AppleSystemReading.Network?>(nil)
    }

    /// Starts watching the network path.
    public init() {
        monitor = NWPathMonitor()
        monitor.pathUpdateHandler = { [latest] path in
            let reading = Self.reading(path)
            latest.network.withLock { $0 = reading }
        }
        monitor.start(queue: queue)
    }

    deinit { monitor.cancel() }

    /// The conditions now.
    public func currentConditions() async -> DeviceConditions {
        await currentReading().conditions
    }

    /// What the APIs report now.
    public func currentReading() async -> AppleSystemReading {
        let info = ProcessInfo.processInfo
        var reading = AppleSystemReading(thermalPressure: Self.pressure(info.thermalState), lowPowerMode: info.isLowPowerModeEnabled)
        #if canImport(UIKit) && !os(tvOS) && !os(watchOS)
        let (battery, level) = await MainActor.run {
            let device = UIDevice.current
            device.isBatteryMonitoringEnabled = true
            return (Self.battery(device.batteryState), Double(device.batteryLevel))
        }
        reading.battery = battery
        reading.batteryLevel = level < 0 ? nil : level
        #endif
        reading.network = latest.network.withLock { $0 } ?? Self.reading(monitor.currentPath)
        return reading
    }

    private static func pressure(_ state: ProcessInfo.ThermalState) -> ThermalPressure {
        switch state {
        case .nominal: .nominal
        case .fair: .fair
        case .serious: .serious
        case .critical: .critical
        @unknown default: .critical
        }
    }

    #if canImport(UIKit) && !os(tvOS) && !os(watchOS)
    private static func battery(_ state: UIDevice.BatteryState) -> AppleSystemReading.Battery {
        switch state {
        case .unknown: .unknown
        case .unplugged: .unplugged
        case .charging: .charging
        case .full: .full
        @unknown default: .unknown
        }
    }
    #endif

    private static func reading(_ path: NWPath) -> AppleSystemReading.Network {
        let interface = path.availableInterfaces.first
        let kind: InterfaceKind? = interface.map {
            switch $0.type {
            case .wifi: .wifi
            case .cellular: .cellular
            case .wiredEthernet: .ethernet
            default: .other
            }
        }
        return AppleSystemReading.Network(
            satisfied: path.status == .satisfied, expensive: path.isExpensive, constrained: path.isConstrained,
            interfaceKind: kind, interfaceName: interface?.name
        )
    }
}

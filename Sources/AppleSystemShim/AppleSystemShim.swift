// A small mirror of the Apple APIs that OrchardSchedulerApple's conditions provider reads — UIKit's `UIDevice`
// battery, Network's `NWPathMonitor`, and `ProcessInfo`'s thermal state and Low Power Mode — so the provider compiles
// and is tested on Linux. Names and shapes follow Apple's API; the `simulate…` members are test hooks standing in for
// the system.
public import Dispatch
public import Foundation
import Synchronization

/// The system state the shims report, set by the `simulate…` hooks.
private let system = Mutex(SimulatedSystem())

private struct SimulatedSystem {
    var thermalState = ProcessInfo.ThermalState.nominal
    var lowPowerMode = false
    var batteryState = UIDevice.BatteryState.unknown
    var batteryLevel: Float = -1
    var path = NWPath(status: .unsatisfied)
}

extension ProcessInfo {
    /// Mirror of `ProcessInfo.ThermalState`.
    public enum ThermalState: Int, Sendable {
        case nominal, fair, serious, critical
    }

    /// Mirror of `ProcessInfo.thermalState`.
    public var thermalState: ThermalState { system.withLock { $0.thermalState } }

    /// Mirror of `ProcessInfo.isLowPowerModeEnabled`.
    public var isLowPowerModeEnabled: Bool { system.withLock { $0.lowPowerMode } }

    /// Test hook: the thermal state and Low Power Mode the system reports from now on.
    public static func simulate(thermalState: ThermalState, lowPowerMode: Bool) {
        system.withLock {
            $0.thermalState = thermalState
            $0.lowPowerMode = lowPowerMode
        }
    }
}

/// Mirror of UIKit's `UIDevice` (battery monitoring only).
@MainActor
public final class UIDevice {
    /// Mirror of `UIDevice.BatteryState`.
    public enum BatteryState: Int, Sendable {
        case unknown, unplugged, charging, full
    }

    /// The device.
    public static let current = UIDevice()

    /// Whether the app monitors the battery; while it is off, the state reads `.unknown` and the level `-1`.
    public var isBatteryMonitoringEnabled = false

    /// The battery's state.
    public var batteryState: BatteryState { isBatteryMonitoringEnabled ? system.withLock { $0.batteryState } : .unknown }

    /// The battery's charge 0…1, or -1 when unknown.
    public var batteryLevel: Float { isBatteryMonitoringEnabled ? system.withLock { $0.batteryLevel } : -1 }

    private init() {}

    /// Test hook: the battery the system reports from now on.
    public nonisolated static func simulate(batteryState: BatteryState, level: Float) {
        system.withLock {
            $0.batteryState = batteryState
            $0.batteryLevel = level
        }
    }
}

/// Mirror of Network's `NWInterface` (its type and name).
public struct NWInterface: Sendable, Hashable {
    /// Mirror of `NWInterface.InterfaceType`.
    public enum InterfaceType: Sendable, Hashable {
        case other, wifi, cellular, wiredEthernet, loopback
    }

    /// The interface's type.
    public let type: InterfaceType
    /// The interface's name (`en0`).
    public let name: String

    /// Creates an interface (test hook: Network makes these).
    public init(type: InterfaceType, name: String) {
        self.type = type
        self.name = name
    }
}

/// Mirror of Network's `NWPath`.
public struct NWPath: Sendable, Hashable {
    /// Mirror of `NWPath.Status`.
    public enum Status: Sendable, Hashable {
        case satisfied, unsatisfied, requiresConnection
    }

    /// Whether the path can be used.
    public let status: Status
    /// Whether the path uses an interface the system considers expensive (cellular, a personal hotspot).
    public let isExpensive: Bool
    /// Whether the path is in Low Data Mode.
    public let isConstrained: Bool
    /// The interfaces the path can use, preferred first.
    public let availableInterfaces: [NWInterface]

    /// Creates a path (test hook: Network makes these).
    public init(status: Status, isExpensive: Bool = false, isConstrained: Bool = false, availableInterfaces: [NWInterface] = []) {
        self.status = status
        self.isExpensive = isExpensive
        self.isConstrained = isConstrained
        self.availableInterfaces = availableInterfaces
    }

    /// Whether the path uses an interface of `type`.
    public func usesInterfaceType(_ type: NWInterface.InterfaceType) -> Bool {
        availableInterfaces.first?.type == type
    }
}

/// Mirror of Network's `NWPathMonitor`: reports the current path, and each change to `pathUpdateHandler` on the
/// queue it was started on.
public final class NWPathMonitor: @unchecked Sendable {
    private struct State {
        var queue: DispatchQueue?
        var cancelled = false
    }

    private final class Weak: @unchecked Sendable {
        weak var monitor: NWPathMonitor?
        init(_ monitor: NWPathMonitor) { self.monitor = monitor }
    }

    private static let monitors = Mutex<[ObjectIdentifier: Weak]>([:])
    private let state = Mutex(State())

    /// Called with every new path on the monitor's queue.
    public var pathUpdateHandler: (@Sendable (NWPath) -> Void)?

    /// A monitor of every interface.
    public init() {}

    /// The path now.
    public var currentPath: NWPath { system.withLock { $0.path } }

    /// Starts delivering paths on `queue` (the current one first).
    public func start(queue: DispatchQueue) {
        state.withLock { $0.queue = queue }
        Self.monitors.withLock { $0[ObjectIdentifier(self)] = Weak(self) }
        deliver(currentPath)
    }

    deinit { Self.monitors.withLock { _ = $0.removeValue(forKey: ObjectIdentifier(self)) } }

    /// Stops delivering paths.
    public func cancel() {
        state.withLock { $0.cancelled = true }
        Self.monitors.withLock { _ = $0.removeValue(forKey: ObjectIdentifier(self)) }
    }

    private func deliver(_ path: NWPath) {
        let (queue, cancelled) = state.withLock { ($0.queue, $0.cancelled) }
        guard let queue, !cancelled, let handler = pathUpdateHandler else { return }
        queue.async { handler(path) }
    }

    /// Test hook: the path the system reports from now on, delivered to every started monitor.
    public static func simulate(path: NWPath) {
        system.withLock { $0.path = path }
        for monitor in monitors.withLock({ $0.values.compactMap(\.monitor) }) { monitor.deliver(path) }
    }
}

// The simulated device, network and unified log behind the UIKit, Network and os shims, for tests.
#if os(Linux)  // Apple platforms have the real framework
@_spi(AppleShimTesting) public import NetworkShim
@_spi(AppleShimTesting) public import OSLogShim
@_spi(AppleShimTesting) public import UIKitShim

/// Sets what the shims of UIKit, Foundation's `ProcessInfo` and Network report, and reads what `os.Logger` wrote.
public enum SimulatedSystem {
    /// The thermal state and Low Power Mode `ProcessInfo` reports from now on.
    public static func set(thermalState: ProcessInfo.ThermalState, lowPowerMode: Bool) {
        simulatedDevice.withLock {
            $0.thermalState = thermalState
            $0.lowPowerMode = lowPowerMode
        }
    }

    /// The battery `UIDevice` reports from now on (while battery monitoring is on).
    public static func set(batteryState: UIDevice.BatteryState, level: Float) {
        simulatedDevice.withLock {
            $0.batteryState = batteryState
            $0.batteryLevel = level
        }
    }

    /// The path every `NWPathMonitor` reports from now on (delivered to the started ones).
    public static func set(path: NWPath) { simulatedNetwork.set(path) }

    /// A path, as Network makes them.
    public static func path(
        _ status: NWPath.Status, expensive: Bool = false, constrained: Bool = false, interfaces: [(NWInterface.InterfaceType, String)] = []
    ) -> NWPath {
        NWPath(status: status, isExpensive: expensive, isConstrained: constrained, availableInterfaces: interfaces.map { NWInterface(type: $0.0, name: $0.1) })
    }

    /// An entry of the unified log as Console.app shows it (private values redacted).
    public struct LogEntry: Sendable, Equatable {
        /// The logger's subsystem.
        public let subsystem: String
        /// The logger's category.
        public let category: String
        /// The entry's level.
        public let level: OSLogType
        /// The message, private values shown as `<private>`.
        public let message: String
    }

    /// What `os.Logger` wrote so far, oldest first.
    public static var unifiedLog: [LogEntry] {
        SimulatedUnifiedLog.shared.all.map { LogEntry(subsystem: $0.subsystem, category: $0.category, level: $0.level, message: $0.message) }
    }
}
#endif

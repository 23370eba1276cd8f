import ArgumentParser
import Foundation
import OrchardScheduler

/// `orchard scheduler …`: inspect the background task scheduler.
struct SchedulerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "scheduler",
        abstract: "Inspect the background task scheduler.",
        subcommands: [Conditions.self]
    )

    /// `orchard scheduler conditions`: what the Linux conditions provider sees.
    struct Conditions: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the device conditions the Linux provider reads (power, network, CPU idleness, thermal zones)."
        )

        enum Format: String, ExpressibleByArgument, CaseIterable {
            case table, json
        }

        @Option(help: "Output format: table or json.")
        var format: Format = .table

        @Option(parsing: .unconditional, help: "Seconds between the two CPU samples the idle fraction is measured over (0: since boot).")
        var sample: Double = 1

        @Option(help: "Interfaces to count as metered (repeatable).")
        var meteredInterface: [String] = []

        @Option(help: "The sysfs mount point.")
        var sysfsRoot: String = "/sys"

        @Option(help: "The procfs mount point.")
        var procfsRoot: String = "/proc"

        func validate() throws {
            guard sample >= 0, sample <= 60 else { throw ValidationError("--sample must be between 0 and 60 seconds") }
        }

        func run() async throws {
            let provider = LinuxConditionsProvider(
                configuration: .init(
                    sysfsRoot: sysfsRoot, procfsRoot: procfsRoot, meteredInterfaces: Set(meteredInterface)
                ))
            var conditions = provider.read()
            if sample > 0 {
                try await Task.sleep(for: .seconds(sample))
                conditions = provider.read()
            }
            switch format {
            case .json:
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
                print(String(decoding: try encoder.encode(ConditionsReport(conditions)), as: UTF8.self))
            case .table:
                print(Self.table(conditions))
            }
        }

        /// The conditions plus what each request constraint would decide under the default rules.
        struct ConditionsReport: Encodable {
            var conditions: DeviceConditions
            var maxTemperatureCelsius: Double?
            var constraintsMet: [String: Bool]
            var unknownRule: String

            init(_ conditions: DeviceConditions) {
                self.conditions = conditions
                self.maxTemperatureCelsius = conditions.maxTemperatureCelsius
                self.constraintsMet = Dictionary(uniqueKeysWithValues: Conditions.constraintChecks(conditions).map { ($0.0, $0.1) })
                self.unknownRule = "no battery means mains power; any other unknown reading fails the constraint that needs it"
            }
        }

        static func constraintChecks(_ conditions: DeviceConditions) -> [(String, Bool)] {
            let rules = ConditionRules()
            let checks: [(String, TaskConstraints)] = [
                ("requiresExternalPower", TaskConstraints(requiresExternalPower: true)),
                ("requiresNetworkConnectivity", TaskConstraints(requiresNetworkConnectivity: true)),
                ("requiresUnmeteredNetwork", TaskConstraints(requiresUnmeteredNetwork: true)),
                ("requiresDeviceIdle", TaskConstraints(requiresDeviceIdle: true)),
                ("requiresBatteryNotLow", TaskConstraints(requiresBatteryNotLow: true)),
            ]
            return checks.map { name, constraints in (name, rules.allows(constraints, kind: .appRefresh, in: conditions)) }
        }

        static func table(_ c: DeviceConditions) -> String {
            func show(_ value: Bool?) -> String { value.map { $0 ? "yes" : "no" } ?? "unknown" }
            func show(_ value: String?) -> String { value ?? "unknown" }
            func percent(_ value: Double?) -> String { value.map { String(format: "%.0f%%", $0 * 100) } ?? "unknown" }
            var rows: [(String, String)] = [
                ("external power", show(c.onExternalPower)),
                ("battery present", show(c.hasBattery)),
                ("battery level", percent(c.batteryLevel)),
                ("battery charging", show(c.batteryCharging)),
                ("network connected", show(c.networkConnected)),
                ("default interface", show(c.networkInterface)),
                ("interface kind", show(c.networkInterfaceKind?.description)),
                ("metered", show(c.networkMetered)),
                ("cpu idle", percent(c.cpuIdleFraction)),
                ("hottest zone", c.maxTemperatureCelsius.map { String(format: "%.1f °C", $0) } ?? "unknown"),
            ]
            for zone in c.thermalZones {
                rows.append(("  \(zone.zone)", String(format: "%.1f °C", zone.celsius) + (zone.type.map { " (\($0))" } ?? "")))
            }
            for (name, met) in constraintChecks(c) {
                rows.append((name, met ? "met" : "not met"))
            }
            let width = rows.map(\.0.count).max() ?? 0
            return rows.map { $0.0.padding(toLength: width, withPad: " ", startingAt: 0) + "  " + $0.1 }.joined(separator: "\n")
        }
    }
}

#if os(Linux)
import AppleShimTesting
import Network
import UIKit
#endif
import Foundation
import OrchardScheduler
import OrchardSchedulerApple
import Testing

/// Apple conditions: the mapping from what the APIs report, and the provider reading them (on Linux, the code an iPhone
/// compiles, against the simulated system). Serialized: the simulated system's state is process-wide.
@Suite(.serialized) struct AppleConditionsTests {
    let rules = ConditionRules()
    let training = TaskConstraints(requiresExternalPower: true, requiresNetworkConnectivity: true, requiresUnmeteredNetwork: true)

    @Test func aChargingPhoneOnWiFiMeetsEveryConstraint() {
        let reading = AppleSystemReading(
            thermalPressure: .fair, lowPowerMode: false, battery: .charging, batteryLevel: 0.4,
            network: .init(satisfied: true, interfaceKind: .wifi, interfaceName: "en0")
        )
        let conditions = reading.conditions
        #expect(conditions.onExternalPower == true && conditions.batteryCharging == true && conditions.hasBattery == true)
        #expect(conditions.batteryLevel == 0.4)
        #expect(conditions.networkConnected == true && conditions.networkMetered == false && conditions.networkInterfaceKind == .wifi)
        #expect(rules.unmet(training, in: conditions).isEmpty)
        // A full battery on its charger is on external power too.
        #expect(AppleSystemReading(thermalPressure: .nominal, lowPowerMode: false, battery: .full, batteryLevel: 1).conditions.onExternalPower == true)
    }

    @Test func heatLowPowerModeBatteryAndExpensiveOrConstrainedNetworksAreEachNamed() {
        func unmet(_ reading: AppleSystemReading) -> [String] { rules.unmet(training, in: reading.conditions).map(\.description) }
        let wifi = AppleSystemReading.Network(satisfied: true, interfaceKind: .wifi)
        #expect(unmet(.init(thermalPressure: .serious, lowPowerMode: false, battery: .charging, network: wifi)) == ["thermalHeadroom"])
        #expect(unmet(.init(thermalPressure: .critical, lowPowerMode: true, battery: .charging, network: wifi)) == ["thermalHeadroom", "lowPowerMode"])
        #expect(unmet(.init(thermalPressure: .nominal, lowPowerMode: false, battery: .unplugged, batteryLevel: 0.9, network: wifi)) == ["externalPower"])
        let cellular = AppleSystemReading.Network(satisfied: true, expensive: true, interfaceKind: .cellular)
        #expect(unmet(.init(thermalPressure: .nominal, lowPowerMode: false, battery: .charging, network: cellular)) == ["unmeteredNetwork"])
        let lowData = AppleSystemReading.Network(satisfied: true, constrained: true, interfaceKind: .wifi)
        #expect(unmet(.init(thermalPressure: .nominal, lowPowerMode: false, battery: .charging, network: lowData)) == ["unmeteredNetwork"])
        #expect(unmet(.init(thermalPressure: .nominal, lowPowerMode: false, battery: .charging, network: .init(satisfied: false))) == ["networkConnectivity"])
        // A refresh task is not held back by heat or Low Power Mode (they guard processing work).
        let hot = AppleSystemReading(thermalPressure: .critical, lowPowerMode: true, battery: .charging, network: wifi).conditions
        #expect(rules.unmet(TaskConstraints(), kind: .appRefresh, in: hot).isEmpty)
    }

    @Test func whatTheAPIsDoNotSayStaysUnknown() {
        // macOS/tvOS: no battery API. Before the first path: no network reading. UIKit's -1 level: unknown.
        let bare = AppleSystemReading(thermalPressure: .nominal, lowPowerMode: false).conditions
        #expect(bare.hasBattery == nil && bare.onExternalPower == nil && bare.networkConnected == nil)
        #expect(
            rules.unmet(training, in: bare).map(\.description) == ["externalPower (unknown)", "networkConnectivity (unknown)", "unmeteredNetwork (unknown)"])
        let unknownBattery = AppleSystemReading(thermalPressure: .nominal, lowPowerMode: false, battery: .unknown, batteryLevel: -1).conditions
        #expect(unknownBattery.hasBattery == true && unknownBattery.onExternalPower == nil && unknownBattery.batteryLevel == nil)
    }

    @Test func thermalPressureRoundTripsAsItsName() throws {
        let conditions = DeviceConditions(thermalPressure: .serious, lowPowerMode: true)
        let json = try JSONEncoder().encode(conditions)
        #expect(String(decoding: json, as: UTF8.self).contains("\"serious\""))
        #expect(try JSONDecoder().decode(DeviceConditions.self, from: json) == conditions)
        // Conditions saved before these fields existed still decode.
        #expect(try JSONDecoder().decode(DeviceConditions.self, from: Data(#"{"thermalZones":[]}"#.utf8)).thermalPressure == nil)
    }

    #if os(Linux)
    @Test func theProviderReadsTheSimulatedSystem() async throws {
        SimulatedSystem.set(thermalState: .nominal, lowPowerMode: false)
        SimulatedSystem.set(batteryState: .charging, level: 0.75)
        SimulatedSystem.set(path: SimulatedSystem.path(.satisfied, interfaces: [(.wifi, "en0")]))
        let provider = AppleConditionsProvider()
        let first = await provider.currentConditions()
        #expect(first.onExternalPower == true && first.batteryLevel == 0.75)
        #expect(first.networkConnected == true && first.networkInterface == "en0" && first.networkMetered == false)
        #expect(ConditionRules().unmet(training, in: first).isEmpty)
        #expect(await MainActor.run { UIDevice.current.isBatteryMonitoringEnabled }, "the provider turns battery monitoring on")

        // The phone leaves Wi-Fi for cellular, is unplugged and heats up: the next reading says so.
        SimulatedSystem.set(path: SimulatedSystem.path(.satisfied, expensive: true, interfaces: [(.cellular, "pdp_ip0")]))
        SimulatedSystem.set(batteryState: .unplugged, level: 0.5)
        SimulatedSystem.set(thermalState: .serious, lowPowerMode: true)
        var second = await provider.currentConditions()
        for _ in 0..<200 where second.networkInterfaceKind != .cellular {
            // The monitor delivers paths on its own queue.
            try await Task.sleep(for: .milliseconds(5))
            second = await provider.currentConditions()
        }
        #expect(second.networkInterfaceKind == .cellular && second.networkMetered == true)
        #expect(
            Set(ConditionRules().unmet(training, in: second).map(\.description)) == ["externalPower", "unmeteredNetwork", "thermalHeadroom", "lowPowerMode"])
        SimulatedSystem.set(thermalState: .nominal, lowPowerMode: false)
    }
    #endif
}

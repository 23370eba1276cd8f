import Foundation
import OrchardScheduler
import Testing

@Suite("Condition rules")
struct ConditionRulesTests {
    let rules = ConditionRules()

    @Test func idealConditionsMeetEveryConstraint() {
        let all = TaskConstraints(
            requiresExternalPower: true, requiresNetworkConnectivity: true, requiresUnmeteredNetwork: true, requiresDeviceIdle: true,
            requiresBatteryNotLow: true)
        #expect(rules.unmet(all, in: .ideal).isEmpty)
    }

    @Test func unknownReadingsBlockByDefaultAndSayWhy() {
        let unmet = rules.unmet(.powerAndNetwork, in: .unknown)
        #expect(unmet == [UnmetConstraint(.externalPower, becauseUnknown: true), UnmetConstraint(.networkConnectivity, becauseUnknown: true)])
        let lenient = ConditionRules(unknownSatisfies: true)
        #expect(lenient.unmet(.powerAndNetwork, in: .unknown).isEmpty)
    }

    @Test func aDeviceWithoutBatteryIsMainsPowered() {
        let vm = DeviceConditions(hasBattery: false, networkConnected: true)
        #expect(rules.allows(TaskConstraints(requiresExternalPower: true, requiresBatteryNotLow: true), in: vm))
    }

    @Test func batteryLowUnlessCharging() {
        var phone = DeviceConditions.ideal
        phone.onExternalPower = false
        phone.batteryCharging = false
        phone.batteryLevel = 0.10
        let notLow = TaskConstraints(requiresBatteryNotLow: true)
        #expect(rules.unmet(notLow, in: phone) == [UnmetConstraint(.batteryNotLow)])
        phone.batteryLevel = 0.5
        #expect(rules.allows(notLow, in: phone))
        phone.batteryLevel = 0.10
        phone.batteryCharging = true
        #expect(rules.allows(notLow, in: phone))
    }

    @Test func meteredNetworkFailsUnmeteredOnly() {
        var phone = DeviceConditions.ideal
        phone.networkMetered = true
        phone.networkInterfaceKind = .cellular
        #expect(rules.allows(TaskConstraints(requiresNetworkConnectivity: true), in: phone))
        #expect(rules.unmet(TaskConstraints(requiresUnmeteredNetwork: true), in: phone) == [UnmetConstraint(.unmeteredNetwork)])
        phone.networkConnected = false
        #expect(rules.unmet(TaskConstraints(requiresUnmeteredNetwork: true), in: phone) == [UnmetConstraint(.networkConnectivity)])
    }

    @Test func idlenessUsesTheThreshold() {
        var device = DeviceConditions.ideal
        device.cpuIdleFraction = 0.79
        #expect(!rules.allows(TaskConstraints(requiresDeviceIdle: true), in: device))
        device.cpuIdleFraction = 0.8
        #expect(rules.allows(TaskConstraints(requiresDeviceIdle: true), in: device))
    }

    @Test func theThermalCeilingGatesProcessingOnly() {
        var hot = DeviceConditions.ideal
        hot.thermalZones = [ThermalZoneReading(zone: "thermal_zone0", celsius: 40), ThermalZoneReading(zone: "thermal_zone1", celsius: 91)]
        #expect(rules.unmet(.none, kind: .processing, in: hot) == [UnmetConstraint(.thermalHeadroom)])
        #expect(rules.allows(.none, kind: .appRefresh, in: hot))
        #expect(rules.allows(.none, kind: .processing, in: .unknown))
    }
}

/// Builds fake sysfs/procfs trees.
struct FakeMachine {
    let root: URL
    var sys: String { root.appendingPathComponent("sys").path }
    var proc: String { root.appendingPathComponent("proc").path }

    init() throws {
        root = try temporaryDirectory()
        try FileManager.default.createDirectory(atPath: sys, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: proc, withIntermediateDirectories: true)
    }

    func write(_ relative: String, _ contents: String) throws {
        let url = root.appendingPathComponent(relative)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data((contents + "\n").utf8).write(to: url)
    }

    func mkdir(_ relative: String) throws {
        try FileManager.default.createDirectory(at: root.appendingPathComponent(relative), withIntermediateDirectories: true)
    }

    /// Removes the fake tree.
    func remove() { try? FileManager.default.removeItem(at: root) }

    func route(_ iface: String) -> String {
        """
        Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
        \(iface)\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
        \(iface)\t00000000\t0102A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0
        """
    }

    func provider(metered: Set<String> = []) -> LinuxConditionsProvider {
        LinuxConditionsProvider(configuration: .init(sysfsRoot: sys, procfsRoot: proc, meteredInterfaces: metered))
    }
}

@Suite("Linux conditions provider")
struct LinuxConditionsProviderTests {
    @Test func laptopOnBatteryOverWiFi() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.write("sys/class/power_supply/AC/type", "Mains")
        try m.write("sys/class/power_supply/AC/online", "0")
        try m.write("sys/class/power_supply/BAT0/type", "Battery")
        try m.write("sys/class/power_supply/BAT0/status", "Discharging")
        try m.write("sys/class/power_supply/BAT0/capacity", "42")
        try m.write("sys/class/power_supply/hidpp_battery_0/type", "Battery")
        try m.write("sys/class/power_supply/hidpp_battery_0/scope", "Device")
        try m.write("sys/class/power_supply/hidpp_battery_0/capacity", "5")
        try m.write("proc/net/route", m.route("wlan0"))
        try m.write("sys/class/net/wlan0/operstate", "up")
        try m.write("sys/class/net/wlan0/type", "1")
        try m.mkdir("sys/class/net/wlan0/wireless")
        try m.write("proc/stat", "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0")
        try m.write("sys/class/thermal/thermal_zone0/temp", "45000")
        try m.write("sys/class/thermal/thermal_zone0/type", "x86_pkg_temp")
        try m.write("sys/class/thermal/thermal_zone1/temp", "51500")
        try m.write("sys/class/thermal/cooling_device0/type", "Fan")

        let c = m.provider().read()
        #expect(c.onExternalPower == false)
        #expect(c.hasBattery == true)
        #expect(c.batteryLevel == 0.42)
        #expect(c.batteryCharging == false)
        #expect(c.networkConnected == true)
        #expect(c.networkInterface == "wlan0")
        #expect(c.networkInterfaceKind == .wifi)
        #expect(c.networkMetered == false)
        #expect(c.cpuIdleFraction == 0.8)
        #expect(c.thermalZones.map(\.zone) == ["thermal_zone0", "thermal_zone1"])
        #expect(c.thermalZones.first?.type == "x86_pkg_temp")
        #expect(c.maxTemperatureCelsius == 51.5)
        #expect(!ConditionRules().allows(TaskConstraints(requiresExternalPower: true), in: c))
    }

    /// Two readings a moment apart (the service loop's, then the window's own): the second repeats the last full
    /// window's idleness instead of measuring the two busy ticks between them; a later reading spans a new window.
    @Test func idlenessIsMeasuredOverAWindowNotBetweenTwoCloseReadings() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        let provider = m.provider()
        try m.write("proc/stat", "cpu  100 0 100 800 0 0 0 0 0 0")
        #expect(provider.read().cpuIdleFraction == 0.8)
        try m.write("proc/stat", "cpu  110 0 110 1780 0 0 0 0 0 0")
        #expect(provider.read().cpuIdleFraction == 0.98)
        try m.write("proc/stat", "cpu  112 0 110 1780 0 0 0 0 0 0")
        #expect(provider.read().cpuIdleFraction == 0.98, "two busy ticks are no window")
        try m.write("proc/stat", "cpu  412 0 110 1780 0 0 0 0 0 0")
        #expect(provider.read().cpuIdleFraction == 0, "300 busy ticks since the last window")
    }

    @Test func chargingLaptop() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.write("sys/class/power_supply/BAT1/type", "Battery")
        try m.write("sys/class/power_supply/BAT1/status", "Charging")
        try m.write("sys/class/power_supply/BAT1/capacity", "12")
        let c = m.provider().read()
        #expect(c.onExternalPower == true)
        #expect(c.batteryCharging == true)
        #expect(ConditionRules().allows(TaskConstraints(requiresExternalPower: true, requiresBatteryNotLow: true), in: c))
    }

    @Test func virtualMachineWithoutBatteryOnEthernet() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.mkdir("sys/class/power_supply")
        try m.write("proc/net/route", m.route("eth0"))
        try m.write("sys/class/net/eth0/operstate", "up")
        try m.write("sys/class/net/eth0/type", "1")
        let c = m.provider().read()
        #expect(c.hasBattery == false)
        #expect(c.onExternalPower == nil)
        #expect(c.networkInterfaceKind == .ethernet)
        #expect(c.networkMetered == false)
        #expect(ConditionRules().allows(TaskConstraints(requiresExternalPower: true, requiresUnmeteredNetwork: true, requiresBatteryNotLow: true), in: c))
    }

    @Test func missingFilesMeanUnknownNotACrash() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        let c = m.provider().read()
        #expect(c == DeviceConditions.unknown)
    }

    @Test func malformedFilesMeanUnknown() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.write("sys/class/power_supply/BAT0/type", "Battery")
        try m.write("sys/class/power_supply/BAT0/capacity", "lots")
        try m.write("sys/class/power_supply/BAT0/status", "Weird")
        try m.write("proc/stat", "nonsense")
        try m.write("proc/net/route", "Iface\tDestination\ngarbage")
        try m.write("sys/class/thermal/thermal_zone0/temp", "hot")
        let c = m.provider().read()
        #expect(c.hasBattery == true)
        #expect(c.batteryLevel == nil)
        #expect(c.batteryCharging == nil)
        #expect(c.onExternalPower == nil)
        #expect(c.cpuIdleFraction == nil)
        #expect(c.networkConnected == false)
        #expect(c.thermalZones.isEmpty)
    }

    @Test func cellularAndConfiguredInterfacesAreMetered() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.write("proc/net/route", m.route("wwan0"))
        try m.write("sys/class/net/wwan0/operstate", "up")
        try m.write("sys/class/net/wwan0/type", "1")
        try m.write("sys/class/net/wwan0/uevent", "INTERFACE=wwan0\nDEVTYPE=wwan")
        var c = m.provider().read()
        #expect(c.networkInterfaceKind == .cellular)
        #expect(c.networkMetered == true)

        try m.write("proc/net/route", m.route("usb0"))
        try m.write("sys/class/net/usb0/operstate", "up")
        try m.write("sys/class/net/usb0/type", "1")
        c = m.provider(metered: ["usb0"]).read()
        #expect(c.networkInterfaceKind == .ethernet)
        #expect(c.networkMetered == true)
        c = m.provider().read()
        #expect(c.networkMetered == false)
    }

    @Test func aDownInterfaceOrNoDefaultRouteIsDisconnected() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.write("proc/net/route", m.route("eth0"))
        try m.write("sys/class/net/eth0/operstate", "down")
        #expect(m.provider().read().networkConnected == false)
        try m.write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT")
        #expect(m.provider().read().networkConnected == false)
    }

    @Test func ipv6DefaultRouteIsUsedWhenThereIsNoIPv4One() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT")
        let zero = String(repeating: "0", count: 32)
        try m.write("proc/net/ipv6_route", "\(zero) 00 \(zero) 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth1")
        try m.write("sys/class/net/eth1/operstate", "up")
        try m.write("sys/class/net/eth1/type", "1")
        let c = m.provider().read()
        #expect(c.networkInterface == "eth1")
        #expect(c.networkConnected == true)
    }

    @Test func cpuIdlenessIsMeasuredBetweenReadings() throws {
        let m = try FakeMachine()
        defer { m.remove() }
        try m.write("proc/stat", "cpu  1000 0 1000 8000 0 0 0 0 0 0")
        let provider = m.provider()
        #expect(provider.read().cpuIdleFraction == 0.8)
        // 400 busy + 100 idle + 100 iowait in the interval: 200 / 600 idle.
        try m.write("proc/stat", "cpu  1300 0 1100 8100 100 0 0 0 0 0")
        let idle = try #require(provider.read().cpuIdleFraction)
        #expect(abs(idle - 200.0 / 600.0) < 1e-12)
    }
}

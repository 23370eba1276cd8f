import Foundation
import OrchardSupport
import Logging
import OrchardClient
import OrchardFormats
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import OrchardScheduler
import Synchronization

/// Power and network as the availability trace says at the device's virtual time: charging on Wi-Fi while
/// eligible, on battery without network otherwise.
struct AvailabilityConditions: DeviceConditionsProvider {
    let device: Int
    let availability: Availability
    let seed: UInt64
    let clock: ManualClock

    func currentConditions() async -> DeviceConditions {
        let eligible = availability.isAvailable(device, at: clock.seconds, seed: seed)
        return DeviceConditions(
            onExternalPower: eligible, hasBattery: true, batteryLevel: eligible ? 0.9 : 0.5, batteryCharging: eligible,
            networkConnected: eligible, networkInterface: eligible ? "wlan0" : nil, networkInterfaceKind: eligible ? .wifi : nil,
            networkMetered: eligible ? false : nil, cpuIdleFraction: 0.9
        )
    }
}

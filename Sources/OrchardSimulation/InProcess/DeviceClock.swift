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

/// The device's clock as its SDK sees it: the virtual clock, where a wait (a retry's backoff) is time the device
/// spends, ended by the window's end or the device going away like any other wait.
struct DeviceClock: WallClock {
    let link: DeviceLink

    var now: WallInstant { link.clock.now }
    var minimumResolution: Duration { .zero }

    func sleep(until deadline: WallInstant, tolerance: Duration? = nil) async throws {
        do { try await link.spend(max(.zero, now.duration(to: deadline)).inSeconds) } catch { throw CancellationError() }
    }
}

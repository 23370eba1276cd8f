import Foundation
import OrchardSupport
import OrchardClient
import OrchardCoordinator
import OrchardCoordinatorTesting
import OrchardFormats
import OrchardInProcess
import OrchardProtocol
import Synchronization
import OrchardTesting
import Testing

/// A coordinator on a real SQLite file, served on loopback HTTP, with a manual clock; plus client factories
/// with per-device state directories and a recorded, instant backoff.
final class ClientHarness: @unchecked Sendable {
    let loopback: LoopbackCoordinator
    let clock: ManualClock
    let sleeps = Mutex<[Duration]>([])

    var directory: URL { loopback.directory }
    var instance: CoordinatorInstance { loopback.instance }
    var server: RunningServer { loopback.server }
    var databasePath: String { loopback.databasePath }
    var url: String { loopback.url }
    var coordinator: Coordinator { instance.coordinator }

    private init(loopback: LoopbackCoordinator, clock: ManualClock) {
        self.loopback = loopback
        self.clock = clock
    }

    static func start() async throws -> ClientHarness {
        let clock = ManualClock()
        return ClientHarness(loopback: try await LoopbackCoordinator.start(configuration: CoordinatorConfiguration(), clock: clock, seed: 11), clock: clock)
    }

    /// Stops the HTTP server, reopens the coordinator on the same SQLite file and serves it on the same port.
    func restart() async throws {
        try await loopback.restart(seed: 12)
    }

    func stop() async {
        await loopback.stop()
    }

    func host(_ request: HostProcessRequest) async throws -> ProcessStatus {
        try await coordinator.host(request)
    }

    /// A device's configuration: its own state directory, the harness clock, instant recorded backoff.
    func configuration(
        device: String, seed: UInt64 = 5, retry: RequestRetryPolicy = RequestRetryPolicy(maximumAttempts: 3), trainer: any LocalTrainer = EngineLocalTrainer(),
        onSleep: @escaping @Sendable () async throws -> Void = {}
    ) -> DeviceConfiguration {
        DeviceConfiguration(
            storageDirectory: directory.appendingPathComponent("device-\(device)", isDirectory: true),
            retry: retry,
            environment: .seeded(
                seed,
                clock: RecordingClock(base: clock) { duration in
                    self.sleeps.withLock { $0.append(duration) }
                    try await onSleep()
                }),
            trainingSeed: 42, trainer: trainer
        )
    }

    /// A client over HTTP, optionally through a recording transport.
    func httpClient(device: String, authToken: String? = nil, configuration: DeviceConfiguration? = nil) throws -> (CoordinatorConnection, RecordingTransport) {
        let transport = RecordingTransport(try HTTPTransport(url: url))
        let client = CoordinatorConnection(
            transport: transport, server: url, authToken: authToken, configuration: configuration ?? self.configuration(device: device))
        return (client, transport)
    }
}

import Foundation
import OrchardSupport
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardInProcess
import OrchardProtocol
import Synchronization
import OrchardTesting
import Testing

/// A coordinator on a real SQLite file, served on loopback HTTP, with a manual clock; plus client factories
/// with per-device state directories and a recorded, instant backoff.
final class ClientHarness: @unchecked Sendable {
    let directory: URL
    let clock: ManualClock
    private(set) var instance: CoordinatorInstance
    private(set) var server: RunningServer
    let sleeps = Mutex<[Duration]>([])

    var databasePath: String { directory.appendingPathComponent("coordinator.sqlite").path }
    var url: String { "http://127.0.0.1:\(server.port)" }
    var coordinator: Coordinator { instance.coordinator }

    private init(directory: URL, clock: ManualClock, instance: CoordinatorInstance, server: RunningServer) {
        self.directory = directory
        self.clock = clock
        self.instance = instance
        self.server = server
    }

    static func start() async throws -> ClientHarness {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-client-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let clock = ManualClock()
        let instance = try await CoordinatorInstance.open(
            database: directory.appendingPathComponent("coordinator.sqlite").path, clock: clock, random: SplitMix64(seed: 11)
        )
        let server = try await instance.serve()
        return ClientHarness(directory: directory, clock: clock, instance: instance, server: server)
    }

    /// Stops the HTTP server, reopens the coordinator on the same SQLite file and serves it on the same port.
    func restart() async throws {
        let port = server.port
        await server.stop()
        instance.close()
        instance = try await CoordinatorInstance.open(database: databasePath, clock: clock, random: SplitMix64(seed: 12))
        server = try await instance.serve(port: port)
    }

    func stop() async {
        await server.stop()
        try? FileManager.default.removeItem(at: directory)
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

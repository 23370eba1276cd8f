import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardML
import OrchardProtocol
import Synchronization
import Testing

/// The coordinator's core as an ``InProcessCoordinator``: session tokens resolved by the core, its errors mapped
/// to client errors exactly as the HTTP layer would send them.
struct CoordinatorAdapter: InProcessCoordinator {
    let coordinator: Coordinator

    private func mapped<T>(_ body: () async throws(CoordinatorError) -> T) async throws(OrchardClientError) -> T {
        do {
            return try await body()
        } catch {
            throw OrchardClientError.server(status: error.status, body: error.body)
        }
    }

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await mapped { () async throws(CoordinatorError) in try await coordinator.authenticate(request) }
    }

    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            return try await coordinator.requestCycle(request, sessionWorker: worker)
        }
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> OrchardProtocol.TrainingPlan {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            return try await coordinator.plan(planID, requestKey: requestKey, sessionWorker: worker)
        }
    }

    func model(_ modelID: String, requestKey: String, session: String) async throws(OrchardClientError) -> (bytes: [UInt8], etag: String) {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            let download = try await coordinator.model(modelID, requestKey: requestKey, sessionWorker: worker)
            return (download.bytes, download.etag)
        }
    }

    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            return try await coordinator.report(body, sessionWorker: worker)
        }
    }
}

/// A transport decorator that records calls and can inject failures, for tests.
final class RecordingTransport: ClientTransport {
    struct Log {
        var cycleResponses: [CycleResponse] = []
        var modelRequests: [ModelRequest] = []
        var downloadHeads: [DownloadHead] = []
        var reports: [[UInt8]] = []
        var reportAttempts = 0
    }

    /// What to do with a call.
    enum Fault: Sendable {
        /// Fail with a network error before the request leaves.
        case dropRequest
        /// Deliver the request, then fail as if the answer was lost.
        case dropAnswer
        /// Cut the download after this many bytes of the body.
        case cutDownload(after: Int)
    }

    let inner: any ClientTransport
    let log = Mutex(Log())
    let reportFaults = Mutex<[Fault]>([])
    let downloadFaults = Mutex<[Fault]>([])

    init(_ inner: any ClientTransport) { self.inner = inner }

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await inner.authenticate(request)
    }

    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        let response = try await inner.requestCycle(request, session: session)
        log.withLock { $0.cycleResponses.append(response) }
        return response
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> OrchardProtocol.TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        log.withLock { $0.modelRequests.append(request) }
        let fault = downloadFaults.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        let recorder = HeadRecorder(inner: sink, log: self, cutAfter: { if case .cutDownload(let n) = fault { return n } else { return nil } }())
        try await inner.downloadModel(request, session: session, into: recorder)
    }

    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        let fault = reportFaults.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        log.withLock { $0.reportAttempts += 1 }
        if case .dropRequest = fault { throw OrchardClientError(.network, "injected: request dropped") }
        let response = try await inner.report(body, session: session)
        log.withLock { $0.reports.append(body) }
        if case .dropAnswer = fault { throw OrchardClientError(.network, "injected: answer lost") }
        return response
    }

    /// Records heads and cuts a download short.
    final class HeadRecorder: DownloadSink {
        let inner: any DownloadSink
        let log: RecordingTransport
        let cutAfter: Int?
        let passed = Mutex(0)

        init(inner: any DownloadSink, log: RecordingTransport, cutAfter: Int?) {
            self.inner = inner
            self.log = log
            self.cutAfter = cutAfter
        }

        func begin(_ head: DownloadHead) throws(OrchardClientError) {
            log.log.withLock { $0.downloadHeads.append(head) }
            try inner.begin(head)
        }

        func append(_ bytes: [UInt8]) throws(OrchardClientError) {
            guard let cutAfter else { return try inner.append(bytes) }
            let already = passed.withLock { $0 }
            let allowed = max(0, min(bytes.count, cutAfter - already))
            if allowed > 0 { try inner.append(Array(bytes[0..<allowed])) }
            passed.withLock { $0 += allowed }
            if already + bytes.count > cutAfter { throw OrchardClientError(.network, "injected: connection cut after \(cutAfter) bytes") }
        }
    }
}

/// A small regression model with a training section, its seeded initial weights and a seeded local dataset.
enum Fixture {
    static let spec = ModelSpec(
        name: "regressor", inputs: [InputSpec(name: "x", shape: [4])],
        layers: [
            LayerSpec(name: "hidden", type: .dense, inputs: ["x"], units: 8, inputSize: 4),
            LayerSpec(name: "act", type: .tanh, inputs: ["hidden"]),
            LayerSpec(name: "out", type: .dense, inputs: ["act"], units: 1, inputSize: 8),
        ],
        training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.05, momentum: 0.9), epochs: 1, batchSize: 8)
    )

    static func initialWeights() throws -> [UInt8] {
        try Model(spec: spec, seed: 7).weightsSafetensors()
    }

    /// `count` samples of y = Σ wᵢxᵢ + noise, from a seeded generator.
    static func dataset(count: Int = 96, seed: UInt64 = 3) throws -> TensorDataset {
        var state = seed
        func next() -> Float {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return Float(Double(state >> 11) * 0x1p-53) * 2 - 1
        }
        var x: [Float] = []
        var y: [Float] = []
        for _ in 0..<count {
            let row = (0..<4).map { _ in next() }
            x += row
            y.append(0.5 * row[0] - 0.25 * row[1] + row[2] * row[3] + 0.05 * next())
        }
        return try TensorDataset(inputs: ["x": Tensor(shape: [count, 4], scalars: x)], targets: Tensor(shape: [count, 1], scalars: y))
    }

    static func host(name: String = "regressor", goal: Int = 5, overSelection: Double = 1.3, authentication: AuthenticationConfig = .open, clientConfig: ClientConfig = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 3)) throws -> HostProcessRequest {
        HostProcessRequest(
            name: name, version: SemanticVersion(1, 0), model: spec, initialWeights: try initialWeights(),
            clientConfig: clientConfig,
            serverConfig: ServerConfig(cycleLength: 3600, goalCount: goal, overSelection: overSelection, minimumReports: 1, paceSteeringWindow: 30, authentication: authentication)
        )
    }
}

/// A coordinator on a real SQLite file, served on loopback HTTP, with a manual clock; plus client factories
/// with per-device state directories and a recorded, instant backoff.
final class ClientHarness: @unchecked Sendable {
    let directory: URL
    let clock: ManualWallClock
    private(set) var instance: CoordinatorInstance
    private(set) var server: RunningServer
    let sleeps = Mutex<[Duration]>([])

    var databasePath: String { directory.appendingPathComponent("coordinator.sqlite").path }
    var url: String { "http://127.0.0.1:\(server.port)" }
    var coordinator: Coordinator { instance.coordinator }

    private init(directory: URL, clock: ManualWallClock, instance: CoordinatorInstance, server: RunningServer) {
        self.directory = directory
        self.clock = clock
        self.instance = instance
        self.server = server
    }

    static func start() async throws -> ClientHarness {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-client-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let clock = ManualWallClock()
        let instance = try await CoordinatorInstance.open(
            database: directory.appendingPathComponent("coordinator.sqlite").path, clock: .manual(clock), random: SplitMix64(seed: 11)
        )
        let server = try await instance.serve()
        return ClientHarness(directory: directory, clock: clock, instance: instance, server: server)
    }

    /// Stops the HTTP server, reopens the coordinator on the same SQLite file and serves it on the same port.
    func restart() async throws {
        let port = server.port
        await server.stop()
        instance = try await CoordinatorInstance.open(database: databasePath, clock: .manual(clock), random: SplitMix64(seed: 12))
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
    func configuration(device: String, seed: UInt64 = 5, retry: RequestRetryPolicy = RequestRetryPolicy(maximumAttempts: 3), trainer: any LocalTrainer = EngineLocalTrainer(), onSleep: @escaping @Sendable () async throws -> Void = {}) -> ClientConfiguration {
        let clock = self.clock
        let sleeps = self.sleeps
        return ClientConfiguration(
            storageDirectory: directory.appendingPathComponent("device-\(device)", isDirectory: true),
            retry: retry,
            environment: .seeded(seed, now: { clock.now }, sleep: { duration in
                sleeps.withLock { $0.append(duration) }
                try await onSleep()
            }),
            trainingSeed: 42, trainer: trainer
        )
    }

    /// A client over HTTP, optionally through a recording transport.
    func httpClient(device: String, authToken: String? = nil, configuration: ClientConfiguration? = nil) throws -> (OrchardClient, RecordingTransport) {
        let transport = RecordingTransport(try HTTPTransport(url: url))
        let client = OrchardClient(transport: transport, server: url, authToken: authToken, configuration: configuration ?? self.configuration(device: device))
        return (client, transport)
    }
}

/// A trainer that cancels its own task after a given number of updates, to interrupt the engine at an exact
/// batch boundary.
struct InterruptingTrainer: LocalTrainer {
    let inner = EngineLocalTrainer()
    let cancelAfterUpdates: Int

    func parameterShapes(of spec: ModelSpec) throws(OrchardClientError) -> [String: [Int]] {
        try inner.parameterShapes(of: spec)
    }

    func train(_ task: LocalTrainingTask, on dataset: any Dataset, resumingFrom checkpoint: [UInt8]?, progress: @escaping @Sendable (TrainingStep) -> Void) throws(OrchardClientError) -> LocalTrainingOutcome {
        let limit = cancelAfterUpdates
        return try inner.train(task, on: dataset, resumingFrom: checkpoint) { step in
            progress(step)
            if step.updates == limit { withUnsafeCurrentTask { $0?.cancel() } }
        }
    }
}

/// Counts calls, thread-safely.
final class Counter: Sendable {
    private let values = Mutex<[String: Int]>([:])
    func hit(_ name: String) { values.withLock { $0[name, default: 0] += 1 } }
    subscript(_ name: String) -> Int { values.withLock { $0[name, default: 0] } }
}

/// The diff tensors of a report body.
func diffOf(_ body: [UInt8]) throws -> [String: [Float]] {
    try Safetensors.decode(body).byName.mapValues(\.values)
}

import Foundation
import OrchardClient
import OrchardFormats
import OrchardML
import OrchardProtocol
import Synchronization
import Testing

/// A transport decorator that records calls and can inject failures, for tests.
final class RecordingTransport: ClientTransport {
    struct Log {
        var cycleRequests: [CycleRequest] = []
        var cycleResponses: [CycleResponse] = []
        var speedTests: [(direction: SpeedTestDirection, bytes: Int)] = []
        var modelRequests: [ModelRequest] = []
        var downloadHeads: [DownloadHead] = []
        var reports: [[UInt8]] = []
        var reportAttempts = 0
        var evaluationReports: [EvaluationReport] = []
        var plans: [(planID: String, requestKey: String)] = []
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
        log.withLock { $0.cycleRequests.append(request) }
        let response = try await inner.requestCycle(request, session: session)
        log.withLock { $0.cycleResponses.append(response) }
        return response
    }

    func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        log.withLock { $0.speedTests.append((direction, bytes)) }
        return try await inner.speedTest(direction, bytes: bytes, session: session)
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        log.withLock { $0.plans.append((planID, requestKey)) }
        return try await inner.plan(planID, requestKey: requestKey, session: session)
    }

    func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse {
        log.withLock { $0.evaluationReports.append(report) }
        return try await inner.evaluationReport(report, session: session)
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
        let (x, y) = samples(count: count, seed: seed)
        return try TensorDataset(inputs: ["x": Tensor(shape: [count, 4], scalars: x)], targets: Tensor(shape: [count, 1], scalars: y))
    }

    /// The dataset as the `--data` file of `orchard client` and `orchard agent`: tensors `x` and `target`.
    static func dataFile(count: Int = 96, seed: UInt64 = 3) -> [UInt8] {
        let (x, y) = samples(count: count, seed: seed)
        return Safetensors.encode([TensorRecord(name: "x", shape: [count, 4], values: x), TensorRecord(name: "target", shape: [count, 1], values: y)])
    }

    /// The inputs (row-major `[count, 4]`) and targets of ``dataset(count:seed:)``.
    static func samples(count: Int, seed: UInt64) -> (x: [Float], y: [Float]) {
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
        return (x, y)
    }

    static func host(
        name: String = "regressor", goal: Int = 5, overSelection: Double = 1.3, authentication: AuthenticationConfig = .open,
        clientConfig: ClientConfig = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 3)
    ) throws -> HostProcessRequest {
        HostProcessRequest(
            name: name, version: SemanticVersion(1, 0), model: spec, initialWeights: try initialWeights(),
            clientConfig: clientConfig,
            serverConfig: ServerConfig(
                cycleLength: 3600, goalCount: goal, overSelection: overSelection, minimumReports: 1, paceSteeringWindow: 30, authentication: authentication)
        )
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

    func train(_ task: LocalTrainingTask, on dataset: any Dataset, resumingFrom checkpoint: [UInt8]?, progress: @escaping @Sendable (TrainingStep) -> Void)
        throws(OrchardClientError) -> LocalTrainingOutcome
    {
        let limit = cancelAfterUpdates
        return try inner.train(task, on: dataset, resumingFrom: checkpoint) { step in
            progress(step)
            if step.updates == limit { withUnsafeCurrentTask { $0?.cancel() } }
        }
    }

    func completedUpdates(in checkpoint: [UInt8], of task: LocalTrainingTask) throws(OrchardClientError) -> Int {
        try inner.completedUpdates(in: checkpoint, of: task)
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

/// The diff the engine computes directly for the fixture (what a device should report).
func referenceDiff(clientConfig: ClientConfig, seed: UInt64, on dataset: (any Dataset)? = nil) throws -> [String: [Float]] {
    let weights = try Safetensors.decode(Fixture.initialWeights()).tensors
    let training = try TrainingConfiguration.resolved(architecture: Fixture.spec, clientConfig: clientConfig, seed: seed)
    let task = LocalTrainingTask(model: CycleModel(spec: Fixture.spec, weights: weights), training: training)
    let data: any Dataset = try dataset ?? Fixture.dataset()
    guard case .completed(let update) = try EngineLocalTrainer().train(task, on: data, resumingFrom: nil, progress: { _ in }) else {
        throw OrchardClientError(.training, "reference run was interrupted")
    }
    return Dictionary(uniqueKeysWithValues: update.diff.map { ($0.name, $0.values) })
}

/// Collects a job's events until its cycle finishes.
func collectEvents(_ job: FederatedJob) -> Task<[JobEvent], Never> {
    let stream = job.events()
    return Task {
        var events: [JobEvent] = []
        for await event in stream {
            events.append(event)
            if case .finished = event { break }
        }
        return events
    }
}

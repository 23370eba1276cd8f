import Foundation
import OrchardSupport
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import OrchardCoordinator
import OrchardCoordinatorTesting
import OrchardFormats
import OrchardProtocol
import OrchardTesting
import Synchronization
import Testing

/// An HTTP response as the tests see it.
struct HTTPResult {
    var status: Int
    var headers: [String: String]
    var body: [UInt8]

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try WireCoding.decoder().decode(T.self, from: Data(body))
    }

    var errorCode: String? { (try? decode(ErrorBody.self))?.error.code.rawValue }

    func header(_ name: String) -> String? {
        headers.first { $0.key.lowercased() == name.lowercased() }?.value
    }
}

/// The coordinator's OpenAPI document, parsed once: every exchange of ``HTTP`` is checked against it.
enum Conformance {
    static let document: OpenAPIConformance = {
        do {
            return try OpenAPIConformance(document: OpenAPI.document)
        } catch {
            preconditionFailure("openapi.json does not parse: \(error)")
        }
    }()
}

/// The exchanges an ``HTTP`` client made, in order.
final class ExchangeLog: Sendable {
    private let entries = Mutex<[HTTPExchange]>([])
    func append(_ exchange: HTTPExchange) { entries.withLock { $0.append(exchange) } }
    var exchanges: [HTTPExchange] { entries.withLock { $0 } }
}

/// A minimal loopback HTTP client over URLSession. Every exchange is checked against `openapi.json` (an issue is
/// recorded for each problem, see ``OpenAPIConformance``) and appended to `log` when one is given.
struct HTTP: Sendable {
    let base: URL
    let session: URLSession
    let log: ExchangeLog?
    /// Whether each request asks for its connection to be closed after the response (`Connection: close`): for a
    /// server with an idle timeout, which may close a pooled connection just as the next request goes out on it (the
    /// client then sees a reset, not an answer). Any timeout can be met: on a loaded machine a test can stall between
    /// two requests for longer than 30 s (a Python step, say).
    let closesConnections: Bool

    init(base: URL, log: ExchangeLog? = nil, closesConnections: Bool = false) {
        self.base = base
        self.log = log
        self.closesConnections = closesConnections
        let configuration = URLSessionConfiguration.ephemeral
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        // The server runs in this process: CPU-bound tests alongside can hold its answer back for longer than the default
        // 60 s without anything being wrong with it (each test's time limit still bounds the wait).
        configuration.timeoutIntervalForRequest = 600
        session = URLSession(configuration: configuration)
    }

    func send(_ method: String, _ path: String, body: [UInt8]? = nil, token: String? = nil, headers: [String: String] = [:]) async throws -> HTTPResult {
        var request = URLRequest(url: URL(string: base.absoluteString + path)!)
        request.httpMethod = method
        if let body { request.httpBody = Data(body) }
        var sent = headers
        if let token { sent["Authorization"] = "Bearer \(token)" }
        for (name, value) in sent { request.setValue(value, forHTTPHeaderField: name) }
        if closesConnections { request.setValue("close", forHTTPHeaderField: "Connection") }
        let (data, response) = try await session.data(for: request)
        let http = try #require(response as? HTTPURLResponse)
        var fields: [String: String] = [:]
        for (key, value) in http.allHeaderFields { fields["\(key)"] = "\(value)" }
        let result = HTTPResult(status: http.statusCode, headers: fields, body: [UInt8](data))
        let exchange = HTTPExchange(
            method: method, target: path, requestHeaders: sent, requestBody: body, status: result.status, responseHeaders: fields, responseBody: result.body)
        log?.append(exchange)
        for problem in Conformance.document.problems(with: exchange) {
            Issue.record("openapi.json: \(problem)")
        }
        return result
    }

    func json(_ method: String, _ path: String, _ value: some Encodable, token: String? = nil) async throws -> HTTPResult {
        try await send(method, path, body: Array(try WireCoding.encoder().encode(value)), token: token, headers: ["Content-Type": MediaType.json])
    }
}

/// A small model with a frozen layer, its initial weights, and helpers to build diffs.
enum Fixture {
    static let model = ModelSpec(
        name: "tiny", inputs: [InputSpec(name: "x", shape: [3])],
        layers: [
            LayerSpec(name: "embed", type: .dense, inputs: ["x"], frozen: true, units: 2, inputSize: 3, useBias: false),
            LayerSpec(name: "out", type: .dense, inputs: ["embed"], units: 2, inputSize: 2, useBias: true),
        ])

    static let weights = [
        TensorRecord(name: "embed.weight", shape: [2, 3], values: [1, 2, 3, 4, 5, 6]),
        TensorRecord(name: "out.weight", shape: [2, 2], values: [0.5, -0.5, 0.25, 1]),
        TensorRecord(name: "out.bias", shape: [2], values: [0, 0.1]),
    ]

    /// A diff that leaves the frozen layer alone and moves the rest by `scale`.
    static func diff(_ scale: Float) -> [TensorRecord] {
        weights.map { tensor in
            let frozen = tensor.name.hasPrefix("embed.")
            return TensorRecord(name: tensor.name, shape: tensor.shape, values: tensor.values.indices.map { frozen ? 0 : scale * Float($0 + 1) })
        }
    }

    static func host(
        name: String = "tiny", goal: Int = 3, minimum: Int = 1, overSelection: Double = 1.3, cycleLength: Double = 600, cycles: Int = 0,
        aggregator: AggregatorConfig = AggregatorConfig()
    ) -> HostProcessRequest {
        HostProcessRequest(
            name: name, version: SemanticVersion(1, 0), model: model, initialWeights: Safetensors.encode(weights),
            clientConfig: ClientConfig(batchSize: 4, learningRate: 0.05, localEpochs: 1, extra: ["note": .string("test")]),
            serverConfig: ServerConfig(
                cycleLength: cycleLength, cycles: cycles, goalCount: goal, overSelection: overSelection, minimumReports: minimum, paceSteeringWindow: 20,
                checkpointRetention: 2, aggregator: aggregator)
        )
    }

    /// `initial + Σ nᵢ dᵢ / Σ nᵢ` for the trainable tensors, computed in Double.
    static func expectedAfterFedAvg(_ reports: [(scale: Float, samples: Int)]) -> [String: [Float]] {
        let total = Double(reports.reduce(0) { $0 + $1.samples })
        var out: [String: [Float]] = [:]
        for tensor in weights {
            let frozen = tensor.name.hasPrefix("embed.")
            out[tensor.name] = tensor.values.indices.map { i in
                if frozen { return tensor.values[i] }
                let mean = reports.reduce(0.0) { $0 + Double($1.samples) * Double($1.scale) * Double(i + 1) } / total
                return Float(Double(tensor.values[i]) + mean)
            }
        }
        return out
    }
}

/// The shared loopback coordinator (a real SQLite file, real HTTP, a manual clock) with this target's HTTP helpers.
final class Harness: @unchecked Sendable {
    static let adminToken = "test-admin-token"
    let loopback: LoopbackCoordinator
    private(set) var http: HTTP
    /// Every exchange of ``http``, across restarts.
    let log = ExchangeLog()

    var directory: URL { loopback.directory }
    let clock: ManualClock
    var configuration: CoordinatorConfiguration { loopback.configuration }
    var instance: CoordinatorInstance { loopback.instance }
    var server: RunningServer { loopback.server }
    var databasePath: String { loopback.databasePath }
    var coordinator: Coordinator { instance.coordinator }

    private init(loopback: LoopbackCoordinator, clock: ManualClock) {
        self.loopback = loopback
        self.clock = clock
        http = HTTP(base: loopback.server.baseURL, log: log, closesConnections: loopback.configuration.connectionIdleTimeout != nil)
    }

    /// - Parameter idleTimeout: The server's idle timeout: none unless the test is about it (``LoopbackCoordinator``).
    static func start(
        configuration: CoordinatorConfiguration = CoordinatorConfiguration(adminToken: adminToken), seed: UInt64 = 1, idleTimeout: Duration? = nil
    ) async throws -> Harness {
        let clock = ManualClock()
        return Harness(
            loopback: try await LoopbackCoordinator.start(configuration: configuration, clock: clock, seed: seed, idleTimeout: idleTimeout), clock: clock)
    }

    /// Stops the server and opens a fresh coordinator on the same database (an orderly restart).
    func restart(seed: UInt64 = 99) async throws {
        try await loopback.restart(seed: seed, samePort: false)
        http = HTTP(base: server.baseURL, log: log, closesConnections: configuration.connectionIdleTimeout != nil)
    }

    func stop() async {
        await loopback.stop()
    }

    /// Runs `body`, then stops the harness (awaited) whether `body` returns or throws: the next test never meets this
    /// one's server still running.
    func stopping(_ body: () async throws -> Void) async throws {
        try await withCleanup(self, stop: { await $0.stop() }) { _ in try await body() }
    }

    func host(_ request: HostProcessRequest = Fixture.host()) async throws -> ProcessStatus {
        let result = try await http.json("POST", Endpoint.processes, request, token: Self.adminToken)
        #expect(result.status == 201, "\(String(decoding: result.body, as: UTF8.self))")
        return try result.decode(ProcessStatus.self)
    }

    func status(_ processID: String) async throws -> ProcessStatus {
        try await http.send("GET", Endpoint.process(processID), token: Self.adminToken).decode(ProcessStatus.self)
    }

    func device(name: String = "tiny", version: String = "1.0.0") async throws -> AuthenticateResponse {
        let request = AuthenticateRequest(processName: name, processVersion: SemanticVersion(version)!)
        let result = try await http.json("POST", Endpoint.authenticate, request)
        #expect(result.status == 200)
        return try result.decode(AuthenticateResponse.self)
    }

    func requestCycle(_ device: AuthenticateResponse, name: String = "tiny", version: String = "1.0") async throws -> CycleResponse {
        let request = CycleRequest(workerID: device.workerID, processName: name, processVersion: SemanticVersion(version)!)
        let result = try await http.json("POST", Endpoint.cycleRequest, request, token: device.sessionToken)
        #expect(result.status == 200, "\(String(decoding: result.body, as: UTF8.self))")
        return try result.decode(CycleResponse.self)
    }

    func join(_ device: AuthenticateResponse) async throws -> CycleAssignment {
        guard case .accepted(let assignment) = try await requestCycle(device) else {
            throw HarnessError(description: "device \(device.workerID) was rejected")
        }
        return assignment
    }

    func report(_ device: AuthenticateResponse, _ assignment: CycleAssignment, diff: [TensorRecord], samples: Int, checkpoint: Int? = nil) async throws
        -> HTTPResult
    {
        let body = ReportEnvelope.encode(
            diff: diff,
            metadata: ReportMetadata(
                workerID: device.workerID, requestKey: assignment.requestKey, sampleCount: samples, metrics: ["loss": 0.5], checkpoint: checkpoint))
        return try await http.send("POST", Endpoint.report, body: body, token: device.sessionToken, headers: ["Content-Type": MediaType.safetensors])
    }

    func checkpoint(_ processID: String, _ number: String = "latest") async throws -> [String: [Float]] {
        let result = try await http.send("GET", Endpoint.checkpoint(processID, number), token: Self.adminToken)
        #expect(result.status == 200)
        return try Safetensors.decode(result.body).byName.mapValues(\.values)
    }
}

struct HarnessError: Error, CustomStringConvertible {
    var description: String
}

func expectClose(_ actual: [String: [Float]], _ expected: [String: [Float]], tolerance: Float = 1e-5, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(Set(actual.keys) == Set(expected.keys), sourceLocation: sourceLocation)
    for (name, values) in expected {
        let got = actual[name] ?? []
        #expect(got.count == values.count, "\(name)", sourceLocation: sourceLocation)
        for (a, b) in zip(got, values) where abs(a - b) > tolerance {
            Issue.record("\(name): \(got) != \(values)", sourceLocation: sourceLocation)
            break
        }
    }
}

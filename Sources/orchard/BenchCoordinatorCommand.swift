import OrchardSupport
import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol

/// `orchard bench coordinator`: drives the real HTTP API on loopback and prints one JSON line.
struct BenchCoordinator: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coordinator",
        abstract: "Benchmark the coordinator over loopback HTTP: check-ins/s, report MB/s, latency, peak RSS.",
        discussion: """
            Starts a coordinator in this process on a free loopback port with a temporary SQLite file, hosts a
            dense model of --params parameters with goal count --devices, then: every device authenticates;
            --devices concurrent devices, each on its own keep-alive connection, send --checkins cycle requests in
            total at --rate per second (open loop; latency is measured from each request's scheduled time, so a
            server that falls behind shows it); then for --rounds cycles every device is admitted to the new cycle,
            one downloads the model, and every device reports a diff (report uploads timed, with
            --report-concurrency in flight). Peak RSS covers server and load generator together.
            """
    )

    @Option(help: "Concurrent devices.")
    var devices = 1000

    @Option(help: "Model parameters.")
    var params = 100_000

    @Option(help: "Cycle requests sent in the check-in phase, across all devices.")
    var checkins = 50_000

    @Option(help: "Check-ins per second offered in the check-in phase (open loop, spread over the devices); 0 sends as fast as possible.")
    var rate = 5000.0

    @Option(help: "Cycles in the report phase (every device reports once per cycle).")
    var rounds = 1

    @Option(help: "Report uploads in flight at once.")
    var reportConcurrency = 32

    @Option(help: "SQLite durability: normal or full.")
    var durability = "normal"

    func validate() throws {
        guard devices >= 1, params >= 10, checkins >= 0, rounds >= 0, reportConcurrency >= 1, rate >= 0 else {
            throw ValidationError("--devices, --report-concurrency ≥ 1, --params ≥ 10, --checkins and --rounds ≥ 0")
        }
        guard SQLiteStore.Durability(durability) != nil else { throw ValidationError("--durability must be normal or full") }
    }

    func run() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let adminToken = "bench-admin"
        let instance = try await CoordinatorInstance.open(
            database: directory.appendingPathComponent("bench.sqlite").path, durability: SQLiteStore.Durability(durability) ?? .normal,
            configuration: CoordinatorConfiguration(adminToken: adminToken, maximumReportBytes: params * 4 + (1 << 20))
        )
        let server = try await instance.serve(host: "127.0.0.1", port: 0, timerInterval: .milliseconds(250))
        let port = server.port

        var poolConfiguration = HTTPClient.Configuration.ConnectionPool()
        poolConfiguration.concurrentHTTP1ConnectionsPerHostSoftLimit = devices
        let client = HTTPClient(
            eventLoopGroupProvider: .singleton,
            configuration: HTTPClient.Configuration(timeout: .init(connect: .seconds(10), read: .seconds(120)), connectionPool: poolConfiguration)
        )
        let load = LoadGenerator(client: client, port: port, adminToken: adminToken)
        do {
            let result = try await measure(load)
            print(result)
        } catch {
            try? await client.shutdown()
            await server.stop()
            throw error
        }
        try await client.shutdown()
        await server.stop()
    }

    private func measure(_ load: LoadGenerator) async throws -> String {
        let devices = self.devices
        let params = self.params
        let reportConcurrency = self.reportConcurrency
        let inputSize = max(1, params / 10)
        let parameterCount = inputSize * 10
        let model = ModelSpec(name: "bench", inputs: [InputSpec(name: "x", shape: [inputSize])], layers: [
            LayerSpec(name: "dense", type: .dense, inputs: ["x"], units: 10, inputSize: inputSize, useBias: false),
        ])
        let weights = Safetensors.encode([TensorRecord(name: "dense.weight", shape: [10, inputSize], values: [Float](repeating: 0.01, count: parameterCount))])
        let server = ServerConfig(cycleLength: 3600, goalCount: devices, overSelection: 1, minimumReports: 1, paceSteeringWindow: 30)
        let host = HostProcessRequest(name: "bench", version: SemanticVersion(1), model: model, initialWeights: weights, serverConfig: server)
        _ = try await load.send("POST", Endpoint.processes, json: host, admin: true)

        // Authenticate every device (not timed).
        let sessions = try await withThrowingTaskGroup(of: AuthenticateResponse.self) { group in
            for _ in 0..<devices {
                group.addTask {
                    try await load.decode(AuthenticateResponse.self, load.send("POST", Endpoint.authenticate, json: AuthenticateRequest(processName: "bench", processVersion: SemanticVersion(1))))
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }

        // One keep-alive connection per device for the check-in phase, and fresh ones for every report round
        // (rounds are minutes apart in a real fleet; a connection does not live from one to the next).
        @Sendable func connectAll() async throws -> [BenchConnection] {
            try await withThrowingTaskGroup(of: (Int, BenchConnection).self) { group in
                for index in sessions.indices {
                    group.addTask { (index, try await BenchConnection.connect(host: "127.0.0.1", port: load.port, group: MultiThreadedEventLoopGroup.singleton)) }
                }
                var connections = [BenchConnection?](repeating: nil, count: sessions.count)
                for try await (index, connection) in group { connections[index] = connection }
                return connections.compactMap { $0 }
            }
        }
        @Sendable func closeAll(_ connections: [BenchConnection]) async {
            await withTaskGroup(of: Void.self) { group in
                for connection in connections { group.addTask { await connection.close() } }
            }
        }
        var connections = try await connectAll()
        let checkinRequests = try sessions.map { session in
            let body = try WireCoding.encoder().encode(CycleRequest(workerID: session.workerID, processName: "bench", processVersion: SemanticVersion(1)))
            return (head: load.head(.POST, Endpoint.cycleRequest, session: session.sessionToken, contentType: MediaType.json), body: ByteBuffer(bytes: body))
        }

        // Check-in phase: `devices` concurrent loops, `checkins` cycle requests in total.
        let perDevice = checkins / devices
        let remainder = checkins % devices
        let rate = self.rate
        // Open loop starts after a lead that lets the server finish setting up 1,000 fresh connections.
        let lead = rate > 0 ? TimeAmount.seconds(1) : .zero
        let scheduleStart = NIODeadline.now() + lead
        let checkinStart = ContinuousClock.now + .nanoseconds(lead.nanoseconds)
        let perDeviceLatencies = try await withThrowingTaskGroup(of: [Double].self) { group in
            for index in sessions.indices {
                let count = perDevice + (index < remainder ? 1 : 0)
                let connection = connections[index]
                let request = checkinRequests[index]
                // Open loop: device `index` sends its k-th request at (index + k × devices) / rate.
                let schedule = rate > 0
                    ? (0..<count).map { k in scheduleStart + .nanoseconds(Int64(Double(index + k * devices) / rate * 1e9)) }
                    : nil
                group.addTask {
                    try await connection.repeatedly(request.head, body: [request.body], count: count, schedule: schedule)
                }
            }
            return try await group.reduce(into: [[Double]]()) { $0.append($1) }
        }
        let checkinLatencies = perDeviceLatencies.flatMap { $0 }
        // A device's first cycle request of a cycle is its admission (a store write); the rest are answered from memory.
        let admissionLatencies = perDeviceLatencies.compactMap(\.first)
        let checkinSeconds = Self.seconds(ContinuousClock.now - checkinStart)

        // Report phase.
        var reportLatencies: [Double] = []
        var reportBytes = 0
        var reportSeconds = 0.0
        var reports = 0
        for _ in 0..<rounds {
            await closeAll(connections)
            connections = try await connectAll()
            let assignments = try await withThrowingTaskGroup(of: (Int, CycleAssignment).self) { group in
                for index in sessions.indices {
                    let connection = connections[index]
                    let request = checkinRequests[index]
                    let worker = sessions[index].workerID
                    group.addTask {
                        let response = try await connection.exchange(request.head, body: [request.body], keepBody: true)
                        let decoded = try load.decode(CycleResponse.self, response.body.map { Array($0.readableBytesView) } ?? [])
                        guard case .accepted(let assignment) = decoded else { throw ValidationError("device \(worker) was not admitted: \(decoded)") }
                        return (index, assignment)
                    }
                }
                var assignments = [CycleAssignment?](repeating: nil, count: sessions.count)
                for try await (index, assignment) in group { assignments[index] = assignment }
                return assignments.compactMap { $0 }
            }
            let first = assignments[0]
            let modelBytes = try await load.send("GET", Endpoint.model(first.modelID) + "?request_key=\(first.requestKey)", session: sessions[0].sessionToken)
            let modelArchive = try Safetensors.decode(modelBytes)
            // Seven distinct diffs, so the server really averages different updates; each report sends its own
            // header and one of these shared data sections (safetensors data follows the header, tensors in name
            // order), so the generator copies no diff per report.
            let shapes = modelArchive.tensors.map { TensorRecord(name: $0.name, shape: $0.shape, values: [Float](repeating: 0, count: $0.values.count)) }
            let variants = (0..<7).map { variant in
                let data = Safetensors.encode(modelArchive.tensors.map {
                    TensorRecord(name: $0.name, shape: $0.shape, values: [Float](repeating: Float(variant) * 1e-4, count: $0.values.count))
                })
                let headerLength = data[0..<8].enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
                return ByteBuffer(bytes: data[(8 + headerLength)...])
            }
            let start = ContinuousClock.now
            let (latencies, bytes) = try await withThrowingTaskGroup(of: (Double, Int).self) { group in
                var latencies: [Double] = []
                var bytes = 0
                var next = 0
                func submit(_ index: Int) {
                    let session = sessions[index]
                    let assignment = assignments[index]
                    let connection = connections[index]
                    let head = load.head(.POST, Endpoint.report, session: session.sessionToken, contentType: MediaType.safetensors)
                    group.addTask {
                        let header = ByteBuffer(bytes: ReportEnvelope.encodeHeader(diff: shapes, metadata: ReportMetadata(workerID: session.workerID, requestKey: assignment.requestKey, sampleCount: 1 + index % 50)))
                        let data = variants[index % 7]
                        let sent = ContinuousClock.now
                        let response = try await connection.exchange(head, body: [header, data])
                        guard response.status == 200 else { throw LoadGenerator.Failure(description: "report: HTTP \(response.status)") }
                        return (Self.milliseconds(ContinuousClock.now - sent), header.readableBytes + data.readableBytes)
                    }
                }
                while next < min(reportConcurrency, assignments.count) {
                    submit(next)
                    next += 1
                }
                while let (latency, size) = try await group.next() {
                    latencies.append(latency)
                    bytes += size
                    if next < assignments.count {
                        submit(next)
                        next += 1
                    }
                }
                return (latencies, bytes)
            }
            reportSeconds += Self.seconds(ContinuousClock.now - start)
            reportLatencies += latencies
            reportBytes += bytes
            reports += latencies.count
        }
        await closeAll(connections)
        let fields: [(String, String)] = [
            ("benchmark", "\"coordinator\""), ("devices", "\(devices)"), ("params", "\(parameterCount)"),
            ("checkins", "\(checkinLatencies.count)"), ("offered_rate", Self.format(rate)),
            ("checkins_per_second", Self.format(Double(checkinLatencies.count) / max(checkinSeconds, 1e-9))),
            ("checkin_p50_ms", Self.format(Self.percentile(checkinLatencies, 0.5))),
            ("checkin_p99_ms", Self.format(Self.percentile(checkinLatencies, 0.99))),
            ("admission_p99_ms", Self.format(Self.percentile(admissionLatencies, 0.99))),
            ("reports", "\(reports)"),
            ("report_mb_per_second", Self.format(Double(reportBytes) / 1e6 / max(reportSeconds, 1e-9))),
            ("report_p50_ms", Self.format(Self.percentile(reportLatencies, 0.5))),
            ("report_p99_ms", Self.format(Self.percentile(reportLatencies, 0.99))),
            ("peak_rss_mb", Self.format(Double(Self.peakRSSBytes()) / 1e6)),
        ]
        return "{" + fields.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
    }

    static func milliseconds(_ duration: Duration) -> Double { seconds(duration) * 1000 }

    static func seconds(_ duration: Duration) -> Double {
        let (s, atto) = duration.components
        return Double(s) + Double(atto) / 1e18
    }

    static func percentile(_ values: [Double], _ p: Double) -> Double {
        guard !values.isEmpty else { return 0 }
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int((Double(sorted.count) * p).rounded(.up)) - 1)]
    }

    static func format(_ value: Double) -> String { String(format: "%.2f", value) }

    /// The process's peak resident set size (VmHWM), in bytes.
    static func peakRSSBytes() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") })
        else { return 0 }
        let kilobytes = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
        return kilobytes * 1024
    }
}

/// Sends requests to the coordinator under test and checks their status.
struct LoadGenerator: Sendable {
    let client: HTTPClient
    let port: Int
    let adminToken: String

    var base: String { "http://127.0.0.1:\(port)" }

    /// A request head for a ``BenchConnection``.
    func head(_ method: HTTPMethod, _ path: String, session: String, contentType: String) -> HTTPRequestHead {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: path)
        head.headers.add(name: "Host", value: "127.0.0.1:\(port)")
        head.headers.add(name: "Authorization", value: "Bearer \(session)")
        head.headers.add(name: "Content-Type", value: contentType)
        return head
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    func send(_ method: String, _ path: String, json: some Encodable, session: String? = nil, admin: Bool = false) async throws -> [UInt8] {
        try await send(method, path, body: Array(try WireCoding.encoder().encode(json)), contentType: MediaType.json, session: session, admin: admin)
    }

    func send(_ method: String, _ path: String, body: [UInt8]? = nil, contentType: String = MediaType.safetensors, session: String? = nil, admin: Bool = false) async throws -> [UInt8] {
        var request = HTTPClientRequest(url: base + path)
        request.method = HTTPMethod(rawValue: method)
        if let body {
            request.headers.add(name: "Content-Type", value: contentType)
            request.body = .bytes(body)
        }
        if let session { request.headers.add(name: "Authorization", value: "Bearer \(session)") }
        if admin { request.headers.add(name: "Authorization", value: "Bearer \(adminToken)") }
        let response = try await client.execute(request, timeout: .seconds(120))
        let buffer = try await response.body.collect(upTo: 1 << 30)
        let bytes = Array(buffer.readableBytesView)
        guard (200..<300).contains(Int(response.status.code)) else {
            throw Failure(description: "\(method) \(path): \(response.status.code) \(String(decoding: bytes, as: UTF8.self))")
        }
        return bytes
    }

    func decode<T: Decodable>(_ type: T.Type, _ bytes: [UInt8]) throws -> T {
        try WireCoding.decoder().decode(T.self, from: Data(bytes))
    }
}

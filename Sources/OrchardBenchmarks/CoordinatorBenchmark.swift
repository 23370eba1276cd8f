import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
public import OrchardCoordinator
public import OrchardCoordinatorPostgres
import OrchardSupport
import OrchardFormats
import OrchardProtocol

/// The coordinator benchmark: a coordinator in this process on a free loopback port with a temporary SQLite file (or
/// ``Configuration/instances`` coordinators on their own ports over a temporary PostgreSQL database), driven over its
/// real HTTP API; device `i` talks to instance `i mod instances` throughout.
///
/// It hosts a dense model of ``Configuration/parameters`` parameters with goal count ``Configuration/devices``,
/// then: every device authenticates; the devices, each on its own keep-alive connection, send
/// ``Configuration/checkins`` cycle requests in total at ``Configuration/rate`` per second (open loop: latency
/// counts from each request's scheduled time, so a server that falls behind shows it); then for
/// ``Configuration/rounds`` cycles every device is admitted to the new cycle on a fresh connection, one downloads
/// the model, and every device reports a diff (uploads timed, ``Configuration/reportConcurrency`` in flight).
/// The timed requests are prepared bytes written on raw NIO connections (``BenchConnection``), so as much of the
/// machine as possible is left to the server. Peak RSS covers the server and the load generator together.
public enum CoordinatorBenchmark {
    /// What the check-in phase requests.
    public enum CheckinTarget: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
        /// `POST /v1/device/cycle-request` with the device's session: the real check-in.
        case cycleRequest = "cycle-request"
        /// `GET /health`: a route that does nothing, through the coordinator's HTTP server and the same load generator.
        case health
        /// The same cycle requests (headers and body) sent to a bare Hummingbird 2 application started beside the
        /// coordinator, which reads each body and echoes it (``HummingbirdFloor``): the floor the HTTP library and the
        /// in-process load generator set for this request on this machine.
        case hummingbird

        public var description: String { rawValue }
    }

    /// What to run.
    public struct Configuration: Sendable, Hashable {
        /// Concurrent devices, each with its own connection; also the cycle's goal count.
        public var devices: Int
        /// Model parameters (rounded down to a multiple of 10: the model is one dense layer with 10 outputs).
        public var parameters: Int
        /// Cycle requests sent in the check-in phase, across all devices.
        public var checkins: Int
        /// Check-ins per second offered in the check-in phase (open loop, spread over the devices); 0 sends each
        /// device's next request as soon as its previous answer arrived.
        public var rate: Double
        /// Cycles in the report phase; every device reports once per cycle.
        public var rounds: Int
        /// Report uploads in flight at once.
        public var reportConcurrency: Int
        /// The coordinator's SQLite durability.
        public var durability: SQLiteStore.Durability
        /// What the check-in phase requests.
        public var checkinTarget: CheckinTarget
        /// The PostgreSQL server to benchmark on (a temporary database is created on it and dropped afterwards), or nil
        /// for a temporary SQLite file.
        public var database: PostgresStoreConfiguration?
        /// Coordinator instances sharing the PostgreSQL database, each on its own loopback port.
        public var instances: Int

        /// Creates a configuration; the defaults are the README's measured setup.
        public init(
            devices: Int = 1000, parameters: Int = 100_000, checkins: Int = 50_000, rate: Double = 5000, rounds: Int = 1,
            reportConcurrency: Int = 32, durability: SQLiteStore.Durability = .normal, checkinTarget: CheckinTarget = .cycleRequest,
            database: PostgresStoreConfiguration? = nil, instances: Int = 1
        ) {
            self.database = database
            self.instances = instances
            self.devices = devices
            self.parameters = parameters
            self.checkins = checkins
            self.rate = rate
            self.rounds = rounds
            self.reportConcurrency = reportConcurrency
            self.durability = durability
            self.checkinTarget = checkinTarget
        }

        /// Throws ``BenchmarkError/Code/invalidConfiguration`` naming the first field out of range.
        public func validate() throws(BenchmarkError) {
            if devices < 1 { throw BenchmarkError.invalid("devices", "at least 1", not: devices) }
            if parameters < 10 { throw BenchmarkError.invalid("parameters", "at least 10", not: parameters) }
            if checkins < 0 { throw BenchmarkError.invalid("checkins", "at least 0", not: checkins) }
            if !(rate >= 0) || !rate.isFinite { throw BenchmarkError.invalid("rate", "a finite number of check-ins per second ≥ 0", not: rate) }
            if rounds < 0 { throw BenchmarkError.invalid("rounds", "at least 0", not: rounds) }
            if reportConcurrency < 1 { throw BenchmarkError.invalid("reportConcurrency", "at least 1", not: reportConcurrency) }
            if instances < 1 { throw BenchmarkError.invalid("instances", "at least 1", not: instances) }
            if instances > 1 && database == nil {
                throw BenchmarkError(
                    .invalidConfiguration, "instances must be 1 without a PostgreSQL database: SQLite serves one coordinator, not \(instances)")
            }
            if let problem = database?.problem { throw BenchmarkError(.invalidConfiguration, "database: \(problem)") }
        }

        /// The model's parameter count: ``parameters`` rounded down to a multiple of 10.
        public var modelParameters: Int { parameters / 10 * 10 }
    }

    /// What a run measured. Latencies are in milliseconds.
    public struct Result: Sendable, Hashable, Encodable {
        /// Concurrent devices.
        public var devices: Int
        /// The hosted model's parameters.
        public var parameters: Int
        /// Cycle requests answered in the check-in phase.
        public var checkins: Int
        /// What the check-in phase requested.
        public var checkinTarget: CheckinTarget = .cycleRequest
        /// The offered check-in rate per second (0: closed loop).
        public var offeredRate: Double
        /// Check-ins answered per second over the check-in phase.
        public var checkinsPerSecond: Double
        /// Median check-in latency (0 without check-ins).
        public var checkinP50Milliseconds: Double
        /// 99th-percentile check-in latency (0 without check-ins).
        public var checkinP99Milliseconds: Double
        /// 99th-percentile latency of each device's first cycle request, the admission that writes its assignment.
        public var admissionP99Milliseconds: Double
        /// 99th-percentile check-in latency over the second half of each device's requests: the steady state, after
        /// the admissions' burst of store writes and the backlog it leaves have passed.
        public var steadyCheckinP99Milliseconds: Double = 0
        /// Reports the coordinator accepted (devices × rounds).
        public var reports: Int
        /// Report bytes uploaded (headers and diffs).
        public var reportBytes: Int
        /// Report upload throughput in MB (10⁶ bytes) per second over the report phases.
        public var reportMegabytesPerSecond: Double
        /// Median report upload latency (0 without reports).
        public var reportP50Milliseconds: Double
        /// 99th-percentile report upload latency (0 without reports).
        public var reportP99Milliseconds: Double
        /// The process's peak resident set size in MiB at the end of the run (server and load generator), nil when
        /// unreadable.
        public var peakRSSMiB: Double?
        /// The store: `sqlite` or `postgres`.
        public var store = "sqlite"
        /// Coordinator instances the devices were spread over.
        public var instances = 1

        private enum CodingKeys: String, CodingKey {
            case benchmark, store, instances, devices, parameters = "params", checkins, checkinTarget = "checkin_target", offeredRate = "offered_rate"
            case checkinsPerSecond = "checkins_per_second", checkinP50Milliseconds = "checkin_p50_ms"
            case checkinP99Milliseconds = "checkin_p99_ms", admissionP99Milliseconds = "admission_p99_ms", reports
            case steadyCheckinP99Milliseconds = "checkin_steady_p99_ms"
            case reportBytes = "report_bytes", reportMegabytesPerSecond = "report_mb_per_second"
            case reportP50Milliseconds = "report_p50_ms", reportP99Milliseconds = "report_p99_ms", peakRSSMiB = "peak_rss_mib"
        }

        /// The JSON-line form: `"benchmark":"coordinator"` and every figure, rates and latencies to 0.01, peak RSS
        /// to 0.1 MiB.
        public func encode(to encoder: any Encoder) throws {
            func hundredths(_ value: Double) -> Double { (value * 100).rounded() / 100 }
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode("coordinator", forKey: .benchmark)
            try container.encode(store, forKey: .store)
            try container.encode(instances, forKey: .instances)
            try container.encode(devices, forKey: .devices)
            try container.encode(parameters, forKey: .parameters)
            try container.encode(checkins, forKey: .checkins)
            try container.encode(checkinTarget.rawValue, forKey: .checkinTarget)
            try container.encode(hundredths(offeredRate), forKey: .offeredRate)
            try container.encode(hundredths(checkinsPerSecond), forKey: .checkinsPerSecond)
            try container.encode(hundredths(checkinP50Milliseconds), forKey: .checkinP50Milliseconds)
            try container.encode(hundredths(checkinP99Milliseconds), forKey: .checkinP99Milliseconds)
            try container.encode(hundredths(admissionP99Milliseconds), forKey: .admissionP99Milliseconds)
            try container.encode(hundredths(steadyCheckinP99Milliseconds), forKey: .steadyCheckinP99Milliseconds)
            try container.encode(reports, forKey: .reports)
            try container.encode(reportBytes, forKey: .reportBytes)
            try container.encode(hundredths(reportMegabytesPerSecond), forKey: .reportMegabytesPerSecond)
            try container.encode(hundredths(reportP50Milliseconds), forKey: .reportP50Milliseconds)
            try container.encode(hundredths(reportP99Milliseconds), forKey: .reportP99Milliseconds)
            try container.encodeIfPresent(peakRSSMiB.map { ($0 * 10).rounded() / 10 }, forKey: .peakRSSMiB)
        }
    }

    /// Connections opened (and confirmed) at once when the devices connect.
    static let connectWindow = 256

    /// The phases ``run(_:progress:)`` reports: the devices connected, the check-in phase, each report round.
    public static func phases(_ configuration: Configuration) -> Int { 2 + configuration.rounds }

    /// Runs the benchmark: validates `configuration`, starts the coordinators, drives them, stops them.
    /// - Parameter progress: Called after each of ``phases(_:)`` phases with the phases done and what finished.
    public static func run(
        _ configuration: Configuration, progress: @escaping @Sendable (_ done: Int, _ detail: String) -> Void = { _, _ in }
    ) async throws -> Result {
        try configuration.validate()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let adminToken = "bench-admin"
        // Every simulated device authenticates from loopback in open mode: the abuse limits would measure themselves.
        func settings(_ index: Int) -> CoordinatorConfiguration {
            CoordinatorConfiguration(
                adminToken: adminToken, maximumReportBytes: configuration.parameters * 4 + (1 << 20), openAuthenticationRate: nil, maximumOpenWorkers: nil,
                maximumUploadsInFlight: max(CoordinatorConfiguration().maximumUploadsInFlight, configuration.reportConcurrency), instanceID: "bench-\(index)"
            )
        }
        var instances: [CoordinatorInstance] = []
        var benchDatabase: (name: String, admin: PostgresStoreConfiguration)?
        var servers: [RunningServer] = []
        var client: HTTPClient?
        var floor: HummingbirdFloor?
        func tearDown() async {
            try? await client?.shutdown()
            await floor?.stop()
            for server in servers { await server.stop() }
            for instance in instances { await instance.shutdown() }
            if let benchDatabase { try? await PostgresAdministration.dropDatabase(benchDatabase.name, using: benchDatabase.admin) }
        }
        do {
            if let admin = configuration.database {
                var random = SystemRandomNumberGenerator()
                let name = "orchard_bench_" + String(random.next() & 0xFFFF_FFFF, radix: 16)
                try await PostgresAdministration.createDatabase(name, using: admin)
                benchDatabase = (name, admin)
                for index in 0..<configuration.instances {
                    let store = try await PostgresStore.open(configuration: admin.database(name))
                    instances.append(try await CoordinatorInstance.open(store: store, configuration: settings(index), release: { await store.shutdown() }))
                }
            } else {
                instances.append(
                    try await CoordinatorInstance.open(
                        database: directory.appendingPathComponent("bench.sqlite").path, durability: configuration.durability, configuration: settings(0)
                    ))
            }
            for instance in instances { servers.append(try await instance.serve(host: "127.0.0.1", port: 0, timerInterval: .milliseconds(250))) }
            var pool = HTTPClient.Configuration.ConnectionPool()
            // The untimed requests (hosting, authenticating every device) share at most `connectWindow` connections,
            // for the reason `connectAll` opens the timed ones in a window.
            pool.concurrentHTTP1ConnectionsPerHostSoftLimit = min(configuration.devices, Self.connectWindow)
            let http = HTTPClient(
                eventLoopGroupProvider: .singleton,
                configuration: HTTPClient.Configuration(timeout: .init(connect: .seconds(10), read: .seconds(120)), connectionPool: pool)
            )
            client = http
            if configuration.checkinTarget == .hummingbird { floor = try await HummingbirdFloor.start() }
            var result = try await measure(
                configuration, servers.map { LoadGenerator(client: http, port: $0.port, adminToken: adminToken) }, floorPort: floor?.port,
                progress: progress
            )
            result.store = configuration.database == nil ? "sqlite" : "postgres"
            result.instances = configuration.instances
            await tearDown()
            return result
        } catch {
            await tearDown()
            throw error
        }
    }

    /// Drives the coordinators: `loads[i % loads.count]` serves device `i`; the first also hosts the process.
    private static func measure(
        _ configuration: Configuration, _ loads: [LoadGenerator], floorPort: Int?, progress: @Sendable (_ done: Int, _ detail: String) -> Void
    ) async throws -> Result {
        let load = loads[0]
        let devices = configuration.devices
        let inputSize = configuration.parameters / 10
        let parameterCount = configuration.modelParameters
        let model = ModelSpec(
            name: "bench", inputs: [InputSpec(name: "x", shape: [inputSize])],
            layers: [
                LayerSpec(name: "dense", type: .dense, inputs: ["x"], units: 10, inputSize: inputSize, useBias: false)
            ])
        let weights = Safetensors.encode([TensorRecord(name: "dense.weight", shape: [10, inputSize], values: [Float](repeating: 0.01, count: parameterCount))])
        let serverConfig = ServerConfig(cycleLength: 3600, goalCount: devices, overSelection: 1, minimumReports: 1, paceSteeringWindow: 30)
        let host = HostProcessRequest(name: "bench", version: SemanticVersion(1), model: model, initialWeights: weights, serverConfig: serverConfig)
        _ = try await load.send(.POST, Endpoint.processes, json: host, admin: true)

        // Authenticate every device (not timed).
        let sessions = try await withThrowingTaskGroup(of: (Int, AuthenticateResponse).self) { group in
            for index in 0..<devices {
                let load = loads[index % loads.count]
                group.addTask {
                    let request = AuthenticateRequest(processName: "bench", processVersion: SemanticVersion(1))
                    return (index, try await load.decode(AuthenticateResponse.self, load.send(.POST, Endpoint.authenticate, json: request)))
                }
            }
            var sessions = [AuthenticateResponse?](repeating: nil, count: devices)
            for try await (index, session) in group { sessions[index] = session }
            return sessions.compactMap { $0 }
        }

        // One keep-alive connection per device for the check-in phase, and fresh ones for every report round
        // (rounds are minutes apart in a real fleet; a connection does not live from one to the next). At most
        // `connectWindow` are opened at once, each confirmed by an exchange: a storm of thousands of connects fills
        // the kernel's accept queue (`somaxconn`, 4,096 here), and a connection whose handshake the server dropped
        // looks open to the client but stalls its first request for seconds of TCP retransmission (5,000 devices
        // at once: check-in phases of 26–27 s instead of 0.6 s).
        // `port`, when given, replaces every coordinator's: the connections of the bare Hummingbird reference.
        @Sendable func connectAll(port: Int? = nil) async throws -> [BenchConnection] {
            try await withThrowingTaskGroup(of: (Int, BenchConnection).self) { group in
                var connections = [BenchConnection?](repeating: nil, count: sessions.count)
                for index in sessions.indices {
                    if index >= Self.connectWindow, let (done, connection) = try await group.next() { connections[done] = connection }
                    let load = loads[index % loads.count]
                    group.addTask {
                        let connection = try await BenchConnection.connect(
                            host: "127.0.0.1", port: port ?? load.port, group: MultiThreadedEventLoopGroup.singleton
                        )
                        let answer = try await connection.exchange(load.head(.GET, Endpoint.health))
                        guard answer.status == 200 else { throw BenchmarkError.status(answer.status, to: "GET \(Endpoint.health)") }
                        return (index, connection)
                    }
                }
                for try await (index, connection) in group { connections[index] = connection }
                return connections.compactMap { $0 }
            }
        }
        @Sendable func closeAll(_ connections: [BenchConnection]) async {
            await withTaskGroup(of: Void.self) { group in
                for connection in connections { group.addTask { await connection.close() } }
            }
        }
        var connections = try await connectAll(port: floorPort)
        progress(1, "\(devices) devices authenticated and connected")
        let checkinRequests = try sessions.enumerated().map { index, session in
            let body = try WireCoding.encoder().encode(CycleRequest(workerID: session.workerID, processName: "bench", processVersion: SemanticVersion(1)))
            let load = loads[index % loads.count]
            return (head: load.head(.POST, Endpoint.cycleRequest, session: session.sessionToken, contentType: MediaType.json), body: ByteBuffer(bytes: body))
        }
        let timedRequests: [(head: HTTPRequestHead, body: ByteBuffer)] =
            switch configuration.checkinTarget {
            case .cycleRequest: checkinRequests
            case .health: sessions.indices.map { index in (head: loads[index % loads.count].head(.GET, Endpoint.health), body: ByteBuffer()) }
            case .hummingbird: checkinRequests
            }

        // Check-in phase: `devices` concurrent loops, `checkins` cycle requests in total.
        let perDevice = configuration.checkins / devices
        let remainder = configuration.checkins % devices
        let rate = configuration.rate
        // Open loop starts after a lead that lets the server finish setting up 1,000 fresh connections.
        let lead = rate > 0 ? TimeAmount.seconds(1) : .zero
        let scheduleStart = NIODeadline.now() + lead
        let checkinStart = ContinuousClock.now + .nanoseconds(lead.nanoseconds)
        let perDeviceLatencies = try await withThrowingTaskGroup(of: [Double].self) { group in
            for index in sessions.indices {
                let count = perDevice + (index < remainder ? 1 : 0)
                let connection = connections[index]
                let request = timedRequests[index]
                // Open loop: device `index` sends its k-th request at (index + k × devices) / rate.
                let schedule =
                    rate > 0
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
        let steadyLatencies = perDeviceLatencies.flatMap { $0.dropFirst($0.count / 2) }
        let checkinSeconds = (ContinuousClock.now - checkinStart).inSeconds
        progress(2, "\(configuration.checkins) check-ins in \(String(format: "%.1f", checkinSeconds)) s")

        // Report phase.
        var reportLatencies: [Double] = []
        var reportBytes = 0
        var reportSeconds = 0.0
        for round in 0..<configuration.rounds {
            await closeAll(connections)
            connections = try await connectAll()
            let assignments = try await withThrowingTaskGroup(of: (Int, CycleAssignment).self) { group in
                for index in sessions.indices {
                    let connection = connections[index]
                    let request = checkinRequests[index]
                    let worker = sessions[index].workerID
                    group.addTask {
                        var decoded: CycleResponse
                        var attempts = 0
                        repeat {
                            let response = try await connection.exchange(request.head, body: [request.body], keepBody: true)
                            decoded = try load.decode(CycleResponse.self, response.body.map { Array($0.readableBytesView) } ?? [])
                            // With several instances the previous cycle may still be closing at another one: ask again
                            // shortly, as a device would after its retry_after.
                            guard case .rejected(let rejection) = decoded, rejection.reason == "cycle_closing", attempts < 100 else { break }
                            attempts += 1
                            try await Task.sleep(for: .milliseconds(50))
                        } while true
                        guard case .accepted(let assignment) = decoded else {
                            let name = "POST \(Endpoint.cycleRequest)"
                            throw BenchmarkError(.unexpectedResponse, "device \(worker) was not admitted: \(decoded)", context: ["request": name])
                        }
                        return (index, assignment)
                    }
                }
                var assignments = [CycleAssignment?](repeating: nil, count: sessions.count)
                for try await (index, assignment) in group { assignments[index] = assignment }
                return assignments.compactMap { $0 }
            }
            let first = assignments[0]
            let modelBytes = try await load.send(
                .GET, Endpoint.model(first.modelID) + "?\(Endpoint.requestKeyQuery)=\(first.requestKey)", session: sessions[0].sessionToken
            )
            let modelArchive = try Safetensors.decode(modelBytes)
            // Seven distinct diffs, so the server really averages different updates; each report sends its own
            // header and one of these shared data sections (safetensors data follows the header, tensors in name
            // order), so the generator copies no diff per report.
            let shapes = modelArchive.tensors.map { TensorRecord(name: $0.name, shape: $0.shape, values: [Float](repeating: 0, count: $0.values.count)) }
            let variants = (0..<7).map { variant in
                let data = Safetensors.encode(
                    modelArchive.tensors.map {
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
                    let head = loads[index % loads.count].head(.POST, Endpoint.report, session: session.sessionToken, contentType: MediaType.safetensors)
                    group.addTask {
                        let metadata = ReportMetadata(workerID: session.workerID, requestKey: assignment.requestKey, sampleCount: 1 + index % 50)
                        let header = ByteBuffer(bytes: ReportEnvelope.encodeHeader(diff: shapes, metadata: metadata))
                        let data = variants[index % 7]
                        let sent = ContinuousClock.now
                        let response = try await connection.exchange(head, body: [header, data])
                        guard response.status == 200 else { throw BenchmarkError.status(response.status, to: "POST \(Endpoint.report)") }
                        return ((ContinuousClock.now - sent).inSeconds * 1000, header.readableBytes + data.readableBytes)
                    }
                }
                while next < min(configuration.reportConcurrency, assignments.count) {
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
            reportSeconds += (ContinuousClock.now - start).inSeconds
            reportLatencies += latencies
            reportBytes += bytes
            progress(2 + round + 1, "report round \(round + 1) of \(configuration.rounds)")
        }
        await closeAll(connections)
        var result = Result(
            devices: devices, parameters: parameterCount, checkins: checkinLatencies.count, checkinTarget: configuration.checkinTarget, offeredRate: rate,
            checkinsPerSecond: checkinLatencies.isEmpty ? 0 : Double(checkinLatencies.count) / max(checkinSeconds, 1e-9),
            checkinP50Milliseconds: Percentile.nearestRank(0.5, of: checkinLatencies) ?? 0,
            checkinP99Milliseconds: Percentile.nearestRank(0.99, of: checkinLatencies) ?? 0,
            admissionP99Milliseconds: Percentile.nearestRank(0.99, of: admissionLatencies) ?? 0,
            reports: reportLatencies.count, reportBytes: reportBytes,
            reportMegabytesPerSecond: reportBytes == 0 ? 0 : Double(reportBytes) / 1e6 / max(reportSeconds, 1e-9),
            reportP50Milliseconds: Percentile.nearestRank(0.5, of: reportLatencies) ?? 0,
            reportP99Milliseconds: Percentile.nearestRank(0.99, of: reportLatencies) ?? 0,
            peakRSSMiB: PeakMemory.residentMiB()
        )
        result.steadyCheckinP99Milliseconds = Percentile.nearestRank(0.99, of: steadyLatencies) ?? 0
        return result
    }
}

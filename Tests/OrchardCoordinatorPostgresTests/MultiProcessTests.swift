import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif
import OrchardBenchmarks
import OrchardCoordinatorPostgres
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardTesting
import Testing

/// Three `orchard serve` processes over one PostgreSQL database, on loopback HTTP: a device checks in at one and
/// reports at another, one instance is killed with SIGKILL mid-cycle and never restarted, and the published
/// checkpoint is still the sample-weighted average of every acknowledged report.
@Suite(.serialized, TestDatabase.requirement) struct MultiProcessTests {
    /// `orchard serve` as a child process over PostgreSQL (URL and password from the environment, never argv).
    final class Server: Sendable {
        let child: OrchardExecutable.Server
        var port: Int { child.port }

        private init(_ child: OrchardExecutable.Server) {
            self.child = child
        }

        static func start(database: PostgresStoreConfiguration, instanceID: String) async throws -> Server {
            var url = URLComponents()
            url.scheme = "postgres"
            url.user = database.user
            url.host = database.host
            url.port = database.port
            url.path = "/" + database.database
            url.queryItems = [URLQueryItem(name: "sslmode", value: database.tlsMode.rawValue)]
            var environment: [String: String] = [:]
            environment["ORCHARD_ADMIN_TOKEN"] = "admin"
            environment["ORCHARD_DATABASE_URL"] = url.string
            environment["ORCHARD_DATABASE_PASSWORD"] = database.password
            return Server(
                try await OrchardExecutable.Server.start(
                    ["--instance-id", instanceID, "--fold-interval", "2", "--log-level", "warning"], environment: environment))
        }

        func kill9() async { await child.kill9() }
        func terminate() { child.terminate() }

        func send(_ method: String, _ path: String, body: [UInt8]? = nil, token: String? = nil, contentType: String = MediaType.json) async throws -> (
            status: Int, body: [UInt8]
        ) {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
            request.httpMethod = method
            if let body {
                request.httpBody = Data(body)
                request.setValue(contentType, forHTTPHeaderField: "Content-Type")
            }
            if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
            let (data, response) = try await URLSession.shared.data(for: request)
            return ((response as? HTTPURLResponse)?.statusCode ?? 0, [UInt8](data))
        }

        func json<T: Decodable>(_ type: T.Type, _ method: String, _ path: String, _ value: some Encodable, token: String? = nil) async throws -> T {
            let (status, body) = try await send(method, path, body: Array(try WireCoding.encoder().encode(value)), token: token)
            guard (200..<300).contains(status) else { throw Failure("\(method) \(path): HTTP \(status) \(String(decoding: body, as: UTF8.self))") }
            return try WireCoding.decoder().decode(T.self, from: Data(body))
        }
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    struct Device {
        var auth: AuthenticateResponse
        var assignment: CycleAssignment?
    }

    static func withServers(_ count: Int, _ body: ([Server]) async throws -> Void) async throws {
        try await TestDatabase.withDatabase { database in
            // The first instance creates the schema; the others start once it exists (migrations are also safe concurrently).
            var servers: [Server] = []
            defer { for server in servers { server.terminate() } }
            for index in 0..<count { servers.append(try await Server.start(database: database, instanceID: "process-\(index)")) }
            try await body(servers)
        }
    }

    static func join(_ server: Server, name: String) async throws -> Device {
        let auth = try await server.json(
            AuthenticateResponse.self, "POST", Endpoint.authenticate, AuthenticateRequest(processName: name, processVersion: SemanticVersion(1, 0)))
        let response = try await server.json(
            CycleResponse.self, "POST", Endpoint.cycleRequest, CycleRequest(workerID: auth.workerID, processName: name, processVersion: SemanticVersion(1, 0)),
            token: auth.sessionToken
        )
        guard case .accepted(let assignment) = response else { return Device(auth: auth) }
        return Device(auth: auth, assignment: assignment)
    }

    static func report(_ device: Device, scale: Float, samples: Int, to server: Server) async throws -> (status: Int, body: [UInt8]) {
        let assignment = try #require(device.assignment)
        let body = ReportEnvelope.encode(
            diff: MultiInstanceTests.diff(scale),
            metadata: ReportMetadata(workerID: device.auth.workerID, requestKey: assignment.requestKey, sampleCount: samples, metrics: ["loss": 0.25])
        )
        return try await server.send("POST", Endpoint.report, body: body, token: device.auth.sessionToken, contentType: MediaType.safetensors)
    }

    @Test func aKilledInstanceLosesNothingItAcknowledgedAndNothingCountsTwice() async throws {
        try await Self.withServers(3) { servers in
            let hosted = try await servers[0].json(ProcessStatus.self, "POST", Endpoint.processes, MultiInstanceTests.host(goal: 8), token: "admin")
            // Nine devices check in round-robin; device i reports at instance (i + 1) % 3.
            var devices: [Device] = []
            for i in 0..<9 { devices.append(try await Self.join(servers[i % 3], name: "multi")) }
            #expect(devices.allSatisfy { $0.assignment != nil })
            let scales: [Float] = [0.5, -1, 2, 0.25, 1.5, -0.75, 3, -2, 1]
            let samples = [3, 7, 2, 5, 11, 4, 6, 9, 8]
            var acknowledged: [(scale: Float, samples: Int)] = []
            // Instance 2 acknowledges three reports (fold interval 2: one partial sum written, one diff pending) …
            for i in [1, 4, 7] {
                let response = try await Self.report(devices[i], scale: scales[i], samples: samples[i], to: servers[2])
                #expect(response.status == 200, "\(String(decoding: response.body, as: UTF8.self))")
                acknowledged.append((scales[i], samples[i]))
            }
            // … and is killed, never to return.
            await servers[2].kill9()
            var closed = 0
            for i in [0, 3, 6, 2, 5] {
                let response = try await Self.report(devices[i], scale: scales[i], samples: samples[i], to: servers[(i + 1) % 3 == 2 ? 0 : (i + 1) % 3])
                #expect(response.status == 200, "\(String(decoding: response.body, as: UTF8.self))")
                acknowledged.append((scales[i], samples[i]))
                if try WireCoding.decoder().decode(ReportResponse.self, from: Data(response.body)).cycleClosed { closed += 1 }
            }
            // The eighth report closes the cycle: the instance that took it, or another whose timer saw the goal first
            // (then no report's answer says so). Wait for the close to be published, whoever does it.
            #expect(closed <= 1, "a cycle closes once")
            var published = false
            for _ in 0..<200 where !published {
                let (_, body) = try await servers[0].send("GET", Endpoint.process(hosted.processID), token: "admin")
                published = (try? WireCoding.decoder().decode(ProcessStatus.self, from: Data(body)))?.latestCheckpoint == 1
                if !published { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(published, "checkpoint 1 is published")
            // A second report of an acknowledged key, and a report into the closed cycle, are refused.
            #expect(try await Self.report(devices[0], scale: 9, samples: 1, to: servers[1]).status == 409)
            // Device 8's key was issued by the killed instance: the closed cycle's assignments are gone from the store, so an
            // instance that never saw the key calls it unknown (403), one that did calls it late (409); never accepted.
            #expect([403, 409].contains(try await Self.report(devices[8], scale: 9, samples: 1, to: servers[0]).status))
            for server in servers.prefix(2) {
                let (status, bytes) = try await server.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: "admin")
                #expect(status == 200)
                let published = try Safetensors.decode(bytes).byName.mapValues(\.values)
                MultiInstanceTests.expectClose(published, MultiInstanceTests.fedAvg(acknowledged))
                let (_, statusBody) = try await server.send("GET", Endpoint.process(hosted.processID), token: "admin")
                let status2 = try WireCoding.decoder().decode(ProcessStatus.self, from: Data(statusBody))
                #expect(status2.latestCheckpoint == 1 && status2.cyclesCompleted == 1 && status2.currentCycle?.number == 2)
            }
        }
    }

    @Test func secureAggregationGoesOnAcrossTheOthersWhenAnInstanceIsKilledBetweenStages() async throws {
        try await Self.withServers(3) { servers in
            let hosted = try await servers[0].json(
                ProcessStatus.self, "POST", Endpoint.processes, SecureMultiInstanceTests.host(goal: 6, minimum: 4), token: "admin")
            let version = SemanticVersion(1, 0)
            var devices: [SecureDeviceDriver] = []
            for i in 0..<6 {
                // Authenticated at one process, checked in at the next.
                let auth = try await servers[i % 3].json(
                    AuthenticateResponse.self, "POST", Endpoint.authenticate, AuthenticateRequest(processName: "multi", processVersion: version))
                let response = try await servers[(i + 1) % 3].json(
                    CycleResponse.self, "POST", Endpoint.cycleRequest, CycleRequest(workerID: auth.workerID, processName: "multi", processVersion: version),
                    token: auth.sessionToken)
                guard case .accepted(let assignment) = response else { throw Failure("device \(i) was turned away: \(response)") }
                let input = SecureMultiInstanceTests.inputs[i]
                devices.append(
                    SecureDeviceDriver(
                        workerID: auth.workerID, sessionToken: auth.sessionToken, assignment: assignment, scale: input.scale, samples: input.samples,
                        seed: UInt64(300 + i), parameters: SecureMultiInstanceTests.parameters, maximumSampleCount: 100))
            }
            func send(_ request: SecureAggregationRequest, of device: SecureDeviceDriver, to server: Server) async throws -> SecureAggregationReply {
                try await server.json(SecureAggregationReply.self, "POST", Endpoint.secureAggregation, request, token: device.sessionToken)
            }
            func step(_ device: inout SecureDeviceDriver, poll: Server, answer: Server) async throws -> SecureAggregationReply {
                let polled = try await send(device.request(), of: device, to: poll)
                guard let message = try device.answer(polled) else { return polled }
                return try await send(message, of: device, to: answer)
            }
            for i in devices.indices {
                try devices[i].advertised(try await send(try devices[i].advertisement(), of: devices[i], to: servers[(i + 2) % 3]))
            }
            for i in devices.indices { _ = try await step(&devices[i], poll: servers[i % 3], answer: servers[(i + 1) % 3]) }
            // Between share_keys and masked_input, one process is killed and never comes back.
            await servers[2].kill9()
            var closed = 0
            for stage in [SecureAggregationStage.maskedInput, .unmask] {
                for i in devices.indices {
                    let reply = try await step(&devices[i], poll: servers[i % 2], answer: servers[(i + 1) % 2])
                    if stage == .unmask {
                        #expect(reply.next == .done)
                        if reply.cycleClosed { closed += 1 }
                    }
                }
            }
            #expect(closed == 1, "the last unmask publishes, once")
            for server in servers.prefix(2) {
                let (_, statusBody) = try await server.send("GET", Endpoint.process(hosted.processID), token: "admin")
                let status = try WireCoding.decoder().decode(ProcessStatus.self, from: Data(statusBody))
                #expect(status.latestCheckpoint == 1 && status.currentCycle?.number == 2)
                let (code, bytes) = try await server.send("GET", Endpoint.checkpoint(hosted.processID, "latest"), token: "admin")
                #expect(code == 200)
                SecureMultiInstanceTests.expectWithinStep(
                    try Safetensors.decode(bytes).byName.mapValues(\.values), MultiInstanceTests.fedAvg(SecureMultiInstanceTests.inputs))
            }
        }
    }

    @Test func devicesRacingAcrossInstancesNeverOverfillACycle() async throws {
        try await Self.withServers(3) { servers in
            _ = try await servers[0].json(ProcessStatus.self, "POST", Endpoint.processes, MultiInstanceTests.host(goal: 10, overSelection: 1.3), token: "admin")
            let admitted = try await withThrowingTaskGroup(of: Bool.self) { group in
                for i in 0..<48 {
                    let server = servers[i % 3]
                    group.addTask { try await Self.join(server, name: "multi").assignment != nil }
                }
                var count = 0
                for try await accepted in group where accepted { count += 1 }
                return count
            }
            // ⌈10 × 1.3⌉ = 13 over three processes.
            #expect(admitted == 13)
        }
    }
}

/// `orchard bench coordinator --database postgres://… --instances 3` on a tiny fleet: every check-in and report
/// answered across three instances, over several cycles, and the temporary database dropped.
@Suite(TestDatabase.requirement) struct PostgresBenchmarkTests {
    @Test func aTinyRunOverThreeInstancesCountsEveryCheckInAndReport() async throws {
        let admin = try TestDatabase.adminConfiguration()
        let before = try await PostgresAdministration.databases(prefix: "orchard_bench_", using: admin, logger: TestDatabase.logger)
        let result = try await CoordinatorBenchmark.run(
            CoordinatorBenchmark.Configuration(
                devices: 6, parameters: 105, checkins: 12, rate: 0, rounds: 3, reportConcurrency: 2, database: admin, instances: 3
            ))
        #expect(result.store == "postgres" && result.instances == 3)
        #expect(result.checkins == 12 && result.reports == 6 * 3)
        #expect(result.reportBytes > result.reports * 100 * 4)
        let after = try await PostgresAdministration.databases(prefix: "orchard_bench_", using: admin, logger: TestDatabase.logger)
        #expect(Set(after) == Set(before), "the benchmark's database is dropped")
    }

    @Test func moreThanOneInstanceNeedsPostgreSQL() {
        #expect(throws: BenchmarkError.self) { try CoordinatorBenchmark.Configuration(instances: 2).validate() }
    }
}

/// A buffered process over two `orchard serve` instances on one PostgreSQL database: one instance is SIGKILLed
/// mid-buffer, and every release is the staleness-weighted fold of exactly the reports acknowledged.
@Suite(.serialized, TestDatabase.requirement) struct BufferedMultiProcessTests {
    static func host() -> HostProcessRequest {
        var request = MultiInstanceTests.host(goal: 1)
        request.serverConfig.aggregationMode = .buffered
        request.serverConfig.buffered = BufferedAggregationConfig(bufferSize: 4, maxConcurrency: 10)
        return request
    }

    /// `base + Σ nᵢ wᵢ dᵢ / Σ nᵢ` (wᵢ the staleness weight), in Double.
    static func release(from base: [String: [Float]], _ reports: [(scale: Float, samples: Int, staleness: Int)]) -> [String: [Float]] {
        let total = Double(reports.reduce(0) { $0 + $1.samples })
        return base.mapValues { values in
            values.indices.map { i in
                let step =
                    reports.reduce(0.0) {
                        $0 + Double($1.samples) * BufferedAggregationConfig().stalenessWeight($1.staleness) * Double($1.scale) * Double(i + 1)
                    }
                    / total
                return Float(Double(values[i]) + step)
            }
        }
    }

    static func report(_ device: MultiProcessTests.Device, scale: Float, samples: Int, checkpoint: Int, to server: MultiProcessTests.Server) async throws
        -> Int
    {
        let assignment = try #require(device.assignment)
        let body = ReportEnvelope.encode(
            diff: MultiInstanceTests.diff(scale),
            metadata: ReportMetadata(workerID: device.auth.workerID, requestKey: assignment.requestKey, sampleCount: samples, checkpoint: checkpoint))
        let (status, answer) = try await server.send("POST", Endpoint.report, body: body, token: device.auth.sessionToken, contentType: MediaType.safetensors)
        if status != 200 { print("report answered \(status): \(String(decoding: answer, as: UTF8.self))") }
        return status
    }

    static func waitForCheckpoint(_ number: Int, processID: String, at server: MultiProcessTests.Server) async throws -> [String: [Float]] {
        for _ in 0..<200 {
            let (_, body) = try await server.send("GET", Endpoint.process(processID), token: "admin")
            if (try? WireCoding.decoder().decode(ProcessStatus.self, from: Data(body)))?.latestCheckpoint == number {
                let (_, bytes) = try await server.send("GET", Endpoint.checkpoint(processID, "\(number)"), token: "admin")
                return try Safetensors.decode(bytes).byName.mapValues(\.values)
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw MultiProcessTests.Failure("checkpoint \(number) was not published")
    }

    @Test func aKilledInstanceMidBufferLosesNothingAcknowledgedAndCountsNothingTwice() async throws {
        try await MultiProcessTests.withServers(2) { servers in
            let hosted = try await servers[0].json(ProcessStatus.self, "POST", Endpoint.processes, Self.host(), token: "admin")
            // Six devices check in alternately; each reports at the other instance.
            var devices: [MultiProcessTests.Device] = []
            for i in 0..<6 { devices.append(try await MultiProcessTests.join(servers[i % 2], name: "multi")) }
            #expect(devices.allSatisfy { $0.assignment?.checkpoint == 0 })
            let base = MultiInstanceTests.weights.reduce(into: [String: [Float]]()) { $0[$1.name] = $1.values }
            for i in 0..<4 {
                #expect(try await Self.report(devices[i], scale: Float(i + 1) / 4, samples: i + 2, checkpoint: 0, to: servers[(i + 1) % 2]) == 200)
            }
            let first = Self.release(from: base, (0..<4).map { (Float($0 + 1) / 4, $0 + 2, 0) })
            MultiInstanceTests.expectClose(try await Self.waitForCheckpoint(1, processID: hosted.processID, at: servers[0]), first)
            // Devices 4 and 5 trained from checkpoint 0 and carried over into buffer 2. Instance 1 acknowledges device 4's
            // report (staleness 1) and is killed. It is asked once it has taken up the release, which instance 0 made:
            // before that it would answer 503 buffer_releasing, and a device would send the report again.
            _ = try await Self.waitForCheckpoint(1, processID: hosted.processID, at: servers[1])
            #expect(try await Self.report(devices[4], scale: -0.5, samples: 3, checkpoint: 0, to: servers[1]) == 200)
            await servers[1].kill9()
            #expect(try await Self.report(devices[4], scale: -0.5, samples: 3, checkpoint: 0, to: servers[0]) == 409, "acknowledged once")
            #expect(try await Self.report(devices[5], scale: 0.75, samples: 5, checkpoint: 0, to: servers[0]) == 200)
            // Two new devices train from checkpoint 1 and fill the buffer at the surviving instance.
            let late = [try await MultiProcessTests.join(servers[0], name: "multi"), try await MultiProcessTests.join(servers[0], name: "multi")]
            #expect(late.allSatisfy { $0.assignment?.checkpoint == 1 })
            #expect(try await Self.report(late[0], scale: 1, samples: 2, checkpoint: 1, to: servers[0]) == 200)
            #expect(try await Self.report(late[1], scale: -1, samples: 4, checkpoint: 1, to: servers[0]) == 200)
            let second = Self.release(from: first, [(-0.5, 3, 1), (0.75, 5, 1), (1, 2, 0), (-1, 4, 0)])
            MultiInstanceTests.expectClose(try await Self.waitForCheckpoint(2, processID: hosted.processID, at: servers[0]), second)
        }
    }
}

import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif
import OrchardCoordinatorPostgres
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// The chaos run: three `orchard serve` processes on one PostgreSQL cluster of the test's own, a fleet of devices
/// spread over them at random, instances SIGKILLed and restarted at random moments and PostgreSQL itself restarted
/// once, until the process has aggregated its cycles. Then, from what the devices sent and were told alone: every
/// acknowledged report counted exactly once, every checkpoint the sample-weighted mean of its cycle's acknowledged
/// reports added to the checkpoint before, and no cycle over-admitted.
@Suite(.serialized, TestDatabase.requirement, .timeLimit(.minutes(5))) struct ChaosRunTests {
    static let devices = 60
    static let cycles = 10
    static let goal = 8
    static let overSelection = 1.5

    /// A PostgreSQL cluster of the test's own (Debian's `pg_createcluster`, as root: the test runs where `.ci/run`
    /// runs), on a free port, with trust authentication on loopback; dropped at the end.
    final class Cluster: Sendable {
        let version: String
        let name: String
        let port: Int

        private init(version: String, name: String, port: Int) {
            self.version = version
            self.name = name
            self.port = port
        }

        /// Creates and starts a cluster, runs `body` with it and drops it, whether `body` returns or throws.
        static func with(_ body: (Cluster) async throws -> Void) async throws {
            let cluster = try await create()
            do {
                try await body(cluster)
            } catch {
                await cluster.drop()
                throw error
            }
            await cluster.drop()
        }

        private static func create() async throws -> Cluster {
            guard FileManager.default.isExecutableFile(atPath: "/usr/bin/pg_createcluster") else {
                throw MultiProcessTests.Failure("the chaos run needs Debian's postgresql-common (pg_createcluster) to make a cluster of its own")
            }
            let versions = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []
            guard let version = versions.compactMap({ Int($0) }).max().map(String.init) else {
                throw MultiProcessTests.Failure("no PostgreSQL server under /usr/lib/postgresql")
            }
            let cluster = Cluster(version: version, name: "orchard-chaos-\(UInt32.random(in: 0...UInt32.max))", port: try freePort())
            do {
                try await run(
                    "/usr/bin/pg_createcluster",
                    [version, cluster.name, "-p", String(cluster.port), "--start", "--", "--auth-host=trust", "--auth-local=trust"])
            } catch {
                await cluster.drop()  // created but not started (the port was taken meanwhile, say): not left behind
                throw error
            }
            return cluster
        }

        func restart() async throws { try await Self.run("/usr/bin/pg_ctlcluster", [version, name, "restart", "-m", "fast"]) }

        func drop() async { try? await Self.run("/usr/bin/pg_dropcluster", [version, name, "--stop"]) }

        var configuration: PostgresStoreConfiguration {
            PostgresStoreConfiguration(host: "127.0.0.1", port: port, user: "postgres", database: "postgres", tlsMode: .disable)
        }

        /// Runs a command to its end with `posix_spawn` and `waitpid`, its output into a file (the server these
        /// commands start inherits their output, and Foundation's `Process` did not see `pg_createcluster` end), on a
        /// thread of its own.
        static func run(_ executable: String, _ arguments: [String]) async throws {
            try await awaitBlocking { try runBlocking(executable, arguments) }
        }

        private static func runBlocking(_ executable: String, _ arguments: [String]) throws {
            let log = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-chaos-\(UUID().uuidString).log")
            defer { try? FileManager.default.removeItem(at: log) }
            let fd = open(log.path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            guard fd >= 0 else { throw MultiProcessTests.Failure("cannot open \(log.path)") }
            var actions = posix_spawn_file_actions_t()
            posix_spawn_file_actions_init(&actions)
            defer { posix_spawn_file_actions_destroy(&actions) }
            posix_spawn_file_actions_adddup2(&actions, fd, 1)
            posix_spawn_file_actions_adddup2(&actions, fd, 2)
            let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
            defer { argv.forEach { free($0) } }
            var pid: pid_t = 0
            let spawned = posix_spawn(&pid, executable, &actions, nil, argv, environ)
            close(fd)
            guard spawned == 0 else { throw MultiProcessTests.Failure("cannot start \(executable): \(String(cString: strerror(spawned)))") }
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
            // Exited normally with status 0 (the low seven bits hold a terminating signal, the next eight the status).
            guard status & 0x7F == 0 && (status >> 8) & 0xFF == 0 else {
                throw MultiProcessTests.Failure("\(executable) \(arguments.joined(separator: " ")) failed (wait status \(status)): \(text)")
            }
        }

        /// A port nothing listens on now.
        static func freePort() throws -> Int {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = 0
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else { throw MultiProcessTests.Failure("cannot find a free port") }
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
            return Int(UInt16(bigEndian: address.sin_port))
        }
    }

    /// The three instances; an index's server is replaced when it is restarted (same instance id, a new port).
    final class Instances: Sendable {
        private let servers: Mutex<[MultiProcessTests.Server?]>
        let database: PostgresStoreConfiguration

        init(database: PostgresStoreConfiguration, count: Int) async throws {
            self.database = database
            var servers: [MultiProcessTests.Server?] = []
            do {
                for index in 0..<count { servers.append(try await MultiProcessTests.Server.start(database: database, instanceID: "chaos-\(index)")) }
            } catch {
                for server in servers { server?.terminate() }  // the ones started before the failure
                throw error
            }
            self.servers = Mutex(servers)
        }

        /// A live instance, chosen with `random`.
        func any(_ random: inout some RandomNumberGenerator) -> MultiProcessTests.Server? {
            let live = servers.withLock { $0.compactMap { $0 } }
            return live.isEmpty ? nil : live[Int.random(in: 0..<live.count, using: &random)]
        }

        /// SIGKILLs instance `index`; false when it was not running.
        @discardableResult
        func kill(_ index: Int) async -> Bool {
            let server = servers.withLock { servers -> MultiProcessTests.Server? in
                defer { servers[index] = nil }
                return servers[index]
            }
            await server?.kill9()
            return server != nil
        }

        /// Starts instance `index` again; false when it could not start (the database restarting): tried again later.
        @discardableResult
        func start(_ index: Int) async -> Bool {
            guard servers.withLock({ $0[index] == nil }),
                let server = try? await MultiProcessTests.Server.start(database: database, instanceID: "chaos-\(index)")
            else {
                return false
            }
            servers.withLock { $0[index] = server }
            return true
        }

        /// Instances not running.
        var stopped: [Int] { servers.withLock { servers in servers.indices.filter { servers[$0] == nil } } }

        func stopAll() { servers.withLock { $0.forEach { $0?.terminate() } } }
    }

    /// What the fleet sent, by device and request key, and whether the run is over.
    final class Ledger: Sendable {
        let reports = Mutex<[Int: [String: Sent]]>([:])
        let done = Atomic(false)

        var isDone: Bool { done.load(ordering: .relaxed) }
        func finish() { done.store(true, ordering: .relaxed) }
        /// Records what became of a report (a report once acknowledged stays acknowledged).
        func record(device: Int, key: String, _ report: Sent) {
            reports.withLock {
                if $0[device]?[key]?.acknowledged == true { return }
                $0[device, default: [:]][key] = report
            }
        }

        /// Whether `device` already delivered the report of `key` (a device asking again in the same cycle gets its
        /// assignment back; it does not train and send again).
        func delivered(device: Int, key: String) -> Bool { reports.withLock { $0[device]?[key] != nil } }
        var all: [Sent] { reports.withLock { $0.values.flatMap(\.values) } }
    }

    /// A report a device sent, and what became of it.
    struct Sent: Sendable {
        var cycle: Int
        var scale: Float
        var samples: Int
        /// The coordinator said it has it (200, or `report_already_received` for a resend).
        var acknowledged: Bool
        /// An attempt ended without an answer and the last answer was a refusal: the store may or may not have it.
        var uncertain: Bool
        /// The last answer's status and error code, for the failure messages.
        var answer = ""
    }

    /// What device `device` sends in cycle `cycle`: a diff scaled by a number of its own.
    static func scale(device: Int, cycle: Int) -> Float { Float((device * 7 + cycle * 3) % 11) / 4 - 1.25 }

    @Test func threeInstancesKilledAtRandomAndARestartedDatabaseLoseNothingAndCountNothingTwice() async throws {
        _ = try TestDatabase.adminConfiguration()  // fails clearly when PostgreSQL is required but not configured
        try await Cluster.with { cluster in try await run(in: cluster) }
    }

    private func run(in cluster: Cluster) async throws {
        let instances = try await Instances(database: cluster.configuration, count: 3)
        defer { instances.stopAll() }
        var seed = SplitMix64(seed: 42)
        guard let first = instances.any(&seed) else { throw MultiProcessTests.Failure("no instance started") }
        var host = MultiInstanceTests.host(goal: Self.goal, overSelection: Self.overSelection, cycleLength: 8)
        host.serverConfig.cycles = Self.cycles
        host.serverConfig.paceSteeringWindow = 1
        host.serverConfig.checkpointRetention = Self.cycles + 2
        let hosted = try await first.json(ProcessStatus.self, "POST", Endpoint.processes, host, token: "admin")

        let ledger = Ledger()
        let started = ContinuousClock.now

        // The chaos: an instance killed every 1.5–3 s and started again 0.3–1 s later; PostgreSQL restarted once.
        let chaos = Task {
            var random = SplitMix64(seed: 7)
            var events: [String] = []
            var restartedDatabase = false
            while !ledger.isDone {
                try? await Task.sleep(for: .milliseconds(Int.random(in: 1500...3000, using: &random)))
                if ledger.isDone { break }
                if !restartedDatabase && ContinuousClock.now - started > .seconds(8) {
                    restartedDatabase = true
                    try await cluster.restart()
                    events.append("postgres restarted")
                    continue
                }
                let index = Int.random(in: 0..<3, using: &random)
                if await instances.kill(index) { events.append("instance \(index) killed") }
                try? await Task.sleep(for: .milliseconds(Int.random(in: 300...1000, using: &random)))
                for stopped in instances.stopped {
                    if await instances.start(stopped) { events.append("instance \(stopped) started") }
                }
            }
            return events
        }
        // Whatever ends the run (its time limit included), the chaos stops before the instances and the cluster go.
        defer {
            ledger.finish()
            chaos.cancel()
        }

        // The fleet: each device authenticates, asks for a cycle and reports, at a random live instance each time.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for device in 0..<Self.devices {
                group.addTask {
                    var random = SplitMix64(seed: UInt64(1000 + device))
                    var auth: AuthenticateResponse?
                    while !ledger.isDone {
                        guard let server = instances.any(&random) else {
                            try await Task.sleep(for: .milliseconds(100))
                            continue
                        }
                        do {
                            if auth == nil {
                                auth = try await server.json(
                                    AuthenticateResponse.self, "POST", Endpoint.authenticate,
                                    AuthenticateRequest(processName: "multi", processVersion: SemanticVersion(1, 0)))
                            }
                            guard let session = auth else { continue }
                            let answer = try await server.json(
                                CycleResponse.self, "POST", Endpoint.cycleRequest,
                                CycleRequest(workerID: session.workerID, processName: "multi", processVersion: SemanticVersion(1, 0)),
                                token: session.sessionToken)
                            guard case .accepted(let assignment) = answer, !ledger.delivered(device: device, key: assignment.requestKey) else {
                                try await Task.sleep(for: .milliseconds(Int.random(in: 100...400, using: &random)))
                                continue
                            }
                            // Training: 2–5 s, long enough for cycles to span the chaos's kills and restarts.
                            try await Task.sleep(for: .milliseconds(Int.random(in: 2000...5000, using: &random)))
                            try await Self.deliver(
                                device: device, session: session, assignment: assignment, instances: instances, random: &random, ledger: ledger)
                        } catch {
                            // A killed instance, a restarting database: try again elsewhere.
                            try await Task.sleep(for: .milliseconds(Int.random(in: 50...200, using: &random)))
                        }
                    }
                }
            }
            // The watcher: stops the fleet once the process has aggregated its cycles (or after three minutes).
            group.addTask {
                var random = SplitMix64(seed: 3)
                while ContinuousClock.now - started < .seconds(180) {
                    try await Task.sleep(for: .milliseconds(500))
                    guard let server = instances.any(&random) else { continue }
                    guard let (status, body) = try? await server.send("GET", Endpoint.process(hosted.processID), token: "admin"), status == 200,
                        let process = try? WireCoding.decoder().decode(ProcessStatus.self, from: Data(body))
                    else { continue }
                    if process.state == .completed { break }
                }
                ledger.finish()
            }
            try await group.waitForAll()
        }
        let events = try await chaos.value
        #expect(events.contains("postgres restarted"), "\(events)")
        #expect(events.filter { $0.hasSuffix("killed") }.count >= 3, "\(events)")

        // Everything below reads one live instance's admin API.
        var random = SplitMix64(seed: 9)
        var reader: MultiProcessTests.Server?
        for _ in 0..<50 where reader == nil {
            reader = instances.any(&random)
            if reader == nil { try await Task.sleep(for: .milliseconds(100)) }
        }
        let server = try #require(reader)
        let (statusCode, statusBody) = try await server.send("GET", Endpoint.process(hosted.processID), token: "admin")
        #expect(statusCode == 200)
        let status = try WireCoding.decoder().decode(ProcessStatus.self, from: Data(statusBody))
        #expect(status.state == .completed && status.cyclesCompleted == Self.cycles, "the process aggregated its \(Self.cycles) cycles within the time")
        let (recordsStatus, recordsBody) = try await server.send("GET", Endpoint.cycles(hosted.processID), token: "admin")
        #expect(recordsStatus == 200)
        let records = try WireCoding.decoder().decode(ProcessCycles.self, from: Data(recordsBody)).cycles
        let reports = ledger.all
        let capacity = Int((Double(Self.goal) * Self.overSelection).rounded(.up))
        var previous = try await Self.checkpoint(0, of: hosted.processID, at: server)
        var checked = 0
        for record in records.sorted(by: { $0.cycle < $1.cycle }) {
            #expect(record.assigned <= capacity, "cycle \(record.cycle) admitted \(record.assigned), more than \(capacity)")
            let acknowledged = reports.filter { $0.cycle == record.cycle && $0.acknowledged }
            let uncertain = reports.filter { $0.cycle == record.cycle && $0.uncertain }
            // Exactly once: every acknowledged report is counted, and nothing else unless it might have been committed.
            #expect(
                record.reported >= acknowledged.count && record.reported <= acknowledged.count + uncertain.count,
                "cycle \(record.cycle): \(record.reported) reports counted, \(acknowledged.count) acknowledged, \(uncertain.count) uncertain; answers of the cycle's reports: \(reports.filter { $0.cycle == record.cycle }.map(\.answer))"
            )
            guard record.outcome == .aggregated, let number = record.checkpoint else { continue }
            let published = try await Self.checkpoint(number, of: hosted.processID, at: server)
            if uncertain.isEmpty || record.reported == acknowledged.count {
                // The checkpoint recomputed from what the devices sent: the previous one plus Σ nᵢ dᵢ / Σ nᵢ.
                let total = Double(acknowledged.reduce(0) { $0 + $1.samples })
                for (name, values) in previous {
                    let expected = values.indices.map { i in
                        Float(Double(values[i]) + acknowledged.reduce(0.0) { $0 + Double($1.samples) * Double($1.scale) * Double(i + 1) } / total)
                    }
                    let got = published[name] ?? []
                    #expect(got.count == expected.count && zip(got, expected).allSatisfy { abs($0 - $1) <= 1e-4 }, "cycle \(record.cycle), \(name)")
                }
                checked += 1
            }
            previous = published
        }
        #expect(checked >= Self.cycles - 2, "checkpoints recomputed independently: \(checked) of \(Self.cycles)")
        let acknowledgedTotal = reports.filter(\.acknowledged).count
        Swift.print(
            "chaos run: \(events.count) events (\(events.joined(separator: ", "))), \(acknowledgedTotal) reports acknowledged, \(reports.filter(\.uncertain).count) uncertain, \(records.count) cycles, \(checked) checkpoints recomputed, \(ContinuousClock.now - started)"
        )
    }

    /// Sends a device's report for `assignment` until an answer settles it: acknowledged, or refused. An attempt that
    /// ends without an answer (the instance was killed mid-request) is repeated at another instance with the same key;
    /// a resend the coordinator already has is acknowledged (`report_already_received`).
    static func deliver(
        device: Int, session: AuthenticateResponse, assignment: CycleAssignment, instances: Instances, random: inout SplitMix64, ledger: Ledger
    ) async throws {
        let scale = Self.scale(device: device, cycle: assignment.cycle)
        let samples = 1 + device % 7
        let body = ReportEnvelope.encode(
            diff: MultiInstanceTests.diff(scale),
            metadata: ReportMetadata(workerID: session.workerID, requestKey: assignment.requestKey, sampleCount: samples, metrics: ["loss": 0.5]))
        var unanswered = false
        for _ in 0..<20 {
            guard let server = instances.any(&random) else {
                try await Task.sleep(for: .milliseconds(100))
                continue
            }
            let answer: (status: Int, body: [UInt8])
            do {
                answer = try await server.send("POST", Endpoint.report, body: body, token: session.sessionToken, contentType: MediaType.safetensors)
            } catch {
                unanswered = true
                try await Task.sleep(for: .milliseconds(100))
                continue
            }
            let code = (try? WireCoding.decoder().decode(ErrorBody.self, from: Data(answer.body)))?.error.code
            if answer.status >= 500 {
                unanswered = true  // the store was unreachable: it may or may not have committed
                try await Task.sleep(for: .milliseconds(100))
                continue
            }
            let acknowledged = answer.status == 200 || code?.rawValue == "report_already_received"
            ledger.record(
                device: device, key: assignment.requestKey,
                Sent(
                    cycle: assignment.cycle, scale: scale, samples: samples, acknowledged: acknowledged, uncertain: !acknowledged && unanswered,
                    answer: "\(answer.status) \(code?.rawValue ?? "")"))
            return
        }
        ledger.record(
            device: device, key: assignment.requestKey, Sent(cycle: assignment.cycle, scale: scale, samples: samples, acknowledged: false, uncertain: true))
    }

    static func checkpoint(_ number: Int, of processID: String, at server: MultiProcessTests.Server) async throws -> [String: [Float]] {
        let (status, bytes) = try await server.send("GET", Endpoint.checkpoint(processID, String(number)), token: "admin")
        guard status == 200 else { throw MultiProcessTests.Failure("checkpoint \(number): HTTP \(status) \(String(decoding: bytes, as: UTF8.self))") }
        return try Safetensors.decode(bytes).byName.mapValues(\.values)
    }
}

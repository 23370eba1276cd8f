import Synchronization
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
@testable import OrchardBenchmarks
import OrchardCoordinator
import OrchardProtocol
import Testing

@Suite struct CoordinatorBenchmarkTests {
    @Test func aTinyRunCountsEveryCheckInAndReport() async throws {
        let configuration = CoordinatorBenchmark.Configuration(
            devices: 3, parameters: 105, checkins: 10, rate: 0, rounds: 2, reportConcurrency: 2, durability: .full
        )
        let phases = Mutex<[Int]>([])
        let result = try await CoordinatorBenchmark.run(configuration) { done, _ in phases.withLock { $0.append(done) } }
        #expect(phases.withLock { $0 } == [1, 2, 3, 4], "connected, check-ins, two report rounds")
        #expect(CoordinatorBenchmark.phases(configuration) == 4)

        #expect(result.devices == 3)
        #expect(result.parameters == 100)  // one dense layer with 10 outputs
        #expect(result.checkins == 10)
        #expect(result.offeredRate == 0)
        #expect(result.reports == 3 * 2)
        // Each report carries the 100 parameters as Float32 after its safetensors header.
        #expect(result.reportBytes > result.reports * 100 * 4)
        #expect(result.reportBytes < result.reports * (100 * 4 + 4096))
        #expect(result.checkinsPerSecond > 0)
        #expect(result.reportMegabytesPerSecond > 0)
        #expect(0 < result.checkinP50Milliseconds && result.checkinP50Milliseconds <= result.checkinP99Milliseconds)
        #expect(0 < result.admissionP99Milliseconds && result.admissionP99Milliseconds <= result.checkinP99Milliseconds)
        #expect(0 < result.steadyCheckinP99Milliseconds && result.steadyCheckinP99Milliseconds <= result.checkinP99Milliseconds)
        #expect(0 < result.reportP50Milliseconds && result.reportP50Milliseconds <= result.reportP99Milliseconds)
        #if os(Linux)
        #expect(try #require(result.peakRSSMiB) > 1)
        #endif

        let line = try JSONLine.encode(result)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(
            Set(object.keys) == [
                "benchmark", "store", "instances", "devices", "params", "checkins", "checkin_target", "offered_rate", "checkins_per_second", "checkin_p50_ms",
                "checkin_p99_ms",
                "admission_p99_ms", "checkin_steady_p99_ms", "reports", "report_bytes", "report_mb_per_second", "report_p50_ms", "report_p99_ms",
                "peak_rss_mib",
            ])
        #expect(object["benchmark"] as? String == "coordinator")
        #expect(object["store"] as? String == "sqlite" && (object["instances"] as? NSNumber)?.intValue == 1)
        #expect(object["checkin_target"] as? String == "cycle-request")
        #expect((object["reports"] as? NSNumber)?.intValue == 6)
        #expect(!line.contains("\n"))
    }

    /// The bound the HTTP server and load generator set: the check-in phase requests `GET /health` instead.
    @Test func theHealthTargetTimesTheNoOpRoute() async throws {
        let result = try await CoordinatorBenchmark.run(
            CoordinatorBenchmark.Configuration(devices: 2, parameters: 10, checkins: 8, rate: 0, rounds: 0, checkinTarget: .health)
        )
        #expect(result.checkins == 8)
        #expect(result.checkinTarget == .health)
        #expect(result.checkinP99Milliseconds > 0)
        #expect(try JSONLine.encode(result).contains(#""checkin_target":"health""#))
    }

    /// The HTTP library's floor: the check-in phase sends its cycle requests to a bare Hummingbird application that
    /// echoes them, and the report phase goes back to the coordinator.
    @Test func theHummingbirdTargetTimesABareApplicationAndReportsToTheCoordinator() async throws {
        let result = try await CoordinatorBenchmark.run(
            CoordinatorBenchmark.Configuration(devices: 2, parameters: 10, checkins: 8, rate: 0, rounds: 1, checkinTarget: .hummingbird)
        )
        #expect(result.checkins == 8 && result.reports == 2)
        #expect(try JSONLine.encode(result).contains(#""checkin_target":"hummingbird""#))
    }

    /// The reference application echoes a cycle request's body, answers `/health`, and has nothing else of the
    /// coordinator's API.
    @Test func theBareApplicationEchoesCycleRequests() async throws {
        let floor = try await HummingbirdFloor.start()
        let connection = try await BenchConnection.connect(host: "127.0.0.1", port: floor.port, group: MultiThreadedEventLoopGroup.singleton)
        let health = try await connection.exchange(LoadGenerator.head(.GET, Endpoint.health, port: floor.port), keepBody: true)
        #expect(health.status == 200 && health.body.map { Array($0.readableBytesView) } == Array(#"{"status":"ok"}"#.utf8))
        let body = ByteBuffer(string: #"{"worker_id":"w"}"#)
        let echo = try await connection.exchange(LoadGenerator.head(.POST, Endpoint.cycleRequest, port: floor.port), body: [body], keepBody: true)
        #expect(echo.status == 200 && echo.body == body)
        let other = try await connection.exchange(LoadGenerator.head(.GET, Endpoint.openAPI, port: floor.port), keepBody: true)
        #expect(other.status == 404)
        await connection.close()
        await floor.stop()
    }

    @Test func anOpenLoopRunWithoutRoundsReportsNothing() async throws {
        let result = try await CoordinatorBenchmark.run(
            CoordinatorBenchmark.Configuration(devices: 2, parameters: 10, checkins: 5, rate: 1000, rounds: 0)
        )
        #expect(result.checkins == 5)
        #expect(result.offeredRate == 1000)
        #expect(result.reports == 0 && result.reportBytes == 0)
        #expect(result.reportMegabytesPerSecond == 0 && result.reportP50Milliseconds == 0 && result.reportP99Milliseconds == 0)
        #expect(result.checkinP50Milliseconds <= result.checkinP99Milliseconds)
    }

    @Test(arguments: [
        (CoordinatorBenchmark.Configuration(devices: 0), "devices"),
        (CoordinatorBenchmark.Configuration(parameters: 9), "parameters"),
        (CoordinatorBenchmark.Configuration(checkins: -1), "checkins"),
        (CoordinatorBenchmark.Configuration(rate: -5), "rate"),
        (CoordinatorBenchmark.Configuration(rate: .infinity), "rate"),
        (CoordinatorBenchmark.Configuration(rate: .nan), "rate"),
        (CoordinatorBenchmark.Configuration(rounds: -1), "rounds"),
        (CoordinatorBenchmark.Configuration(reportConcurrency: 0), "reportConcurrency"),
    ])
    func aBadConfigurationIsRefusedNamingItsField(_ configuration: CoordinatorBenchmark.Configuration, _ field: String) async {
        let error = await #expect(throws: BenchmarkError.self) { try await CoordinatorBenchmark.run(configuration) }
        #expect(error?.code == .invalidConfiguration)
        #expect(error?.context["field"] == field)
        #expect(error?.message.hasPrefix(field + " must be") == true)
        #expect(error?.message.contains("--") == false)
        #expect(error?.description.hasPrefix("invalid_configuration: ") == true)
    }

    @Test func theDefaultsAreValid() throws {
        let defaults = CoordinatorBenchmark.Configuration()
        try defaults.validate()
        #expect(defaults.devices == 1000 && defaults.parameters == 100_000 && defaults.checkins == 50_000)
        #expect(defaults.rate == 5000 && defaults.rounds == 1 && defaults.reportConcurrency == 32 && defaults.durability == .normal)
    }
}

import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import OrchardBenchmarks
import OrchardCoordinator
import OrchardCoordinatorTesting
import OrchardProtocol
import Testing

extension LoopbackCoordinator {
    func connect() async throws -> BenchConnection {
        try await BenchConnection.connect(host: "127.0.0.1", port: server.port, group: MultiThreadedEventLoopGroup.singleton)
    }

    func head(_ method: HTTPMethod, _ path: String, contentType: String? = nil) -> HTTPRequestHead {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: path)
        head.headers.add(name: "Host", value: "127.0.0.1:\(server.port)")
        if let contentType { head.headers.add(name: "Content-Type", value: contentType) }
        return head
    }
}

@Suite(.timeLimit(.minutes(2))) struct BenchConnectionTests {
    @Test func exchangesRequestsWithBodiesAndKeepsTheConnectionAlive() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let connection = try await coordinator.connect()

        let health = try await connection.exchange(coordinator.head(.GET, Endpoint.health), keepBody: true)
        #expect(health.status == 200)
        let body = try #require(health.body)
        #expect(body.readableBytes == health.bodyBytes)
        #expect(String(buffer: body).contains("ok"))

        // A JSON body in two parts on the same connection: the coordinator reads the whole request (it names a
        // process that is not hosted) and answers 404 with an error that names it.
        let request = try WireCoding.encoder().encode(AuthenticateRequest(processName: "absent-process", processVersion: SemanticVersion(1)))
        let parts = [ByteBuffer(bytes: request.prefix(5)), ByteBuffer(bytes: request.dropFirst(5))]
        let answer = try await connection.exchange(coordinator.head(.POST, Endpoint.authenticate, contentType: MediaType.json), body: parts, keepBody: true)
        #expect(answer.status == 404)
        #expect(String(buffer: try #require(answer.body)).contains("absent-process"))

        // Without keepBody only the size comes back.
        let counted = try await connection.exchange(coordinator.head(.GET, Endpoint.health))
        #expect(counted.status == 200 && counted.body == nil && counted.bodyBytes == health.bodyBytes)

        await connection.close()
        await coordinator.stop()
    }

    @Test func repeatedRequestsReturnOneLatencyEach() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let connection = try await coordinator.connect()

        let closedLoop = try await connection.repeatedly(coordinator.head(.GET, Endpoint.health), body: [], count: 25)
        #expect(closedLoop.count == 25)
        #expect(closedLoop.allSatisfy { $0 >= 0 && $0.isFinite })

        // Scheduled times already past: each request goes as soon as the previous answer arrived, and its latency
        // counts from its scheduled time, so it is at least the time since that schedule.
        let origin = NIODeadline.now() - .milliseconds(500)
        let openLoop = try await connection.repeatedly(
            coordinator.head(.GET, Endpoint.health), body: [], count: 3, schedule: [origin, origin, origin]
        )
        #expect(openLoop.count == 3)
        #expect(openLoop.allSatisfy { $0 >= 500 })
        #expect(openLoop == openLoop.sorted())

        #expect(try await connection.repeatedly(coordinator.head(.GET, Endpoint.health), body: [], count: 0).isEmpty)

        // Scheduled times ahead: no request goes before its time, so the series ends after the last one.
        let start = NIODeadline.now()
        let ahead = [start + .milliseconds(30), start + .milliseconds(60), start + .milliseconds(90)]
        let paced = try await connection.repeatedly(coordinator.head(.GET, Endpoint.health), body: [], count: 3, schedule: ahead)
        #expect(NIODeadline.now() - start >= .milliseconds(90))
        #expect(paced.count == 3)
        #expect(paced.allSatisfy { $0 >= 0 && $0.isFinite })

        await connection.close()
        await coordinator.stop()
    }

    @Test func aSeriesOnAClosedConnectionFailsInsteadOfWaiting() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let connection = try await coordinator.connect()
        await connection.close()

        let error = await #expect(throws: BenchmarkError.self) {
            try await connection.repeatedly(coordinator.head(.GET, Endpoint.health), body: [], count: 2)
        }
        #expect(error?.code == .connectionClosed)
        let scheduled = await #expect(throws: BenchmarkError.self) {
            try await connection.repeatedly(coordinator.head(.GET, Endpoint.health), body: [], count: 1, schedule: [.now() + .milliseconds(5)])
        }
        #expect(scheduled?.code == .connectionClosed)
        await coordinator.stop()
    }

    @Test func anAnswerOutside2xxFailsTheSeriesWithItsStatus() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let connection = try await coordinator.connect()

        // No session token: the coordinator refuses the cycle request.
        let error = await #expect(throws: BenchmarkError.self) {
            try await connection.repeatedly(
                coordinator.head(.POST, Endpoint.cycleRequest, contentType: MediaType.json), body: [ByteBuffer(string: "{}")], count: 3)
        }
        #expect(error?.code == .unexpectedResponse)
        #expect(error?.context["request"] == "POST \(Endpoint.cycleRequest)")
        #expect(error?.context["status"] == "401")

        // The connection is still usable.
        #expect(try await connection.exchange(coordinator.head(.GET, Endpoint.health)).status == 200)

        await connection.close()
        await coordinator.stop()
    }
}

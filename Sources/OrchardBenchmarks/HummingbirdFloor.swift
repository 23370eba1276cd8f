import Hummingbird
import Logging
import NIOCore
import OrchardProtocol
import ServiceLifecycle

/// A bare Hummingbird 2 application on loopback, the benchmark's reference for the HTTP library's own cost, with no
/// middleware and Hummingbird's default configuration: `POST` on the cycle-request path reads the body and echoes it
/// (the same request and an answer of about the same size as a check-in, without the check-in's work), and
/// `GET /health` answers static bytes.
struct HummingbirdFloor: Sendable {
    /// The bound port.
    let port: Int
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    /// Starts the application on a free loopback port and returns once it listens.
    static func start() async throws -> HummingbirdFloor {
        let router = Router()
        let body = ByteBuffer(string: #"{"status":"ok"}"#)
        router.get(RouterPath(stringLiteral: Endpoint.health)) { _, _ in
            Response(status: .ok, headers: [.contentType: "application/json"], body: ResponseBody(byteBuffer: body))
        }
        router.post(RouterPath(stringLiteral: Endpoint.cycleRequest)) { request, _ in
            let echo = try await request.body.collect(upTo: 64 << 10)
            return Response(status: .ok, headers: [.contentType: "application/json"], body: ResponseBody(byteBuffer: echo))
        }
        let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router, configuration: ApplicationConfiguration(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in
                continuation.yield(channel.localAddress?.port ?? 0)
                continuation.finish()
            },
            logger: Logger(label: "orchard.bench.hummingbird")
        )
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: [app], logger: Logger(label: "orchard.bench.hummingbird")))
        let task = Task {
            defer { continuation.finish() }
            try await group.run()
        }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next(), port > 0 else {
            await group.triggerGracefulShutdown()
            if case .failure(let error) = await task.result { throw error }
            throw BenchmarkError(.unexpectedResponse, "the bare Hummingbird application stopped before listening", context: ["request": "listen"])
        }
        return HummingbirdFloor(port: port, group: group, task: task)
    }

    /// Stops the application gracefully and waits for it to finish.
    func stop() async {
        await group.triggerGracefulShutdown()
        _ = await task.result
    }
}

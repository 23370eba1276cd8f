public import NIOCore
public import NIOHTTP1
import NIOPosix

/// One keep-alive HTTP/1.1 connection of the coordinator benchmark's load generator: a request at a time,
/// written from prepared bytes and answered with the status and body size only.
///
/// The benchmark measures the server, and the generator shares the machine's cores with it, so the generator
/// does as little as an HTTP client can: no pool, no redirects, no decompression, no per-request allocation of
/// headers beyond NIO's encoder.
public final class BenchConnection: Sendable {
    /// A finished exchange.
    public struct Response: Sendable {
        /// The HTTP status code.
        public var status: Int
        /// The body's size in bytes.
        public var bodyBytes: Int
        /// The body, when the exchange asked to keep it.
        public var body: ByteBuffer?
    }

    private let channel: any Channel
    private let handler: NIOLoopBound<ExchangeHandler>

    private init(channel: any Channel, handler: NIOLoopBound<ExchangeHandler>) {
        self.channel = channel
        self.handler = handler
    }

    /// Connects to `host:port` on `group`.
    public static func connect(host: String, port: Int, group: any EventLoopGroup) async throws -> BenchConnection {
        let eventLoop = group.next()
        let channel = try await ClientBootstrap(group: eventLoop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(ExchangeHandler())
                }
            }
            .connect(host: host, port: port).get()
        let handler = try await channel.eventLoop.submit {
            NIOLoopBound(try channel.pipeline.syncOperations.handler(type: ExchangeHandler.self), eventLoop: channel.eventLoop)
        }.get()
        return BenchConnection(channel: channel, handler: handler)
    }

    /// Sends one request and waits for its whole response.
    /// - Parameters:
    ///   - head: The request line and headers (`Content-Length` is added for a body).
    ///   - body: The body's parts, written one after the other (none for no body).
    ///   - keepBody: Whether the response body is returned (otherwise only counted).
    public func exchange(_ head: HTTPRequestHead, body: [ByteBuffer] = [], keepBody: Bool = false) async throws -> Response {
        let promise = channel.eventLoop.makePromise(of: Response.self)
        let handler = self.handler
        let channel = self.channel
        channel.eventLoop.execute {
            Self.send(head, body: body, on: channel, through: handler.value, keepBody: keepBody, answer: promise)
        }
        return try await promise.futureResult.get()
    }

    /// Sends the same request `count` times, one after the other, and returns each answer's latency in
    /// milliseconds — all on the connection's event loop, so the load generator costs no task switch or timer of
    /// Swift concurrency per request.
    ///
    /// With `schedule`, request k is sent at `schedule[k]`, or as soon as answer k − 1 arrived if that is later
    /// (open loop), and its latency counts from `schedule[k]`, so time spent waiting behind a slow server shows;
    /// without, each request is sent as soon as the previous answer arrived and counts from its sending. An answer
    /// outside 2xx fails the whole series with ``BenchmarkError/Code/unexpectedResponse``.
    public func repeatedly(_ head: HTTPRequestHead, body: [ByteBuffer], count: Int, schedule: [NIODeadline]? = nil) async throws -> [Double] {
        precondition(count >= 0 && (schedule == nil || schedule?.count == count), "a non-negative count and one scheduled time per request")
        let done = channel.eventLoop.makePromise(of: [Double].self)
        let handler = self.handler
        let channel = self.channel
        channel.eventLoop.execute {
            RepeatedRequests(channel: channel, handler: handler.value, head: head, body: body, count: count, schedule: schedule, done: done).next()
        }
        return try await done.futureResult.get()
    }

    /// Writes one request on the channel's event loop; `answer` completes with its response.
    fileprivate static func send(
        _ head: HTTPRequestHead, body: [ByteBuffer], on channel: any Channel, through handler: ExchangeHandler, keepBody: Bool,
        answer: EventLoopPromise<Response>
    ) {
        handler.start(answer, keepBody: keepBody)
        var head = head
        if !body.isEmpty { head.headers.replaceOrAdd(name: "Content-Length", value: "\(body.reduce(0) { $0 + $1.readableBytes })") }
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        for part in body { channel.write(HTTPClientRequestPart.body(.byteBuffer(part)), promise: nil) }
        channel.writeAndFlush(HTTPClientRequestPart.end(nil)).whenFailure { answer.fail($0) }
    }

    /// Closes the connection.
    public func close() async {
        try? await channel.close()
    }
}

/// The loop behind ``BenchConnection/repeatedly(_:body:count:schedule:)``; lives on the channel's event loop.
private final class RepeatedRequests {
    let channel: any Channel
    let handler: ExchangeHandler
    let head: HTTPRequestHead
    let body: [ByteBuffer]
    let count: Int
    let schedule: [NIODeadline]?
    let done: EventLoopPromise<[Double]>
    var latencies: [Double] = []

    init(channel: any Channel, handler: ExchangeHandler, head: HTTPRequestHead, body: [ByteBuffer], count: Int, schedule: [NIODeadline]?, done: EventLoopPromise<[Double]>) {
        self.channel = channel
        self.handler = handler
        self.head = head
        self.body = body
        self.count = count
        self.schedule = schedule
        self.done = done
        latencies.reserveCapacity(count)
    }

    func next() {
        let index = latencies.count
        guard index < count else {
            done.succeed(latencies)
            return
        }
        if let due = schedule?[index], NIODeadline.now() < due {
            channel.eventLoop.assumeIsolated().scheduleTask(deadline: due) { self.send(from: due) }
        } else {
            send(from: schedule?[index] ?? .now())
        }
    }

    private func send(from reference: NIODeadline) {
        let answer = channel.eventLoop.makePromise(of: BenchConnection.Response.self)
        BenchConnection.send(head, body: body, on: channel, through: handler, keepBody: false, answer: answer)
        answer.futureResult.assumeIsolated().whenComplete { result in
            switch result {
            case .success(let response) where (200..<300).contains(response.status):
                self.latencies.append(Double((NIODeadline.now() - reference).nanoseconds) / 1e6)
                self.next()
            case .success(let response):
                let request = "\(self.head.method) \(self.head.uri)"
                self.done.fail(BenchmarkError(
                    .unexpectedResponse, "\(request): HTTP \(response.status)", context: ["request": request, "status": "\(response.status)"]
                ))
            case .failure(let error):
                self.done.fail(error)
            }
        }
    }
}

/// Completes the pending exchange's promise when its response ends.
private final class ExchangeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart

    private var promise: EventLoopPromise<BenchConnection.Response>?
    private var status = 0
    private var bodyBytes = 0
    private var keepBody = false
    private var body: ByteBuffer?

    func start(_ promise: EventLoopPromise<BenchConnection.Response>, keepBody: Bool) {
        self.promise = promise
        self.keepBody = keepBody
        status = 0
        bodyBytes = 0
        body = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            status = Int(head.status.code)
        case .body(var part):
            bodyBytes += part.readableBytes
            if keepBody {
                if body == nil { body = part } else { body!.writeBuffer(&part) }
            }
        case .end:
            let response = BenchConnection.Response(status: status, bodyBytes: bodyBytes, body: body)
            let promise = self.promise
            self.promise = nil
            body = nil
            promise?.succeed(response)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(error)
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail(BenchmarkError(.connectionClosed, "the server closed the connection"))
        context.fireChannelInactive()
    }

    private func fail(_ error: any Error) {
        let promise = self.promise
        self.promise = nil
        promise?.fail(error)
    }
}

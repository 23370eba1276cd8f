import NIOCore
import NIOHTTP1
import NIOPosix

/// One keep-alive HTTP/1.1 connection of the coordinator benchmark's load generator: a request at a time,
/// written from prepared bytes and answered with the status and body size only.
///
/// The benchmark measures the server, and the generator shares the machine's cores with it, so the generator
/// does as little as an HTTP client can: no pool, no redirects, no decompression, no per-request allocation of
/// headers beyond NIO's encoder.
final class BenchConnection: Sendable {
    /// A finished exchange.
    struct Response: Sendable {
        var status: Int
        var bodyBytes: Int
        var body: ByteBuffer?
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    private let channel: any Channel
    private let handler: NIOLoopBound<ExchangeHandler>

    private init(channel: any Channel, handler: NIOLoopBound<ExchangeHandler>) {
        self.channel = channel
        self.handler = handler
    }

    /// Connects to `host:port` on `group`.
    static func connect(host: String, port: Int, group: any EventLoopGroup) async throws -> BenchConnection {
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
    ///   - body: The body, if any.
    ///   - keepBody: Whether the response body is returned (otherwise only counted).
    func exchange(_ head: HTTPRequestHead, body: ByteBuffer?, keepBody: Bool = false) async throws -> Response {
        let promise = channel.eventLoop.makePromise(of: Response.self)
        let handler = self.handler
        let channel = self.channel
        channel.eventLoop.execute {
            handler.value.start(promise, keepBody: keepBody)
            var head = head
            if let body { head.headers.replaceOrAdd(name: "Content-Length", value: "\(body.readableBytes)") }
            channel.write(HTTPClientRequestPart.head(head), promise: nil)
            if let body { channel.write(HTTPClientRequestPart.body(.byteBuffer(body)), promise: nil) }
            channel.writeAndFlush(HTTPClientRequestPart.end(nil)).whenFailure { promise.fail($0) }
        }
        return try await promise.futureResult.get()
    }

    /// Closes the connection.
    func close() async {
        try? await channel.close()
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
        fail(BenchConnection.Failure(description: "the server closed the connection"))
        context.fireChannelInactive()
    }

    private func fail(_ error: any Error) {
        let promise = self.promise
        self.promise = nil
        promise?.fail(error)
    }
}

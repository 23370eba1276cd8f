public import NIOCore
public import NIOHTTP1
import NIOPosix
import Foundation

/// One keep-alive HTTP/1.1 connection of the coordinator benchmark's load generator: a request at a time,
/// written from prepared bytes and answered with the status and body size only.
///
/// The benchmark measures the server, and the generator shares the machine's cores with it, so the generator
/// does as little as an HTTP client can: no pool, no redirects, no decompression, and no HTTP codec — a request is
/// written as bytes encoded once, and a response is read by ``ResponseParser`` (status line, `Content-Length` or
/// chunked framing; header values other than those are not looked at).
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
        // The head, then the body's parts as they are: a report's megabytes are written from the caller's buffers (which
        // reports share), not copied into one request buffer per upload in flight.
        let parts = [Self.encodeHead(head, bodyLength: body.reduce(0) { $0 + $1.readableBytes }, hasBody: !body.isEmpty)] + body
        channel.eventLoop.execute {
            Self.send(parts, on: channel, through: handler.value, keepBody: keepBody, answer: promise)
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
        let request = Self.encode(head, body: body)
        let name = "\(head.method) \(head.uri)"
        channel.eventLoop.execute {
            RepeatedRequests(channel: channel, handler: handler.value, request: request, name: name, count: count, schedule: schedule, done: done).next()
        }
        return try await done.futureResult.get()
    }

    /// A request's bytes: the request line, the headers (`Content-Length` set for a body) and the body.
    static func encode(_ head: HTTPRequestHead, body: [ByteBuffer]) -> ByteBuffer {
        let length = body.reduce(0) { $0 + $1.readableBytes }
        var buffer = encodeHead(head, bodyLength: length, hasBody: !body.isEmpty)
        buffer.reserveCapacity(buffer.readableBytes + length)
        for var part in body { buffer.writeBuffer(&part) }
        return buffer
    }

    /// A request's line and headers, with `Content-Length: bodyLength` for a body (and for any POST or PUT).
    static func encodeHead(_ head: HTTPRequestHead, bodyLength: Int, hasBody: Bool) -> ByteBuffer {
        var headers = head.headers
        if hasBody || head.method == .POST || head.method == .PUT { headers.replaceOrAdd(name: "Content-Length", value: "\(bodyLength)") }
        var buffer = ByteBuffer()
        buffer.reserveCapacity(256)
        buffer.writeString("\(head.method.rawValue) \(head.uri) HTTP/\(head.version.major).\(head.version.minor)\r\n")
        for (name, value) in headers { buffer.writeString("\(name): \(value)\r\n") }
        buffer.writeString("\r\n")
        return buffer
    }

    /// Writes one request in `parts` (head first) on the channel's event loop and flushes them together.
    fileprivate static func send(
        _ parts: [ByteBuffer], on channel: any Channel, through handler: ExchangeHandler, keepBody: Bool, answer: EventLoopPromise<Response>
    ) {
        handler.start(PromisedAnswer(answer), keepBody: keepBody)
        // A failed write fails the writes after it too, so the last one's failure answers for all of them.
        for part in parts.dropLast() { channel.write(part, promise: nil) }
        channel.writeAndFlush(parts[parts.count - 1]).whenFailure { answer.fail($0) }
    }

    /// Closes the connection.
    public func close() async {
        try? await channel.close()
    }
}

/// The loop behind ``BenchConnection/repeatedly(_:body:count:schedule:)``; lives on the channel's event loop.
///
/// It is the load generator's per-request path, so it allocates nothing per request: the answer comes back as a
/// call (``ExchangeAnswer``), not through a promise and its future; a request's due time is a scheduled callback of
/// the loop, not a scheduled task with its promise; a write's failure closes the channel, and the closing answers the
/// pending request with ``BenchmarkError/Code/connectionClosed``.
private final class RepeatedRequests: ExchangeAnswer, NIOScheduledCallbackHandler {
    let channel: any Channel
    let handler: ExchangeHandler
    let request: ByteBuffer
    let name: String
    let count: Int
    let schedule: [NIODeadline]?
    let done: EventLoopPromise<[Double]>
    var latencies: [Double] = []
    /// What the pending request's latency counts from.
    var reference = NIODeadline.uptimeNanoseconds(0)

    init(
        channel: any Channel, handler: ExchangeHandler, request: ByteBuffer, name: String, count: Int, schedule: [NIODeadline]?,
        done: EventLoopPromise<[Double]>
    ) {
        self.channel = channel
        self.handler = handler
        self.request = request
        self.name = name
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
            reference = due
            do {
                try channel.eventLoop.assumeIsolated().scheduleCallback(at: due, handler: self)
            } catch {
                done.fail(error)
            }
        } else {
            send(from: schedule?[index] ?? .now())
        }
    }

    func handleScheduledCallback(eventLoop: some EventLoop) {
        send(from: reference)
    }

    func didCancelScheduledCallback(eventLoop: some EventLoop) {
        done.fail(BenchmarkError(.connectionClosed, "\(name): the event loop shut down before the request was sent"))
    }

    private func send(from reference: NIODeadline) {
        self.reference = reference
        // On the loop, an active channel stays so until this write is done: a write that fails closes it, and its
        // closing answers the request. A channel closed already would never answer.
        guard channel.isActive else {
            done.fail(BenchmarkError(.connectionClosed, "\(name): the connection is closed"))
            return
        }
        handler.start(self, keepBody: false)
        channel.writeAndFlush(request, promise: nil)
    }

    func answered(_ result: Result<BenchConnection.Response, any Error>) {
        switch result {
        case .success(let response) where (200..<300).contains(response.status):
            latencies.append(Double((NIODeadline.now() - reference).nanoseconds) / 1e6)
            next()
        case .success(let response):
            done.fail(BenchmarkError.status(response.status, to: name))
        case .failure(let error):
            done.fail(error)
        }
    }
}

/// Who waits for an exchange's response: called once, on the channel's event loop, with the response or the failure.
private protocol ExchangeAnswer: AnyObject {
    func answered(_ result: Result<BenchConnection.Response, any Error>)
}

/// An answer that completes a promise.
private final class PromisedAnswer: ExchangeAnswer {
    let promise: EventLoopPromise<BenchConnection.Response>

    init(_ promise: EventLoopPromise<BenchConnection.Response>) {
        self.promise = promise
    }

    func answered(_ result: Result<BenchConnection.Response, any Error>) {
        promise.completeWith(result)
    }
}

/// Answers the pending exchange when its response ends, reading the response bytes with
/// ``ResponseParser``.
private final class ExchangeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private var answer: (any ExchangeAnswer)?
    private var parser = ResponseParser()

    func start(_ answer: any ExchangeAnswer, keepBody: Bool) {
        self.answer = answer
        parser.reset(keepBody: keepBody)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        do {
            if let response = try parser.feed(&bytes) {
                let answer = self.answer
                self.answer = nil
                answer?.answered(.success(response))
            }
        } catch {
            fail(error)
            context.close(promise: nil)
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
        let answer = self.answer
        self.answer = nil
        answer?.answered(.failure(error))
    }
}

/// The load generator's HTTP/1.1 response reader: the status code, then the body framed by `Content-Length` or
/// chunked transfer coding, counted (and kept on request). One response at a time; bytes after it are an error,
/// since the generator never pipelines.
struct ResponseParser {
    private enum State { case head, body(remaining: Int), chunkSize, chunk(remaining: Int), chunkEnd, trailer }
    private var state = State.head
    private var pending = ByteBuffer()
    private var status = 0
    private var bodyBytes = 0
    private var keepBody = false
    private var body: ByteBuffer?

    /// The largest response head accepted.
    static let maximumHeadBytes = 64 * 1024

    /// Starts reading a new response.
    mutating func reset(keepBody: Bool) {
        state = .head
        pending.clear()
        status = 0
        bodyBytes = 0
        self.keepBody = keepBody
        body = nil
    }

    /// Consumes `bytes`; returns the response once it is complete.
    mutating func feed(_ bytes: inout ByteBuffer) throws -> BenchConnection.Response? {
        if pending.readableBytes == 0 { pending = bytes } else { pending.writeBuffer(&bytes) }
        while true {
            switch state {
            case .head:
                guard let end = Self.headLength(pending) else {
                    guard pending.readableBytes <= Self.maximumHeadBytes else { throw malformed("a response head over 64 KiB") }
                    return nil
                }
                try pending.withUnsafeReadableBytes { raw in try readHead(UnsafeRawBufferPointer(rebasing: raw[..<end])) }
                pending.moveReaderIndex(forwardBy: end)
            case .body(let remaining):
                let take = min(remaining, pending.readableBytes)
                consumeBody(take)
                if remaining - take > 0 {
                    state = .body(remaining: remaining - take)
                    return nil
                }
                return try finish()
            case .chunkSize:
                guard let line = readLine() else { return nil }
                let hex = line.split(separator: ";", maxSplits: 1).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
                guard let size = Int(hex, radix: 16), size >= 0 else { throw malformed("chunk size '\(line)'") }
                state = size == 0 ? .trailer : .chunk(remaining: size)
            case .chunk(let remaining):
                let take = min(remaining, pending.readableBytes)
                consumeBody(take)
                if remaining - take > 0 {
                    state = .chunk(remaining: remaining - take)
                    return nil
                }
                state = .chunkEnd
            case .chunkEnd:
                guard let line = readLine() else { return nil }
                guard line.isEmpty else { throw malformed("chunk not followed by CRLF") }
                state = .chunkSize
            case .trailer:
                guard let line = readLine() else { return nil }
                if line.isEmpty { return try finish() }
            }
        }
    }

    private static let lineEnd = Array("\r\n".utf8)

    /// The length of the response head (through its blank line) at the start of `buffer`, if it is all there.
    private static func headLength(_ buffer: ByteBuffer) -> Int? {
        buffer.withUnsafeReadableBytes { raw -> Int? in
            guard raw.count >= 4 else { return nil }
            for i in 3..<raw.count where raw[i] == 10 && raw[i - 1] == 13 && raw[i - 2] == 10 && raw[i - 3] == 13 { return i + 1 }
            return nil
        }
    }

    /// Reads the status code and the body's framing from a response head's bytes (no String per response).
    private mutating func readHead(_ head: UnsafeRawBufferPointer) throws {
        let prefix: [UInt8] = Array("HTTP/1.".utf8)
        func digit(_ i: Int) -> Int? { head[i] >= 48 && head[i] <= 57 ? Int(head[i] - 48) : nil }
        guard head.count >= 12, prefix.indices.allSatisfy({ head[$0] == prefix[$0] }), head[8] == 32,
            let d0 = digit(9), let d1 = digit(10), let d2 = digit(11)
        else { throw malformed("status line '\(String(decoding: head.prefix(64), as: UTF8.self))'") }
        status = d0 * 100 + d1 * 10 + d2
        var length: Int?
        var chunked = false
        // Header lines: from after the status line's CR LF to the blank line.
        var start = 12
        while start < head.count, head[start] != 10 { start += 1 }
        start += 1
        while start < head.count - 2 {
            var end = start
            while end < head.count - 1, !(head[end] == 13 && head[end + 1] == 10) { end += 1 }
            let line = UnsafeRawBufferPointer(rebasing: head[start..<end])
            guard let colon = line.firstIndex(of: 58) else { throw malformed("header line '\(String(decoding: line, as: UTF8.self))'") }
            let name = UnsafeRawBufferPointer(rebasing: line[..<colon])
            var valueStart = colon + 1
            while valueStart < line.count, line[valueStart] == 32 || line[valueStart] == 9 { valueStart += 1 }
            var valueEnd = line.count
            while valueEnd > valueStart, line[valueEnd - 1] == 32 || line[valueEnd - 1] == 9 { valueEnd -= 1 }
            let value = UnsafeRawBufferPointer(rebasing: line[valueStart..<valueEnd])
            if Self.equalsIgnoringCase(name, Self.contentLength) {
                var parsed = 0
                guard !value.isEmpty, value.count <= 18 else { throw malformed("Content-Length '\(String(decoding: value, as: UTF8.self))'") }
                for byte in value {
                    guard byte >= 48 && byte <= 57 else { throw malformed("Content-Length '\(String(decoding: value, as: UTF8.self))'") }
                    parsed = parsed * 10 + Int(byte - 48)
                }
                length = parsed
            } else if Self.equalsIgnoringCase(name, Self.transferEncoding) {
                chunked = String(decoding: value, as: UTF8.self).lowercased().contains("chunked")
            }
            start = end + 2
        }
        if chunked {
            state = .chunkSize
        } else if let length, length > 0, !(100..<200).contains(status), status != 204, status != 304 {
            state = .body(remaining: length)
        } else {
            state = .body(remaining: 0)
        }
    }

    private static let contentLength = Array("content-length".utf8)
    private static let transferEncoding = Array("transfer-encoding".utf8)

    private static func equalsIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ lowercase: [UInt8]) -> Bool {
        guard bytes.count == lowercase.count else { return false }
        for i in 0..<bytes.count where bytes[i] | 0x20 != lowercase[i] && !(lowercase[i] == 45 && bytes[i] == 45) { return false }
        return true
    }

    private mutating func readLine() -> String? {
        guard let end = pending.readableBytesView.firstRange(of: Self.lineEnd) else { return nil }
        let line = pending.readString(length: end.lowerBound - pending.readerIndex) ?? ""
        pending.moveReaderIndex(forwardBy: 2)
        return line
    }

    private mutating func consumeBody(_ count: Int) {
        guard count > 0 else { return }
        bodyBytes += count
        if keepBody, var slice = pending.readSlice(length: count) {
            if body == nil { body = slice } else { body!.writeBuffer(&slice) }
        } else {
            pending.moveReaderIndex(forwardBy: count)
        }
    }

    private mutating func finish() throws -> BenchConnection.Response {
        guard pending.readableBytes == 0 else { throw malformed("\(pending.readableBytes) bytes after the response") }
        pending.discardReadBytes()
        let response = BenchConnection.Response(status: status, bodyBytes: bodyBytes, body: body)
        state = .head
        body = nil
        return response
    }

    private func malformed(_ what: String) -> BenchmarkError {
        BenchmarkError(.unexpectedResponse, "malformed HTTP response: \(what)", context: ["detail": what])
    }
}

import Crypto
import Foundation
public import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import HTTPTypes
public import Logging
public import NIOCore
import OrchardFormats
import OrchardProtocol
import OrchardSupport
public import Prometheus
public import ServiceLifecycle
import Synchronization

/// The request context of the coordinator's routes: Hummingbird's core context and the peer's address.
public struct CoordinatorRequestContext: RequestContext, RemoteAddressRequestContext {
    /// Hummingbird's core context.
    public var coreContext: CoreRequestContextStorage
    /// The connected peer's address.
    public let remoteAddress: SocketAddress?

    /// Creates the context of a request arriving on `source`'s channel.
    public init(source: ApplicationRequestContextSource) {
        coreContext = CoreRequestContextStorage(source: source)
        remoteAddress = source.channel.remoteAddress
    }

    /// The peer's IP address (no port), as the domain's ``ClientAddress``; nil when unknown (e.g. a Unix socket).
    var clientAddress: ClientAddress? { remoteAddress?.ipAddress.map(ClientAddress.init) }
}

/// The coordinator's HTTP API (Hummingbird 2): thin routes over ``Coordinator``.
public enum CoordinatorServer {
    /// Builds the router for every endpoint in `Endpoint`.
    /// - Parameters:
    ///   - coordinator: The started coordinator.
    ///   - registry: The Prometheus registry served at `/metrics`.
    ///   - dashboard: The dashboard's sessions and history (`/dashboard`); nil serves no dashboard and admits only the
    ///     admin token.
    ///   - secureCookie: Whether the dashboard's session cookie is `Secure` (served over TLS).
    public static func router(
        coordinator: Coordinator, registry: PrometheusCollectorRegistry, dashboard: Dashboard? = nil, secureCookie: Bool = false
    ) -> Router<CoordinatorRequestContext> {
        let router = Router(context: CoordinatorRequestContext.self)
        router.add(middleware: ErrorMiddleware(logger: Logger(label: "orchard.http")))
        let limits = coordinator.configuration
        let digests = RepresentationDigests()

        let healthy = Array(#"{"status":"ok"}"#.utf8)
        router.get(RouterPath(stringLiteral: Endpoint.health)) { _, _ in json(bytes: healthy) }
        router.get(RouterPath(stringLiteral: Endpoint.metrics)) { _, _ in
            var headers = HTTPFields()
            headers[.contentType] = "text/plain; version=0.0.4; charset=utf-8"
            return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
        }
        router.get(RouterPath(stringLiteral: Endpoint.openAPI)) { _, _ in
            var headers = HTTPFields()
            headers[.contentType] = MediaType.json
            return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: OpenAPI.document)))
        }

        // Device API.
        router.post(RouterPath(stringLiteral: Endpoint.authenticate)) { request, context in
            let message = try await decode(AuthenticateRequest.self, request, limit: limits.maximumMessageBytes)
            return try json(await coordinator.authenticate(message, from: context.clientAddress))
        }
        router.post(RouterPath(stringLiteral: Endpoint.cycleRequest)) { request, _ in
            let session = try await deviceSession(request, coordinator)
            // The hottest request is read directly when it is plain JSON; anything else takes the strict decoder.
            let body = try await collect(request, limit: limits.maximumMessageBytes)
            let message = try body.withUnsafeBytes { raw in try CycleRequest.directDecode(raw) ?? decode(CycleRequest.self, body: body) }
            let answer = try await coordinator.requestCycle(message, session: session)
            // The hottest answer is written directly (JSONEncoder would cost more than the rest of the request).
            guard let bytes = answer.directJSON() else { return try json(answer) }
            return json(bytes: bytes)
        }
        router.get(RouterPath(stringLiteral: Endpoint.model(":\(Endpoint.Parameter.model)"))) { request, context in
            let session = try await deviceSession(request, coordinator)
            let key = try requestKey(request)
            let modelID = context.parameters.get(Endpoint.Parameter.model) ?? ""
            var format = ModelFormat.safetensors
            if let name = request.uri.queryParameters.get(Endpoint.formatQuery) {
                guard let chosen = ModelFormat(rawValue: String(name)) else {
                    let known = ModelFormat.allCases.map(\.rawValue).joined(separator: ", ")
                    throw CoordinatorError(.invalidRequest, "format '\(name.prefix(40))' is not one of \(known)")
                }
                format = chosen
            }
            let download = try await coordinator.model(modelID, requestKey: key, session: session, format: format)
            var response = try ranged(download.bytes, etag: download.etag, request: request)
            if download.format == .mlmodel { response.headers[.contentType] = "application/octet-stream" }
            response.headers[RepresentationDigests.field] = digests.value(of: download.bytes, etag: download.etag)
            return response
        }
        router.get(RouterPath(stringLiteral: Endpoint.plan(":\(Endpoint.Parameter.plan)"))) { request, context in
            let session = try await deviceSession(request, coordinator)
            let key = try requestKey(request)
            return try json(await coordinator.plan(context.parameters.get(Endpoint.Parameter.plan) ?? "", requestKey: key, session: session))
        }
        router.post(RouterPath(stringLiteral: Endpoint.report)) { request, _ in
            try await offTheEventLoop {
                let session = try await deviceSession(request, coordinator)
                if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > limits.maximumReportBytes {
                    throw CoordinatorError(.payloadTooLarge, "body of \(length) bytes exceeds the limit of \(limits.maximumReportBytes)")
                }
                // Streamed: each chunk is checked and spooled as it arrives, never the whole body in memory.
                let upload = try coordinator.beginUpload(session: session)
                do {
                    for try await chunk in request.body {
                        try await upload.consume(chunk.readableBytesView)
                    }
                    return try json(await upload.finish())
                } catch {
                    await upload.abandon()
                    throw error
                }
            }
        }
        router.post(RouterPath(stringLiteral: Endpoint.evaluationReport)) { request, _ in
            let session = try await deviceSession(request, coordinator)
            let message = try await decode(EvaluationReport.self, request, limit: limits.maximumMessageBytes)
            return try json(await coordinator.evaluationReport(message, session: session))
        }
        router.post(RouterPath(stringLiteral: Endpoint.secureAggregation)) { request, _ in
            try await offTheEventLoop {
                let session = try await deviceSession(request, coordinator)
                // A masked input is the model's words: 4 bytes a word as a MaskedInputEnvelope (safetensors), a third more
                // in base64 JSON; the session's process sets the limit, and a process without secure aggregation is
                // refused, before the body is read. A body larger than a message takes one of the upload places, so
                // that large bodies held at once stay bounded.
                let bodyLimit = try await coordinator.secureAggregationBodyLimit(session: session)
                let length = request.headers[.contentLength].flatMap { Int($0) } ?? Int.max
                let large = length > limits.maximumMessageBytes
                if large { try coordinator.takeUploadPlace(workerID: session.workerID) }
                defer { if large { coordinator.endUpload(workerID: session.workerID) } }
                let message: SecureAggregationRequest
                if isSafetensors(request) {
                    let body = try await collect(request, limit: bodyLimit.safetensors)
                    do throws(FormatError) {
                        message = try MaskedInputEnvelope.decode(body)
                    } catch {
                        throw CoordinatorError(.malformedSafetensors, "the masked input: \(error.message)")
                    }
                } else {
                    // A poll, most of the requests, is read directly; anything else takes the strict decoder.
                    let body = try await collect(request, limit: bodyLimit.json)
                    message = try body.withUnsafeBytes { raw in
                        try SecureAggregationRequest.directDecode(raw) ?? decode(SecureAggregationRequest.self, body: body)
                    }
                }
                let reply = try await coordinator.secureAggregation(message, session: session)
                // Waits, most of the replies, are written directly.
                guard let bytes = reply.directJSON() else { return try json(reply) }
                return json(bytes: bytes)
            }
        }
        router.get(RouterPath(stringLiteral: Endpoint.speedTest)) { request, _ in
            let session = try await deviceSession(request, coordinator)
            var requested: Int?
            if let text = request.uri.queryParameters.get(Endpoint.bytesQuery) {
                guard let count = Int(text), count >= 1 else { throw CoordinatorError(.invalidRequest, "bytes must be a positive integer") }
                requested = count
            }
            let allowed = try await coordinator.admitSpeedTest(.download, requested: requested, session: session)
            var headers = HTTPFields()
            headers[.contentType] = "application/octet-stream"
            headers[.cacheControl] = "no-store"
            return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(repeating: 0x5A, count: requested ?? allowed)))
        }
        router.post(RouterPath(stringLiteral: Endpoint.speedTest)) { request, _ in
            let session = try await deviceSession(request, coordinator)
            let declared = request.headers[.contentLength].flatMap { Int($0) }
            let allowed = try await coordinator.admitSpeedTest(.upload, requested: declared, session: session)
            let body = try await collect(request, limit: allowed)
            return try json(SpeedTestUploadResponse(bytes: body.count))
        }

        // Admin API.
        router.post(RouterPath(stringLiteral: Endpoint.processes)) { request, context in
            try await offTheEventLoop {
                try requireAdmin(request, from: context.clientAddress, coordinator)
                let message = try await decode(HostProcessRequest.self, request, limit: limits.maximumAdminBodyBytes)
                return try json(await coordinator.host(message), status: .created)
            }
        }
        router.get(RouterPath(stringLiteral: Endpoint.processes)) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator, dashboard)
            return try json(await coordinator.processList())
        }
        router.get(RouterPath(stringLiteral: Endpoint.process(":\(Endpoint.Parameter.process)"))) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator, dashboard)
            return try json(await coordinator.status(processID: context.parameters.get(Endpoint.Parameter.process) ?? ""))
        }
        router.delete(RouterPath(stringLiteral: Endpoint.process(":\(Endpoint.Parameter.process)"))) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator)
            try await coordinator.delete(processID: context.parameters.get(Endpoint.Parameter.process) ?? "")
            return Response(status: .noContent)
        }
        router.get(RouterPath(stringLiteral: Endpoint.checkpoint(":\(Endpoint.Parameter.process)", ":\(Endpoint.Parameter.checkpoint)"))) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator, dashboard)
            let text = context.parameters.get(Endpoint.Parameter.checkpoint) ?? ""
            let number: Int?
            if text == "latest" {
                number = nil
            } else if let value = Int(text), value >= 0 {
                number = value
            } else {
                throw CoordinatorError(.invalidRequest, "checkpoint must be a non-negative integer or 'latest'")
            }
            let processID = context.parameters.get(Endpoint.Parameter.process) ?? ""
            let checkpoint = try await coordinator.checkpoint(processID: processID, number: number)
            var response = try ranged(checkpoint.bytes, etag: "\"\(processID).\(checkpoint.number)\"", request: request)
            response.headers[HTTPField.Name("Orchard-Checkpoint")!] = "\(checkpoint.number)"
            return response
        }
        let evaluationPath = RouterPath(stringLiteral: Endpoint.evaluation(":\(Endpoint.Parameter.process)"))
        router.put(evaluationPath) { request, context in
            try await offTheEventLoop {
                try requireAdmin(request, from: context.clientAddress, coordinator)
                let processID = context.parameters.get(Endpoint.Parameter.process) ?? ""
                let body = try await collect(request, limit: coordinator.configuration.maximumEvaluationDataBytes)
                return try json(await coordinator.attachEvaluationData(processID: processID, bytes: body))
            }
        }
        router.get(evaluationPath) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator, dashboard)
            return try json(await coordinator.evaluations(processID: context.parameters.get(Endpoint.Parameter.process) ?? ""))
        }
        router.delete(evaluationPath) { request, context in
            try requireAdmin(request, from: context.clientAddress, coordinator)
            try await coordinator.removeEvaluationData(processID: context.parameters.get(Endpoint.Parameter.process) ?? "")
            return Response(status: .noContent)
        }
        addDashboardRoutes(to: router, coordinator: coordinator, dashboard: dashboard, secureCookie: secureCookie)
        return router
    }

    /// Builds the application: the router bound to `host:port` (HTTPS when `tls` is given), with extra services
    /// (e.g. the cycle timer) run alongside and shut down gracefully with it.
    public static func application(
        coordinator: Coordinator, registry: PrometheusCollectorRegistry, host: String = "127.0.0.1", port: Int = 8080, tls: CoordinatorTLS? = nil,
        services: [any Service] = [], logger: Logger = Logger(label: "orchard.http"), dashboard: Dashboard? = nil,
        onServerRunning: @escaping @Sendable (Int) async -> Void = { _ in }
    ) throws -> some ApplicationProtocol {
        let idle = coordinator.configuration.connectionIdleTimeout.map { TimeAmount.nanoseconds($0.inNanoseconds) }
        let http1 = HTTP1Channel.Configuration(additionalChannelHandlers: [ReceiveBufferLimit()], idleTimeout: idle)
        return Application(
            router: router(coordinator: coordinator, registry: registry, dashboard: dashboard, secureCookie: tls != nil),
            server: HTTPServerBuilder { responder in
                if let tls {
                    return EventLoopBoundChannel(
                        base: try TLSChannel(HTTP1Channel(responder: responder, configuration: http1), tlsConfiguration: tls.configuration))
                }
                return EventLoopBoundChannel(base: HTTP1Channel(responder: responder, configuration: http1))
            },
            configuration: ApplicationConfiguration(address: .hostname(host, port: port), serverName: "orchard", backlog: 4096),
            services: services,
            onServerRunning: { channel in await onServerRunning(channel.localAddress?.port ?? port) },
            logger: logger
        )
    }

    // MARK: Helpers

    /// Runs a route's work on the global concurrent pool rather than on its connection's event loop
    /// (``EventLoopBoundChannel``): for the routes that check and write megabytes (reports, masked inputs, a hosted
    /// model's weights), so that the loop goes on reading and writing its other connections meanwhile.
    private static func offTheEventLoop(_ work: () async throws -> Response) async throws -> Response {
        try await withTaskExecutorPreference(globalConcurrentExecutor, operation: work)
    }

    private static func collect(_ request: Request, limit: Int) async throws -> [UInt8] {
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > limit {
            throw CoordinatorError(.payloadTooLarge, "body of \(length) bytes exceeds the limit of \(limit)")
        }
        // Chunks go straight into one array sized from Content-Length (collecting into a ByteBuffer first
        // would copy every report body twice).
        var bytes: [UInt8] = []
        bytes.reserveCapacity(min(limit, request.headers[.contentLength].flatMap { Int($0) } ?? 0))
        for try await chunk in request.body {
            guard bytes.count + chunk.readableBytes <= limit else {
                throw CoordinatorError(.payloadTooLarge, "body exceeds the limit of \(limit) bytes")
            }
            bytes.append(contentsOf: chunk.readableBytesView)
        }
        return bytes
    }

    /// Whether the body is declared as safetensors (`application/vnd.safetensors`, parameters ignored).
    private static func isSafetensors(_ request: Request) -> Bool {
        guard let type = request.headers[.contentType] else { return false }
        return type.split(separator: ";").first?.trimmingCharacters(in: .whitespaces).lowercased() == MediaType.safetensors
    }

    private static func decode<T: Decodable>(_ type: T.Type, _ request: Request, limit: Int) async throws -> T {
        try decode(type, body: try await collect(request, limit: limit))
    }

    private static func decode<T: Decodable>(_ type: T.Type, body: [UInt8]) throws -> T {
        do {
            // Strict: an admin request's unknown keys (a misspelt server_config field) are refused, not ignored.
            return try WireCoding.strictDecoder().decode(T.self, from: Data(body))
        } catch {
            // A process whose model or configurations do not decode (an unknown key, an unknown enum value) is an
            // invalid configuration, not malformed JSON.
            if T.self == HostProcessRequest.self, let error = error as? DecodingError, let context = error.context,
                let first = context.codingPath.first?.stringValue, ["model", "client_config", "server_config"].contains(first)
            {
                throw CoordinatorError(.invalidConfiguration, "\(describe(error))")
            }
            throw CoordinatorError(.malformedJSON, "body is not a valid \(T.self): \(describe(error))")
        }
    }

    private static func describe(_ error: any Error) -> String {
        guard let error = error as? DecodingError else { return "not JSON" }
        func path(_ context: DecodingError.Context) -> String {
            let joined = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
            return joined.isEmpty ? "" : " at \(joined)"
        }
        switch error {
        case .keyNotFound(let key, let context): return "missing key '\(key.stringValue)'\(path(context))"
        case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
            return context.debugDescription + path(context)
        @unknown default: return "\(error)"
        }
    }

    static func bearer(_ request: Request) -> String? {
        guard let value = request.headers[.authorization] else { return nil }
        // `Bearer <token>`, the scheme case-insensitive (RFC 9110), surrounding spaces ignored; on every request,
        // so it is parsed on the UTF-8 bytes.
        let utf8 = value.utf8
        guard utf8.count > 7 else { return nil }
        var index = utf8.startIndex
        for expected in "bearer ".utf8 {
            let byte = utf8[index]
            guard byte == expected || (expected != 0x20 && byte == expected - 0x20) else { return nil }
            index = utf8.index(after: index)
        }
        var end = utf8.endIndex
        while index < end, utf8[index] == 0x20 || utf8[index] == 0x09 { index = utf8.index(after: index) }
        while end > index, utf8[utf8.index(before: end)] == 0x20 || utf8[utf8.index(before: end)] == 0x09 { end = utf8.index(before: end) }
        return String(value[index..<end])
    }

    private static func deviceSession(_ request: Request, _ coordinator: Coordinator) async throws -> DeviceSession {
        guard let token = bearer(request) else {
            throw CoordinatorError.unauthorized("Authorization: Bearer <session token> is required")
        }
        return try await coordinator.session(forToken: token)
    }

    /// Admits the admin token as a bearer header, or (for reading: `GET`) a live dashboard session cookie.
    static func requireAdmin(_ request: Request, from address: ClientAddress?, _ coordinator: Coordinator, _ dashboard: Dashboard? = nil) throws {
        guard
            try coordinator.checkAdmin(token: bearer(request), from: address)
                || (request.method == .get && coordinator.configuration.adminToken != nil
                    && dashboard?.isValid(session: request.cookies[Dashboard.cookieName]?.value) == true)
        else {
            throw CoordinatorError.unauthorized(coordinator.configuration.adminToken == nil ? "the admin API is disabled" : "admin token required")
        }
    }

    private static func requestKey(_ request: Request) throws -> String {
        guard let key = request.uri.queryParameters.get(Endpoint.requestKeyQuery), !key.isEmpty else {
            throw CoordinatorError(.invalidRequest, "query parameter \(Endpoint.requestKeyQuery) is required")
        }
        return String(key)
    }

    /// A 200 answer of JSON already written.
    static func json(bytes: [UInt8]) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = MediaType.json
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        let data = try WireCoding.encoder().encode(value)
        var headers = HTTPFields()
        headers[.contentType] = MediaType.json
        return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// Serves immutable bytes with a strong ETag, `If-None-Match` (304) and a single `Range` (206/416), by the
    /// rules of ``DownloadSelection``.
    private static func ranged(_ bytes: [UInt8], etag: String, request: Request) throws -> Response {
        var headers = HTTPFields()
        headers[.eTag] = etag
        headers[.acceptRanges] = "bytes"
        headers[.contentType] = MediaType.safetensors
        let selection = try DownloadSelection.select(
            total: bytes.count, etag: etag, range: request.headers[.range], ifRange: request.headers[.ifRange],
            ifNoneMatch: request.headers[.ifNoneMatch]
        )
        switch selection {
        case .notModified:
            return Response(status: .notModified, headers: headers)
        case .whole:
            return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: bytes)))
        case .partial(let range):
            headers[.contentRange] = "bytes \(range.lowerBound)-\(range.upperBound - 1)/\(bytes.count)"
            return Response(status: .partialContent, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: bytes[range])))
        }
    }
}

extension DecodingError {
    /// The context of whichever case this is.
    fileprivate var context: Context? {
        switch self {
        case .keyNotFound(_, let context), .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context): context
        @unknown default: nil
        }
    }
}

/// Bounds what each connection keeps for receiving: NIO reads up to `maxMessagesPerRead` (4) times per wake-up and
/// keeps a pooled buffer per read, each grown to 64 KiB by a large upload, for the connection's life — 256 KiB per
/// idle keep-alive connection after a report (a heaptrack profile of the benchmark: 255 MB for a thousand devices).
/// One read per wake-up into at most 16 KiB keeps 16 KiB per connection.
final class ReceiveBufferLimit: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    // Everything passes through unchanged (the default `channelRead` forwards without unwrapping).
    typealias InboundIn = ByteBuffer

    func handlerAdded(context: ChannelHandlerContext) {
        guard let options = context.channel.syncOptions else { return }
        try? options.setOption(ChannelOptions.maxMessagesPerRead, value: 1)
        try? options.setOption(ChannelOptions.recvAllocator, value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 2048, maximum: 16384))
    }
}

public import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
public import OrchardProtocol
import Synchronization

/// The coordinator's HTTP API over `URLSession` (FoundationNetworking on Linux), so the same code runs on Apple
/// platforms and Linux devices.
///
/// Every call has a timeout; model downloads stream into their sink as bytes arrive, send `Range` and
/// `If-Range` when resuming, and report where the served bytes start and the whole file's SHA-256 (RFC 9530
/// `Repr-Digest: sha-256=:<base64>:`).
public struct HTTPTransport: ClientTransport {
    /// The coordinator's base URL.
    public let baseURL: URL
    /// Seconds a request may wait for data before it fails as a network error.
    public let timeout: Double
    private let session: URLSession

    /// Creates a transport.
    /// - Parameters:
    ///   - url: The coordinator's base URL, `http` or `https` with a host.
    ///   - timeout: Seconds a request may wait for data.
    /// - Throws: ``OrchardClientError/Code/invalidConfiguration`` when the URL is not an absolute HTTP(S) URL.
    public init(url: String, timeout: Double = 30) throws(OrchardClientError) {
        guard let parsed = URL(string: url), let scheme = parsed.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = parsed.host, !host.isEmpty
        else {
            throw OrchardClientError(.invalidConfiguration, "'\(url)' is not a coordinator URL such as https://fl.example.com or http://127.0.0.1:8080")
        }
        guard timeout > 0, timeout.isFinite else {
            throw OrchardClientError(.invalidConfiguration, "timeout must be a positive number of seconds, not \(timeout)")
        }
        baseURL = parsed
        self.timeout = timeout
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = timeout
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        session = URLSession(configuration: configuration)
    }

    public func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await exchange("POST", Endpoint.authenticate, body: request, session: nil)
    }

    public func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await exchange("POST", Endpoint.cycleRequest, body: request, session: session)
    }

    public func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        let request = try makeRequest("GET", Endpoint.plan(planID), query: [Endpoint.requestKeyQuery: requestKey], session: session)
        let (data, status) = try await send(request)
        return try decodeAnswer(TrainingPlan.self, data: data, status: status)
    }

    public func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        var request = try makeRequest("POST", Endpoint.report, session: session)
        request.setValue(MediaType.safetensors, forHTTPHeaderField: "Content-Type")
        request.httpBody = Data(body)
        let (data, status) = try await send(request)
        return try decodeAnswer(ReportResponse.self, data: data, status: status)
    }

    public func downloadModel(_ model: ModelRequest, session token: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        var request = try makeRequest("GET", Endpoint.model(model.modelID), query: [Endpoint.requestKeyQuery: model.requestKey], session: token)
        if model.offset > 0 {
            request.setValue("bytes=\(model.offset)-", forHTTPHeaderField: "Range")
            if let etag = model.etag { request.setValue(etag, forHTTPHeaderField: "If-Range") }
        }
        let delegate = DownloadDelegate(sink: sink)
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = timeout
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        let downloadSession = URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil)
        defer { downloadSession.finishTasksAndInvalidate() }
        let task = downloadSession.dataTask(with: request)
        let outcome: Result<Void, OrchardClientError> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                delegate.start(continuation)
                task.resume()
            }
        } onCancel: {
            task.cancel()
        }
        try outcome.get()
    }

    public func speedTest(_ direction: SpeedTestDirection, bytes: Int) async throws(OrchardClientError) -> Int {
        if direction == .download {
            let request = try makeRequest("GET", Endpoint.speedTest, query: [Endpoint.bytesQuery: String(bytes)], session: nil)
            let (data, status) = try await send(request)
            guard (200..<300).contains(status) else {
                throw OrchardClientError.server(status: status, body: try? WireCoding.decoder().decode(ErrorBody.self, from: data))
            }
            return data.count
        }
        var request = try makeRequest("POST", Endpoint.speedTest, session: nil)
        request.setValue("application/octet-stream", forHTTPHeaderField: "Content-Type")
        request.httpBody = Data(repeating: 0x5A, count: max(bytes, 0))
        let (data, status) = try await send(request)
        return try decodeAnswer(SpeedTestUploadResponse.self, data: data, status: status).bytes
    }

    // MARK: Helpers

    private func makeRequest(_ method: String, _ path: String, query: [String: String] = [:], session: String?) throws(OrchardClientError) -> URLRequest {
        guard var components = URLComponents(url: baseURL, resolvingAgainstBaseURL: false) else {
            throw OrchardClientError(.invalidConfiguration, "cannot build a request URL from \(baseURL)")
        }
        let prefix = components.path.hasSuffix("/") ? String(components.path.dropLast()) : components.path
        components.path = prefix + path
        if !query.isEmpty { components.queryItems = query.sorted { $0.key < $1.key }.map { URLQueryItem(name: $0.key, value: $0.value) } }
        guard let url = components.url else {
            throw OrchardClientError(.invalidConfiguration, "cannot build a request URL for \(path) from \(baseURL)")
        }
        var request = URLRequest(url: url, timeoutInterval: timeout)
        request.httpMethod = method
        request.setValue(WireProtocol.version.description, forHTTPHeaderField: WireProtocol.versionHeader)
        request.setValue(MediaType.json + ", " + MediaType.safetensors, forHTTPHeaderField: "Accept")
        if let session { request.setValue("Bearer \(session)", forHTTPHeaderField: "Authorization") }
        return request
    }

    private func exchange<Body: Encodable, Answer: Decodable>(_ method: String, _ path: String, body: Body, session: String?) async throws(OrchardClientError) -> Answer {
        var request = try makeRequest(method, path, session: session)
        do {
            request.httpBody = try WireCoding.encoder().encode(body)
        } catch {
            throw OrchardClientError(.invalidConfiguration, "cannot encode \(Body.self): \(error)")
        }
        request.setValue(MediaType.json, forHTTPHeaderField: "Content-Type")
        let (data, status) = try await send(request)
        return try decodeAnswer(Answer.self, data: data, status: status)
    }

    private func send(_ request: URLRequest) async throws(OrchardClientError) -> (Data, Int) {
        do {
            let (data, response) = try await session.data(for: request)
            guard let http = response as? HTTPURLResponse else {
                throw OrchardClientError(.network, "the answer from \(baseURL) is not HTTP")
            }
            return (data, http.statusCode)
        } catch let error as OrchardClientError {
            throw error
        } catch {
            throw Self.networkError(error, url: request.url)
        }
    }

    private func decodeAnswer<Answer: Decodable>(_ type: Answer.Type, data: Data, status: Int) throws(OrchardClientError) -> Answer {
        guard (200..<300).contains(status) else {
            throw OrchardClientError.server(status: status, body: try? WireCoding.decoder().decode(ErrorBody.self, from: data))
        }
        do {
            return try WireCoding.decoder().decode(Answer.self, from: data)
        } catch {
            throw OrchardClientError(.serverError, "the coordinator's answer is not a valid \(Answer.self): \(error)", httpStatus: status)
        }
    }

    /// Maps a URL loading error to a client error.
    static func networkError(_ error: any Error, url: URL?) -> OrchardClientError {
        if let urlError = error as? URLError, urlError.code == .cancelled {
            return cancelledError()
        }
        if error is CancellationError { return cancelledError() }
        return OrchardClientError(.network, "request to \(url?.absoluteString ?? "the coordinator") failed: \(error.localizedDescription)")
    }
}

/// Streams one download's answer into a sink and reports its outcome once.
private final class DownloadDelegate: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    private struct State {
        var continuation: CheckedContinuation<Result<Void, OrchardClientError>, Never>?
        var failure: OrchardClientError?
        var status = 0
        var errorBody = Data()
        var finished = false
    }

    private let sink: any DownloadSink
    private let state = Mutex(State())

    init(sink: any DownloadSink) { self.sink = sink }

    func start(_ continuation: CheckedContinuation<Result<Void, OrchardClientError>, Never>) {
        state.withLock { $0.continuation = continuation }
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void
    ) {
        guard let http = response as? HTTPURLResponse else {
            fail(OrchardClientError(.network, "the model answer is not HTTP"), task: dataTask)
            completionHandler(.cancel)
            return
        }
        state.withLock { $0.status = http.statusCode }
        let etag = http.value(forHTTPHeaderField: "ETag")
        let digest = http.value(forHTTPHeaderField: ModelIntegrity.digestHeader).flatMap { ModelIntegrity.parseSHA256(fieldValue: $0) }
        let length = http.expectedContentLength >= 0 ? Int(http.expectedContentLength) : nil
        let head: DownloadHead
        switch http.statusCode {
        case 200:
            head = DownloadHead(start: 0, totalLength: length, etag: etag, sha256: digest)
        case 206:
            guard let range = http.value(forHTTPHeaderField: "Content-Range"), let parsed = Self.parseContentRange(range) else {
                fail(OrchardClientError(.serverError, "206 answer without a valid Content-Range", httpStatus: 206), task: dataTask)
                completionHandler(.cancel)
                return
            }
            head = DownloadHead(start: parsed.start, totalLength: parsed.total, etag: etag, sha256: digest)
        default:
            completionHandler(.allow)
            return
        }
        do {
            try sink.begin(head)
            completionHandler(.allow)
        } catch {
            fail(error, task: dataTask)
            completionHandler(.cancel)
        }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        let status = state.withLock { $0.status }
        guard status == 200 || status == 206 else {
            state.withLock { $0.errorBody.append(data) }
            return
        }
        do {
            try sink.append([UInt8](data))
        } catch {
            fail(error, task: dataTask)
        }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        let (continuation, result) = state.withLock { state -> (CheckedContinuation<Result<Void, OrchardClientError>, Never>?, Result<Void, OrchardClientError>) in
            let result: Result<Void, OrchardClientError>
            if let failure = state.failure {
                result = .failure(failure)
            } else if let error {
                result = .failure(HTTPTransport.networkError(error, url: task.originalRequest?.url))
            } else if state.status == 200 || state.status == 206 {
                result = .success(())
            } else {
                let body = try? WireCoding.decoder().decode(ErrorBody.self, from: state.errorBody)
                result = .failure(OrchardClientError.server(status: state.status, body: body))
            }
            let continuation = state.continuation
            state.continuation = nil
            state.finished = true
            return (continuation, result)
        }
        continuation?.resume(returning: result)
    }

    private func fail(_ error: OrchardClientError, task: URLSessionTask) {
        state.withLock { if $0.failure == nil { $0.failure = error } }
        task.cancel()
    }

    /// Parses `bytes a-b/total`.
    static func parseContentRange(_ value: String) -> (start: Int, total: Int?)? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        guard trimmed.hasPrefix("bytes ") else { return nil }
        let spec = trimmed.dropFirst(6)
        let parts = spec.split(separator: "/", maxSplits: 1)
        guard parts.count == 2, let dash = parts[0].firstIndex(of: "-"), let start = Int(parts[0][..<dash]) else { return nil }
        return (start, parts[1] == "*" ? nil : Int(parts[1]))
    }
}

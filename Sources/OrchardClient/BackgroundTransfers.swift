public import Foundation
#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif
public import OrchardProtocol
import OrchardSupport
import Synchronization

/// Model downloads and report uploads through a background `URLSession`, which the system carries on while the app
/// is suspended, and finishes by relaunching it (`sessionSendsLaunchEvents`): the transfers Apple's guidance moves
/// out of the app's own process. Every other call goes through `inner` (the HTTP transport).
///
/// A transfer that finishes while nobody waits for it — the app was suspended or relaunched — is kept in
/// ``directory`` under its key (the model and request key, or a digest of the report's body), and the next call for
/// the same model or report takes the kept result instead of transferring again. The system's relaunch hands the
/// app a completion handler for the session's events: pass it to ``handleEventsForBackgroundURLSession(_:completionHandler:)``.
///
/// Background sessions trust the system's certificate authorities only (no private CA), and read uploads from files.
public final class BackgroundTransferTransport: NSObject, ClientTransport, URLSessionDataDelegate, URLSessionDownloadDelegate, @unchecked Sendable {
    /// The transport for everything else.
    public let inner: any ClientTransport
    /// The coordinator's base URL.
    public let baseURL: URL
    /// Where finished transfers nobody waited for are kept, and report bodies are staged for upload.
    public let directory: URL
    /// The background session's identifier.
    public let identifier: String

    private struct Waiter {
        var id: UInt64
        var continuation: CheckedContinuation<Finished, Never>
    }

    private struct State {
        var waiters: [String: [Waiter]] = [:]
        var inFlight: Set<String> = []
        var received: [Int: [UInt8]] = [:]
        /// Transfers that finished while nobody waited, by key (also written to disk, for a later launch).
        var finished: [String: Finished] = [:]
        var nextWaiter: UInt64 = 0
    }

    /// A finished transfer: the HTTP status, its headers' entity tag and model digest (`Repr-Digest`), and the body.
    struct Finished: Sendable {
        var status: Int
        var etag: String?
        var digest: String? = nil
        var body: [UInt8]
        var failure: String?
    }

    private let state = Mutex(State())
    /// The relaunch's events: the app's completion handler, and whether the session already said it delivered them
    /// (the two can arrive in either order). Main-actor state: UIKit hands the handler over on the main thread.
    @MainActor private var eventsDone: (() -> Void)?
    @MainActor private var eventsFinished = false
    private var session: URLSession!

    /// Creates the transport and (re)connects to the background session `identifier`: transfers a previous launch
    /// started are delivered to this one.
    /// - Parameters:
    ///   - baseURL: The coordinator, e.g. `https://fl.example.com`.
    ///   - inner: The transport for authentication, cycle requests, plans and the rest.
    ///   - directory: A directory of the app's own (created if needed).
    ///   - identifier: The background session's identifier, fixed for the app.
    public init(baseURL: URL, inner: any ClientTransport, directory: URL, identifier: String = "dev.orchard.transfers") throws(OrchardClientError) {
        self.baseURL = baseURL
        self.inner = inner
        self.directory = directory
        self.identifier = identifier
        super.init()
        do { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) } catch {
            throw OrchardClientError(.storage, "cannot create the transfer directory \(directory.path): \(FileAccessError(error, writing: true).message)")
        }
        #if canImport(FoundationNetworking)
        // Linux has no background sessions: the same delegate-driven session runs in the process (the HTTP
        // transport's resumable downloads stay the default there).
        let configuration = URLSessionConfiguration.default
        #else
        let configuration = URLSessionConfiguration.background(withIdentifier: identifier)
        configuration.sessionSendsLaunchEvents = true
        configuration.isDiscretionary = false
        #endif
        session = URLSession(configuration: configuration, delegate: self, delegateQueue: nil)
    }

    /// Call from the app delegate's `application(_:handleEventsForBackgroundURLSession:completionHandler:)` (UIKit
    /// calls it on the main thread with a plain closure): the handler runs on the main thread once the session has
    /// delivered the relaunch's events, at once if it already has. Returns `false` for another session's identifier
    /// (the app handles that one itself).
    @MainActor @discardableResult
    public func handleEventsForBackgroundURLSession(_ identifier: String, completionHandler: @escaping () -> Void) -> Bool {
        guard identifier == self.identifier else { return false }
        if eventsFinished {
            eventsFinished = false
            completionHandler()
        } else {
            eventsDone = completionHandler
        }
        return true
    }

    /// Stops the session (its finished transfers stay kept).
    public func invalidate() { session.finishTasksAndInvalidate() }

    // MARK: ClientTransport

    public func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse { try await inner.authenticate(request) }
    public func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await inner.requestCycle(request, session: session)
    }
    public func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }
    public func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        try await inner.speedTest(direction, bytes: bytes, session: session)
    }
    public func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        try await inner.secureAggregation(request, session: session)
    }

    /// Starts downloading the assignment's model in the background and returns at once: the download goes on while
    /// the app is suspended, and ``downloadModel(_:session:into:)`` for the same model takes its result (or waits for
    /// it). Call it as soon as a cycle is assigned.
    public func prefetchModel(_ request: ModelRequest, session token: String) throws(OrchardClientError) {
        let key = Self.key(request)
        let started = state.withLock { $0.inFlight.insert(key).inserted }
        guard started else { return }
        try startDownload(request, key: key, session: token)
    }

    public func downloadModel(_ request: ModelRequest, session token: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        let key = Self.key(request)
        let finished: Finished
        if let kept = try takeKept(key) {
            finished = kept
        } else {
            // Wait for a download already in flight (a prefetch, or one a relaunch is finishing), else start one.
            let attach = state.withLock { !$0.inFlight.insert(key).inserted }
            if attach {
                finished = try await wait(for: key) {}
            } else {
                finished = try await wait(for: key) { () throws(OrchardClientError) in try startDownload(request, key: key, session: token) }
            }
        }
        if let failure = finished.failure { throw OrchardClientError(.network, "model download failed: \(failure)") }
        guard finished.status == 200 else { throw Self.serverError(status: finished.status, body: finished.body) }
        // The coordinator's SHA-256 of the model travels with it, so the job verifies the bytes as over HTTP.
        let sha256 = finished.digest.flatMap { ModelIntegrity.parseSHA256(fieldValue: $0) }
        try sink.begin(DownloadHead(start: 0, totalLength: finished.body.count, etag: finished.etag, sha256: sha256))
        try sink.append(finished.body)
    }

    public func report(_ body: [UInt8], session token: String) async throws(OrchardClientError) -> ReportResponse {
        let key = "report-\(Self.digest(body))"
        let finished: Finished
        if let kept = try takeKept(key) {
            finished = kept
        } else if state.withLock({ !$0.inFlight.insert(key).inserted }) {
            // The same report is already on its way (an earlier call, or a relaunch finishing it): wait for its answer.
            finished = try await wait(for: key) {}
        } else {
            // Background sessions upload from files only.
            let staged = directory.appendingPathComponent("\(key).upload")
            var urlRequest: URLRequest
            do {
                try Data(body).write(to: staged, options: .atomic)
                urlRequest = try makeRequest(Endpoint.report, query: [:], session: token)
            } catch {
                state.withLock { _ = $0.inFlight.remove(key) }
                if let error = error as? OrchardClientError { throw error }
                throw OrchardClientError(.storage, "cannot stage the report for upload: \(FileAccessError(error, writing: true).message)")
            }
            urlRequest.httpMethod = "POST"
            urlRequest.setValue(MediaType.safetensors, forHTTPHeaderField: "Content-Type")
            let task = session.uploadTask(with: urlRequest, fromFile: staged)
            task.taskDescription = key
            finished = try await wait(for: key) { task.resume() }
            try? FileManager.default.removeItem(at: staged)
        }
        if let failure = finished.failure { throw OrchardClientError(.network, "report upload failed: \(failure)") }
        guard (200..<300).contains(finished.status) else { throw Self.serverError(status: finished.status, body: finished.body) }
        do { return try WireCoding.decoder().decode(ReportResponse.self, from: Data(finished.body)) } catch {
            throw OrchardClientError(.serverError, "the coordinator's answer is not a valid ReportResponse: \(error)", httpStatus: finished.status)
        }
    }

    private static func key(_ request: ModelRequest) -> String {
        "model-\(safe(request.modelID))-\(safe(request.requestKey))-\(request.format)"
    }

    private func startDownload(_ request: ModelRequest, key: String, session token: String) throws(OrchardClientError) {
        var urlRequest: URLRequest
        do throws(OrchardClientError) {
            urlRequest = try makeRequest(
                Endpoint.model(request.modelID),
                query: [
                    Endpoint.requestKeyQuery: request.requestKey, Endpoint.formatQuery: request.format.rawValue,
                ], session: token)
        } catch {
            state.withLock { _ = $0.inFlight.remove(key) }
            throw error
        }
        urlRequest.httpMethod = "GET"
        let task = session.downloadTask(with: urlRequest)
        task.taskDescription = key
        task.resume()
    }

    // MARK: Waiting and keeping

    /// Waits for the transfer under `key`, after `start` (which starts it, or nothing when it is already on its way).
    /// A result that arrived before the wait began (kept in memory, or on disk by an earlier launch) is taken at once;
    /// looking for it and registering happen under one lock, so a delivery can never fall between them. A `start` that
    /// throws ends the wait with its error, and the other callers waiting for the same key with a failure: nothing is
    /// left waiting for a transfer that never started. Cancelling the waiting task ends its wait with `cancelled`; the
    /// transfer goes on and is kept for the next call.
    private func wait(for key: String, start: () throws(OrchardClientError) -> Void) async throws(OrchardClientError) -> Finished {
        let onDisk = kept(key)
        let id = state.withLock { state -> UInt64 in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        var startError: OrchardClientError?
        let finished = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Finished, Never>) in
                let ready = state.withLock { state -> Finished? in
                    if let done = state.finished.removeValue(forKey: key) ?? onDisk { return done }
                    if Task.isCancelled { return Finished(status: 0, etag: nil, body: [], failure: Self.cancelledFailure) }
                    state.waiters[key, default: []].append(Waiter(id: id, continuation: continuation))
                    return nil
                }
                if let ready {
                    continuation.resume(returning: ready)
                    return
                }
                do throws(OrchardClientError) {
                    try start()
                } catch {
                    startError = error
                    let waiters = state.withLock { state -> [Waiter] in
                        state.inFlight.remove(key)
                        return state.waiters.removeValue(forKey: key) ?? []
                    }
                    let failed = Finished(status: 0, etag: nil, body: [], failure: "the transfer could not start: \(error.message)")
                    for waiter in waiters { waiter.continuation.resume(returning: failed) }
                }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.waiters[key]?.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters[key]?.remove(at: index)
            }
            waiter?.continuation.resume(returning: Finished(status: 0, etag: nil, body: [], failure: Self.cancelledFailure))
        }
        if let startError { throw startError }
        if finished.failure == Self.cancelledFailure {
            throw OrchardClientError(.cancelled, "the background transfer's wait was cancelled; the transfer goes on")
        }
        return finished
    }

    private static let cancelledFailure = "cancelled"

    /// Hands a finished transfer to its waiters, or keeps it (in memory, and on disk for a later launch) for the next
    /// call with the same key.
    private func deliver(_ key: String, _ finished: Finished) {
        let waiters = state.withLock { state -> [Waiter] in
            state.inFlight.remove(key)
            let waiters = state.waiters.removeValue(forKey: key) ?? []
            if waiters.isEmpty { state.finished[key] = finished }
            return waiters
        }
        if !waiters.isEmpty {
            for waiter in waiters { waiter.continuation.resume(returning: finished) }
            return
        }
        let record = KeptTransfer(status: finished.status, etag: finished.etag, digest: finished.digest, body: Data(finished.body), failure: finished.failure)
        if let data = try? JSONEncoder().encode(record) {
            try? data.write(to: directory.appendingPathComponent("\(key).kept"), options: .atomic)
        }
    }

    private struct KeptTransfer: Codable {
        var status: Int
        var etag: String?
        var digest: String?
        var body: Data
        var failure: String?
    }

    /// The kept result of a transfer that finished while nobody waited (a failure included), removed as it is taken:
    /// this launch's from memory, an earlier launch's from disk.
    private func kept(_ key: String) -> Finished? {
        let url = directory.appendingPathComponent("\(key).kept")
        if let inMemory = state.withLock({ $0.finished.removeValue(forKey: key) }) {
            try? FileManager.default.removeItem(at: url)
            return inMemory
        }
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        defer { try? FileManager.default.removeItem(at: url) }
        guard let data = try? Data(contentsOf: url), let record = try? JSONDecoder().decode(KeptTransfer.self, from: data) else { return nil }
        return Finished(status: record.status, etag: record.etag, digest: record.digest, body: [UInt8](record.body), failure: record.failure)
    }

    /// A kept result to use instead of transferring: a kept failure is not one (the caller transfers again).
    private func takeKept(_ key: String) throws(OrchardClientError) -> Finished? {
        guard let finished = kept(key), finished.failure == nil else { return nil }
        return finished
    }

    // MARK: URLSession delegate

    public func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL) {
        guard let key = downloadTask.taskDescription else { return }
        // The file at `location` is removed when this method returns: read it now.
        let body = (try? Data(contentsOf: location)).map { [UInt8]($0) } ?? []
        let response = downloadTask.response as? HTTPURLResponse
        deliver(
            key,
            Finished(
                status: response?.statusCode ?? 0, etag: response?.value(forHTTPHeaderField: "ETag"),
                digest: response?.value(forHTTPHeaderField: ModelIntegrity.digestHeader), body: body, failure: nil
            ))
    }

    public func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        let id = dataTask.taskIdentifier
        state.withLock { $0.received[id, default: []] += [UInt8](data) }
    }

    public func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let key = task.taskDescription else { return }
        let body = state.withLock { $0.received.removeValue(forKey: task.taskIdentifier) } ?? []
        if let error {
            deliver(key, Finished(status: 0, etag: nil, body: [], failure: "\(error.localizedDescription)"))
        } else if !(task is URLSessionDownloadTask) {
            let response = task.response as? HTTPURLResponse
            deliver(key, Finished(status: response?.statusCode ?? 0, etag: nil, body: body, failure: nil))
        }
    }

    public func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession) {
        // Apple asks for the handler on the main queue; the app may not have handed it over yet.
        Task { @MainActor in sessionFinishedEvents() }
    }

    /// The session delivered the relaunch's events: call the app's handler, or remember it for when it arrives.
    @MainActor func sessionFinishedEvents() {
        if let done = eventsDone {
            eventsDone = nil
            done()
        } else {
            eventsFinished = true
        }
    }

    // MARK: Helpers

    private func makeRequest(_ path: String, query: [String: String], session: String) throws(OrchardClientError) -> URLRequest {
        guard var components = URLComponents(url: baseURL, resolvingAgainstBaseURL: false) else {
            throw OrchardClientError(.invalidConfiguration, "cannot build a request URL from \(baseURL)")
        }
        let prefix = components.path.hasSuffix("/") ? String(components.path.dropLast()) : components.path
        components.path = prefix + path
        if !query.isEmpty { components.queryItems = query.sorted { $0.key < $1.key }.map { URLQueryItem(name: $0.key, value: $0.value) } }
        guard let url = components.url else { throw OrchardClientError(.invalidConfiguration, "cannot build a request URL for \(path) from \(baseURL)") }
        var request = URLRequest(url: url)
        request.setValue(WireProtocol.version.description, forHTTPHeaderField: WireProtocol.versionHeader)
        request.setValue("Bearer \(session)", forHTTPHeaderField: "Authorization")
        return request
    }

    private static func serverError(status: Int, body: [UInt8]) -> OrchardClientError {
        OrchardClientError.server(status: status, body: try? WireCoding.decoder().decode(ErrorBody.self, from: Data(body)), retryAfter: nil)
    }

    /// A name safe in a file name.
    private static func safe(_ text: String) -> String {
        String(text.map { $0.isLetter || $0.isNumber || $0 == "." || $0 == "_" ? $0 : "-" })
    }

    /// A digest of a report's bytes (FNV-1a, 64 bits): the report's key.
    private static func digest(_ bytes: [UInt8]) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return String(hash, radix: 16)
    }
}

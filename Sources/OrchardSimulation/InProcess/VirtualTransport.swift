import Foundation
import OrchardSupport
import Logging
import OrchardClient
import OrchardFormats
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import OrchardScheduler
import Synchronization

/// The device's transport: the real one (HTTP on loopback, or in-process calls), with its calls ordered on the
/// fleet's virtual time line and its transfers taking the device's link time.
struct VirtualTransport: ClientTransport {
    let inner: any ClientTransport
    let link: DeviceLink

    func interrupted(_ reason: DeviceLink.Interruption) -> OrchardClientError {
        switch reason {
        case .expired: OrchardClientError(.cancelled, "the background window expired during a transfer")
        case .killed: OrchardClientError(.cancelled, "the device went away")
        case .roundOver: OrchardClientError(.cancelled, "the round ended before the call")
        }
    }

    func call<T: Sendable>(effect: (T) -> FleetTimeline.Effect = { _ in .none }, _ body: () async throws(OrchardClientError) -> T)
        async throws(OrchardClientError) -> T
    {
        do {
            return try await link.call(effect: effect, body).get()
        } catch let error as DeviceLink.Interruption {
            throw interrupted(error)
        } catch let error as OrchardClientError {
            throw error
        } catch {
            throw OrchardClientError(.network, "\(error)")
        }
    }

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await call { () async throws(OrchardClientError) in try await inner.authenticate(request) }
    }

    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        let response = try await call(effect: { (response: CycleResponse) in
            if case .rejected(let rejection) = response, rejection.reason == "cycle_full" { return .cycleFull }
            return .none
        }) { () async throws(OrchardClientError) in try await inner.requestCycle(request, session: session) }
        if case .accepted = response { link.noteCheckIn(admitted: true) } else { link.noteCheckIn(admitted: false) }
        return response
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await call { () async throws(OrchardClientError) in try await inner.plan(planID, requestKey: requestKey, session: session) }
    }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        let buffer = BufferedDownload()
        try await call { () async throws(OrchardClientError) in try await inner.downloadModel(request, session: session, into: buffer) }
        let (head, bytes) = buffer.contents
        // The bytes arrive over the link's time; a window's end or the device going away cuts the transfer.
        let start = link.clock.seconds
        let seconds = Double(bytes.count) / link.profile.downloadBytesPerSecond
        var arrived = bytes.count
        var interruption: DeviceLink.Interruption?
        do { try await link.spend(seconds) } catch {
            interruption = error
            arrived = seconds > 0 ? min(bytes.count, Int(Double(bytes.count) * (link.clock.seconds - start) / seconds)) : 0
        }
        if let head {
            try sink.begin(head)
            if arrived > 0 { try sink.append(arrived == bytes.count ? bytes : Array(bytes[..<arrived])) }
        }
        link.noteDownload(arrived)
        if let interruption { throw interrupted(interruption) }
    }

    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await report(byteCount: body.count, body: { () throws(OrchardClientError) -> [UInt8] in body }, session: session)
    }

    /// The upload takes the link's time for `byteCount` bytes; the report is read (from the device's disk) only once
    /// the call's turn comes, so the devices waiting for theirs do not hold their reports in memory.
    func report(byteCount: Int, body: () throws(OrchardClientError) -> [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        do { try await link.spend(Double(byteCount) / link.profile.uploadBytesPerSecond) } catch { throw interrupted(error) }
        let response = try await call(effect: { $0.cycleClosed ? .closedCycle : .none }) { () async throws(OrchardClientError) in
            try await inner.report(try body(), session: session)
        }
        link.noteUpload(byteCount)
        link.noteReported()
        return response
    }
}

extension VirtualTransport {
    /// A secure-aggregation step: the device may go away before the message of share_keys, masked_input or unmask
    /// (the fleet's dropout, drawn per stage; going away before advertise_keys is the dropout during its download and
    /// training); the request's and the answer's bytes take the device's link time.
    func secureAggregation(_ request: SecureAggregationRequest, session: String) async throws(OrchardClientError) -> SecureAggregationReply {
        let stage: SecureAggregationStage? =
            request.advertiseKeys != nil
            ? .advertiseKeys
            : request.shareKeys != nil
                ? .shareKeys
                : request.maskedInput != nil ? .maskedInput : request.consistencyCheck != nil ? .consistencyCheck : request.unmask != nil ? .unmask : nil
        if let stage, stage != .advertiseKeys, await link.dropsBefore(stage) { throw interrupted(.killed) }
        // The bytes the request takes on the wire. Over HTTP the body is encoded once, here, and the answer's size is
        // the HTTP transport's; in process, where nothing is encoded, both are counted as the HTTP transport would send them.
        let http = inner as? HTTPTransport
        let body = http == nil ? nil : try SecureAggregationBody(request)
        let up: Int
        if let body {
            up = body.bytes.count
        } else if request.maskedInput != nil, request.maskedInputFormat == .safetensors {
            up = MaskedInputEnvelope.byteCount(request)
        } else if let poll = request.directJSON() {
            up = poll.count
        } else {
            var light = request
            light.maskedInput?.words = []
            let wordBytes = 4 * (request.maskedInput?.words.count ?? 0)
            up = ((try? WireCoding.encoder().encode(light).count) ?? 0) + (wordBytes + 2) / 3 * 4
        }
        do { try await link.spend(Double(up) / link.profile.uploadBytesPerSecond) } catch { throw interrupted(error) }
        let (reply, answerBytes) = try await call(effect: { $0.reply.cycleClosed ? .closedCycle : .none }) {
            () async throws(OrchardClientError) -> (reply: SecureAggregationReply, answerBytes: Int?) in
            if let http, let body {
                let (reply, bytes) = try await http.secureAggregation(body, session: session)
                return (reply, bytes)
            }
            return (try await inner.secureAggregation(request, session: session), nil)
        }
        let down = answerBytes ?? reply.directJSON()?.count ?? (try? WireCoding.encoder().encode(reply).count) ?? 0
        link.noteUpload(up)
        if let stage { link.noteSecureStep(stage) }
        do { try await link.spend(Double(down) / link.profile.downloadBytesPerSecond) } catch { throw interrupted(error) }
        link.noteDownload(down)
        return reply
    }

    /// An evaluation result: a small JSON message each way, on the device's link.
    func evaluationReport(_ report: EvaluationReport, session: String) async throws(OrchardClientError) -> EvaluationReportResponse {
        let up = (try? WireCoding.encoder().encode(report).count) ?? 256
        do { try await link.spend(Double(up) / link.profile.uploadBytesPerSecond) } catch { throw interrupted(error) }
        let response = try await call { () async throws(OrchardClientError) in try await inner.evaluationReport(report, session: session) }
        link.noteUpload(up)
        return response
    }

    /// The speed test's bytes take the device's link time, so the SDK measures the device's profile.
    func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        let moved = try await call { () async throws(OrchardClientError) in try await inner.speedTest(direction, bytes: bytes, session: session) }
        let rate = direction == .download ? link.profile.downloadBytesPerSecond : link.profile.uploadBytesPerSecond
        do { try await link.spend(Double(moved) / rate) } catch { throw interrupted(error) }
        return moved
    }
}

/// Holds a download until its link time has passed.
final class BufferedDownload: DownloadSink {
    private let state = Mutex<(head: DownloadHead?, bytes: [UInt8])>((nil, []))

    var contents: (DownloadHead?, [UInt8]) { state.withLock { ($0.head, $0.bytes) } }

    func begin(_ head: DownloadHead) throws(OrchardClientError) {
        state.withLock {
            $0.head = head
            // The bytes arrive in chunks: room for all of them at once rather than growing (and copying) as they come;
            // at most 256 MiB up front, whatever length the coordinator announced (it is checked after the download).
            if let total = head.totalLength, total > head.start { $0.bytes.reserveCapacity(min(total - head.start, 256 << 20)) }
        }
    }
    func append(_ bytes: [UInt8]) throws(OrchardClientError) { state.withLock { $0.bytes += bytes } }
}

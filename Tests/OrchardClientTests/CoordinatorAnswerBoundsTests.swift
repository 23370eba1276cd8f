import Foundation
@testable import OrchardClient
import OrchardProtocol
import OrchardScheduler
import OrchardSupport
import Testing

/// What a device does with answers that are legal on the wire but must not be taken at face value: a wait too long
/// to schedule, a refusal that did not come from the coordinator, an assignment refreshed to another model.
@Suite("Coordinator answers at their bounds")
struct CoordinatorAnswerBoundsTests {
    typealias Cases = JobCycleStateMachineTests

    @Test("a retry-after beyond a week, or not a number of seconds, is heard as a week; a negative one as now")
    func retryAfterIsBounded() {
        #expect(RetryAfter.bounded(1e19) == RetryAfter.longest)
        #expect(RetryAfter.bounded(.infinity) == RetryAfter.longest)
        #expect(RetryAfter.bounded(-5) == 0)
        #expect(RetryAfter.bounded(.nan) == 0)
        #expect(RetryAfter.bounded(120) == 120)
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        #expect(RetryAfter.seconds("9999999999999999999", now: now) == RetryAfter.longest)
        #expect(RetryAfter.seconds(String(repeating: "9", count: 400), now: now) == RetryAfter.longest)
        #expect(RetryAfter.seconds("Fri, 31 Dec 9999 23:59:59 GMT", now: now) == RetryAfter.longest)
        let error = OrchardClientError.server(status: 503, body: nil, retryAfter: 1e300)
        #expect(error.retryAfter == RetryAfter.longest)
    }

    @Test("a rejection or a report receipt asking to wait 10¹⁹ s finishes the cycle with a week")
    func farWaitsFinishBounded() throws {
        var machine = Cases.machine()
        _ = machine.start(constraints: .none)
        _ = machine.stateLoaded(Cases.stored(), now: Cases.now)
        let rejected = machine.cycleAnswered(.rejected(CycleRejection(retryAfter: 1e19, reason: "cycle_full")))
        #expect(Cases.outcome(rejected) == .rejected(retryAfter: RetryAfter.longest, reason: "cycle_full"))

        var reporting = Cases.machine()
        _ = try Cases.toTraining(&reporting)
        _ = reporting.trainingEnded(.completed(try Cases.update()))
        let done = reporting.reportAnswered(ReportResponse(cycle: 3, reportsReceived: 1, retryAfter: 1e19))
        #expect(Cases.outcome(done)?.retryAfter == RetryAfter.longest)
    }

    @Test("a date too far to be an instant is taken as the bound instead of trapping")
    func farDatesSaturate() {
        let far = WallInstant(Date(timeIntervalSince1970: 1e300))
        let infinite = WallInstant(Date(timeIntervalSince1970: .infinity))
        #expect(far == infinite)
        #expect(far > WallInstant(Date(timeIntervalSince1970: 1e12)))
        #expect(WallInstant(Date(timeIntervalSince1970: -.infinity)) < WallInstant(Date(timeIntervalSince1970: -1e12)))
        #expect(WallInstant(Date(timeIntervalSince1970: .nan)) == WallInstant(sinceEpoch: .zero))
        // An ordinary date is unchanged, to the nanosecond.
        #expect(WallInstant(Date(timeIntervalSince1970: 1_700_000_000.25)).sinceEpoch == .seconds(1_700_000_000) + .milliseconds(250))
    }

    @Test("a report refused by something between device and coordinator (no Orchard error body) is kept for the next window")
    func reportKeptWhenAProxyRefuses() throws {
        for status in [404, 408, 413] {
            var machine = Cases.machine()
            _ = try Cases.toTraining(&machine)
            _ = machine.trainingEnded(.completed(try Cases.update()))
            let actions = machine.requestFailed(.server(status: status, body: nil))
            #expect(!Cases.names(actions).contains("clearPendingReport"), "HTTP \(status) without an error body discarded the report")
            #expect(Cases.failure(actions)?.httpStatus == status)
        }
        // The coordinator's own refusal still discards it: it cannot ever be accepted.
        var refused = Cases.machine()
        _ = try Cases.toTraining(&refused)
        _ = refused.trainingEnded(.completed(try Cases.update()))
        let actions = refused.requestFailed(.server(status: 400, body: ErrorBody(code: .shapeMismatch, message: "shapes differ")))
        #expect(Cases.names(actions) == ["clearPendingReport", "fail:server_error"])
    }

    @Test("a checkpoint resumed for one assignment is not applied after the assignment is refreshed to another model")
    func refreshedAssignmentDropsTheResumeState() throws {
        let state: [UInt8] = [1, 2, 3]
        let key = ClientStore.CheckpointKey(requestKey: "k1", modelID: "p.2", cycle: 3)
        var machine = Cases.machine()
        try Cases.toModel(&machine, stored: Cases.stored(checkpoint: (key, state)))
        _ = machine.cachedModelLoaded(nil, info: nil)
        // The buffered process published p.3 since the assignment: the download is refused and the cycle asked again.
        let superseded = machine.requestFailed(.server(status: 404, body: ErrorBody(code: .unknownCheckpoint, message: "superseded")))
        #expect(Cases.names(superseded).suffix(1) == ["requestCycle"])
        let refreshed = machine.cycleAnswered(.accepted(Cases.assignment(key: "k1", modelID: "p.3")))
        #expect(Cases.names(refreshed) == ["discardCheckpoint", "phase:downloadingPlan", "downloadPlan"])
        _ = machine.planDownloaded(Cases.plan, shapes: try Cases.shapes())
        _ = machine.cachedModelLoaded(nil, info: nil)
        let bytes = try Fixture.initialWeights()
        let info = ClientStore.ModelInfo(modelID: "p.3", etag: "\"p.3\"", totalLength: bytes.count, sha256: Data(ModelIntegrity.sha256(bytes)))
        let training = machine.modelDownloaded(bytes, info: info)
        #expect(Cases.names(training) == ["keepModel", "phase:training", "train"])
        #expect(Cases.trainingInput(training)?.resumeState == nil)
    }
}

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

/// The device's link and the OS's limits on it: moves the device's clock for transfers and training, cuts them
/// at the window's end (and waits for the OS to expire the task) or at the moment the device goes away, and puts
/// its coordinator calls in the fleet's virtual-time order.
final class DeviceLink: Sendable {
    /// Why a stretch of work stopped short.
    enum Interruption: Error {
        /// The background window ended; the OS has expired the task (its Swift task is cancelled).
        case expired
        /// The device went away.
        case killed
        /// The round ended before the call.
        case roundOver
    }

    let device: Int
    let clock: ManualClock
    let profile: DeviceProfile
    private let timeline: FleetTimeline
    private let coordinator: FleetCoordinator
    private let state: Mutex<(round: DeviceRoundState, stopped: Bool)>
    private let failed = FirstError<SimulationError>()

    init(device: Int, clock: ManualClock, profile: DeviceProfile, timeline: FleetTimeline, coordinator: FleetCoordinator) {
        self.device = device
        self.clock = clock
        self.profile = profile
        self.timeline = timeline
        self.coordinator = coordinator
        state = Mutex((DeviceRoundState(record: DeviceRoundRecord(device: device)), false))
    }

    func begin(_ round: DeviceRoundState) { state.withLock { $0 = (round, false) } }
    /// A failure of the simulation itself (not of the device) met during a call.
    var failure: SimulationError? { failed.value }
    func end() -> DeviceRoundRecord { state.withLock { $0.round.record } }
    func setWindowEnd(_ time: Double) { state.withLock { $0.round.windowEnd = time } }
    /// Whether the device went away or the round ended: no more windows this round.
    var isStopped: Bool { state.withLock { $0.stopped } }
    func noteExpiration(at time: Double) { state.withLock { $0.round.record.expirations.append(time) } }
    func noteResumption() {
        let now = clock.seconds
        state.withLock { $0.round.record.resumptions.append(now) }
    }

    /// The next boundary of the device's work: the window's end or the moment it goes away.
    var boundary: Double {
        state.withLock { min($0.round.windowEnd, $0.round.killAt ?? .infinity) }
    }

    /// Spends `seconds` of the device's time, or stops at the window's end or when the device goes away.
    func spend(_ seconds: Double) async throws(Interruption) {
        let now = clock.seconds
        let target = now + seconds
        let (windowEnd, killAt) = state.withLock { ($0.round.windowEnd, $0.round.killAt) }
        if let killAt, killAt <= windowEnd, target >= killAt {
            clock.advance(to: killAt)
            state.withLock {
                $0.round.record.droppedAt = killAt
                $0.stopped = true
            }
            await timeline.moved(device)
            throw .killed
        }
        if target > windowEnd {
            // The scheduler's timer fires at the window's end and expires the task, cancelling this one (a
            // microsecond past the end, so its deadline is reached whatever the rounding of its arithmetic).
            clock.advance(to: windowEnd + 1e-6)
            await timeline.moved(device)
            try? await clock.sleepUntilCancelled()
            throw .expired
        }
        clock.advance(to: target)
        await timeline.moved(device)
    }

    /// Makes one coordinator call at the device's current virtual time, in the fleet's order; `effect` tells from the
    /// call's answer what it did to the round (a report closing the cycle, a check-in turned away as `cycle_full`).
    func call<T: Sendable>(effect: (T) -> FleetTimeline.Effect = { _ in .none }, _ body: () async throws(OrchardClientError) -> T) async throws(Interruption)
        -> Result<T, OrchardClientError>
    {
        let time = clock.seconds
        if let killAt = state.withLock({ $0.round.killAt }), time >= killAt {
            state.withLock {
                $0.round.record.droppedAt = killAt
                $0.stopped = true
            }
            throw .killed
        }
        do {
            try await timeline.acquire(device, at: time)
        } catch {
            state.withLock { $0.stopped = true }
            throw .roundOver
        }
        coordinator.move(to: time)
        let result: Result<T, OrchardClientError>
        do throws(OrchardClientError) { result = .success(try await body()) } catch { result = .failure(error) }
        var outcome = FleetTimeline.Effect.none
        if case .success(let value) = result { outcome = effect(value) }
        // A secure cycle can also close inside a call whose answer does not say so (a stage found past its deadline);
        // a plain one closes with the report that says it.
        if case .none = outcome, coordinator.secureStageTimeout != nil, await coordinator.roundCycleClosed() { outcome = .closedCycle }
        await timeline.release(at: time, effect: outcome)
        return result
    }

    /// Records the device as gone if it goes away before `time`; true when it did.
    /// Sets when the device goes away during its next task (nil: it does not), for a second task in the same round.
    func rearm(killAt: Double?) { state.withLock { $0.round.killAt = killAt } }

    func dropIfGone(before time: Double) -> Bool {
        state.withLock { state in
            guard let killAt = state.round.killAt, killAt < time else { return false }
            state.round.record.droppedAt = killAt
            state.stopped = true
            return true
        }
    }

    func noteCheckIn(admitted: Bool) {
        let now = clock.seconds
        state.withLock {
            if $0.round.record.checkedInAt == nil { $0.round.record.checkedInAt = now }
            if admitted && $0.round.record.assignedAt == nil { $0.round.record.assignedAt = now }
        }
    }

    func noteReported() {
        let now = clock.seconds
        state.withLock { $0.round.record.reportedAt = now }
    }

    func noteDownload(_ bytes: Int) {
        let now = clock.seconds
        state.withLock { $0.round.record.downloads.append(Transfer(time: now, bytes: bytes)) }
    }

    /// Whether the device goes away before sending `stage`'s message (a draw of its own per device, round and stage);
    /// if so it is recorded as gone now.
    func dropsBefore(_ stage: SecureAggregationStage) async -> Bool {
        let salt: UInt64 =
            switch stage {
            case .advertiseKeys: 1
            case .shareKeys: 2
            case .maskedInput: 3
            case .consistencyCheck: 5
            default: 4
            }
        let now = clock.seconds
        let dropped = state.withLock { state in
            let round = state.round
            let draw = OrchardRandomAccess.uniform(seed: round.seed, a: UInt64(device), b: UInt64(round.round) << 3 | salt, salt: 0x5EC_A66)
            guard draw < round.stageDropout else { return false }
            state.round.record.droppedAt = now
            state.stopped = true
            return true
        }
        if dropped { await timeline.moved(device) }
        return dropped
    }

    /// The device's local training diverged: it drops out of the round now.
    func noteDiverged() async {
        await dropOut(diverged: true)
    }

    /// The device holds every one of its samples out for evaluation: it has nothing to train on and sends nothing this
    /// round (a dropout, as a phone in that state would be).
    func noteNothingToTrain() async {
        await dropOut(diverged: false)
    }

    private func dropOut(diverged: Bool) async {
        let now = clock.seconds
        state.withLock { state in
            state.round.record.droppedAt = now
            if diverged { state.round.record.diverged = true }
            state.stopped = true
        }
        await timeline.moved(device)
    }

    /// The coordinator accepted the device's message of `stage`.
    func noteSecureStep(_ stage: SecureAggregationStage) {
        let now = clock.seconds
        state.withLock {
            $0.round.record.secureSteps.insert(stage)
            if stage == .maskedInput { $0.round.record.reportedAt = now }
        }
    }

    func noteUpload(_ bytes: Int) {
        let now = clock.seconds
        state.withLock { $0.round.record.uploads.append(Transfer(time: now, bytes: bytes)) }
    }
}

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

/// A byte transfer on a device's link, at the virtual time it ended.
struct Transfer: Sendable, Hashable {
    var time: Double
    var bytes: Int
}

/// What one device did in one round, on its virtual clock (the fleet keeps what happened before the round ended).
struct DeviceRoundRecord: Sendable {
    var device: Int
    /// When it first asked for the round's cycle (admitted or turned away).
    var checkedInAt: Double?
    /// When the coordinator first admitted it to the round's cycle.
    var assignedAt: Double?
    /// When its report was accepted.
    var reportedAt: Double?
    /// When it went away (app killed, network gone) for the rest of the round.
    var droppedAt: Double?
    /// When the OS expired its background task with training unfinished.
    var expirations: [Double] = []
    /// When training resumed from a checkpoint in a later window.
    var resumptions: [Double] = []
    var downloads: [Transfer] = []
    var uploads: [Transfer] = []
    /// The secure-aggregation stages whose message the coordinator accepted.
    var secureSteps: Set<SecureAggregationStage> = []
}

/// The OS side of a device's round: the window it is in and the moment it will be killed, if it will.
struct DeviceRoundState: Sendable {
    var windowEnd = Double.infinity
    var killAt: Double?
    var record: DeviceRoundRecord
    /// The probability of going away before each secure-aggregation stage's message, and the draws' seed and round.
    var stageDropout = 0.0
    var seed: UInt64 = 0
    var round = 0
}

/// One virtual device: its own clock, scheduler (BGTaskScheduler's contract, with power and network read from the
/// availability trace at the device's virtual time), Orchard client with its job directory on disk, link speeds
/// and data slice. The simulator plays the OS: it grants background windows when the device is eligible and kills
/// the app when the device drops out; everything else is the SDK's own behaviour.
final class VirtualDevice: Sendable {
    static let taskIdentifier = "dev.orchard.simulation.train"
    /// The wall-clock date of virtual time zero on every device.
    static let epoch = ManualClock.simulationEpoch.date
    /// How far past the window's end the scheduler's deadline lies: work that ends exactly at the end stays inside
    /// the window, and a device that runs out of window moves its clock past the deadline (``DeviceLink/spend(_:)``)
    /// so the scheduler's expiry, not thread timing, decides.
    static let expiryMargin = 5e-7

    let index: Int
    let clock: ManualClock
    let scheduler: BackgroundScheduler<ManualClock>
    let job: FederatedJob
    private let link: DeviceLink
    private let failure = FirstError<OrchardClientError>()

    /// Sets up the device: its client and job in `directory`, its scheduler with the training task registered.
    init(
        index: Int, profile: DeviceProfile, directory: URL, transport: any ClientTransport, processName: String,
        processVersion: String, workload: some FleetWorkload, availability: Availability, windowSeconds: Double, seed: UInt64,
        timeline: FleetTimeline, coordinator: FleetCoordinator, slots: AsyncSemaphore
    ) async throws(SimulationError) {
        self.index = index
        let clock = ManualClock.virtual()
        self.clock = clock
        let link = DeviceLink(device: index, clock: clock, profile: profile, timeline: timeline, coordinator: coordinator)
        self.link = link
        let silent = Logger(label: "orchard.simulation.device") { _ in SwiftLogNoOpLogHandler() }
        let conditions = AvailabilityConditions(device: index, availability: availability, seed: seed, clock: clock)
        let epoch = Self.epoch
        // A retry's backoff passes on the device's clock, and ends with the window like any other wait.
        let environment = ClientEnvironment.seeded(seed ^ 0xC11E_57 &+ UInt64(index), clock: DeviceClock(link: link), seedNoise: true)
        var random = OrchardRandom.derived(seed: seed ^ 0x7EA1_7123, stream: UInt64(index))
        var configuration = DeviceConfiguration(
            storageDirectory: directory, environment: environment, trainingSeed: random.next(), conditions: conditions, logger: silent, durability: .unsynced)
        if coordinator.secureConsistencyCheck {
            (configuration.secureAggregationIdentity, configuration.secureAggregationAuthorities) = try SimulatedAttestation.credentials(
                seed: seed, device: index)
        }
        let client = CoordinatorConnection(
            transport: VirtualTransport(inner: transport, link: link), server: "orchard-simulation", configuration: configuration)
        do {
            job = try client.newJob(processName: processName, version: processVersion)
            scheduler = try BackgroundScheduler(
                configuration: SchedulerConfiguration(
                    permittedIdentifiers: [Self.taskIdentifier], processingBudget: .seconds(windowSeconds + Self.expiryMargin),
                    conditionPollInterval: .seconds(Int64.max / 8)
                ),
                clock: clock, startDate: epoch, conditions: conditions, logger: silent
            )
        } catch {
            throw SimulationError(.training, "device \(index) cannot be set up: \(error)")
        }
        let job = self.job
        let trainer = DeviceTrainer(device: index, workload: workload, link: link, slots: slots)
        let failure = self.failure
        do {
            try await scheduler.register(identifier: Self.taskIdentifier) { task in
                do throws(OrchardClientError) {
                    _ = try await job.run { context in try await trainer.train(context) }
                    task.setTaskCompleted(success: true)
                } catch  where error.code == .cancelled {
                    // The window expired (checkpoint saved), the device went away, or the round ended.
                    task.setTaskCompleted(success: false)
                } catch {
                    failure.record(error)
                    task.setTaskCompleted(success: false)
                }
            }
        } catch {
            throw SimulationError(.training, "device \(index) cannot register its background task: \(error)")
        }
    }

    /// Virtual seconds over which a device that drops out during its task goes away: its download, its training and
    /// (for a plain report) its upload. With secure aggregation the task ends with the training: each later stage's
    /// message draws its own dropout, so going away during the masked input's upload is that stage's draw, not a
    /// second one on top of it.
    static func dropoutSpan(modelBytes: Int, updates: Int, profile: DeviceProfile, secureStages: Bool) -> Double {
        let upload = secureStages ? 0 : Double(modelBytes) / profile.uploadBytesPerSecond
        return Double(modelBytes) / profile.downloadBytesPerSecond + Double(updates) * profile.secondsPerUpdate + upload
    }

    /// Runs the device's round: background windows from its check-in until it reports, is turned away, drops
    /// out, or the round ends.
    /// - Parameters:
    ///   - round: The round number (the dropout and resume-delay draws depend on it).
    ///   - deadline: The cycle's deadline.
    ///   - updates: Optimizer updates its local training takes (for the dropout point).
    ///   - modelBytes: Size of the model it downloads (for the dropout point).
    ///   - conditions: Fleet behaviour.
    ///   - seed: The simulation seed.
    ///   - timeline: The round's timeline (the device's clock must already be at its check-in time, and the device
    ///     in the timeline).
    func runRound(round: Int, deadline: Double, updates: Int, modelBytes: Int, conditions: FleetConditions, seed: UInt64, timeline: FleetTimeline)
        async throws(SimulationError) -> DeviceRoundRecord
    {
        let checkIn = clock.seconds
        var random = OrchardRandom.derived(seed: seed ^ 0xD0_0D1E, stream: UInt64(index) << 32 | UInt64(UInt32(truncatingIfNeeded: round)))
        var state = DeviceRoundState(record: DeviceRoundRecord(device: index), stageDropout: conditions.dropout, seed: seed, round: round)
        if random.nextDouble() < conditions.dropout {
            // It goes away somewhere between check-in and the moment its work would be done without interruptions.
            state.killAt =
                checkIn + random.nextDouble()
                * Self.dropoutSpan(
                    modelBytes: modelBytes, updates: updates, profile: link.profile, secureStages: conditions.secureStages
                )
        } else {
            _ = random.nextDouble()
        }
        guard var window = conditions.availability.window(for: index, atOrAfter: checkIn, seed: seed), window.start <= checkIn else {
            return state.record
        }
        var windowEnd = min(checkIn + conditions.windowSeconds, window.end)
        link.begin(state)
        // The app submits its training task when the round opens (the round-based simulation's stand-in for the
        // coordinator's pace steering: FedAvg draws from every eligible device each round), rather than at the
        // `retry_after` of its last report.
        do {
            // An expired run may run again as soon as the OS grants a window (the OS's delay is the fleet's
            // `resumeDelay`), not after an exponential backoff that would grow over the rounds.
            try await scheduler.submit(
                TaskRequest(
                    identifier: Self.taskIdentifier, kind: .processing, constraints: .powerAndNetwork,
                    retry: RetryPolicy(base: .zero, multiplier: 1, cap: .zero)
                ))
        } catch {
            throw SimulationError(.training, "device \(index) cannot submit its background task: \(error)")
        }
        while true {
            link.setWindowEnd(windowEnd)
            let report: WindowReport
            do {
                report = try await scheduler.runWindow(budget: .seconds(max(0, windowEnd + Self.expiryMargin - clock.seconds)), kinds: [.processing])
            } catch {
                throw SimulationError(.training, "device \(index)'s scheduler failed: \(error)")
            }
            if let error = failure.value {
                throw SimulationError(.training, "device \(index)'s job failed: \(error)")
            }
            if let error = link.failure { throw error }
            guard let run = report.runs.last, run.outcome == .expired, !link.isStopped else { break }
            link.noteExpiration(at: windowEnd)
            // The next background task: after the OS's delay and once the scheduler's retry of the expired task is
            // due, inside an eligibility window, before the deadline.
            let delay = conditions.resumeDelay.lowerBound + random.nextDouble() * (conditions.resumeDelay.upperBound - conditions.resumeDelay.lowerBound)
            guard let due = await scheduler.effectiveBeginDate(of: Self.taskIdentifier) else { break }
            let earliest = max(windowEnd + delay, due.timeIntervalSince(Self.epoch))
            let next = conditions.availability.window(for: index, atOrAfter: earliest, seed: seed)
            let start = next.map { max(earliest, $0.start) } ?? .infinity
            // Between windows the app is not running; a device that goes away before the next one drops out there.
            if link.dropIfGone(before: min(start, deadline)) { break }
            guard let next, start < deadline else { break }
            window = next
            clock.advance(to: start)
            await timeline.moved(index)
            windowEnd = min(start + conditions.windowSeconds, window.end)
        }
        return link.end()
    }
}

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
        do { try await link.spend(Double(body.count) / link.profile.uploadBytesPerSecond) } catch { throw interrupted(error) }
        let response = try await call(effect: { $0.cycleClosed ? .closedCycle : .none }) { () async throws(OrchardClientError) in
            try await inner.report(body, session: session)
        }
        link.noteUpload(body.count)
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
        // The bytes the request takes on the wire; a masked input's words are counted, not encoded twice.
        let up: Int
        if request.maskedInput != nil, request.maskedInputFormat == .safetensors {
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
        let reply = try await call(effect: { $0.cycleClosed ? .closedCycle : .none }) { () async throws(OrchardClientError) in
            try await inner.secureAggregation(request, session: session)
        }
        let down = reply.directJSON()?.count ?? (try? WireCoding.encoder().encode(reply).count) ?? 0
        link.noteUpload(up)
        if let stage { link.noteSecureStep(stage) }
        do { try await link.spend(Double(down) / link.profile.downloadBytesPerSecond) } catch { throw interrupted(error) }
        link.noteDownload(down)
        return reply
    }

    /// The speed test's bytes take the device's link time, so the SDK measures the device's profile.
    func speedTest(_ direction: SpeedTestDirection, bytes: Int, session: String) async throws(OrchardClientError) -> Int {
        let moved = try await call { () async throws(OrchardClientError) in try await inner.speedTest(direction, bytes: bytes, session: session) }
        let rate = direction == .download ? link.profile.downloadBytesPerSecond : link.profile.uploadBytesPerSecond
        do { try await link.spend(Double(moved) / rate) } catch { throw interrupted(error) }
        return moved
    }
}

/// The device's clock as its SDK sees it: the virtual clock, where a wait (a retry's backoff) is time the device
/// spends, ended by the window's end or the device going away like any other wait.
struct DeviceClock: WallClock {
    let link: DeviceLink

    var now: WallInstant { link.clock.now }
    var minimumResolution: Duration { .zero }

    func sleep(until deadline: WallInstant, tolerance: Duration? = nil) async throws {
        do { try await link.spend(max(.zero, now.duration(to: deadline)).inSeconds) } catch { throw CancellationError() }
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

/// The device's local training inside the job's cycle, through the SDK's trainer under the settings the
/// coordinator sent (``OrchardClient/CycleContext/training``): stretches of real training that fit the current
/// window (each update costs the device's `secondsPerUpdate` of virtual time), a checkpoint saved through the SDK
/// when the window ends first, and the resumed run in a later window continuing from it.
struct DeviceTrainer: Sendable {
    let device: Int
    let workload: any FleetWorkload
    let link: DeviceLink
    let slots: AsyncSemaphore

    func train(_ context: CycleContext) async throws -> LocalUpdate {
        let task = LocalTrainingTask(model: context.model, training: context.training)
        let total = context.training.plannedUpdates(samples: workload.sampleCount(device: device))
        let cost = link.profile.secondsPerUpdate
        var checkpoint = context.savedCheckpoint
        var done = 0
        if let checkpoint {
            link.noteResumption()
            done = try workload.completedUpdates(device: device, in: checkpoint, of: task)
        }
        while true {
            let fit = max(0, Int(((link.boundary - link.clock.seconds) / cost).rounded(.down)))
            let stretch = min(total - done, fit)
            if stretch > 0 {
                // The stretch's virtual time passes first, so the rest of the fleet need not wait for the computation.
                do {
                    try await link.spend(Double(stretch) * cost)
                } catch .expired {
                    // Rounding put the stretch a hair past the window's end: stop as at any expiry.
                    if let checkpoint { try context.saveCheckpoint(checkpoint) }
                    throw CancellationError()
                } catch {
                    throw CancellationError()
                }
                var paused = task
                paused.pauseAfterUpdates = done + stretch
                let stretchTask = paused
                let from = checkpoint
                let result = try await slots.runTraining { () throws -> LocalTrainingOutcome in
                    try workload.train(device: device, stretchTask, resumingFrom: from)
                }
                switch result {
                case .completed(let update):
                    return update
                case .interrupted(let state):
                    checkpoint = state
                    done += stretch
                }
            }
            do {
                try await link.spend(cost)
            } catch .expired {
                // Expired by the OS: persist everything the next window needs through the SDK, then stop.
                if let checkpoint { try context.saveCheckpoint(checkpoint) }
                throw CancellationError()
            } catch {
                throw CancellationError()
            }
        }
    }
}

/// Power and network as the availability trace says at the device's virtual time: charging on Wi-Fi while
/// eligible, on battery without network otherwise.
struct AvailabilityConditions: DeviceConditionsProvider {
    let device: Int
    let availability: Availability
    let seed: UInt64
    let clock: ManualClock

    func currentConditions() async -> DeviceConditions {
        let eligible = availability.isAvailable(device, at: clock.seconds, seed: seed)
        return DeviceConditions(
            onExternalPower: eligible, hasBattery: true, batteryLevel: eligible ? 0.9 : 0.5, batteryCharging: eligible,
            networkConnected: eligible, networkInterface: eligible ? "wlan0" : nil, networkInterfaceKind: eligible ? .wifi : nil,
            networkMetered: eligible ? false : nil, cpuIdleFraction: 0.9
        )
    }
}

/// The first error recorded by concurrent work.
final class FirstError<E: Error & Sendable>: Sendable {
    private let first = Mutex<E?>(nil)

    var value: E? { first.withLock { $0 } }

    func record(_ error: E) { first.withLock { $0 = $0 ?? error } }
}

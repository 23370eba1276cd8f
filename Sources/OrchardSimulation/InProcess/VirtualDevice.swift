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
    /// Whether the device dropped out because its local training diverged (NaN or infinity).
    var diverged = false
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
    let scheduler: BackgroundScheduler
    let job: FederatedJob
    private let link: DeviceLink
    /// Whether the process aggregates buffered: a round then spans virtual time, and the device checks in again at
    /// every window the OS grants it in the round (``FleetConditions/windowInterval``).
    private let buffered: Bool
    private let failure = FirstError<OrchardClientError>()

    /// Sets up the device: its client and job in `directory`, its scheduler with the training task registered.
    init(
        index: Int, profile: DeviceProfile, directory: URL, transport: any ClientTransport, processName: String,
        processVersion: String, workload: some FleetWorkload, availability: Availability, windowSeconds: Double, seed: UInt64,
        timeline: FleetTimeline, coordinator: FleetCoordinator, slots: AsyncSemaphore
    ) async throws(SimulationError) {
        self.index = index
        buffered = coordinator.buffered
        let clock = ManualClock.virtual()
        self.clock = clock
        let link = DeviceLink(device: index, clock: clock, profile: profile, timeline: timeline, coordinator: coordinator)
        self.link = link
        let silent = Logger(label: "orchard.simulation.device") { _ in SwiftLogNoOpLogHandler() }
        let conditions = AvailabilityConditions(device: index, availability: availability, seed: seed, clock: clock)
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
                clock: clock, conditions: conditions, logger: silent
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
                    if coordinator.evaluates {
                        _ = try await job.run(tasks: [.evaluation, .training], evaluate: { context in try await trainer.evaluate(context) }) { context in
                            try await trainer.train(context)
                        }
                    } else {
                        _ = try await job.run { context in try await trainer.train(context) }
                    }
                    task.setTaskCompleted(success: true)
                } catch  where error.code == .cancelled {
                    // The window expired (checkpoint saved), the device went away, or the round ended.
                    task.setTaskCompleted(success: false)
                } catch  where error.code == .diverged {
                    // Local training from this global model produced NaN or infinity (e.g. a model poisoned out of
                    // range): the device sends nothing and drops out of the round, as a phone would; the round's record
                    // counts it.
                    await link.noteDiverged()
                    task.setTaskCompleted(success: false)
                } catch  where error.code == .training && error.message.contains(DeviceTrainer.nothingToTrain) {
                    // Every sample held out (a small slice, a large holdout_fraction): the device sends nothing and drops
                    // out of the round, counted as such, rather than the whole run failing.
                    task.setTaskCompleted(success: false)
                } catch  where [.deadlinePassed, .reportTooStale].contains(error.serverCode) {
                    // Buffered: the device's work came too late (its assignment expired across windows, or the model it
                    // trained moved on past max_staleness); the SDK dropped the report, as on a phone, and the device
                    // comes back at a later window.
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

    /// Submits the training task. An expired run may run again as soon as the OS grants a window (the OS's delay is the
    /// fleet's `resumeDelay`), not after an exponential backoff that would grow over the rounds.
    private func submitTask() async throws(SimulationError) {
        do {
            try await scheduler.submit(
                TaskRequest(
                    identifier: Self.taskIdentifier, kind: .processing, constraints: .powerAndNetwork,
                    retry: RetryPolicy(base: .zero, multiplier: 1, cap: .zero)
                ))
        } catch {
            throw SimulationError(.training, "device \(index) cannot submit its background task: \(error)")
        }
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
        try await submitTask()
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
            guard let run = report.runs.last, !link.isStopped else { break }
            if run.outcome != .expired {
                // Buffered, with windows on the OS's schedule: the device checks in again at its next window in the round
                // (a report or a refusal ends only this window's work).
                guard buffered, let next = conditions.grantedWindow(device: index, atOrAfter: clock.seconds + 1, seed: seed), next < deadline,
                    let span = conditions.availability.window(for: index, atOrAfter: next, seed: seed)
                else { break }
                // A new task: it draws its own dropout, as the round's first one did.
                let goes = random.nextDouble() < conditions.dropout
                let point = random.nextDouble()
                link.rearm(
                    killAt: goes
                        ? next + point
                            * Self.dropoutSpan(modelBytes: modelBytes, updates: updates, profile: link.profile, secureStages: conditions.secureStages)
                        : nil)
                try await submitTask()
                window = span
                clock.advance(to: next)
                await timeline.moved(index)
                windowEnd = min(next + conditions.windowSeconds, window.end)
                continue
            }
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

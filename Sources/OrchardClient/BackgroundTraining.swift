import OrchardSupport
import Foundation
import Logging
public import OrchardML
public import OrchardProtocol
public import OrchardScheduler

extension FederatedJob {
    /// Registers this job as a background processing task and submits its first request, unless the scheduler
    /// already holds one for this identifier (a persistent scheduler restarted with the job's request in its
    /// store): that request is kept, with its earliest begin date (the coordinator's `retry_after`), so a restart
    /// does not ask the coordinator again at once. Kept requests whose constraints or priority differ from
    /// `options` are resubmitted with the same earliest begin date.
    ///
    /// Each launch trains one cycle on the dataset `data` returns. Expiry of the window cancels the Swift task,
    /// which stops training at the next batch boundary and saves a checkpoint; the task then completes as
    /// unsuccessful and the scheduler keeps its request. After a report or a rejection the job resubmits itself
    /// to begin at the coordinator's `retry_after` (or the options' `defaultInterval`).
    /// - Parameters:
    ///   - scheduler: The scheduler (register before it starts).
    ///   - options: Identifier, constraints and interval.
    ///   - data: Loads the device's local samples for a run.
    ///   - tasks: The tasks each window takes (``train(on:constraints:tasks:)``): an evaluation task first when the
    ///     coordinator has one, then training, by default.
    ///   - onOutcome: Called after each run with its outcome or error.
    public func scheduleBackgroundTraining(
        on scheduler: any BackgroundTaskScheduling, options: BackgroundTrainingOptions,
        data: @escaping @Sendable () async throws -> any Dataset, tasks: [DeviceTask] = [.evaluation, .training],
        onOutcome: @escaping @Sendable (Result<CycleOutcome, OrchardClientError>) -> Void = { _ in }
    ) async throws(OrchardClientError) {
        try await schedule(on: scheduler, options: options, kind: .processing, tasks: tasks, data: data, onOutcome: onOutcome)
    }

    /// Registers this job's evaluation tasks in short windows: an app-refresh task (about 30 seconds on iOS, granted far
    /// more often than a processing window), each of whose launches offers only evaluation
    /// (`train(on:tasks: [.evaluation])`) — the latest checkpoint run on the held-out samples, metrics sent, no training.
    /// Expiry cancels the run; the task then completes as unsuccessful and keeps its request. After a run the task is
    /// submitted again for the coordinator's `retry_after` or `options.defaultInterval`. `options.constraints` do not
    /// apply: iOS's app refresh takes none.
    /// - Parameters:
    ///   - scheduler: The scheduler (register before it starts).
    ///   - options: Identifier (another than the training task's), interval and priority.
    ///   - data: Loads the device's local samples for a run.
    ///   - onOutcome: Called after each run with its outcome (``CycleOutcome/evaluated(_:)`` when a result was taken) or
    ///     error.
    public func scheduleBackgroundEvaluation(
        on scheduler: any BackgroundTaskScheduling, options: BackgroundTrainingOptions,
        data: @escaping @Sendable () async throws -> any Dataset,
        onOutcome: @escaping @Sendable (Result<CycleOutcome, OrchardClientError>) -> Void = { _ in }
    ) async throws(OrchardClientError) {
        try await schedule(on: scheduler, options: options, kind: .appRefresh, tasks: [.evaluation], data: data, onOutcome: onOutcome)
    }

    private func schedule(
        on scheduler: any BackgroundTaskScheduling, options: BackgroundTrainingOptions, kind: TaskKind, tasks: [DeviceTask],
        data: @escaping @Sendable () async throws -> any Dataset, onOutcome: @escaping @Sendable (Result<CycleOutcome, OrchardClientError>) -> Void
    ) async throws(OrchardClientError) {
        do {
            try await scheduler.register(identifier: options.identifier) { [self] task in
                try await backgroundRun(task, scheduler: scheduler, options: options, kind: kind, tasks: tasks, data: data, onOutcome: onOutcome)
            }
            let kept = await scheduler.pendingRequests().first { $0.identifier == options.identifier }
            let wanted = request(options, kind: kind, begin: kept?.earliestBeginDate)
            if let kept {
                client.configuration.logger.info(
                    "keeping the background request pending in the scheduler's store",
                    metadata: [
                        "task": "\(options.identifier)", "earliest_begin": "\(kept.earliestBeginDate.map { "\($0)" } ?? "as soon as possible")",
                    ])
                // The same request: leave it as it is (its submission date, which ages it, included).
                if kept.kind == wanted.kind && kept.constraints == wanted.constraints && kept.priority == wanted.priority { return }
            }
            try await scheduler.submit(wanted)
        } catch {
            let what = kind == .appRefresh ? "evaluation" : "training"
            throw OrchardClientError(.invalidConfiguration, "cannot schedule background \(what): \(error)")
        }
    }

    private func request(_ options: BackgroundTrainingOptions, kind: TaskKind, after delay: Double) -> TaskRequest {
        request(options, kind: kind, begin: client.configuration.environment.clock.date.addingTimeInterval(delay))
    }

    private func request(_ options: BackgroundTrainingOptions, kind: TaskKind, begin: Date?) -> TaskRequest {
        kind == .appRefresh
            ? .appRefresh(options.identifier, earliestBeginDate: begin, priority: options.priority)
            : .processing(options.identifier, earliestBeginDate: begin, constraints: options.constraints, priority: options.priority)
    }

    private func backgroundRun(
        _ task: BackgroundTask, scheduler: any BackgroundTaskScheduling, options: BackgroundTrainingOptions, kind: TaskKind, tasks: [DeviceTask],
        data: @Sendable () async throws -> any Dataset, onOutcome: @Sendable (Result<CycleOutcome, OrchardClientError>) -> Void
    ) async throws {
        let logger = client.configuration.logger
        task.expirationHandler = { logger.info("background window expired; stopping at the next batch", metadata: ["task": "\(task.identifier)"]) }
        let outcome: CycleOutcome
        do throws(OrchardClientError) {
            let dataset: any Dataset
            do {
                dataset = try await data()
            } catch {
                throw OrchardClientError(.training, "cannot load the local dataset: \(error)")
            }
            outcome = try await train(on: dataset, tasks: tasks)
        } catch {
            onOutcome(.failure(error))
            if error.code == .cancelled {
                // Progress is checkpointed; the scheduler keeps the request of an expired run.
                task.setTaskCompleted(success: false)
                return
            }
            throw error
        }
        onOutcome(.success(outcome))
        let interval = Double(options.defaultInterval.components.seconds)
        let delay = outcome.retryAfter ?? interval
        try await scheduler.submit(request(options, kind: kind, after: delay))
        task.setTaskCompleted(success: true)
    }
}

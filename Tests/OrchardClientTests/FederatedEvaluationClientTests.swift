import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardInProcess
import OrchardML
import OrchardProtocol
import OrchardScheduler
import OrchardSupport
import Synchronization
import Testing

/// The device side of federated evaluation, end to end on loopback HTTP: a window that takes an evaluation task
/// runs the checkpoint on its held-out split, sends the metrics, then trains on the rest only.
@Suite("Federated evaluation from the device", .serialized)
struct FederatedEvaluationClientTests {
    static let config = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 2, holdoutFraction: 0.25)

    static func host() throws -> HostProcessRequest {
        var request = try Fixture.host(goal: 2, overSelection: 2, clientConfig: config)
        request.serverConfig.evaluation = FederatedEvaluationConfig(goal: 2)
        return request
    }

    /// The engine's metrics of the initial weights on the held-out part of `dataset` for the harness seed (42).
    static func expectedMetrics(_ dataset: TensorDataset) throws -> EvaluationMetrics {
        var model = try Model(spec: Fixture.spec)
        try model.loadWeights(safetensors: try Fixture.initialWeights())
        let split = HoldoutSplit(count: dataset.count, fraction: 0.25, seed: 42)
        return try model.evaluationMetrics(on: split.holdoutPart(of: dataset), loss: .meanSquaredError)
    }

    @Test("a window evaluates on its held-out split, then trains on the rest only")
    func evaluateThenTrain() async throws {
        try await withHarness { harness in
            let process = try await harness.host(Self.host())
            let (client, transport) = try harness.httpClient(device: "a")
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let events = collectEvents(job)
            let dataset = try Fixture.dataset()
            let outcome = try await job.train(on: dataset)
            guard case .reported(let receipt) = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(receipt.cycle == 1)
            let seen = await events.value
            let phases = seen.compactMap { if case .phase(let p) = $0 { p } else { nil } }
            #expect(
                phases == [
                    .authenticating, .requestingCycle, .downloadingPlan, .downloadingModel, .evaluating, .reportingEvaluation, .requestingCycle,
                    .downloadingPlan, .downloadingModel, .training, .reporting, .finished,
                ])
            let evaluated = seen.compactMap { if case .evaluated(let r) = $0 { r } else { nil } }
            let evaluation = try #require(evaluated.first)
            let expected = try Self.expectedMetrics(dataset)
            let split = HoldoutSplit(count: dataset.count, fraction: 0.25, seed: 42)
            #expect(evaluation.checkpoint == 0 && evaluation.resultsReceived == 1)
            #expect(evaluation.samples == split.holdout.count && split.holdout.count > 10 && split.holdout.count < 40)
            #expect(evaluation.metrics["loss"] == expected.loss && evaluation.metrics["mae"] == expected.values["mae"])

            // The update was trained on the training part alone: the engine's diff on those samples, not on all of them.
            let reported = try diffOf(try #require(transport.log.withLock { $0.reports.first }))
            #expect(reported == (try referenceDiff(clientConfig: Self.config, seed: 42 &+ 1, on: split.trainingPart(of: dataset))))
            #expect(reported != (try referenceDiff(clientConfig: Self.config, seed: 42 &+ 1)))
            // The model was downloaded once: training reused the copy the evaluation fetched.
            #expect(transport.log.withLock { $0.modelRequests.count } == 1)
            let requests = transport.log.withLock { $0.cycleRequests.map(\.tasks) }
            #expect(requests == [[.evaluation, .training], nil])

            // A short window takes the evaluation alone; the second result meets the goal.
            let (other, _) = try harness.httpClient(device: "b")
            let second = try other.newJob(processName: "regressor", version: "1.0")
            let otherData = try Fixture.dataset(count: 64, seed: 9)
            guard case .evaluated(let secondReceipt) = try await second.train(on: otherData, tasks: [.evaluation]) else {
                Issue.record("expected an evaluation")
                return
            }
            #expect(secondReceipt.resultsReceived == 2)
            let status = try await harness.coordinator.status(processID: process.processID)
            let federated = try #require(status.federatedEvaluation)
            let otherExpected = try Self.expectedMetrics(otherData)
            let total = Double(expected.samples + otherExpected.samples)
            #expect(federated.samples == expected.samples + otherExpected.samples && federated.devices == 2)
            let loss = (expected.loss * Double(expected.samples) + otherExpected.loss * Double(otherExpected.samples)) / total
            #expect(abs(federated.metrics["loss"]! - loss) < 1e-12)
            #expect(abs(federated.metrics["rmse"]! - loss.squareRoot()) < 1e-12)

            // With the goal met, a third device trains without an evaluation task.
            let (third, thirdTransport) = try harness.httpClient(device: "c")
            guard case .reported = try await third.newJob(processName: "regressor", version: "1.0").train(on: Fixture.dataset(count: 48, seed: 5)) else {
                Issue.record("expected a report")
                return
            }
            #expect(thirdTransport.log.withLock { $0.evaluationReports.isEmpty && $0.cycleResponses.count == 1 })
        }
    }

    @Test("a device with nothing held out leaves the task and trains")
    func nothingHeldOut() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Self.host())
            let (client, transport) = try harness.httpClient(device: "tiny")
            let job = try client.newJob(processName: "regressor", version: "1.0")
            // The longest prefix of samples none of which the device (seed 42) holds out.
            let count = (0..<96).prefix { !HoldoutSplit.isHeldOut($0, fraction: 0.25, seed: 42) }.count
            try #require(count >= 1)
            let outcome = try await job.train(on: Fixture.dataset(count: count))
            #expect(transport.log.withLock { $0.evaluationReports.isEmpty })
            if case .reported = outcome {} else { Issue.record("expected a report, got \(outcome)") }
            // Having seen the process's fraction, the device no longer offers evaluation it cannot do; an evaluation-only
            // window ends at once without calling the coordinator.
            _ = try await job.train(on: Fixture.dataset(count: count))
            #expect(transport.log.withLock { $0.cycleRequests.map(\.tasks) } == [[.evaluation, .training], nil, nil])
            let requests = transport.log.withLock { $0.cycleRequests.count }
            #expect(try await job.train(on: Fixture.dataset(count: count), tasks: [.evaluation]) == .rejected(retryAfter: 3600, reason: "nothing_held_out"))
            #expect(transport.log.withLock { $0.cycleRequests.count } == requests)
        }
    }

    @Test("the split is fixed by the seed, keeps its sides as data is added, and holds about the fraction out")
    func splitIsStable() {
        let small = HoldoutSplit(count: 1000, fraction: 0.2, seed: 7)
        let large = HoldoutSplit(count: 1500, fraction: 0.2, seed: 7)
        #expect(Array(large.holdout.prefix(small.holdout.count)) == small.holdout)
        #expect(Set(small.holdout).isDisjoint(with: small.training) && small.holdout.count + small.training.count == 1000)
        #expect((170...230).contains(small.holdout.count), "\(small.holdout.count)")
        #expect(HoldoutSplit(count: 1000, fraction: 0.2, seed: 8).holdout != small.holdout)
        #expect(HoldoutSplit(count: 1000, fraction: 0, seed: 7).holdout.isEmpty)
    }
}

/// Evaluation in short windows: an app-refresh task that takes only evaluation tasks.
@Suite("Federated evaluation in short background windows")
struct ShortWindowEvaluationTests {
    @Test("an app-refresh task evaluates, is resubmitted after the interval, and is never admitted to training")
    func shortWindows() async throws {
        try await withInProcessCoordinator { coordinator, clock, directory in
            let hosted = try await coordinator.host(FederatedEvaluationClientTests.host())
            let scheduler = RecordingScheduler()
            let outcomes = Mutex<[Result<CycleOutcome, OrchardClientError>]>([])
            let client = CoordinatorConnection(
                transport: InProcessTransport(coordinator: coordinator), server: "in-process",
                configuration: inMemoryConfiguration(directory, device: "short", clock: clock))
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let dataset = try Fixture.dataset()
            let options = BackgroundTrainingOptions(identifier: "evaluate", defaultInterval: .seconds(900))
            try await job.scheduleBackgroundEvaluation(on: scheduler, options: options, data: { dataset }) { result in
                outcomes.withLock { $0.append(result) }
            }
            let first = try #require(await scheduler.submitted.first)
            #expect(first.kind == .appRefresh && first.earliestBeginDate == nil)
            let handler = try #require(await scheduler.handlers["evaluate"])

            let run = TaskRun(task: BackgroundTask(identifier: "evaluate", kind: .appRefresh, timeLimit: .seconds(30)), handler: handler)
            #expect(try #require(await run.waitForCompletion()).success)
            guard case .success(.evaluated(let receipt)) = try #require(outcomes.withLock { $0.last }) else {
                Issue.record("expected an evaluation, got \(String(describing: outcomes.withLock { $0.last }))")
                return
            }
            #expect(receipt.checkpoint == 0 && receipt.resultsReceived == 1)
            let again = try #require(await scheduler.submitted.last)
            #expect(again.kind == .appRefresh && again.earliestBeginDate == clock.date.addingTimeInterval(900))

            // The next short window finds nothing to evaluate (its result is in) and is turned away, not admitted to train.
            let second = TaskRun(task: BackgroundTask(identifier: "evaluate", kind: .appRefresh, timeLimit: .seconds(30)), handler: handler)
            #expect(try #require(await second.waitForCompletion()).success)
            guard case .success(.rejected(_, let reason)) = try #require(outcomes.withLock { $0.last }) else {
                Issue.record("expected a rejection, got \(String(describing: outcomes.withLock { $0.last }))")
                return
            }
            #expect(reason == "no_evaluation_task")
            let status = try await coordinator.status(processID: hosted.processID)
            #expect(status.currentCycle?.assigned == 0)
        }
    }
}

import Foundation
@testable import OrchardClient
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardScheduler
import Testing

/// The evaluation task inside the job cycle state machine, without I/O.
@Suite("Job cycle state machine: evaluation tasks")
struct EvaluationStateMachineTests {
    typealias Machine = JobCycleStateMachine
    typealias Tests = JobCycleStateMachineTests

    static func machine(tasks: [DeviceTask] = [.evaluation, .training]) -> Machine {
        Machine(
            setup: Machine.Setup(
                server: Tests.server, authToken: "jwt", processName: "regressor", version: SemanticVersion(1, 0),
                retry: RequestRetryPolicy(maximumAttempts: 2), conditionRules: ConditionRules(), trainingSeed: 42, tasks: tasks
            ))
    }

    static let task = EvaluationAssignment(requestKey: "e.2.99.abc", processID: "p", checkpoint: 2, modelID: "p.2", planID: "p", reportWithin: 300)
    static var plan: TrainingPlan {
        TrainingPlan(planID: "p", model: Fixture.spec, clientConfig: ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 3, holdoutFraction: 0.25))
    }

    /// Up to the evaluation step: session saved, evaluation task given, plan and model in hand.
    static func toEvaluation(_ machine: inout Machine) throws -> [Machine.Action] {
        _ = machine.start(constraints: .none)
        let requested = machine.stateLoaded(Tests.stored(), now: Tests.now)
        guard case .requestCycle(let request, _) = requested.last else { throw MachineTestError("no cycle request") }
        #expect(request.tasks == machine.setup.tasks)
        #expect(Tests.names(machine.cycleAnswered(.evaluate(Self.task))) == ["phase:downloadingPlan", "downloadPlan"])
        #expect(Tests.names(machine.planDownloaded(Self.plan, shapes: try Tests.shapes())) == ["phase:downloadingModel", "loadCachedModel"])
        #expect(Tests.names(machine.cachedModelLoaded(nil, info: nil)) == ["downloadModel"])
        let bytes = try Fixture.initialWeights()
        return machine.modelDownloaded(bytes, info: Tests.info(for: bytes))
    }

    @Test("evaluate, send the metrics, then ask again for training only")
    func evaluateThenTrain() throws {
        var machine = Self.machine()
        let evaluating = try Self.toEvaluation(&machine)
        #expect(Tests.names(evaluating) == ["keepModel", "phase:evaluating", "evaluate"])
        guard case .evaluate(let input) = evaluating.last else { throw MachineTestError("no evaluate action") }
        #expect(input.assignment == Self.task && input.plan.clientConfig.holdoutFraction == 0.25)
        let sending = machine.evaluationEnded(EvaluationMetrics(samples: 24, loss: 0.3, values: ["rmse": 0.3.squareRoot(), "mae": 0.4]))
        #expect(Tests.names(sending) == ["phase:reportingEvaluation", "uploadEvaluation"])
        guard case .uploadEvaluation(let report, let session) = sending.last else { throw MachineTestError("no upload") }
        #expect(
            report == EvaluationReport(workerID: "w1", requestKey: "e.2.99.abc", samples: 24, metrics: ["loss": 0.3, "rmse": 0.3.squareRoot(), "mae": 0.4]))
        #expect(session == "t1")
        let next = machine.evaluationAnswered(EvaluationReportResponse(checkpoint: 2, resultsReceived: 7))
        #expect(Tests.names(next) == ["evaluated", "phase:requestingCycle", "requestCycle"])
        guard case .requestCycle(let again, _) = next.last else { throw MachineTestError("no second request") }
        #expect(again.tasks == nil, "the second request offers training alone, as devices before 2.5 do")
        // Training goes on as usual, with the model the evaluation kept.
        #expect(Tests.names(machine.cycleAnswered(.accepted(Tests.assignment()))) == ["phase:downloadingPlan", "downloadPlan"])
        #expect(Tests.names(machine.planDownloaded(Self.plan, shapes: try Tests.shapes())) == ["phase:downloadingModel", "loadCachedModel"])
        let bytes = try Fixture.initialWeights()
        #expect(Tests.names(machine.cachedModelLoaded(bytes, info: Tests.info(for: bytes))) == ["downloaded", "phase:training", "train"])
    }

    @Test("an evaluation-only window ends with the evaluation; one that could not evaluate is turned away for a while")
    func evaluationOnly() throws {
        var machine = Self.machine(tasks: [.evaluation])
        _ = try Self.toEvaluation(&machine)
        // A sequence model's metrics carry their positions to the report.
        let sequenceResult = machine.evaluationEnded(EvaluationMetrics(samples: 5, loss: 1, values: ["perplexity": exp(1.2)], positions: 37))
        guard case .uploadEvaluation(let report, _) = sequenceResult.last else { throw MachineTestError("no upload") }
        #expect(report.positions == 37 && report.samples == 5)
        let ended = machine.evaluationAnswered(EvaluationReportResponse(checkpoint: 2, resultsReceived: 1))
        #expect(
            Tests.outcome(ended) == .evaluated(EvaluationReceipt(checkpoint: 2, samples: 5, metrics: ["loss": 1, "perplexity": exp(1.2)], resultsReceived: 1)))

        var empty = Self.machine(tasks: [.evaluation])
        _ = try Self.toEvaluation(&empty)
        let nothing = empty.evaluationEnded(nil)
        #expect(Tests.outcome(nothing) == .rejected(retryAfter: Machine.evaluationRetry, reason: "evaluation_left"))
    }

    @Test("an evaluation task nobody asked for fails the window; an evaluation-only window does not train when an old coordinator admits it")
    func unsolicited() throws {
        var trainingOnly = Self.machine(tasks: [.training])
        _ = trainingOnly.start(constraints: .none)
        let requested = trainingOnly.stateLoaded(Tests.stored(), now: Tests.now)
        guard case .requestCycle(let request, _) = requested.last else { throw MachineTestError("no cycle request") }
        #expect(request.tasks == nil)
        #expect(Tests.failure(trainingOnly.cycleAnswered(.evaluate(Self.task)))?.code == .serverError)

        var evaluationOnly = Self.machine(tasks: [.evaluation])
        _ = evaluationOnly.start(constraints: .none)
        _ = evaluationOnly.stateLoaded(Tests.stored(), now: Tests.now)
        let answered = evaluationOnly.cycleAnswered(.accepted(Tests.assignment()))
        #expect(Tests.outcome(answered) == .rejected(retryAfter: 600, reason: "training_not_taken"))
    }

    @Test("a task that cannot be done is left and the window trains; cancellation still fails")
    func leftTasks() throws {
        // Nothing held out.
        var none = Self.machine()
        _ = try Self.toEvaluation(&none)
        #expect(Tests.names(none.evaluationEnded(nil)) == ["phase:requestingCycle", "requestCycle"])
        // A non-finite loss is not sent.
        var diverged = Self.machine()
        _ = try Self.toEvaluation(&diverged)
        #expect(Tests.names(diverged.evaluationEnded(EvaluationMetrics(samples: 3, loss: .infinity))) == ["phase:requestingCycle", "requestCycle"])
        // The checkpoint moved on before the upload.
        var closed = Self.machine()
        _ = try Self.toEvaluation(&closed)
        _ = closed.evaluationEnded(EvaluationMetrics(samples: 3, loss: 1))
        let refused = closed.requestFailed(OrchardClientError(.serverError, "closed", httpStatus: 409, serverCode: .evaluationClosed))
        #expect(Tests.names(refused) == ["phase:requestingCycle", "requestCycle"])
        // Already stored (the answer was lost): counted as delivered.
        var duplicate = Self.machine()
        _ = try Self.toEvaluation(&duplicate)
        _ = duplicate.evaluationEnded(EvaluationMetrics(samples: 3, loss: 1))
        let delivered = duplicate.requestFailed(OrchardClientError(.serverError, "again", httpStatus: 409, serverCode: .evaluationAlreadyReceived))
        #expect(Tests.names(delivered) == ["evaluated", "phase:requestingCycle", "requestCycle"])
        // A failed evaluation is left; a cancelled one ends the window.
        var failed = Self.machine()
        _ = try Self.toEvaluation(&failed)
        #expect(Tests.names(failed.evaluationFailed(OrchardClientError(.training, "no"))) == ["phase:requestingCycle", "requestCycle"])
        var cancelled = Self.machine()
        _ = try Self.toEvaluation(&cancelled)
        #expect(Tests.failure(cancelled.evaluationFailed(OrchardClientError(.cancelled, "window ended")))?.code == .cancelled)
        // A plan download refused for the evaluation key (expired) is left too.
        var expired = Self.machine()
        _ = expired.start(constraints: .none)
        _ = expired.stateLoaded(Tests.stored(), now: Tests.now)
        _ = expired.cycleAnswered(.evaluate(Self.task))
        let gone = expired.requestFailed(OrchardClientError(.serverError, "expired", httpStatus: 409, serverCode: .deadlinePassed))
        #expect(Tests.names(gone) == ["phase:requestingCycle", "requestCycle"])
    }
}

struct MachineTestError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

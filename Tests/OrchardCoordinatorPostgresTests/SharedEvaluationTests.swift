import Foundation
import OrchardCoordinator
import OrchardData
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardSupport
import Testing

/// Server-side evaluation over several instances: data attached through one instance, a checkpoint published by
/// another, which evaluates it; every instance lists the same evaluations.
@Suite(.serialized) struct SharedEvaluationTests {
    typealias Group = MultiInstanceTests.Group

    @Test(arguments: StoreKind.underTest) func theInstanceThatPublishesEvaluatesOnDataAttachedElsewhere(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2, foldInterval: 1) { group in
            var request = MultiInstanceTests.host(goal: 1, overSelection: 1)
            request.model.training = TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1))
            let hosted = try await group[0].host(request)
            let data = DeviceDataFile.encode(
                try TensorDataset(
                    inputs: ["x": Tensor(shape: [4, 3], scalars: (0..<12).map { Float($0) / 6 - 1 })],
                    targets: Tensor(shape: [4, 2], scalars: [0, 1, 1, 0, 0.5, 0.5, -1, 2])))
            let attached = try await group[0].attachEvaluationData(processID: hosted.processID, bytes: data)
            #expect(attached.evaluations.map(\.checkpoint) == [0] && attached.dataSamples == 4)

            // A device served by instance 1 closes the cycle there: instance 1 publishes checkpoint 1 and evaluates it.
            let device = try await group.device(at: 1)
            let assignment = try MultiInstanceTests.accepted(try await group.requestCycle(device, at: 1))
            #expect(try await group.report(device, assignment, scale: 0.2, samples: 3, at: 1).cycleClosed)
            await group[1].evaluationsSettled()
            await group[0].evaluationsSettled()

            var model = try Model(spec: request.model)
            try model.loadWeights(safetensors: try await group[0].checkpoint(processID: hosted.processID, number: 1).bytes)
            let expected = try model.evaluationMetrics(on: try DeviceDataFile.decode(data), loss: .meanSquaredError)
            for instance in [0, 1] {
                let listed = try await group[instance].evaluations(processID: hosted.processID)
                #expect(listed.evaluations.map(\.checkpoint) == [0, 1], "instance \(instance)")
                #expect(listed.evaluations.last?.metrics == expected.values.merging(["loss": expected.loss]) { _, loss in loss })
                #expect(try await group[instance].status(processID: hosted.processID).evaluation?.checkpoint == 1)
            }
            // A checkpoint whose publisher never evaluated it (the data attached straight to the store afterwards, as
            // if that instance had died first) is evaluated by another instance's timer once the seal lease has passed.
            try await group.store.setEvaluationData(processID: hosted.processID, data: nil)
            let device2 = try await group.device(at: 1)
            let assignment2 = try MultiInstanceTests.accepted(try await group.requestCycle(device2, at: 1))
            #expect(try await group.report(device2, assignment2, scale: -0.1, samples: 2, at: 1).cycleClosed)
            await group[1].evaluationsSettled()
            try await group.store.setEvaluationData(processID: hosted.processID, data: (data, 4))
            await group[0].tick()
            await group[0].evaluationsSettled()
            #expect(try await group.store.evaluations(processID: hosted.processID, limit: 5).map(\.checkpoint) == [0, 1], "not before the lease")
            group.clock.advance(bySeconds: 31)
            await group[0].tick()
            await group[0].evaluationsSettled()
            #expect(try await group.store.evaluations(processID: hosted.processID, limit: 5).map(\.checkpoint) == [0, 1, 2])
            // Once caught up, later ticks read nothing more and evaluate nothing twice.
            group.clock.advance(bySeconds: 2)
            await group[0].tick()
            await group[1].tick()
            #expect(try await group.store.evaluations(processID: hosted.processID, limit: 5).count == 3)

            // Deleted through one instance: gone for the other too.
            try await group[1].delete(processID: hosted.processID)
            #expect(try await group.store.evaluationData(processID: hosted.processID) == nil)
            #expect(try await group.store.evaluations(processID: hosted.processID, limit: 5).isEmpty)
        }
    }

    /// Federated evaluation over several instances: a task handed out at one instance is served and accepted at
    /// another (its key carries its own proof), results at every instance count toward one goal, and the evaluation is
    /// finalized once; a checkpoint superseded at another instance is finalized there with the results it has.
    @Test(arguments: StoreKind.underTest) func federatedEvaluationSpansInstancesAndIsFinalizedOnce(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2, foldInterval: 1) { group in
            var request = MultiInstanceTests.host(goal: 1, overSelection: 1)
            request.model.training = TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1))
            request.clientConfig.holdoutFraction = 0.2
            request.serverConfig.evaluation = FederatedEvaluationConfig(goal: 2)
            let hosted = try await group[0].host(request)
            func task(_ device: (response: AuthenticateResponse, session: DeviceSession), at instance: Int) async throws -> EvaluationAssignment {
                let answer = try await group[instance].requestCycle(
                    CycleRequest(
                        workerID: device.response.workerID, processName: "multi", processVersion: SemanticVersion(1, 0), tasks: [.evaluation, .training]),
                    session: device.session)
                guard case .evaluate(let task) = answer else { throw MultiInstanceTests.HarnessFailure("no evaluation task: \(answer)") }
                return task
            }
            func send(
                _ device: (response: AuthenticateResponse, session: DeviceSession), _ task: EvaluationAssignment, loss: Double, samples: Int, at instance: Int
            ) async throws -> EvaluationReportResponse {
                let session = try await group[instance].session(forToken: device.response.sessionToken)
                return try await group[instance].evaluationReport(
                    EvaluationReport(workerID: device.response.workerID, requestKey: task.requestKey, samples: samples, metrics: ["loss": loss]),
                    session: session)
            }
            // Given at instance 0; plan, model and result at instance 1.
            let a = try await group.device(at: 0)
            let taskA = try await task(a, at: 0)
            let sessionA1 = try await group[1].session(forToken: a.response.sessionToken)
            #expect(try await group[1].plan(hosted.processID, requestKey: taskA.requestKey, session: sessionA1).clientConfig.holdoutFraction == 0.2)
            #expect(try await group[1].model(taskA.modelID, requestKey: taskA.requestKey, session: sessionA1).bytes.count > 0)
            #expect(try await send(a, taskA, loss: 1, samples: 1, at: 1).resultsReceived == 1)
            // A second worker's result at instance 0 meets the goal: one evaluation, the same at both instances.
            let b = try await group.device(at: 1)
            let taskB = try await task(b, at: 1)
            #expect(try await send(b, taskB, loss: 2, samples: 3, at: 0).resultsReceived == 2)
            for instance in [0, 1] {
                let evaluation = try #require(try await group[instance].status(processID: hosted.processID).federatedEvaluation, "instance \(instance)")
                #expect(evaluation.checkpoint == 0 && evaluation.devices == 2 && evaluation.samples == 4 && evaluation.metrics["loss"] == 1.75)
            }
            do {
                _ = try await send(a, taskA, loss: 1, samples: 1, at: 0)
                Issue.record("a result after the evaluation was finalized was accepted")
            } catch let error as CoordinatorError {
                #expect(error.code == .evaluationAlreadyReceived || error.code == .evaluationClosed, "\(error)")
            }
            // Checkpoint 0's evaluation is done: the next device trains; its report at instance 1 publishes checkpoint 1.
            let c = try await group.device(at: 0)
            let training = try MultiInstanceTests.accepted(try await group.requestCycle(c, at: 0))
            #expect(try await group.report(c, training, scale: 0.1, samples: 2, at: 1).cycleClosed)
            // Checkpoint 1 is evaluated; a result sent to the instance that did not publish it is taken up there.
            let e = try await group.device(at: 1)
            let taskE = try await task(e, at: 1)
            #expect(taskE.checkpoint == 1)
            #expect(try await send(e, taskE, loss: 0.5, samples: 2, at: 0).resultsReceived == 1)
            // Checkpoint 2 is published at instance 0; checkpoint 1's one result is finalized there, once.
            let f = try await group.device(at: 0)
            let training2 = try MultiInstanceTests.accepted(try await group.requestCycle(f, at: 0))
            #expect(try await group.report(f, training2, scale: -0.1, samples: 2, at: 0).cycleClosed)
            let listed = try await group[1].evaluations(processID: hosted.processID).federated
            #expect(listed.map(\.checkpoint) == [0, 1] && listed.last?.devices == 1 && listed.last?.metrics["loss"] == 0.5)
            #expect(try await group.store.pendingEvaluationCheckpoints(processID: hosted.processID).isEmpty)
        }
    }
}

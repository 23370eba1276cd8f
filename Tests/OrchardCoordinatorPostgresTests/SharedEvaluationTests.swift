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
}

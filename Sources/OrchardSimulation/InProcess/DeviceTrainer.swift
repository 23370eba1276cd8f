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

/// The device's local training inside the job's cycle, through the SDK's trainer under the settings the
/// coordinator sent (``OrchardClient/CycleContext/training``): stretches of real training that fit the current
/// window (each update costs the device's `secondsPerUpdate` of virtual time), a checkpoint saved through the SDK
/// when the window ends first, and the resumed run in a later window continuing from it.
struct DeviceTrainer: Sendable {
    let device: Int
    let workload: any FleetWorkload
    let link: DeviceLink
    let slots: AsyncSemaphore

    /// The message of the error a device with no sample outside its held-out split ends its training with.
    static let nothingToTrain = "every one of the device's samples is held out for evaluation; none is left to train on"

    func train(_ context: CycleContext) async throws -> LocalUpdate {
        let task = LocalTrainingTask(model: context.model, training: context.training)
        // Under federated evaluation the device trains on the samples outside its held-out split only.
        let indices = context.holdoutSplit(count: workload.sampleCount(device: device))?.training
        if let indices, indices.isEmpty {
            await link.noteNothingToTrain()
            throw OrchardClientError(.training, Self.nothingToTrain)
        }
        let total = context.training.plannedUpdates(samples: indices?.count ?? workload.sampleCount(device: device))
        let cost = link.profile.secondsPerUpdate
        var checkpoint = context.savedCheckpoint
        var done = 0
        if let checkpoint {
            link.noteResumption()
            done = try workload.completedUpdates(device: device, in: checkpoint, of: task)
        }
        while true {
            // Clamped in Double first: a device far faster than the median (a speed trace's outlier) fits more updates in
            // its window than an Int holds, or infinitely many when its cost underflows to zero.
            let fit = Int(max(0, min(Double(total - done), ((link.boundary - link.clock.seconds) / cost).rounded(.down))))
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
                    try workload.train(device: device, stretchTask, on: indices, resumingFrom: from)
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

    /// An evaluation task: the checkpoint run on the device's held-out samples. Its virtual time is a forward pass per
    /// batch, a third of a training update's (`secondsPerUpdate`); a window that ends first leaves the task.
    func evaluate(_ context: EvaluationContext) async throws -> EvaluationMetrics? {
        let holdout = context.holdoutSplit(count: workload.sampleCount(device: device)).holdout
        guard !holdout.isEmpty else { return nil }
        let batch = max(1, context.plan.clientConfig.batchSize ?? context.plan.model.training?.batchSize ?? 32)
        let batches = (holdout.count + batch - 1) / batch
        do { try await link.spend(Double(batches) * link.profile.secondsPerUpdate / 3) } catch { throw CancellationError() }
        let model = context.model
        return try await slots.runTraining { () throws -> EvaluationMetrics in
            try workload.evaluate(device: device, model: model, on: holdout)
        }
    }
}

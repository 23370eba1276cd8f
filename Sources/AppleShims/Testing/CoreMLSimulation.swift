// The simulated Core ML training behind the CoreML shim, for tests.
#if os(Linux)  // Apple platforms have the real framework
@_spi(AppleShimTesting) public import CoreMLShim
import Foundation

/// Sets what the simulated Core ML computes when an `MLUpdateTask` runs, and what a cancelled task does.
public enum SimulatedCoreMLTraining {
    /// What a training run is given.
    public struct Run: @unchecked Sendable {
        /// The compiled model (the shim's copy of the `.mlmodel`).
        public let modelURL: URL
        /// The training samples.
        public let trainingData: any MLBatchProvider
        /// The update parameters the caller set.
        public let parameters: [MLParameterKey: Any]
        /// Whether the task was cancelled (a simulation that takes time checks it between steps).
        public let isCancelled: @Sendable () -> Bool
    }

    /// What a cancelled task does.
    public enum Cancellation: Sendable {
        /// It calls its completion handler with the state `.cancelling`.
        case completesCancelled
        /// It never calls its completion handler.
        case neverCallsBack
    }

    /// The training the system does: the updated `.weights`/`.biases` of every updatable layer (scoped to the layer).
    /// `nil`: a task fails.
    public static var training: (@Sendable (Run) throws -> [MLParameterKey: MLMultiArray])? {
        get {
            guard let inner = SimulatedCoreML.shared.training else { return nil }
            return { @Sendable run in
                try inner(SimulatedCoreML.Run(modelURL: run.modelURL, trainingData: run.trainingData, parameters: run.parameters, isCancelled: run.isCancelled))
            }
        }
        set {
            guard let outer = newValue else {
                SimulatedCoreML.shared.training = nil
                return
            }
            SimulatedCoreML.shared.training = { @Sendable run in
                try outer(Run(modelURL: run.modelURL, trainingData: run.trainingData, parameters: run.parameters, isCancelled: run.isCancelled))
            }
        }
    }

    /// What a cancelled task does (`.completesCancelled` by default).
    public static var cancellation: Cancellation {
        get { SimulatedCoreML.shared.cancellation == .neverCallsBack ? .neverCallsBack : .completesCancelled }
        set { SimulatedCoreML.shared.cancellation = newValue == .neverCallsBack ? .neverCallsBack : .completesCancelled }
    }
}
#endif

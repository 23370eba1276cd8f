// The part of Apple's Core ML that OrchardCoreMLTrainer uses, for Linux: multi-arrays, feature and batch providers,
// model compilation, `MLUpdateTask` and reading updated parameters. Orchard's Apple-facing targets import it as `CoreML`
// (Package.swift aliases the module on Linux). Declarations are transcribed from the SDK's CoreML headers (MLUpdateTask.h,
// MLModel.h, MLMultiArray.h, MLFeatureValue.h, MLParameterKey.h) as Swift imports them; see docs/apple-shims.md.
//
// The on-device training itself is simulated: AppleShimTesting sets what a task computes, and whether a cancelled task
// calls its completion handler at all (Apple's documentation of `cancel()` does not promise that it does).
#if os(Linux)  // Apple platforms have the real framework
@_exported public import Foundation

/// Mirror of `MLMultiArrayDataType`.
public enum MLMultiArrayDataType: Int, Sendable {
    case double = 65600, float32 = 65568, int32 = 131104
}

/// Mirror of `MLMultiArray` (values kept as `Double`).
public final class MLMultiArray: NSObject {
    /// The shape.
    public let shape: [NSNumber]
    /// The element type.
    public let dataType: MLMultiArrayDataType
    private var values: [Double]

    /// An array of zeros.
    public init(shape: [NSNumber], dataType: MLMultiArrayDataType) throws {
        guard shape.allSatisfy({ $0.intValue > 0 }) else { throw MLModelError(.generic, "shape \(shape) has a non-positive dimension") }
        self.shape = shape
        self.dataType = dataType
        values = Array(repeating: 0, count: shape.reduce(1) { $0 * $1.intValue })
    }

    /// The number of elements.
    public var count: Int { values.count }

    /// The element at a linear index.
    public subscript(index: Int) -> NSNumber {
        get { NSNumber(value: values[index]) }
        set { values[index] = dataType == .int32 ? Double(newValue.int32Value) : newValue.doubleValue }
    }
}

/// Mirror of `MLFeatureType`.
public enum MLFeatureType: Int, Sendable {
    case invalid, int64, double, string, image, multiArray, dictionary, sequence
}

/// Mirror of `MLFeatureValue`.
public final class MLFeatureValue: NSObject {
    /// The value's type.
    public let type: MLFeatureType
    /// The multi-array, for `.multiArray`.
    public let multiArrayValue: MLMultiArray?
    /// The integer, for `.int64`.
    public let int64Value: Int64

    /// A multi-array value.
    public init(multiArray: MLMultiArray) {
        type = .multiArray
        multiArrayValue = multiArray
        int64Value = 0
    }

    /// An integer value.
    public init(int64: Int64) {
        type = .int64
        multiArrayValue = nil
        int64Value = int64
    }
}

/// Mirror of `MLFeatureProvider`.
public protocol MLFeatureProvider {
    /// The features' names.
    var featureNames: Set<String> { get }
    /// A feature's value.
    func featureValue(for featureName: String) -> MLFeatureValue?
}

/// Mirror of `MLDictionaryFeatureProvider`.
public final class MLDictionaryFeatureProvider: NSObject, MLFeatureProvider {
    /// The values by name.
    public let dictionary: [String: MLFeatureValue]

    /// A provider of `dictionary`'s values (each an `MLFeatureValue`, an `MLMultiArray` or an integer).
    public init(dictionary: [String: Any]) throws {
        var values: [String: MLFeatureValue] = [:]
        for (name, value) in dictionary {
            switch value {
            case let feature as MLFeatureValue: values[name] = feature
            case let array as MLMultiArray: values[name] = MLFeatureValue(multiArray: array)
            case let number as Int: values[name] = MLFeatureValue(int64: Int64(number))
            case let number as Int64: values[name] = MLFeatureValue(int64: number)
            default: throw MLModelError(.featureType, "feature '\(name)' has a value of type \(type(of: value))")
            }
        }
        self.dictionary = values
    }

    public var featureNames: Set<String> { Set(dictionary.keys) }
    public func featureValue(for featureName: String) -> MLFeatureValue? { dictionary[featureName] }
}

/// Mirror of `MLBatchProvider`.
public protocol MLBatchProvider {
    /// The number of samples.
    var count: Int { get }
    /// A sample's features.
    func features(at index: Int) -> any MLFeatureProvider
}

/// Mirror of `MLArrayBatchProvider`.
public final class MLArrayBatchProvider: NSObject, MLBatchProvider {
    /// The samples.
    public let array: [any MLFeatureProvider]

    /// A provider of `array`.
    public init(array: [any MLFeatureProvider]) { self.array = array }

    public var count: Int { array.count }
    public func features(at index: Int) -> any MLFeatureProvider { array[index] }
}

/// `MLKey`: a named key, optionally scoped (to a layer).
open class MLKey: NSObject {
    /// The key's name.
    public let name: String
    /// The scope (a layer's name), if any.
    public let scope: String?

    init(name: String, scope: String?) {
        self.name = name
        self.scope = scope
    }

    open override func isEqual(_ object: Any?) -> Bool {
        guard let other = object as? MLKey else { return false }
        return type(of: other) == type(of: self) && other.name == name && other.scope == scope
    }

    open override var hash: Int {
        var hasher = Hasher()
        hasher.combine(name)
        hasher.combine(scope)
        return hasher.finalize()
    }

    open override var description: String { scope.map { "\($0).\(name)" } ?? name }
}

/// `MLParameterKey` (a class, as in the SDK): the update parameters, and a layer's parameters (`scoped(to:)`).
open class MLParameterKey: MLKey {
    /// The learning rate.
    public class var learningRate: MLParameterKey { MLParameterKey(name: "learningRate", scope: nil) }
    /// The momentum.
    public class var momentum: MLParameterKey { MLParameterKey(name: "momentum", scope: nil) }
    /// The mini-batch size.
    public class var miniBatchSize: MLParameterKey { MLParameterKey(name: "miniBatchSize", scope: nil) }
    /// Adam's beta1.
    public class var beta1: MLParameterKey { MLParameterKey(name: "beta1", scope: nil) }
    /// Adam's beta2.
    public class var beta2: MLParameterKey { MLParameterKey(name: "beta2", scope: nil) }
    /// Adam's epsilon.
    public class var eps: MLParameterKey { MLParameterKey(name: "eps", scope: nil) }
    /// The number of epochs.
    public class var epochs: MLParameterKey { MLParameterKey(name: "epochs", scope: nil) }
    /// Whether to shuffle.
    public class var shuffle: MLParameterKey { MLParameterKey(name: "shuffle", scope: nil) }
    /// A layer's weights.
    public class var weights: MLParameterKey { MLParameterKey(name: "weights", scope: nil) }
    /// A layer's biases.
    public class var biases: MLParameterKey { MLParameterKey(name: "biases", scope: nil) }

    /// The key scoped to the layer named `scope`.
    public func scoped(to scope: String) -> MLParameterKey { MLParameterKey(name: name, scope: scope) }
}

/// Mirror of `MLModelConfiguration`.
public final class MLModelConfiguration: NSObject {
    /// Update parameters overriding the model's defaults.
    public var parameters: [MLParameterKey: Any]?

    /// A default configuration.
    public override init() {}
}

/// Mirror of `MLWritable`.
public protocol MLWritable {
    /// Writes the model (compiled) to `url`.
    func write(to url: URL) throws
}

/// Mirror of `MLModel` (compilation, and the parameters of an updated model).
public final class MLModel: NSObject, MLWritable {
    private let parameters: [MLParameterKey: MLMultiArray]
    private let compiled: Data

    init(parameters: [MLParameterKey: MLMultiArray], compiled: Data) {
        self.parameters = parameters
        self.compiled = compiled
    }

    /// Compiles the `.mlmodel` at `url` and returns the compiled model's location (the shim copies the file).
    public static func compileModel(at url: URL) throws -> URL { try compile(url) }

    private static func compile(_ url: URL) throws -> URL {
        let destination = FileManager.default.temporaryDirectory.appendingPathComponent("\(UUID().uuidString).mlmodelc")
        do { try FileManager.default.copyItem(at: url, to: destination) } catch {
            throw MLModelError(.io, "cannot compile \(url.path): \(error.localizedDescription)")
        }
        return destination
    }

    /// Compiles the `.mlmodel` at `url` (the async form the SDK's overlay adds from iOS 16 / macOS 13; Swift picks it
    /// in an async context).
    public static func compileModel(at url: URL) async throws -> URL {
        try compile(url)
    }

    /// A parameter's value: an update parameter, or an updatable layer's weights or biases (`MLMultiArray`).
    public func parameterValue(for key: MLParameterKey) throws -> Any {
        guard let value = parameters[key] else { throw MLModelError(.parameters, "the model has no parameter \(key)") }
        return value
    }

    public func write(to url: URL) throws { try compiled.write(to: url) }
}

/// Mirror of `MLModelError`.
public struct MLModelError: Error, Sendable, CustomStringConvertible {
    /// Mirror of `MLModelError.Code`.
    public enum Code: Int, Sendable {
        case generic, featureType, io, customLayer, customModel, update, parameters
    }

    public let code: Code
    public let message: String

    init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "MLModelError(\(code)): \(message)" }
}

/// Mirror of `MLTaskState`.
public enum MLTaskState: Int, Sendable {
    case suspended = 1, running, cancelling, completed, failed
}

/// `MLUpdateContext`: what an update task hands its completion handler.
public final class MLUpdateContext: NSObject {
    /// The task that finished.
    public let task: MLUpdateTask
    /// The updated model.
    public let model: MLModel

    init(task: MLUpdateTask, model: MLModel) {
        self.task = task
        self.model = model
    }
}

/// What the simulated Core ML does when it trains; AppleShimTesting sets it.
@_spi(AppleShimTesting) public final class SimulatedCoreML: @unchecked Sendable {
    /// What a training run is given.
    @_spi(AppleShimTesting) public struct Run: @unchecked Sendable {
        @_spi(AppleShimTesting) public let modelURL: URL
        @_spi(AppleShimTesting) public let trainingData: any MLBatchProvider
        @_spi(AppleShimTesting) public let parameters: [MLParameterKey: Any]
        @_spi(AppleShimTesting) public let isCancelled: @Sendable () -> Bool

        @_spi(AppleShimTesting) public init(
            modelURL: URL, trainingData: any MLBatchProvider, parameters: [MLParameterKey: Any], isCancelled: @escaping @Sendable () -> Bool
        ) {
            self.modelURL = modelURL
            self.trainingData = trainingData
            self.parameters = parameters
            self.isCancelled = isCancelled
        }
    }

    /// What happens when a running task is cancelled.
    @_spi(AppleShimTesting) public enum Cancellation: Sendable {
        /// The completion handler is called, the task's state `.cancelling`.
        case completesCancelled
        /// The completion handler is never called (nothing in Apple's documentation promises it is).
        case neverCallsBack
    }

    private let lock = NSLock()
    private var _training: (@Sendable (Run) throws -> [MLParameterKey: MLMultiArray])?
    private var _cancellation = Cancellation.completesCancelled

    @_spi(AppleShimTesting) public static let shared = SimulatedCoreML()

    @_spi(AppleShimTesting) public var training: (@Sendable (Run) throws -> [MLParameterKey: MLMultiArray])? {
        get { lock.withLock { _training } }
        set { lock.withLock { _training = newValue } }
    }

    @_spi(AppleShimTesting) public var cancellation: Cancellation {
        get { lock.withLock { _cancellation } }
        set { lock.withLock { _cancellation = newValue } }
    }
}

/// `MLUpdateTask`: trains the compiled model at a URL on a batch provider and calls the completion handler with the
/// updated model.
public final class MLUpdateTask: NSObject {
    private let modelURL: URL
    private let trainingData: any MLBatchProvider
    private let configuration: MLModelConfiguration?
    private let completion: (MLUpdateContext) -> Void
    private let lock = NSLock()
    private var taskState = MLTaskState.suspended
    private var failure: String?

    /// A task; call ``resume()`` to start it.
    public init(
        forModelAt modelURL: URL, trainingData: any MLBatchProvider, configuration: MLModelConfiguration?,
        completionHandler: @escaping (MLUpdateContext) -> Void
    ) throws {
        guard FileManager.default.fileExists(atPath: modelURL.path) else { throw MLModelError(.io, "no compiled model at \(modelURL.path)") }
        self.modelURL = modelURL
        self.trainingData = trainingData
        self.configuration = configuration
        self.completion = completionHandler
    }

    /// The task's state.
    public var state: MLTaskState { lock.withLock { taskState } }
    /// Why the task failed.
    public var error: (any Error)? { lock.withLock { failure.map { MLModelError(.update, $0) } } }

    /// Starts (or continues) the task.
    public func resume() {
        // A task cancelled before it started does not train: it ends as a cancelled one does.
        let cancelledFirst = lock.withLock { () -> Bool in
            if taskState == .cancelling { return true }
            taskState = .running
            return false
        }
        if cancelledFirst {
            guard SimulatedCoreML.shared.cancellation == .completesCancelled else { return }
            nonisolated(unsafe) let task = self
            DispatchQueue.global().async { task.completion(MLUpdateContext(task: task, model: MLModel(parameters: [:], compiled: Data()))) }
            return
        }
        // Core ML trains on a queue of its own (the task is not Sendable in the SDK; the shim's queue owns it here).
        nonisolated(unsafe) let task = self
        let run = SimulatedCoreML.Run(
            modelURL: modelURL, trainingData: trainingData, parameters: configuration?.parameters ?? [:],
            isCancelled: { task.state == .cancelling }
        )
        let simulated = SimulatedCoreML.shared
        DispatchQueue.global().async { task.train(run, simulated) }
    }

    private func train(_ run: SimulatedCoreML.Run, _ simulated: SimulatedCoreML) {
        var parameters: [MLParameterKey: MLMultiArray] = [:]
        do {
            guard let training = simulated.training else { throw MLModelError(.update, "no simulated training is set (SimulatedCoreML)") }
            parameters = try training(run)
            lock.withLock { taskState = taskState == .cancelling ? .cancelling : .completed }
        } catch {
            lock.withLock { (taskState, failure) = (.failed, "\(error)") }
        }
        if state == .cancelling, simulated.cancellation == .neverCallsBack { return }
        let compiled = (try? Data(contentsOf: modelURL)) ?? Data()
        completion(MLUpdateContext(task: self, model: MLModel(parameters: parameters, compiled: compiled)))
    }

    /// Cancels the task; whether the completion handler is called afterwards is not promised.
    public func cancel() {
        lock.withLock { if taskState == .running || taskState == .suspended { taskState = .cancelling } }
    }
}
#endif

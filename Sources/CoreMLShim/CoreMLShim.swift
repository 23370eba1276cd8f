// A small mirror of the part of Apple's Core ML that OrchardCoreMLTrainer uses — multi-arrays, feature and batch
// providers, model compilation, `MLUpdateTask` and reading updated parameters — so the trainer compiles and is tested
// on Linux. Names and shapes follow Apple's API; `MLUpdateTask.simulatedTraining` is the test hook standing in for the
// on-device training Core ML does.
public import Foundation
import Synchronization

/// Mirror of `MLMultiArrayDataType`.
public enum MLMultiArrayDataType: Int, Sendable {
    case double = 65600, float32 = 65568, int32 = 131104
}

/// Mirror of `MLMultiArray` (values kept as `Double`).
public final class MLMultiArray: @unchecked Sendable {
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
public final class MLFeatureValue: @unchecked Sendable {
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
public final class MLDictionaryFeatureProvider: MLFeatureProvider, @unchecked Sendable {
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
public final class MLArrayBatchProvider: MLBatchProvider, @unchecked Sendable {
    /// The samples.
    public let array: [any MLFeatureProvider]

    /// A provider of `array`.
    public init(array: [any MLFeatureProvider]) { self.array = array }

    public var count: Int { array.count }
    public func features(at index: Int) -> any MLFeatureProvider { array[index] }
}

/// Mirror of `MLParameterKey`: the update parameters, and the parameters of a layer (`scoped(to:)`).
public struct MLParameterKey: Hashable, Sendable, CustomStringConvertible {
    /// The parameter's name, and the layer it is scoped to.
    public let name: String
    public let scope: String?

    private init(_ name: String, scope: String? = nil) {
        self.name = name
        self.scope = scope
    }

    public static let learningRate = MLParameterKey("learningRate")
    public static let momentum = MLParameterKey("momentum")
    public static let miniBatchSize = MLParameterKey("miniBatchSize")
    public static let beta1 = MLParameterKey("beta1")
    public static let beta2 = MLParameterKey("beta2")
    public static let eps = MLParameterKey("eps")
    public static let epochs = MLParameterKey("epochs")
    public static let shuffle = MLParameterKey("shuffle")
    public static let weights = MLParameterKey("weights")
    public static let biases = MLParameterKey("biases")

    /// The key for the layer named `layer`.
    public func scoped(to layer: String) -> MLParameterKey { MLParameterKey(name, scope: layer) }

    public var description: String { scope.map { "\($0).\(name)" } ?? name }
}

/// Mirror of `MLModelConfiguration`.
public final class MLModelConfiguration: @unchecked Sendable {
    /// Update parameters overriding the model's defaults.
    public var parameters: [MLParameterKey: Any]?

    /// A default configuration.
    public init() {}
}

/// Mirror of `MLWritable`.
public protocol MLWritable {
    /// Writes the model (compiled) to `url`.
    func write(to url: URL) throws
}

/// Mirror of `MLModel` (compilation, and the parameters of an updated model).
public final class MLModel: MLWritable, @unchecked Sendable {
    private let parameters: [MLParameterKey: MLMultiArray]
    private let compiled: Data

    init(parameters: [MLParameterKey: MLMultiArray], compiled: Data) {
        self.parameters = parameters
        self.compiled = compiled
    }

    /// Compiles the `.mlmodel` at `url` and returns the compiled model's location (the shim copies the file).
    public static func compileModel(at url: URL) throws -> URL {
        let destination = FileManager.default.temporaryDirectory.appendingPathComponent("\(UUID().uuidString).mlmodelc")
        do { try FileManager.default.copyItem(at: url, to: destination) } catch {
            throw MLModelError(.io, "cannot compile \(url.path): \(error.localizedDescription)")
        }
        return destination
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
    case suspended, running, cancelling, completed, failed
}

/// Mirror of `MLUpdateContext`.
public final class MLUpdateContext: @unchecked Sendable {
    /// The task that finished.
    public let task: MLUpdateTask
    /// The updated model.
    public let model: MLModel

    init(task: MLUpdateTask, model: MLModel) {
        self.task = task
        self.model = model
    }
}

/// Mirror of `MLUpdateTask`: trains the compiled model at a URL on a batch provider and calls the completion handler
/// with the updated model, on a queue of its own.
public final class MLUpdateTask: @unchecked Sendable {
    /// What the simulated training is given.
    public struct SimulatedRun: @unchecked Sendable {
        /// The compiled model (the shim's copy of the `.mlmodel`).
        public let modelURL: URL
        /// The training samples.
        public let trainingData: any MLBatchProvider
        /// The update parameters the caller set.
        public let parameters: [MLParameterKey: Any]
        /// Whether the task was cancelled (checked between steps by a simulation that takes time).
        public let isCancelled: @Sendable () -> Bool
    }

    /// Test hook: the training the system would do — the updated values of every updatable layer's `.weights` and
    /// `.biases` (scoped to the layer). Unset, a task fails.
    nonisolated(unsafe) public static var simulatedTraining: (@Sendable (SimulatedRun) throws -> [MLParameterKey: MLMultiArray])?

    private let modelURL: URL
    private let trainingData: any MLBatchProvider
    private let configuration: MLModelConfiguration?
    private let completion: (MLUpdateContext) -> Void
    private let stateLock = Mutex<(MLTaskState, String?)>((.suspended, nil))

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
    public var state: MLTaskState { stateLock.withLock { $0.0 } }
    /// Why the task failed.
    public var error: (any Error)? { stateLock.withLock { $0.1.map { MLModelError(.update, $0) } } }

    /// Starts (or continues) the task.
    public func resume() {
        stateLock.withLock { $0.0 = .running }
        let run = SimulatedRun(
            modelURL: modelURL, trainingData: trainingData, parameters: configuration?.parameters ?? [:],
            isCancelled: { [self] in state == .cancelling }
        )
        DispatchQueue.global().async { [self] in
            var parameters: [MLParameterKey: MLMultiArray] = [:]
            do {
                guard let training = Self.simulatedTraining else { throw MLModelError(.update, "no simulated training is set (MLUpdateTask.simulatedTraining)") }
                parameters = try training(run)
                stateLock.withLock { $0.0 = $0.0 == .cancelling ? .cancelling : .completed }
            } catch {
                stateLock.withLock { $0 = (.failed, "\(error)") }
            }
            let compiled = (try? Data(contentsOf: modelURL)) ?? Data()
            completion(MLUpdateContext(task: self, model: MLModel(parameters: parameters, compiled: compiled)))
        }
    }

    /// Asks the task to stop.
    public func cancel() {
        stateLock.withLock { if $0.0 == .running || $0.0 == .suspended { $0.0 = .cancelling } }
    }
}

/// The element type of Core ML multi-array features.
public struct CoreMLArrayDataType: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable { case double, float32 }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// 64-bit floating point: what coremltools' `NeuralNetworkBuilder` declares by default.
    public static let double = CoreMLArrayDataType(.double)
    /// 32-bit floating point.
    public static let float32 = CoreMLArrayDataType(.float32)

    /// `double` or `float32`.
    public var description: String { kind.rawValue }

    var proto: CoreML_Specification_ArrayFeatureType.ArrayDataType {
        switch kind {
        case .double: .double
        case .float32: .float32
        }
    }
}

/// The values an integer update parameter (mini-batch size, epochs) may take on the device.
public struct CoreMLAllowedIntegers: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable { case set([Int]), range(ClosedRange<Int>) }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Exactly these values.
    public static func set(_ values: [Int]) -> CoreMLAllowedIntegers { CoreMLAllowedIntegers(.set(values)) }
    /// Any value in this range.
    public static func range(_ range: ClosedRange<Int>) -> CoreMLAllowedIntegers { CoreMLAllowedIntegers(.range(range)) }

    /// Whether `value` is allowed.
    public func contains(_ value: Int) -> Bool {
        switch kind {
        case .set(let values): values.contains(value)
        case .range(let range): range.contains(value)
        }
    }

    /// The allowed values, when they are a set.
    public var values: [Int]? {
        if case .set(let values) = kind { return values }
        return nil
    }

    /// The allowed range, when it is a range.
    public var range: ClosedRange<Int>? {
        if case .range(let range) = kind { return range }
        return nil
    }

    /// `{a, b}` for a set, `[min, max]` for a range.
    public var description: String {
        switch kind {
        case .set(let values): "{" + values.map(String.init).joined(separator: ", ") + "}"
        case .range(let range): "[\(range.lowerBound), \(range.upperBound)]"
        }
    }
}

/// The ranges within which an app may change an updatable model's hyper-parameters on the device
/// (`MLModelConfiguration.parameters`). Defaults follow coremltools' `SgdParams` and `AdamParams`.
public struct CoreMLUpdateRanges: Sendable, Hashable {
    /// Allowed learning rates.
    public var learningRate: ClosedRange<Double>
    /// Allowed SGD momentum values.
    public var momentum: ClosedRange<Double>
    /// Allowed Adam β₁ values.
    public var beta1: ClosedRange<Double>
    /// Allowed Adam β₂ values.
    public var beta2: ClosedRange<Double>
    /// Allowed Adam ε values.
    public var epsilon: ClosedRange<Double>
    /// Allowed mini-batch sizes; `nil` allows only the training spec's batch size.
    public var miniBatchSizes: CoreMLAllowedIntegers?
    /// Allowed epoch counts; `nil` allows only the training spec's epochs.
    public var epochs: CoreMLAllowedIntegers?

    /// Creates ranges; every parameter defaults to coremltools' default.
    public init(
        learningRate: ClosedRange<Double> = 0...1, momentum: ClosedRange<Double> = 0...1,
        beta1: ClosedRange<Double> = 0...1, beta2: ClosedRange<Double> = 0...1, epsilon: ClosedRange<Double> = 0...1,
        miniBatchSizes: CoreMLAllowedIntegers? = nil, epochs: CoreMLAllowedIntegers? = nil
    ) {
        self.learningRate = learningRate
        self.momentum = momentum
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.miniBatchSizes = miniBatchSizes
        self.epochs = epochs
    }
}

/// Descriptive metadata stored in a Core ML model.
public struct CoreMLMetadata: Sendable, Hashable {
    /// A one-line description of the model.
    public var shortDescription: String
    /// The model's author.
    public var author: String
    /// The model's license.
    public var license: String
    /// The model's version string.
    public var version: String

    /// Creates metadata; every field defaults to empty.
    public init(shortDescription: String = "", author: String = "", license: String = "", version: String = "") {
        self.shortDescription = shortDescription
        self.author = author
        self.license = license
        self.version = version
    }
}

/// How the exporter treats an Orchard `dropout` layer, which Core ML's neural networks do not have.
public struct CoreMLDropoutHandling: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable { case reject, omit }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Refuse to export a model with dropout.
    public static let reject = CoreMLDropoutHandling(.reject)
    /// Leave dropout out: predictions are unchanged, but on-device updates train without dropout.
    public static let omit = CoreMLDropoutHandling(.omit)

    /// `reject` or `omit`.
    public var description: String { kind.rawValue }
    var omits: Bool { kind == .omit }
}

/// Settings for ``CoreMLExporter``.
public struct CoreMLExportOptions: Sendable, Hashable {
    /// Whether to write an updatable model (needs the spec's `training`); otherwise a prediction-only model.
    public var updatable: Bool
    /// The element type declared for multi-array inputs, outputs and regression targets.
    public var arrayDataType: CoreMLArrayDataType
    /// What to do with dropout layers.
    public var dropout: CoreMLDropoutHandling
    /// Whether to leave out training settings Core ML cannot express (weight decay, an update cap)
    /// instead of refusing to export.
    public var dropsUnrepresentableTrainingSettings: Bool
    /// Whether the device shuffles the training data every epoch.
    public var shuffle: Bool
    /// Allowed ranges for the on-device hyper-parameters.
    public var ranges: CoreMLUpdateRanges
    /// Descriptive metadata.
    public var metadata: CoreMLMetadata

    /// Creates options; every field has a default.
    public init(
        updatable: Bool = true, arrayDataType: CoreMLArrayDataType = .double, dropout: CoreMLDropoutHandling = .reject,
        dropsUnrepresentableTrainingSettings: Bool = false, shuffle: Bool = true,
        ranges: CoreMLUpdateRanges = CoreMLUpdateRanges(), metadata: CoreMLMetadata = CoreMLMetadata()
    ) {
        self.updatable = updatable
        self.arrayDataType = arrayDataType
        self.dropout = dropout
        self.dropsUnrepresentableTrainingSettings = dropsUnrepresentableTrainingSettings
        self.shuffle = shuffle
        self.ranges = ranges
        self.metadata = metadata
    }
}

/// A named feature and its per-sample shape.
public struct FeatureSpec: Sendable, Hashable, Codable {
    /// The name; for inputs, the model input it feeds.
    public var name: String
    /// The per-sample shape.
    public var shape: [Int]

    /// Creates a feature spec.
    public init(name: String, shape: [Int]) {
        self.name = name
        self.shape = shape
    }

    /// Number of Float values per sample.
    public var elementCount: Int { shape.reduce(1, *) }
}

/// Samples the trainer batches from, without copying the dataset.
///
/// The trainer copies each sample of a batch into a batch buffer it reuses; a dataset only has to write one
/// sample's values into the destination it is given. Classification targets are class indices stored as Float
/// (shape `[1]`); categorical inputs are category indices stored as Float.
public protocol Dataset: Sendable {
    /// Number of samples.
    var count: Int { get }
    /// The inputs every sample provides, by model input name.
    var inputSpecs: [FeatureSpec] { get }
    /// The target every sample provides.
    var targetSpec: FeatureSpec { get }
    /// Writes input `input` (a position in ``inputSpecs``) of sample `index` into `destination`.
    func copyInput(_ input: Int, of index: Int, into destination: UnsafeMutableBufferPointer<Float>)
    /// Writes the target of sample `index` into `destination`.
    func copyTarget(of index: Int, into destination: UnsafeMutableBufferPointer<Float>)
}

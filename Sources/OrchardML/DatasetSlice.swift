/// A view of some samples of a base dataset, by position, without copying them.
///
/// Federated partitions are slices: every client's slice shares the base dataset's storage.
public struct DatasetSlice<Base: Dataset>: Dataset {
    /// The dataset the slice reads from.
    public let base: Base
    /// Positions in `base` of this slice's samples, in slice order.
    public let indices: [Int]

    /// Creates a view of `indices` of `base`.
    /// - Parameters:
    ///   - base: The dataset to read from.
    ///   - indices: Positions in `0..<base.count`.
    public init(_ base: Base, indices: [Int]) {
        precondition(indices.allSatisfy { (0..<base.count).contains($0) }, "slice index out of range")
        self.base = base
        self.indices = indices
    }

    public var count: Int { indices.count }
    public var inputSpecs: [FeatureSpec] { base.inputSpecs }
    public var targetSpec: FeatureSpec { base.targetSpec }

    public func copyInput(_ input: Int, of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        base.copyInput(input, of: indices[index], into: destination)
    }

    public func copyTarget(of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        base.copyTarget(of: indices[index], into: destination)
    }
}

extension Dataset {
    /// A view of the samples at `indices`, without copying them.
    public func slice(_ indices: [Int]) -> DatasetSlice<Self> { DatasetSlice(self, indices: indices) }
}

public import OrchardML

extension Dataset {
    /// The class label of every sample: the target's single value, which must be a non-negative integer.
    public func classLabels() throws(DataError) -> [Int] {
        guard targetSpec.elementCount == 1 else {
            throw DataError(.invalidArgument, "target '\(targetSpec.name)' has shape \(targetSpec.shape); class labels need shape [1]")
        }
        var labels = [Int](repeating: 0, count: count)
        var value: Float = 0
        for i in 0..<count {
            withUnsafeMutablePointer(to: &value) { copyTarget(of: i, into: UnsafeMutableBufferPointer(start: $0, count: 1)) }
            guard value >= 0, value == value.rounded(), value < Float(Int32.max) else {
                throw DataError(.malformedValue, "target of sample \(i) is \(value), not a class index")
            }
            labels[i] = Int(value)
        }
        return labels
    }
}

/// The one order in which a model's tensors are laid end to end as one flat vector: by name. The device flattens its
/// update in this order before masking it for secure aggregation, and the coordinator's running sum and checkpoints
/// (`ModelLayout`) place each tensor at the offset this order gives, so both sides agree on what coordinate `i` is.
public enum FlatOrder {
    /// Whether the tensor named `a` comes before the tensor named `b`.
    public static func precedes(_ a: String, _ b: String) -> Bool { a < b }

    /// `tensors` in flat order.
    public static func sorted(_ tensors: [TensorRecord]) -> [TensorRecord] {
        tensors.sorted { precedes($0.name, $1.name) }
    }

    /// The values of `tensors`, laid end to end in flat order.
    public static func flatten(_ tensors: [TensorRecord]) -> [Float] {
        var flat: [Float] = []
        flat.reserveCapacity(tensors.reduce(0) { $0 + $1.values.count })
        for tensor in sorted(tensors) { flat.append(contentsOf: tensor.values) }
        return flat
    }
}

public import OrchardFormats

/// What a device that trains with Core ML reports: the change `MLUpdateTask` made, as the difference between the
/// `.mlmodel` the coordinator served (`GET /v1/device/models/{id}?format=mlmodel`) and the updated one the task wrote,
/// in Orchard's tensor names and layouts — the same diff an Orchard-engine device sends.
public enum CoreMLUpdateDiff {
    /// `updated − received` for every tensor of the model.
    /// - Throws: ``CoreMLError`` when either file is not a model Orchard reads, their architectures differ (layers,
    ///   inputs, output), a tensor is missing or changed shape, or the update holds a non-finite value.
    public static func diff(received: [UInt8], updated: [UInt8]) throws(CoreMLError) -> [TensorRecord] {
        let before = try CoreMLImporter().importModel(from: received)
        let after = try CoreMLImporter().importModel(from: updated)
        guard before.spec.layers.map(\.name) == after.spec.layers.map(\.name), before.spec.inputs == after.spec.inputs,
            before.spec.output == after.spec.output
        else {
            throw CoreMLError(
                .invalidModel,
                "the updated model's architecture differs from the one received (layers \(after.spec.layers.map(\.name)), expected \(before.spec.layers.map(\.name)))"
            )
        }
        let updatedByName = Dictionary(after.weights.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        guard after.weights.count == before.weights.count else {
            throw CoreMLError(.weightMismatch, "the updated model has \(after.weights.count) tensors; the one received has \(before.weights.count)")
        }
        var diff: [TensorRecord] = []
        for tensor in before.weights {
            guard let changed = updatedByName[tensor.name] else {
                throw CoreMLError(.weightMismatch, "the updated model has no tensor '\(tensor.name)'")
            }
            guard changed.shape == tensor.shape else {
                throw CoreMLError(.weightMismatch, "tensor '\(tensor.name)' has shape \(changed.shape) after the update, \(tensor.shape) before")
            }
            guard changed.values.allSatisfy(\.isFinite) else {
                throw CoreMLError(.weightMismatch, "tensor '\(tensor.name)' holds a non-finite value after the update")
            }
            diff.append(TensorRecord(name: tensor.name, shape: tensor.shape, values: zip(changed.values, tensor.values).map { $0 - $1 }))
        }
        return diff
    }
}

public import OrchardFormats

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An optimizer's accumulated state: the update count and its per-parameter slots (momentum, Adam moments).
///
/// Slots are flat vectors in the plan's parameter order; frozen parameters' entries stay zero. In a checkpoint
/// each slot of each trainable parameter is a tensor `optimizer.<parameter>.<slot>`.
public struct OptimizerState: Sendable, Hashable {
    /// The optimizer kind (`sgd` or `adam`).
    public var kind: String
    /// Number of updates applied.
    public var step: Int
    /// Slot name → flat vector over all parameters.
    public var slots: [String: [Float]]

    /// Creates a state.
    public init(kind: String, step: Int, slots: [String: [Float]]) {
        self.kind = kind
        self.step = step
        self.slots = slots
    }

    /// The slot names an optimizer configuration keeps.
    public static func slotNames(for spec: OptimizerSpec) -> [String] {
        switch spec.type {
        case "adam": ["m", "v"]
        case "sgd" where spec.momentum != 0: ["momentum"]
        default: []
        }
    }
}

/// Applies updates to a plan's flat parameters from its flat gradients, over the trainable ranges only.
final class Optimizer {
    let spec: OptimizerSpec
    let count: Int
    var step: Int
    /// Slot buffers, in ``OptimizerState/slotNames(for:)`` order.
    let slots: [UnsafeMutablePointer<Float>]
    let slotNames: [String]

    init(spec: OptimizerSpec, parameterCount: Int) throws(EngineError) {
        guard spec.type == "sgd" || spec.type == "adam" else {
            throw EngineError(.invalidArgument, "unknown optimizer '\(spec.type)' (expected sgd or adam)")
        }
        guard spec.learningRate > 0, spec.learningRate.isFinite else {
            throw EngineError(.invalidArgument, "learning rate must be positive, not \(spec.learningRate)")
        }
        guard spec.momentum >= 0, spec.momentum < 1, spec.weightDecay >= 0 else {
            throw EngineError(.invalidArgument, "momentum must be in [0, 1) and weight decay ≥ 0")
        }
        guard spec.type != "adam" || (spec.beta1 >= 0 && spec.beta1 < 1 && spec.beta2 >= 0 && spec.beta2 < 1 && spec.epsilon > 0) else {
            throw EngineError(.invalidArgument, "Adam needs betas in [0, 1) and a positive epsilon")
        }
        self.spec = spec
        self.count = parameterCount
        self.step = 0
        slotNames = OptimizerState.slotNames(for: spec)
        slots = slotNames.map { _ in
            let p = UnsafeMutablePointer<Float>.allocate(capacity: max(parameterCount, 1))
            p.initialize(repeating: 0, count: max(parameterCount, 1))
            return p
        }
    }

    deinit {
        for s in slots { s.deallocate() }
    }

    /// The learning rate when the update is plain SGD (`w -= lr · g`: no momentum, no weight decay), which dense
    /// layers can apply during back-propagation (``CompiledModel/backward(batch:descentRate:)``); nil otherwise.
    var plainDescentRate: Float? {
        spec.type == "sgd" && spec.momentum == 0 && spec.weightDecay == 0 ? Float(spec.learningRate) : nil
    }

    /// Applies one update (PyTorch's semantics for SGD with momentum and for Adam with L2 weight decay).
    func update(parameters w: UnsafeMutablePointer<Float>, gradients g: UnsafePointer<Float>, ranges: [Range<Int>]) {
        step += 1
        apply(parameters: w, gradients: g, ranges: ranges)
    }

    /// The values' part of the update of step ``step`` (counted already): each value and its slots change on their
    /// own, so disjoint ranges may be applied side by side.
    func apply(parameters w: UnsafeMutablePointer<Float>, gradients g: UnsafePointer<Float>, ranges: [Range<Int>]) {
        let lr = Float(spec.learningRate)
        let wd = Float(spec.weightDecay)
        if spec.type == "adam" {
            let b1 = Float(spec.beta1), b2 = Float(spec.beta2), eps = Float(spec.epsilon)
            let c1 = Float(1 - pow(spec.beta1, Double(step)))
            let c2 = Float(1 - pow(spec.beta2, Double(step)))
            let stepSize = lr / c1
            let m = slots[0], v = slots[1]
            for range in ranges {
                for i in range {
                    let gi = g[i] + wd * w[i]
                    m[i] = b1 * m[i] + (1 - b1) * gi
                    v[i] = b2 * v[i] + (1 - b2) * gi * gi
                    w[i] -= stepSize * m[i] / ((v[i] / c2).squareRoot() + eps)
                }
            }
        } else if spec.momentum != 0 {
            let mu = Float(spec.momentum)
            let buffer = slots[0]
            let first = step == 1
            for range in ranges {
                for i in range {
                    let gi = g[i] + wd * w[i]
                    let b = first ? gi : mu * buffer[i] + gi
                    buffer[i] = b
                    w[i] -= lr * b
                }
            }
        } else if wd != 0 {
            for range in ranges {
                for i in range { w[i] -= lr * (g[i] + wd * w[i]) }
            }
        } else {
            for range in ranges {
                for i in range { w[i] -= lr * g[i] }
            }
        }
    }

    /// A copy of the state.
    var state: OptimizerState {
        var s: [String: [Float]] = [:]
        for (name, p) in zip(slotNames, slots) { s[name] = Array(UnsafeBufferPointer(start: p, count: count)) }
        return OptimizerState(kind: spec.type, step: step, slots: s)
    }

    /// Restores a state saved from an optimizer of the same kind over the same parameters.
    func restore(_ state: OptimizerState) throws(EngineError) {
        guard state.kind == spec.type else {
            throw EngineError(.incompatibleCheckpoint, "optimizer state is for '\(state.kind)', not '\(spec.type)'")
        }
        guard state.step >= 0 else { throw EngineError(.incompatibleCheckpoint, "optimizer step \(state.step) is negative") }
        for (name, p) in zip(slotNames, slots) {
            guard let values = state.slots[name] else {
                throw EngineError(.incompatibleCheckpoint, "optimizer state lacks slot '\(name)'")
            }
            guard values.count == count else {
                throw EngineError(.incompatibleCheckpoint, "optimizer slot '\(name)' has \(values.count) values, expected \(count)")
            }
            values.withUnsafeBufferPointer { p.update(from: $0.baseAddress!, count: count) }
        }
        step = state.step
    }
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The cell a recurrent layer runs.
public enum RecurrentCell: Sendable, Hashable {
    /// Gates i, f, g, o (PyTorch's `nn.LSTM`).
    case lstm
    /// The coupled input–forget gate LSTM: gates i, g, o, and f = 1 − i.
    case cifg
    /// Gates r, z, n (PyTorch's `nn.GRU`).
    case gru
}

/// The shape of a recurrent layer's pass over a batch: batch-first inputs `[batch, steps, inputSize]`, the hidden state
/// `[batch, hidden]`, gate pre-activations `[batch, gates × hidden]` in PyTorch's gate order.
struct RecurrentShape {
    typealias Cell = RecurrentCell

    var cell: Cell
    var batch: Int
    var steps: Int
    var inputSize: Int
    var hidden: Int
    /// Whether the output is every step's hidden state `[batch, steps, hidden]` or the last one's `[batch, hidden]`.
    var returnSequences: Bool

    /// Gates per hidden unit: 4 for the LSTM, 3 for CIFG and the GRU.
    var gates: Int { cell == .lstm ? 4 : 3 }
    /// The width of a step's gate row, `gates × hidden`.
    var gateWidth: Int { gates * hidden }

    /// Floats of scratch a training pass keeps per sample (activations of every step, for back-propagation through
    /// time): the gate activations, the hidden states, and the cells (LSTM) or the recurrent candidate term (GRU).
    static func scratchPerSample(cell: Cell, steps: Int, hidden: Int) -> Int {
        let gates = cell == .lstm ? 4 : 3
        return steps * (gates * hidden + 2 * hidden)
    }

    /// Floats of per-step scratch a backward pass needs per sample: two gate-gradient rows and two state rows.
    static func stepScratchPerSample(cell: Cell, hidden: Int) -> Int {
        let gates = cell == .lstm ? 4 : 3
        return 2 * gates * hidden + 3 * hidden
    }
}

/// The parameters of a recurrent layer (PyTorch's layout: `weight_ih` `[gates × hidden, inputSize]`, `weight_hh`
/// `[gates × hidden, hidden]`, biases `[gates × hidden]`) and, when it trains, their gradients.
struct RecurrentParameters {
    var weightIH: UnsafeMutablePointer<Float>
    var weightHH: UnsafeMutablePointer<Float>
    var biasIH: UnsafeMutablePointer<Float>?
    var biasHH: UnsafeMutablePointer<Float>?
    var weightIHGradient: UnsafeMutablePointer<Float>?
    var weightHHGradient: UnsafeMutablePointer<Float>?
    var biasIHGradient: UnsafeMutablePointer<Float>?
    var biasHHGradient: UnsafeMutablePointer<Float>?
}

extension Ops {
    @inline(__always)
    static func sigmoid(_ x: Float) -> Float { 1 / (1 + expf(-x)) }

    /// The pass forward through time. `scratch` holds ``RecurrentShape/scratchPerSample(cell:steps:hidden:)`` floats
    /// per sample, laid out step-major: every step's gate activations `[steps, batch, gateWidth]`, hidden states
    /// `[steps, batch, hidden]`, then cells (LSTM, CIFG) or the GRU's `W_hn h + b_hn` `[steps, batch, hidden]`;
    /// ``recurrentBackward(_:x:parameters:scratch:step:dy:dx:accumulateDx:)`` reads them back. `step` is the per-step
    /// scratch (``RecurrentShape/stepScratchPerSample(cell:hidden:)`` floats per sample).
    static func recurrentForward(_ s: RecurrentShape, x: CPtr, parameters p: RecurrentParameters, scratch: Ptr, step: Ptr, y: Ptr) {
        let (b, h, g) = (s.batch, s.hidden, s.gateWidth)
        let acts = scratch
        let states = scratch + s.steps * b * g
        let extra = states + s.steps * b * h
        for t in 0..<s.steps {
            let a = acts + t * b * g
            let state = states + t * b * h
            let other = extra + t * b * h
            let previous: CPtr? = t == 0 ? nil : CPtr(states + (t - 1) * b * h)
            let previousCell: CPtr? = t == 0 ? nil : CPtr(extra + (t - 1) * b * h)
            // x_t W_ihᵀ + b_ih for the batch (x_t's rows are a stride of steps × inputSize apart).
            GEMM.multiply(
                transposeB: true, m: b, n: g, k: s.inputSize, a: x + t * s.inputSize, lda: s.steps * s.inputSize, b: p.weightIH, ldb: s.inputSize, c: a, ldc: g)
            if let bias = p.biasIH { addRowVector(rows: b, width: g, vector: bias, into: a) }
            switch s.cell {
            case .lstm, .cifg:
                if let previous {
                    GEMM.multiply(transposeB: true, m: b, n: g, k: h, a: previous, lda: h, b: p.weightHH, ldb: h, beta: 1, c: a, ldc: g)
                }
                if let bias = p.biasHH { addRowVector(rows: b, width: g, vector: bias, into: a) }
                for r in 0..<b {
                    let row = a + r * g
                    for j in 0..<h {
                        let cPrevious = previousCell.map { $0[r * h + j] } ?? 0
                        let c: Float
                        let o: Float
                        if s.cell == .lstm {
                            let i = sigmoid(row[j]), f = sigmoid(row[h + j]), gg = tanhf(row[2 * h + j])
                            o = sigmoid(row[3 * h + j])
                            (row[j], row[h + j], row[2 * h + j], row[3 * h + j]) = (i, f, gg, o)
                            c = f * cPrevious + i * gg
                        } else {
                            let i = sigmoid(row[j]), gg = tanhf(row[h + j])
                            o = sigmoid(row[2 * h + j])
                            (row[j], row[h + j], row[2 * h + j]) = (i, gg, o)
                            c = (1 - i) * cPrevious + i * gg
                        }
                        other[r * h + j] = c
                        state[r * h + j] = o * tanhf(c)
                    }
                }
            case .gru:
                // The recurrent term h_{t−1} W_hhᵀ + b_hh: its r and z parts join the input's; its n part is kept (it is
                // multiplied by r).
                let recurrent = step
                if let previous {
                    GEMM.multiply(transposeB: true, m: b, n: g, k: h, a: previous, lda: h, b: p.weightHH, ldb: h, c: recurrent, ldc: g)
                } else {
                    recurrent.update(repeating: 0, count: b * g)
                }
                if let bias = p.biasHH { addRowVector(rows: b, width: g, vector: bias, into: recurrent) }
                for r in 0..<b {
                    for j in 0..<h {
                        let row = a + r * g
                        let sums = recurrent + r * g
                        let reset = sigmoid(row[j] + sums[j])
                        let update = sigmoid(row[h + j] + sums[h + j])
                        let candidate = tanhf(row[2 * h + j] + reset * sums[2 * h + j])
                        (row[j], row[h + j], row[2 * h + j]) = (reset, update, candidate)
                        other[r * h + j] = sums[2 * h + j]
                        let hPrevious = previous.map { $0[r * h + j] } ?? 0
                        state[r * h + j] = (1 - update) * candidate + update * hPrevious
                    }
                }
            }
        }
        copyRecurrentOutput(s, states: states, y: y)
    }

    /// The layer's output from the hidden states: every step's, batch-first, or the last step's.
    private static func copyRecurrentOutput(_ s: RecurrentShape, states: CPtr, y: Ptr) {
        let (b, h) = (s.batch, s.hidden)
        if s.returnSequences {
            for t in 0..<s.steps {
                for r in 0..<b { (y + (r * s.steps + t) * h).update(from: states + (t * b + r) * h, count: h) }
            }
        } else {
            y.update(from: states + (s.steps - 1) * b * h, count: b * h)
        }
    }

    /// Back-propagation through time: the parameter gradients (overwritten; none for a frozen layer) and, with `dx`,
    /// the input gradient (`accumulateDx` adds to it). `step` holds
    /// ``RecurrentShape/stepScratchPerSample(cell:hidden:)`` floats per sample.
    static func recurrentBackward(
        _ s: RecurrentShape, x: CPtr, parameters p: RecurrentParameters, scratch: CPtr, step: Ptr, dy: CPtr, dx: Ptr?, accumulateDx: Bool
    ) {
        let (b, h, g, n) = (s.batch, s.hidden, s.gateWidth, s.inputSize)
        let acts = scratch
        let states = scratch + s.steps * b * g
        let extra = states + s.steps * b * h
        let dInput = step  // [b, g]: the gradient of the input-side pre-activations
        let dRecurrent = step + b * g  // [b, g]: of the recurrent-side ones (the GRU's differ in n)
        let dh = dRecurrent + b * g  // [b, h]: the gradient reaching h_t
        let dc = dh + b * h  // [b, h]: reaching c_t (LSTM, CIFG)
        let dhNext = dc + b * h  // [b, h]: reaching h_{t-1} through the recurrence
        dhNext.update(repeating: 0, count: b * h)
        dc.update(repeating: 0, count: b * h)
        p.weightIHGradient?.update(repeating: 0, count: g * n)
        p.weightHHGradient?.update(repeating: 0, count: g * h)
        p.biasIHGradient?.update(repeating: 0, count: g)
        p.biasHHGradient?.update(repeating: 0, count: g)
        if let dx, !accumulateDx { dx.update(repeating: 0, count: b * s.steps * n) }
        for t in stride(from: s.steps - 1, through: 0, by: -1) {
            let a = acts + t * b * g
            let other = extra + t * b * h
            let previous: CPtr? = t == 0 ? nil : states + (t - 1) * b * h
            let previousCell: CPtr? = t == 0 ? nil : extra + (t - 1) * b * h
            // The gradient reaching h_t: from the output and from step t + 1.
            for r in 0..<b {
                for j in 0..<h {
                    var value = dhNext[r * h + j]
                    if s.returnSequences {
                        value += dy[(r * s.steps + t) * h + j]
                    } else if t == s.steps - 1 {
                        value += dy[r * h + j]
                    }
                    dh[r * h + j] = value
                }
            }
            switch s.cell {
            case .lstm, .cifg:
                for r in 0..<b {
                    let row = a + r * g
                    let dRow = dInput + r * g
                    for j in 0..<h {
                        let c = other[r * h + j]
                        let tc = tanhf(c)
                        let cPrevious = previousCell.map { $0[r * h + j] } ?? 0
                        let i: Float, f: Float, gg: Float, o: Float
                        if s.cell == .lstm {
                            (i, f, gg, o) = (row[j], row[h + j], row[2 * h + j], row[3 * h + j])
                        } else {
                            (i, gg, o) = (row[j], row[h + j], row[2 * h + j])
                            f = 1 - i
                        }
                        let dhValue = dh[r * h + j]
                        let dcValue = dc[r * h + j] + dhValue * o * (1 - tc * tc)
                        let dO = dhValue * tc
                        let dG = dcValue * i
                        if s.cell == .lstm {
                            dRow[j] = dcValue * gg * i * (1 - i)
                            dRow[h + j] = dcValue * cPrevious * f * (1 - f)
                            dRow[2 * h + j] = dG * (1 - gg * gg)
                            dRow[3 * h + j] = dO * o * (1 - o)
                        } else {
                            // f = 1 − i: the forget path's gradient reaches i with the opposite sign.
                            dRow[j] = dcValue * (gg - cPrevious) * i * (1 - i)
                            dRow[h + j] = dG * (1 - gg * gg)
                            dRow[2 * h + j] = dO * o * (1 - o)
                        }
                        dc[r * h + j] = dcValue * f
                    }
                }
                accumulateRecurrentGradients(s, t: t, x: x, previous: previous, dInput: dInput, dRecurrent: dInput, parameters: p)
                if let dx { GEMM.multiply(m: b, n: n, k: g, a: dInput, lda: g, b: p.weightIH, ldb: n, beta: 1, c: dx + t * n, ldc: s.steps * n) }
                if t > 0 { GEMM.multiply(m: b, n: h, k: g, a: dInput, lda: g, b: p.weightHH, ldb: h, c: dhNext, ldc: h) }
            case .gru:
                for r in 0..<b {
                    let row = a + r * g
                    let dRow = dInput + r * g
                    let dRecurrentRow = dRecurrent + r * g
                    for j in 0..<h {
                        let (reset, update, candidate) = (row[j], row[h + j], row[2 * h + j])
                        let hPrevious = previous.map { $0[r * h + j] } ?? 0
                        let dhValue = dh[r * h + j]
                        let dCandidate = dhValue * (1 - update) * (1 - candidate * candidate)
                        let dUpdate = dhValue * (hPrevious - candidate) * update * (1 - update)
                        let dReset = dCandidate * other[r * h + j] * reset * (1 - reset)
                        (dRow[j], dRow[h + j], dRow[2 * h + j]) = (dReset, dUpdate, dCandidate)
                        (dRecurrentRow[j], dRecurrentRow[h + j], dRecurrentRow[2 * h + j]) = (dReset, dUpdate, dCandidate * reset)
                        // The direct path h' = … + z h.
                        dc[r * h + j] = dhValue * update
                    }
                }
                accumulateRecurrentGradients(s, t: t, x: x, previous: previous, dInput: dInput, dRecurrent: dRecurrent, parameters: p)
                if let dx { GEMM.multiply(m: b, n: n, k: g, a: dInput, lda: g, b: p.weightIH, ldb: n, beta: 1, c: dx + t * n, ldc: s.steps * n) }
                if t > 0 {
                    dhNext.update(from: dc, count: b * h)
                    GEMM.multiply(m: b, n: h, k: g, a: dRecurrent, lda: g, b: p.weightHH, ldb: h, beta: 1, c: dhNext, ldc: h)
                }
            }
        }
    }

    /// Adds step `t`'s parameter gradients: `dInputᵀ x_t` and `dRecurrentᵀ h_{t−1}` to the weights, the rows' sums to
    /// the biases.
    private static func accumulateRecurrentGradients(
        _ s: RecurrentShape, t: Int, x: CPtr, previous: CPtr?, dInput: CPtr, dRecurrent: CPtr, parameters p: RecurrentParameters
    ) {
        let (b, h, g, n) = (s.batch, s.hidden, s.gateWidth, s.inputSize)
        if let gradient = p.weightIHGradient {
            GEMM.multiply(transposeA: true, m: g, n: n, k: b, a: dInput, lda: g, b: x + t * n, ldb: s.steps * n, beta: 1, c: gradient, ldc: n)
        }
        if let gradient = p.weightHHGradient, let previous {
            GEMM.multiply(transposeA: true, m: g, n: h, k: b, a: dRecurrent, lda: g, b: previous, ldb: h, beta: 1, c: gradient, ldc: h)
        }
        for r in 0..<b {
            if let gradient = p.biasIHGradient { for j in 0..<g { gradient[j] += dInput[r * g + j] } }
            if let gradient = p.biasHHGradient { for j in 0..<g { gradient[j] += dRecurrent[r * g + j] } }
        }
    }
}

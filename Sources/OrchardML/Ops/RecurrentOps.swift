#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import COrchardKernels

/// The cell a recurrent layer runs.
public enum RecurrentCell: Sendable, Hashable {
    /// Gates i, f, g, o (PyTorch's `nn.LSTM`).
    case lstm
    /// The coupled input–forget gate LSTM: gates i, g, o, and f = 1 − i.
    case cifg
    /// Gates r, z, n (PyTorch's `nn.GRU`).
    case gru
}

/// Where an LSTM or CIFG step's element-wise work runs (the GRU's always runs in Swift).
enum CellKernel: Sendable, CaseIterable {
    /// Swift on eight-lane vectors, built for the baseline instruction set (SSE on x86-64): always available.
    case portable
    /// `orchard_avx2_lstm_*`: AVX2 and FMA, chosen at run time.
    case avx2
    /// `orchard_avx512_lstm_*`: AVX-512F, chosen at run time.
    case avx512

    /// The kernels that go with the matrix backend: the portable backend keeps Swift, the AVX2 one pins AVX2, any other
    /// takes the widest the CPU has.
    static var current: CellKernel { choice(for: GEMM.backend) }

    /// The kernels that go with `backend` on this CPU.
    static func choice(for backend: MatrixBackend) -> CellKernel {
        guard backend != .portable && AVX2GEMM.isAvailable else { return .portable }
        return backend == .avx2 || !AVX2GEMM.isAVX512Available ? .avx2 : .avx512
    }

    /// Whether this CPU can run the kernels.
    var isAvailable: Bool {
        switch self {
        case .portable: true
        case .avx2: AVX2GEMM.isAvailable
        case .avx512: AVX2GEMM.isAVX512Available
        }
    }
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

    /// Floats of scratch a training pass keeps per sample (for back-propagation through time), step-major: the input
    /// (`[steps, batch, inputSize]`), every step's gate activations, hidden states, and cells (LSTM) or the recurrent
    /// candidate term (GRU).
    static func scratchPerSample(cell: Cell, steps: Int, inputSize: Int, hidden: Int) -> Int {
        let gates = cell == .lstm ? 4 : 3
        return steps * (inputSize + gates * hidden + 2 * hidden)
    }

    /// Floats of room for the transposed weights (``RecurrentParameters/transposed``).
    static func transposedCount(cell: Cell, inputSize: Int, hidden: Int) -> Int {
        (cell == .lstm ? 4 : 3) * hidden * (inputSize + hidden)
    }

    /// Floats of working space a pass needs per sample: every step's gate gradients on the input side, then those of
    /// the recurrent side (room enough for the step-major input gradient too), three state rows and one gate row.
    static func stepScratchPerSample(cell: Cell, steps: Int, inputSize: Int, hidden: Int) -> Int {
        let gates = cell == .lstm ? 4 : 3
        return steps * gates * hidden + steps * max(gates * hidden, inputSize) + 3 * hidden + gates * hidden
    }
}

/// The parameters of a recurrent layer (PyTorch's layout: `weight_ih` `[gates × hidden, inputSize]`, `weight_hh`
/// `[gates × hidden, hidden]`, biases `[gates × hidden]`) and, when it trains, their gradients.
struct RecurrentParameters {
    var weightIH: UnsafeMutablePointer<Float>
    var weightHH: UnsafeMutablePointer<Float>
    /// Room for the weights transposed (`[features, gates × units]` then `[units, gates × units]`), which the forward
    /// pass writes: its products are then `A · B`, which the wide kernels run best at a short batch.
    var transposed: UnsafeMutablePointer<Float>
    var biasIH: UnsafeMutablePointer<Float>?
    var biasHH: UnsafeMutablePointer<Float>?
    var weightIHGradient: UnsafeMutablePointer<Float>?
    var weightHHGradient: UnsafeMutablePointer<Float>?
    var biasIHGradient: UnsafeMutablePointer<Float>?
    var biasHHGradient: UnsafeMutablePointer<Float>?
}

extension Ops {
    typealias V8 = SIMD8<Float>

    /// `e^x` for eight lanes: Cephes' range reduction and polynomial, about 1 ulp (inputs clamped to ±87, where
    /// Float's exponent ends).
    @inline(__always)
    static func exp(_ x: V8) -> V8 {
        var clamped = x
        clamped.replace(with: -87, where: x .< -87)
        clamped.replace(with: 87, where: x .> 87)
        // Adding 1.5 × 2²³ rounds to an integer held in the low mantissa bits.
        let magic = V8(repeating: 12_582_912)
        let shifted = clamped * 1.442_695_040_888_963_4 + magic
        let n = shifted - magic
        var r = clamped - n * 0.693_359_375
        r = r - n * -2.121_944_40e-4
        var p = V8(repeating: 1.987_569_150_0e-4)
        p = p * r + 1.398_199_950_7e-3
        p = p * r + 8.333_451_907_3e-3
        p = p * r + 4.166_579_589_4e-2
        p = p * r + 1.666_666_545_9e-1
        p = p * r + 5.000_000_120_1e-1
        let e = p * (r * r) + r + 1
        let bits = (unsafeBitCast(shifted, to: SIMD8<UInt32>.self) &- unsafeBitCast(magic, to: SIMD8<UInt32>.self) &+ 127) &<< 23
        return e * unsafeBitCast(bits, to: V8.self)
    }

    @inline(__always) static func sigmoid(_ x: V8) -> V8 { 1 / (1 + exp(-x)) }
    @inline(__always) static func tanh(_ x: V8) -> V8 { 1 - 2 / (exp(2 * x) + 1) }

    @inline(__always) static func load(_ p: CPtr) -> V8 { UnsafeRawPointer(p).loadUnaligned(as: V8.self) }
    @inline(__always) static func store(_ v: V8, _ p: Ptr) { UnsafeMutableRawPointer(p).storeBytes(of: v, as: V8.self) }

    /// Applies `f` in place to `count` values, eight at a time (the tail through a padded vector, so every value
    /// goes through the same arithmetic).
    @inline(__always)
    static func mapInPlace(_ p: Ptr, _ count: Int, _ f: (V8) -> V8) {
        var j = 0
        while j + 8 <= count {
            store(f(load(p + j)), p + j)
            j += 8
        }
        if j < count {
            var v = V8()
            for k in 0..<(count - j) { v[k] = p[j + k] }
            let out = f(v)
            for k in 0..<(count - j) { p[j + k] = out[k] }
        }
    }

    /// Runs `body(j, width)` over `0..<count` in chunks of eight and one shorter tail; `body` reads and writes
    /// `width` lanes at `j` (a tail loads padded vectors).
    @inline(__always)
    static func lanes(_ count: Int, _ body: (Int, Int) -> Void) {
        var j = 0
        while j + 8 <= count {
            body(j, 8)
            j += 8
        }
        if j < count { body(j, count - j) }
    }

    @inline(__always) static func load(_ p: CPtr, _ width: Int) -> V8 {
        if width == 8 { return load(p) }
        var v = V8()
        for k in 0..<width { v[k] = p[k] }
        return v
    }

    @inline(__always) static func store(_ v: V8, _ p: Ptr, _ width: Int) {
        if width == 8 { return store(v, p) }
        for k in 0..<width { p[k] = v[k] }
    }

    /// The pass forward through time. `scratch` holds ``RecurrentShape/scratchPerSample(cell:steps:inputSize:hidden:)``
    /// floats per sample: the step-major input, every step's gate activations, hidden states, and cells (LSTM, CIFG)
    /// or the GRU's `W_hn h + b_hn`; ``recurrentBackward(_:x:parameters:scratch:step:dy:dx:accumulateDx:kernel:)`` reads
    /// them back. `step` is working space (``RecurrentShape/stepScratchPerSample(cell:steps:inputSize:hidden:)`` per sample).
    /// The input projection of every step is one matrix product; only the recurrent one runs step by step.
    static func recurrentForward(
        _ s: RecurrentShape, x: CPtr, parameters p: RecurrentParameters, scratch: Ptr, step: Ptr, y: Ptr, kernel: CellKernel = .current
    ) {
        let (b, h, g, n, steps) = (s.batch, s.hidden, s.gateWidth, s.inputSize, s.steps)
        let xs = scratch
        let acts = xs + steps * b * n
        let states = acts + steps * b * g
        let extra = states + steps * b * h
        // The input, step-major: each step's rows side by side.
        for t in 0..<steps {
            for r in 0..<b { (xs + (t * b + r) * n).update(from: x + (r * steps + t) * n, count: n) }
        }
        let weightIHT = p.transposed, weightHHT = p.transposed + n * g
        transpose(p.weightIH, rows: g, columns: n, into: weightIHT)
        transpose(p.weightHH, rows: g, columns: h, into: weightHHT)
        GEMM.multiply(m: steps * b, n: g, k: n, a: xs, lda: n, b: weightIHT, ldb: g, c: acts, ldc: g)
        if let bias = p.biasIH { addRowVector(rows: steps * b, width: g, vector: bias, into: acts) }
        if s.cell != .gru, let bias = p.biasHH { addRowVector(rows: steps * b, width: g, vector: bias, into: acts) }
        let recurrent = step  // [b, g]: the GRU's h W_hhᵀ + b_hh
        for t in 0..<steps {
            let a = acts + t * b * g
            let state = states + t * b * h
            let other = extra + t * b * h
            let previous: CPtr? = t == 0 ? nil : CPtr(states + (t - 1) * b * h)
            let previousCell: CPtr? = t == 0 ? nil : CPtr(extra + (t - 1) * b * h)
            switch s.cell {
            case .lstm, .cifg:
                if let previous { GEMM.multiply(m: b, n: g, k: h, a: previous, lda: h, b: weightHHT, ldb: g, beta: 1, c: a, ldc: g) }
                let lstm = s.cell == .lstm
                switch kernel {
                case .avx512:
                    orchard_avx512_lstm_forward(!lstm, b, h, a, g, previousCell, other, state)
                    continue
                case .avx2:
                    orchard_avx2_lstm_forward(!lstm, b, h, a, g, previousCell, other, state)
                    continue
                case .portable: break
                }
                for r in 0..<b {
                    let row = a + r * g
                    // LSTM rows: i, f, g, o; CIFG rows: i, g, o.
                    let (input, forget, candidate, output) = lstm ? (row, row + h, row + 2 * h, row + 3 * h) : (row, row, row + h, row + 2 * h)
                    mapInPlace(input, h, sigmoid)
                    if lstm { mapInPlace(forget, h, sigmoid) }
                    mapInPlace(candidate, h, tanh)
                    mapInPlace(output, h, sigmoid)
                    lanes(h) { j, w in
                        let i = load(input + j, w), gg = load(candidate + j, w), o = load(output + j, w)
                        let f = lstm ? load(forget + j, w) : 1 - i
                        let cPrevious = previousCell.map { load($0 + r * h + j, w) } ?? V8()
                        let c = f * cPrevious + i * gg
                        store(c, other + r * h + j, w)
                        store(o * tanh(c), state + r * h + j, w)
                    }
                }
            case .gru:
                if let previous {
                    GEMM.multiply(m: b, n: g, k: h, a: previous, lda: h, b: weightHHT, ldb: g, c: recurrent, ldc: g)
                } else {
                    recurrent.update(repeating: 0, count: b * g)
                }
                if let bias = p.biasHH { addRowVector(rows: b, width: g, vector: bias, into: recurrent) }
                for r in 0..<b {
                    let row = a + r * g, sums = recurrent + r * g
                    lanes(h) { j, w in
                        let reset = sigmoid(load(row + j, w) + load(sums + j, w))
                        let update = sigmoid(load(row + h + j, w) + load(sums + h + j, w))
                        let hn = load(sums + 2 * h + j, w)
                        let candidate = tanh(load(row + 2 * h + j, w) + reset * hn)
                        store(reset, row + j, w)
                        store(update, row + h + j, w)
                        store(candidate, row + 2 * h + j, w)
                        store(hn, other + r * h + j, w)
                        let hPrevious = previous.map { load($0 + r * h + j, w) } ?? V8()
                        store((1 - update) * candidate + update * hPrevious, state + r * h + j, w)
                    }
                }
            }
        }
        copyRecurrentOutput(s, states: states, y: y)
    }

    /// `out = mᵀ` for a row-major `rows × columns` matrix, in blocks that stay in cache.
    static func transpose(_ m: CPtr, rows: Int, columns: Int, into out: Ptr) {
        let block = 32
        for r0 in stride(from: 0, to: rows, by: block) {
            for c0 in stride(from: 0, to: columns, by: block) {
                for r in r0..<min(r0 + block, rows) {
                    for c in c0..<min(c0 + block, columns) { out[c * rows + r] = m[r * columns + c] }
                }
            }
        }
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
    /// the input gradient (`accumulateDx` adds to it). The gate gradients of every step are kept, so the weight
    /// gradients and the input gradient are one matrix product each over all steps; only the gradient reaching the
    /// previous hidden state runs step by step.
    static func recurrentBackward(
        _ s: RecurrentShape, x: CPtr, parameters p: RecurrentParameters, scratch: CPtr, step: Ptr, dy: CPtr, dx: Ptr?, accumulateDx: Bool,
        kernel: CellKernel = .current
    ) {
        let (b, h, g, n, steps) = (s.batch, s.hidden, s.gateWidth, s.inputSize, s.steps)
        let xs = scratch
        let acts = xs + steps * b * n
        let states = acts + steps * b * g
        let extra = states + steps * b * h
        let dInputs = step  // [steps, b, g]: gradients of the input-side pre-activations
        let dRecurrents = step + steps * b * g  // [steps, b, g]: of the recurrent side (the GRU's differ in n)
        let dh = dRecurrents + steps * b * max(g, n)  // [b, h]: the gradient reaching h_t
        let dc = dh + b * h  // [b, h]: reaching c_t (LSTM, CIFG); the GRU's direct path to h_{t−1}
        let dhNext = dc + b * h  // [b, h]: reaching h_{t−1} through the recurrence
        dhNext.update(repeating: 0, count: b * h)
        dc.update(repeating: 0, count: b * h)
        for t in stride(from: steps - 1, through: 0, by: -1) {
            let a = acts + t * b * g
            let other = extra + t * b * h
            let previous: CPtr? = t == 0 ? nil : states + (t - 1) * b * h
            let previousCell: CPtr? = t == 0 ? nil : extra + (t - 1) * b * h
            let dInput = dInputs + t * b * g
            // The step's output gradient, if it has one: every step's with returnSequences, else only the last.
            let stepDy: CPtr? = s.returnSequences ? dy + t * h : (t == steps - 1 ? dy : nil)
            let stepDyStride = s.returnSequences ? steps * h : h
            if s.cell != .gru && kernel != .portable {
                // The wide kernels add the output's gradient to dhNext themselves.
                if kernel == .avx512 {
                    orchard_avx512_lstm_backward(s.cell == .cifg, b, h, a, g, other, previousCell, dhNext, stepDy, stepDyStride, dc, dInput)
                } else {
                    orchard_avx2_lstm_backward(s.cell == .cifg, b, h, a, g, other, previousCell, dhNext, stepDy, stepDyStride, dc, dInput)
                }
                if t > 0 { GEMM.multiply(m: b, n: h, k: g, a: dInput, lda: g, b: p.weightHH, ldb: h, c: dhNext, ldc: h) }
                continue
            }
            // The gradient reaching h_t: from the output and from step t + 1.
            for r in 0..<b {
                let out: CPtr? = s.returnSequences ? dy + (r * steps + t) * h : (t == steps - 1 ? dy + r * h : nil)
                lanes(h) { j, w in
                    var value = load(dhNext + r * h + j, w)
                    if let out { value += load(out + j, w) }
                    store(value, dh + r * h + j, w)
                }
            }
            switch s.cell {
            case .lstm, .cifg:
                let lstm = s.cell == .lstm
                for r in 0..<b {
                    let row = a + r * g, dRow = dInput + r * g
                    let (input, forget, candidate, output) = lstm ? (row, row + h, row + 2 * h, row + 3 * h) : (row, row, row + h, row + 2 * h)
                    lanes(h) { j, w in
                        let c = load(other + r * h + j, w)
                        let tc = tanh(c)
                        let cPrevious = previousCell.map { load($0 + r * h + j, w) } ?? V8()
                        let i = load(input + j, w), gg = load(candidate + j, w), o = load(output + j, w)
                        let f = lstm ? load(forget + j, w) : 1 - i
                        let dhValue = load(dh + r * h + j, w)
                        let dcValue = load(dc + r * h + j, w) + dhValue * o * (1 - tc * tc)
                        let dO = dhValue * tc * o * (1 - o)
                        let dG = dcValue * i * (1 - gg * gg)
                        if lstm {
                            store(dcValue * gg * i * (1 - i), dRow + j, w)
                            store(dcValue * cPrevious * f * (1 - f), dRow + h + j, w)
                            store(dG, dRow + 2 * h + j, w)
                            store(dO, dRow + 3 * h + j, w)
                        } else {
                            // f = 1 − i: the forget path's gradient reaches i with the opposite sign.
                            store(dcValue * (gg - cPrevious) * i * (1 - i), dRow + j, w)
                            store(dG, dRow + h + j, w)
                            store(dO, dRow + 2 * h + j, w)
                        }
                        store(dcValue * f, dc + r * h + j, w)
                    }
                }
                if t > 0 { GEMM.multiply(m: b, n: h, k: g, a: dInput, lda: g, b: p.weightHH, ldb: h, c: dhNext, ldc: h) }
            case .gru:
                let dRecurrent = dRecurrents + t * b * g
                for r in 0..<b {
                    let row = a + r * g, dRow = dInput + r * g, dRecurrentRow = dRecurrent + r * g
                    lanes(h) { j, w in
                        let reset = load(row + j, w), update = load(row + h + j, w), candidate = load(row + 2 * h + j, w)
                        let hPrevious = previous.map { load($0 + r * h + j, w) } ?? V8()
                        let dhValue = load(dh + r * h + j, w)
                        let dCandidate = dhValue * (1 - update) * (1 - candidate * candidate)
                        let dUpdate = dhValue * (hPrevious - candidate) * update * (1 - update)
                        let dReset = dCandidate * load(other + r * h + j, w) * reset * (1 - reset)
                        store(dReset, dRow + j, w)
                        store(dUpdate, dRow + h + j, w)
                        store(dCandidate, dRow + 2 * h + j, w)
                        store(dReset, dRecurrentRow + j, w)
                        store(dUpdate, dRecurrentRow + h + j, w)
                        store(dCandidate * reset, dRecurrentRow + 2 * h + j, w)
                        // The direct path h' = … + z h.
                        store(dhValue * update, dc + r * h + j, w)
                    }
                }
                if t > 0 {
                    dhNext.update(from: dc, count: b * h)
                    GEMM.multiply(m: b, n: h, k: g, a: dRecurrent, lda: g, b: p.weightHH, ldb: h, beta: 1, c: dhNext, ldc: h)
                }
            }
        }
        // Over every step at once: the weight and bias gradients, and the input's. The weight gradients are deep
        // (steps × batch) and narrow; Orchard's own kernels run them faster than OpenBLAS, which the automatic choice
        // picks past a depth of 256 (char-lstm at batch 10 in two parts: 3,381 against 3,244 sequences/s, same sitting).
        let dRecurrentAll = s.cell == .gru ? CPtr(dRecurrents) : CPtr(dInputs)
        let own: MatrixBackend? = GEMM.backend == .automatic && AVX2GEMM.isAvailable ? (AVX2GEMM.isAVX512Available ? .avx512 : .avx2) : nil
        if let gradient = p.weightIHGradient {
            GEMM.multiply(transposeA: true, m: g, n: n, k: steps * b, a: dInputs, lda: g, b: xs, ldb: n, c: gradient, ldc: n, using: own)
        }
        if let gradient = p.weightHHGradient {
            if steps > 1 {
                GEMM.multiply(
                    transposeA: true, m: g, n: h, k: (steps - 1) * b, a: dRecurrentAll + b * g, lda: g, b: states, ldb: h, c: gradient, ldc: h,
                    using: own)
            } else {
                gradient.update(repeating: 0, count: g * h)
            }
        }
        if let gradient = p.biasIHGradient { sumRows(rows: steps * b, width: g, source: dInputs, into: gradient) }
        if let gradient = p.biasHHGradient { sumRows(rows: steps * b, width: g, source: dRecurrentAll, into: gradient) }
        if let dx {
            // dInputs W_ih, step-major, into the working space the recurrent gradients are done with, then batch-first.
            let dxs = dRecurrents
            GEMM.multiply(m: steps * b, n: n, k: g, a: dInputs, lda: g, b: p.weightIH, ldb: n, c: dxs, ldc: n)
            for t in 0..<steps {
                for r in 0..<b {
                    let source = dxs + (t * b + r) * n, target = dx + (r * steps + t) * n
                    if accumulateDx {
                        for k in 0..<n { target[k] += source[k] }
                    } else {
                        target.update(from: source, count: n)
                    }
                }
            }
        }
    }
}

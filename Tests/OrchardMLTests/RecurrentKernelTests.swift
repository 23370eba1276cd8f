import OrchardSupport
@testable import OrchardML
import Testing

/// The LSTM and CIFG cell kernels on AVX2 and AVX-512 against the portable Swift path they stand in for: a whole pass
/// forward and back through time (outputs, every stored activation, cell and state, the weight, bias and input
/// gradients), at hidden widths with and without a vector tail (1…21 and 128), with the whole sequence or only the last
/// step returned.
@Suite struct RecurrentKernelTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var kernel: CellKernel
        var cell: RecurrentCell
        var hidden: Int
        var returnSequences: Bool
        var testDescription: String { "\(kernel) \(cell) hidden \(hidden) \(returnSequences ? "sequence" : "last")" }
    }

    static let cases: [Case] = {
        var all: [Case] = []
        for kernel in [CellKernel.avx2, .avx512] {
            for cell in [RecurrentCell.lstm, .cifg] {
                for hidden in [1, 5, 8, 13, 16, 21, 128] {
                    for returnSequences in [true, false] { all.append(Case(kernel: kernel, cell: cell, hidden: hidden, returnSequences: returnSequences)) }
                }
            }
        }
        // A kernel the CPU lacks is never chosen there, so it is not run (AVX-512 on an AVX2-only machine, both on arm64).
        return all.filter { $0.kernel.isAvailable }
    }()

    /// Everything one pass produces, flattened per buffer.
    struct Pass {
        var y: [Float]
        var scratch: [Float]
        var gradients: [[Float]]
        var dx: [Float]
    }

    /// Runs a seeded pass of `shape` forward and back on `kernel`. `poison` puts a NaN into one input value; `nudge` moves
    /// every input value up by one ulp.
    static func pass(_ shape: RecurrentShape, kernel: CellKernel, poison: Bool = false, nudge: Bool = false) -> Pass {
        var rng = SplitMix64(state: UInt64(shape.hidden * 7919 + shape.gates * 31 + (shape.returnSequences ? 1 : 0)))
        func values(_ count: Int, _ scale: Float) -> [Float] { (0..<count).map { _ in (rng.nextFloat() * 2 - 1) * scale } }
        let (b, n, h, g, steps) = (shape.batch, shape.inputSize, shape.hidden, shape.gateWidth, shape.steps)
        var x = values(b * steps * n, 2)
        if poison { x[n + 1] = .nan }
        if nudge { x = x.map(\.nextUp) }
        // One buffer for every parameter and gradient: weight_ih, weight_hh, bias_ih, bias_hh, then their gradients.
        let sizes = [g * n, g * h, g, g]
        let parameterCount = sizes.reduce(0, +)
        // PyTorch's initial range, U(±1/√hidden): wider weights make the recurrence chaotic, and any rounding difference
        // grows step by step.
        let storage = values(parameterCount, 1 / Float(h).squareRoot()) + [Float](repeating: 0, count: parameterCount)
        let buffer = UnsafeMutablePointer<Float>.allocate(capacity: storage.count)
        defer { buffer.deallocate() }
        buffer.initialize(from: storage, count: storage.count)
        let offsets = sizes.indices.map { sizes[..<$0].reduce(0, +) }
        let gradientBase = buffer + parameterCount
        var transposed = [Float](repeating: 0, count: RecurrentShape.transposedCount(cell: shape.cell, inputSize: n, hidden: h))
        var scratch = [Float](repeating: 0, count: b * RecurrentShape.scratchPerSample(cell: shape.cell, steps: steps, inputSize: n, hidden: h))
        var step = [Float](repeating: 0, count: b * RecurrentShape.stepScratchPerSample(cell: shape.cell, steps: steps, inputSize: n, hidden: h))
        let outputCount = shape.returnSequences ? b * steps * h : b * h
        var y = [Float](repeating: 0, count: outputCount)
        let dy = values(outputCount, 1)
        var dx = [Float](repeating: 0, count: x.count)
        transposed.withUnsafeMutableBufferPointer { tr in
            let parameters = RecurrentParameters(
                weightIH: buffer + offsets[0], weightHH: buffer + offsets[1], transposed: tr.baseAddress!, biasIH: buffer + offsets[2],
                biasHH: buffer + offsets[3], weightIHGradient: gradientBase + offsets[0], weightHHGradient: gradientBase + offsets[1],
                biasIHGradient: gradientBase + offsets[2], biasHHGradient: gradientBase + offsets[3])
            x.withUnsafeBufferPointer { px in
                scratch.withUnsafeMutableBufferPointer { ps in
                    step.withUnsafeMutableBufferPointer { pt in
                        y.withUnsafeMutableBufferPointer { py in
                            Ops.recurrentForward(
                                shape, x: px.baseAddress!, parameters: parameters, scratch: ps.baseAddress!, step: pt.baseAddress!,
                                y: py.baseAddress!, kernel: kernel)
                        }
                        dy.withUnsafeBufferPointer { pdy in
                            dx.withUnsafeMutableBufferPointer { pdx in
                                Ops.recurrentBackward(
                                    shape, x: px.baseAddress!, parameters: parameters, scratch: ps.baseAddress!, step: pt.baseAddress!,
                                    dy: pdy.baseAddress!, dx: pdx.baseAddress, accumulateDx: false, kernel: kernel)
                            }
                        }
                    }
                }
            }
        }
        let gradients = sizes.indices.map { Array(UnsafeBufferPointer(start: gradientBase + offsets[$0], count: sizes[$0])) }
        return Pass(y: y, scratch: scratch, gradients: gradients, dx: dx)
    }

    /// The largest difference relative to max(1, |expected|); infinity where one side is NaN and the other is not.
    static func worst(_ actual: [Float], _ expected: [Float]) -> Float {
        zip(actual, expected).reduce(0) { worst, pair in
            if pair.0.isNaN || pair.1.isNaN { return pair.0.isNaN == pair.1.isNaN ? worst : .infinity }
            return max(worst, abs(pair.0 - pair.1) / max(1, abs(pair.1)))
        }
    }

    /// Tolerance: the kernels fuse multiply-adds and the portable path does not, so results differ by rounding; over
    /// six steps forward and back that stays under 1e-5 relative (measured: at most 4.8e-6, on AMD EPYC with AVX-512).
    @Test(arguments: cases)
    func kernelMatchesThePortablePath(_ c: Case) {
        let shape = RecurrentShape(cell: c.cell, batch: 3, steps: 6, inputSize: 5, hidden: c.hidden, returnSequences: c.returnSequences)
        let expected = Self.pass(shape, kernel: .portable)
        let actual = Self.pass(shape, kernel: c.kernel)
        #expect(Self.worst(actual.y, expected.y) < 1e-5, "output")
        #expect(Self.worst(actual.scratch, expected.scratch) < 1e-5, "activations, cells and states kept for the backward pass")
        for (index, name) in ["weight_ih", "weight_hh", "bias_ih", "bias_hh"].enumerated() {
            #expect(Self.worst(actual.gradients[index], expected.gradients[index]) < 1e-5, "\(name) gradient")
        }
        #expect(Self.worst(actual.dx, expected.dx) < 1e-5, "input gradient")
        #expect(actual.gradients.allSatisfy { $0.contains { $0 != 0 } }, "every gradient is written")
    }

    /// ‖a − e‖ / ‖e‖ over all values.
    static func normRelative(_ a: [Float], _ e: [Float]) -> Double {
        var difference = 0.0, norm = 0.0
        for (x, y) in zip(a, e) {
            difference += Double(x - y) * Double(x - y)
            norm += Double(y) * Double(y)
        }
        return (difference / norm).squareRoot()
    }

    /// Over 80 steps (char-lstm's length) back-propagation through time amplifies any rounding difference: on this seed the
    /// CIFG's gradients of the first steps grow tenfold, and moving every input by one ulp changes the portable path's
    /// gradients by up to 1.2e-4 relative. The kernels must stay within that noise of the portable path, not add to it
    /// (measured: their difference is 0.2–0.9 times the nudge's).
    @Test(arguments: CellKernel.allCases.filter { $0 != .portable && $0.isAvailable })
    func overALongSequenceTheKernelDiffersNoMoreThanAnUlpOfInputDoes(_ kernel: CellKernel) {
        for cell in [RecurrentCell.lstm, .cifg] {
            let shape = RecurrentShape(cell: cell, batch: 5, steps: 80, inputSize: 8, hidden: 128, returnSequences: true)
            let portable = Self.pass(shape, kernel: .portable)
            let nudged = Self.pass(shape, kernel: .portable, nudge: true)
            let wide = Self.pass(shape, kernel: kernel)
            for index in 0..<4 {
                let noise = Self.normRelative(nudged.gradients[index], portable.gradients[index])
                let difference = Self.normRelative(wide.gradients[index], portable.gradients[index])
                #expect(difference <= 2 * max(noise, 1e-6), "\(cell) gradient \(index): \(difference) against an ulp's \(noise)")
            }
            let noise = Self.normRelative(nudged.dx, portable.dx), difference = Self.normRelative(wide.dx, portable.dx)
            #expect(difference <= 2 * max(noise, 1e-6), "\(cell) input gradient: \(difference) against an ulp's \(noise)")
        }
    }

    /// A NaN input reaches the output and the gradients on every kernel (the divergence check relies on it): the
    /// kernels' clamps must not turn it into a number.
    @Test(arguments: CellKernel.allCases.filter(\.isAvailable))
    func aNaNInputStaysNaN(_ kernel: CellKernel) {
        for cell in [RecurrentCell.lstm, .cifg] {
            let shape = RecurrentShape(cell: cell, batch: 2, steps: 3, inputSize: 4, hidden: 19, returnSequences: true)
            let result = Self.pass(shape, kernel: kernel, poison: true)
            #expect(result.y.contains { $0.isNaN }, "\(cell): the output")
            #expect(result.gradients[1].contains { $0.isNaN }, "\(cell): the recurrent weights' gradient")
        }
    }

    /// The kernel follows the matrix backend: the portable backend keeps Swift, the AVX2 backend pins AVX2, any other
    /// takes the widest the CPU has.
    @Test func theKernelFollowsTheMatrixBackend() {
        let widest: CellKernel = AVX2GEMM.isAVX512Available ? .avx512 : AVX2GEMM.isAvailable ? .avx2 : .portable
        #expect(CellKernel.choice(for: .portable) == .portable)
        #expect(CellKernel.choice(for: .avx2) == (AVX2GEMM.isAvailable ? .avx2 : .portable))
        for backend in [MatrixBackend.automatic, .avx512, .blas] { #expect(CellKernel.choice(for: backend) == widest, "\(backend)") }
    }
}

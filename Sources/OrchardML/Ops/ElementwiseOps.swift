#if canImport(Glibc)
import OrchardSupport
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Pointer kernels shared by the value-type layers (inference) and the compiled training plan.
///
/// Every function works on caller-owned memory and allocates nothing. A gradient destination is either
/// overwritten or, when `accumulate` is true, added to (a buffer read by several layers collects every reader's
/// gradient).
enum Ops {
    typealias Ptr = UnsafeMutablePointer<Float>
    typealias CPtr = UnsafePointer<Float>

    /// Writes or adds `value` at `p[i]`.
    @inline(__always)
    static func store(_ p: Ptr, _ i: Int, _ value: Float, _ accumulate: Bool) {
        if accumulate { p[i] += value } else { p[i] = value }
    }

    // MARK: Dense

    /// `y[b, :] = x[b, :] · Wᵀ + bias` for `batch` rows.
    static func denseForward(batch: Int, inSize: Int, outSize: Int, x: CPtr, weight: CPtr, bias: CPtr?, y: Ptr) {
        GEMM.multiply(transposeB: true, m: batch, n: outSize, k: inSize, a: x, lda: inSize, b: weight, ldb: inSize, c: y, ldc: outSize)
        if let bias { addRowVector(rows: batch, width: outSize, vector: bias, into: y) }
    }

    /// Weight, bias and input gradients of a dense layer; pass nil for the ones not needed. With `descentRate`,
    /// the weight and bias gradients are not stored: the parameters take the plain SGD step
    /// `w -= descentRate · g` at once (after the input gradient has used the old weights), which saves writing the
    /// weight gradient and reading it back in the optimizer.
    static func denseBackward(
        batch: Int, inSize: Int, outSize: Int, x: CPtr, weight: Ptr, bias: Ptr?, dy: CPtr,
        dWeight: Ptr?, dBias: Ptr?, dx: Ptr?, accumulateDx: Bool, descentRate: Float? = nil
    ) {
        if let dx {
            GEMM.multiply(m: batch, n: inSize, k: outSize, a: dy, lda: outSize, b: weight, ldb: inSize, beta: accumulateDx ? 1 : 0, c: dx, ldc: inSize)
        }
        if let rate = descentRate, dWeight != nil {
            GEMM.multiply(
                transposeA: true, m: outSize, n: inSize, k: batch, alpha: -rate, a: dy, lda: outSize, b: x, ldb: inSize, beta: 1, c: weight, ldc: inSize)
            if let bias, dBias != nil {
                for j in 0..<outSize {
                    var sum: Float = 0
                    for r in 0..<batch { sum += dy[r * outSize + j] }
                    bias[j] -= rate * sum
                }
            }
            return
        }
        if let dWeight {
            GEMM.multiply(transposeA: true, m: outSize, n: inSize, k: batch, a: dy, lda: outSize, b: x, ldb: inSize, c: dWeight, ldc: inSize)
        }
        if let dBias { sumRows(rows: batch, width: outSize, source: dy, into: dBias) }
    }

    /// Adds `vector` (length `width`) to every row.
    static func addRowVector(rows: Int, width: Int, vector: CPtr, into y: Ptr) {
        for r in 0..<rows {
            let row = y + r * width
            for j in 0..<width { row[j] += vector[j] }
        }
    }

    /// `out[j] = Σ_r source[r, j]`.
    static func sumRows(rows: Int, width: Int, source: CPtr, into out: Ptr) {
        out.update(repeating: 0, count: width)
        for r in 0..<rows {
            let row = source + r * width
            for j in 0..<width { out[j] += row[j] }
        }
    }

    // MARK: Activations

    /// `y = max(x, 0)`, eight lanes at a time (a scalar loop here compiles to a branch per element).
    static func reluForward(count: Int, x: CPtr, y: Ptr) {
        typealias V = SIMD8<Float>
        var i = 0
        while i + 8 <= count {
            let v = UnsafeRawPointer(x + i).loadUnaligned(as: V.self)
            UnsafeMutableRawPointer(y + i).storeBytes(of: v.replacing(with: 0, where: v .<= 0), as: V.self)
            i += 8
        }
        while i < count {
            y[i] = max(x[i], 0)
            i += 1
        }
    }

    /// `dx (+)= y > 0 ? dy : 0`, eight lanes at a time: ReLU's sign pattern is data-dependent, so a branch per
    /// element mispredicts about half the time.
    static func reluBackward(count: Int, y: CPtr, dy: CPtr, dx: Ptr, accumulate: Bool) {
        typealias V = SIMD8<Float>
        var i = 0
        while i + 8 <= count {
            let yv = UnsafeRawPointer(y + i).loadUnaligned(as: V.self)
            var g = V().replacing(with: UnsafeRawPointer(dy + i).loadUnaligned(as: V.self), where: yv .> 0)
            if accumulate { g += UnsafeRawPointer(dx + i).loadUnaligned(as: V.self) }
            UnsafeMutableRawPointer(dx + i).storeBytes(of: g, as: V.self)
            i += 8
        }
        while i < count {
            let g: Float = y[i] > 0 ? dy[i] : 0
            dx[i] = accumulate ? dx[i] + g : g
            i += 1
        }
    }

    static func sigmoidForward(count: Int, x: CPtr, y: Ptr) {
        for i in 0..<count {
            let v = x[i]
            // Both branches avoid overflow of exp for large |v|.
            if v >= 0 { y[i] = 1 / (1 + expf(-v)) } else { let e = expf(v); y[i] = e / (1 + e) }
        }
    }

    static func sigmoidBackward(count: Int, y: CPtr, dy: CPtr, dx: Ptr, accumulate: Bool) {
        for i in 0..<count { store(dx, i, dy[i] * y[i] * (1 - y[i]), accumulate) }
    }

    static func tanhForward(count: Int, x: CPtr, y: Ptr) {
        for i in 0..<count { y[i] = tanhf(x[i]) }
    }

    static func tanhBackward(count: Int, y: CPtr, dy: CPtr, dx: Ptr, accumulate: Bool) {
        for i in 0..<count { store(dx, i, dy[i] * (1 - y[i] * y[i]), accumulate) }
    }

    /// Row-wise softmax, shifted by the row maximum for stability; the exponentials eight lanes at a time
    /// (``exp(_:)``, within 1e-7 relative of libm's).
    static func softmaxForward(rows: Int, width: Int, x: CPtr, y: Ptr) {
        for r in 0..<rows {
            let xr = x + r * width, yr = y + r * width
            var m = -Float.infinity
            for j in 0..<width { m = max(m, xr[j]) }
            var lanes = V8()
            var j = 0
            while j + 8 <= width {
                let e = exp(load(xr + j) - m)
                store(e, yr + j)
                lanes += e
                j += 8
            }
            var s = lanes.sum()
            if j < width {
                var v = V8(repeating: -.infinity)
                for k in 0..<(width - j) { v[k] = xr[j + k] - m }
                let e = exp(v)
                for k in 0..<(width - j) {
                    yr[j + k] = e[k]
                    s += e[k]
                }
            }
            let inv = 1 / s
            for j in 0..<width { yr[j] *= inv }
        }
    }

    /// `dx = y ⊙ (dy − ⟨dy, y⟩)` per row.
    static func softmaxBackward(rows: Int, width: Int, y: CPtr, dy: CPtr, dx: Ptr, accumulate: Bool) {
        for r in 0..<rows {
            let yr = y + r * width, dyr = dy + r * width, dxr = dx + r * width
            var dot: Float = 0
            for j in 0..<width { dot += dyr[j] * yr[j] }
            for j in 0..<width { store(dxr, j, yr[j] * (dyr[j] - dot), accumulate) }
        }
    }

    /// Copies or adds `dy` into `dx` (layers whose gradient passes through unchanged).
    static func passGradient(count: Int, dy: CPtr, dx: Ptr, accumulate: Bool) {
        if accumulate {
            for i in 0..<count { dx[i] += dy[i] }
        } else {
            dx.update(from: dy, count: count)
        }
    }

    // MARK: Dropout

    /// Inverted dropout: keeps each unit with probability `1 − rate`, scaled by `1 / (1 − rate)`; writes the mask.
    static func dropoutForward(count: Int, rate: Float, x: CPtr, y: Ptr, mask: Ptr, random: inout OrchardRandom) {
        let scale = 1 / (1 - rate)
        for i in 0..<count {
            let keep: Float = random.nextFloat() >= rate ? scale : 0
            mask[i] = keep
            y[i] = x[i] * keep
        }
    }

    static func dropoutBackward(count: Int, mask: CPtr, dy: CPtr, dx: Ptr, accumulate: Bool) {
        for i in 0..<count { store(dx, i, dy[i] * mask[i], accumulate) }
    }

    // MARK: Embedding

    /// Looks up `indicesPerSample` rows per sample; output rows are laid end to end.
    static func embeddingForward(batch: Int, indicesPerSample: Int, dim: Int, indices: CPtr, table: CPtr, y: Ptr) {
        for s in 0..<(batch * indicesPerSample) {
            let row = Int(indices[s])
            (y + s * dim).update(from: table + row * dim, count: dim)
        }
    }

    /// Scatter-adds output gradients into the table gradient (which it first zeroes).
    static func embeddingBackward(batch: Int, indicesPerSample: Int, dim: Int, vocabulary: Int, indices: CPtr, dy: CPtr, dTable: Ptr) {
        dTable.update(repeating: 0, count: vocabulary * dim)
        for s in 0..<(batch * indicesPerSample) {
            let dst = dTable + Int(indices[s]) * dim, src = dy + s * dim
            for j in 0..<dim { dst[j] += src[j] }
        }
    }

    /// Checks that every index is an integer in `0..<vocabulary`, returning the first offending value.
    static func firstInvalidIndex(count: Int, indices: CPtr, vocabulary: Int) -> Float? {
        for i in 0..<count {
            let v = indices[i]
            if !(v >= 0 && v < Float(vocabulary)) || v != v.rounded(.towardZero) { return v }
        }
        return nil
    }

    // MARK: Concat

    /// Joins inputs along the last axis: `outer` blocks per sample, each input contributing `widths[i]` values.
    static func concatForward(batchOuter: Int, widths: [Int], inputs: [Ptr], y: Ptr) {
        let total = widths.reduce(0, +)
        for r in 0..<batchOuter {
            var offset = 0
            for (i, w) in widths.enumerated() {
                (y + r * total + offset).update(from: inputs[i] + r * w, count: w)
                offset += w
            }
        }
    }

    /// Splits the output gradient back into input `index`.
    static func concatBackward(batchOuter: Int, widths: [Int], index: Int, offset: Int, dy: CPtr, dx: Ptr, accumulate: Bool) {
        let total = widths.reduce(0, +)
        let w = widths[index]
        for r in 0..<batchOuter {
            let src = dy + r * total + offset, dst = dx + r * w
            if accumulate {
                for j in 0..<w { dst[j] += src[j] }
            } else {
                dst.update(from: src, count: w)
            }
        }
    }
}

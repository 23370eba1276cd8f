import OrchardFormats

/// The geometry of a 2-D window (convolution or pooling) over a `[C, H, W]` sample.
struct WindowGeometry: Sendable, Hashable {
    var channels: Int, height: Int, width: Int
    var kernelH: Int, kernelW: Int
    var strideH: Int, strideW: Int
    var padTop: Int, padLeft: Int
    var outH: Int, outW: Int

    init(channels: Int, height: Int, width: Int, kernel: [Int], strides: [Int], padding: Padding) {
        self.channels = channels
        self.height = height
        self.width = width
        kernelH = kernel[0]
        kernelW = kernel[1]
        strideH = strides[0]
        strideW = strides[1]
        let h = padding.resolve(input: height, kernel: kernelH, stride: strideH, axis: 0)
        let w = padding.resolve(input: width, kernel: kernelW, stride: strideW, axis: 1)
        outH = h.output
        outW = w.output
        padTop = h.padBefore
        padLeft = w.padBefore
    }

    var inputCount: Int { channels * height * width }
    /// The input rows output row `oi`'s window covers inside the image.
    func windowRows(_ oi: Int) -> Range<Int> {
        let start = oi * strideH - padTop
        return max(0, start)..<min(height, start + kernelH)
    }
    /// The input columns output column `oj`'s window covers inside the image.
    func windowColumns(_ oj: Int) -> Range<Int> {
        let start = oj * strideW - padLeft
        return max(0, start)..<min(width, start + kernelW)
    }
    var outputPlane: Int { outH * outW }
    /// Rows of the im2col matrix: one per (channel, kernel row, kernel column).
    var patchSize: Int { channels * kernelH * kernelW }
}

extension Ops {
    /// Unfolds one `[C, H, W]` sample into a `[C·kh·kw, OH·OW]` matrix, zero where the window leaves the image.
    static func im2col(_ g: WindowGeometry, x: CPtr, col: Ptr) {
        var row = 0
        for c in 0..<g.channels {
            let plane = x + c * g.height * g.width
            for ki in 0..<g.kernelH {
                for kj in 0..<g.kernelW {
                    let dst = col + row * g.outputPlane
                    for oi in 0..<g.outH {
                        let ii = oi * g.strideH + ki - g.padTop
                        let line = dst + oi * g.outW
                        if ii < 0 || ii >= g.height {
                            line.update(repeating: 0, count: g.outW)
                            continue
                        }
                        let src = plane + ii * g.width
                        for oj in 0..<g.outW {
                            let jj = oj * g.strideW + kj - g.padLeft
                            line[oj] = (jj >= 0 && jj < g.width) ? src[jj] : 0
                        }
                    }
                    row += 1
                }
            }
        }
    }

    /// Folds a `[C·kh·kw, OH·OW]` gradient matrix back onto a `[C, H, W]` sample, adding overlapping windows.
    static func col2im(_ g: WindowGeometry, col: CPtr, dx: Ptr, accumulate: Bool) {
        if !accumulate { dx.update(repeating: 0, count: g.inputCount) }
        var row = 0
        for c in 0..<g.channels {
            let plane = dx + c * g.height * g.width
            for ki in 0..<g.kernelH {
                for kj in 0..<g.kernelW {
                    let src = col + row * g.outputPlane
                    for oi in 0..<g.outH {
                        let ii = oi * g.strideH + ki - g.padTop
                        guard ii >= 0 && ii < g.height else { continue }
                        let line = plane + ii * g.width
                        for oj in 0..<g.outW {
                            let jj = oj * g.strideW + kj - g.padLeft
                            if jj >= 0 && jj < g.width { line[jj] += src[oi * g.outW + oj] }
                        }
                    }
                    row += 1
                }
            }
        }
    }

    /// Convolution of `batch` samples: per sample, im2col then `y = W · col + bias`.
    static func convForward(_ g: WindowGeometry, filters: Int, batch: Int, x: CPtr, weight: CPtr, bias: CPtr?, y: Ptr, col: Ptr) {
        let outCount = filters * g.outputPlane
        for s in 0..<batch {
            im2col(g, x: x + s * g.inputCount, col: col)
            let ys = y + s * outCount
            GEMM.multiply(m: filters, n: g.outputPlane, k: g.patchSize, a: weight, lda: g.patchSize, b: col, ldb: g.outputPlane, c: ys, ldc: g.outputPlane)
            if let bias {
                for f in 0..<filters {
                    let b = bias[f], line = ys + f * g.outputPlane
                    for p in 0..<g.outputPlane { line[p] += b }
                }
            }
        }
    }

    /// Convolution gradients; pass nil for the ones not needed. `col` and `dcol` are `patchSize × OH·OW` scratch.
    static func convBackward(
        _ g: WindowGeometry, filters: Int, batch: Int, x: CPtr, weight: CPtr, dy: CPtr,
        dWeight: Ptr?, dBias: Ptr?, dx: Ptr?, accumulateDx: Bool, col: Ptr, dcol: Ptr
    ) {
        let outCount = filters * g.outputPlane
        if let dBias { dBias.update(repeating: 0, count: filters) }
        for s in 0..<batch {
            let dys = dy + s * outCount
            if let dWeight {
                im2col(g, x: x + s * g.inputCount, col: col)
                GEMM.multiply(
                    transposeB: true, m: filters, n: g.patchSize, k: g.outputPlane,
                    a: dys, lda: g.outputPlane, b: col, ldb: g.outputPlane, beta: s == 0 ? 0 : 1, c: dWeight, ldc: g.patchSize
                )
            }
            if let dBias {
                for f in 0..<filters {
                    let line = dys + f * g.outputPlane
                    var sum: Float = 0
                    for p in 0..<g.outputPlane { sum += line[p] }
                    dBias[f] += sum
                }
            }
            if let dx {
                GEMM.multiply(
                    transposeA: true, m: g.patchSize, n: g.outputPlane, k: filters,
                    a: weight, lda: g.patchSize, b: dys, ldb: g.outputPlane, c: dcol, ldc: g.outputPlane
                )
                col2im(g, col: dcol, dx: dx + s * g.inputCount, accumulate: accumulateDx)
            }
        }
    }

    /// Max pooling of `batch` samples, recording the per-sample input offset of each maximum in `argmax`
    /// (as Float, exact below 2²⁴; −1 when the window saw only padding).
    static func maxPoolForward(_ g: WindowGeometry, batch: Int, x: CPtr, y: Ptr, argmax: Ptr) {
        let outCount = g.channels * g.outputPlane
        for s in 0..<batch {
            let xs = x + s * g.inputCount
            for c in 0..<g.channels {
                let plane = c * g.height * g.width
                for oi in 0..<g.outH {
                    for oj in 0..<g.outW {
                        var best = -Float.infinity
                        var bestIndex = -1
                        for ki in 0..<g.kernelH {
                            let ii = oi * g.strideH + ki - g.padTop
                            guard ii >= 0 && ii < g.height else { continue }
                            for kj in 0..<g.kernelW {
                                let jj = oj * g.strideW + kj - g.padLeft
                                guard jj >= 0 && jj < g.width else { continue }
                                let idx = plane + ii * g.width + jj
                                if bestIndex < 0 || xs[idx] > best { best = xs[idx]; bestIndex = idx }
                            }
                        }
                        let o = s * outCount + c * g.outputPlane + oi * g.outW + oj
                        y[o] = bestIndex < 0 ? 0 : best
                        argmax[o] = Float(bestIndex)
                    }
                }
            }
        }
    }

    /// Average pooling of `batch` samples: each output is the mean of the window's positions inside the image
    /// (padding is left out of the count; a window that sees only padding gives 0).
    static func avgPoolForward(_ g: WindowGeometry, batch: Int, x: CPtr, y: Ptr) {
        let outCount = g.channels * g.outputPlane
        for s in 0..<batch {
            let xs = x + s * g.inputCount
            for c in 0..<g.channels {
                let plane = c * g.height * g.width
                for oi in 0..<g.outH {
                    let rows = g.windowRows(oi)
                    for oj in 0..<g.outW {
                        let columns = g.windowColumns(oj)
                        var sum: Float = 0
                        for ii in rows { for jj in columns { sum += xs[plane + ii * g.width + jj] } }
                        let count = rows.count * columns.count
                        y[s * outCount + c * g.outputPlane + oi * g.outW + oj] = count == 0 ? 0 : sum / Float(count)
                    }
                }
            }
        }
    }

    /// Spreads each output gradient evenly over the positions its average read.
    static func avgPoolBackward(_ g: WindowGeometry, batch: Int, dy: CPtr, dx: Ptr, accumulate: Bool) {
        if !accumulate { dx.update(repeating: 0, count: batch * g.inputCount) }
        let outCount = g.channels * g.outputPlane
        for s in 0..<batch {
            let dxs = dx + s * g.inputCount
            for c in 0..<g.channels {
                let plane = c * g.height * g.width
                for oi in 0..<g.outH {
                    let rows = g.windowRows(oi)
                    for oj in 0..<g.outW {
                        let columns = g.windowColumns(oj)
                        let count = rows.count * columns.count
                        guard count > 0 else { continue }
                        let share = dy[s * outCount + c * g.outputPlane + oi * g.outW + oj] / Float(count)
                        for ii in rows { for jj in columns { dxs[plane + ii * g.width + jj] += share } }
                    }
                }
            }
        }
    }

    /// Routes each output gradient to the input position that held the maximum.
    static func maxPoolBackward(_ g: WindowGeometry, batch: Int, argmax: CPtr, dy: CPtr, dx: Ptr, accumulate: Bool) {
        if !accumulate { dx.update(repeating: 0, count: batch * g.inputCount) }
        let outCount = g.channels * g.outputPlane
        for s in 0..<batch {
            let dxs = dx + s * g.inputCount
            for o in 0..<outCount {
                let idx = Int(argmax[s * outCount + o])
                if idx >= 0 { dxs[idx] += dy[s * outCount + o] }
            }
        }
    }
}

import OrchardFormats
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Values at any count (so the eight-wide body and the tail both run), with NaN, infinities, zeros of both signs,
/// subnormals and the largest finite values planted at random places, and a random byte offset (any alignment).
private let scanInput = fuzzed { rng -> (values: [Float], offset: Int) in
    var values = (0..<Int.random(in: 0...70, using: &rng)).map { _ in Float.random(in: -3...3, using: &rng) }
    let specials: [Float] = [.nan, .infinity, -.infinity, 0, -0.0, .leastNonzeroMagnitude, -.greatestFiniteMagnitude, .greatestFiniteMagnitude]
    if !values.isEmpty {
        for _ in 0..<Int.random(in: 0...2, using: &rng) {
            values[Int.random(in: 0..<values.count, using: &rng)] = specials.randomElement(using: &rng)!
        }
    }
    if Bool.random(using: &rng) { values = values.map { _ -> Float in Bool.random(using: &rng) ? 0 : -0.0 } }
    return (values, Int.random(in: 0...7, using: &rng))
}

@Suite(.shrinking(false)) struct FloatScanTests {
    @Test("the scan agrees with a value-by-value reference at any alignment and count")
    func agreesWithTheReference() async {
        await propertyCheck(count: 400, input: scanInput) { input in
            var bytes = [UInt8](repeating: 0xAB, count: input.offset)
            for value in input.values { withUnsafeBytes(of: value.bitPattern.littleEndian) { bytes += $0 } }
            bytes += [0xCD, 0xEF]  // a trailing partial value is ignored
            let scan = bytes.withUnsafeBytes { FloatScan.summary(littleEndian: UnsafeRawBufferPointer(rebasing: $0[input.offset...])) }
            let finite = input.values.allSatisfy(\.isFinite)
            #expect(scan.allFinite == finite)
            #expect(FloatScan.allFinite(input.values) == finite)
            #expect(scan.allZero == input.values.allSatisfy { $0 == 0 })
            if finite {
                let reference = input.values.reduce(0.0) { $0 + Double($1) * Double($1) }
                #expect(abs(scan.sumOfSquares - reference) <= 1e-12 * max(reference, 1))
            }
        }
    }

    @Test("an empty run is finite, all zero, and sums to zero")
    func empty() {
        let scan = FloatScan.summary(littleEndian: UnsafeRawBufferPointer(start: nil, count: 0))
        #expect(scan.allFinite && scan.allZero && scan.sumOfSquares == 0)
        #expect(FloatScan.allFinite([Float]()))
    }
}

import OrchardSupport
@testable import OrchardML
import Testing

/// The vectorised ReLU against its definition, over lengths with and without a scalar tail.
@Suite struct ReLUOpsTests {
    @Test(arguments: [1, 8, 13, 24, 31])
    func forwardAndBackwardMatchTheDefinition(count: Int) {
        var rng = SplitMix64(state: UInt64(count))
        let x = (0..<count).map { i in i % 5 == 0 ? 0 : rng.nextFloat() }
        let dy = (0..<count).map { _ in rng.nextFloat() }
        let old = (0..<count).map { _ in rng.nextFloat() }
        var y = [Float](repeating: .nan, count: count)
        Ops.reluForward(count: count, x: x, y: &y)
        #expect(y == x.map { $0 > 0 ? $0 : 0 })
        for accumulate in [false, true] {
            var dx = old
            Ops.reluBackward(count: count, y: y, dy: dy, dx: &dx, accumulate: accumulate)
            let expected = (0..<count).map { i in (accumulate ? old[i] : 0) + (y[i] > 0 ? dy[i] : 0) }
            #expect(dx == expected, "accumulate \(accumulate)")
        }
    }
}

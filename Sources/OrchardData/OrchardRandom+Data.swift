public import OrchardSupport
import Foundation
import OrchardML

extension OrchardRandom {
    /// A uniformly random permutation of `0..<count` (Fisher–Yates over the identity).
    public mutating func permutation(_ count: Int) -> [Int] {
        var indices = Array(0..<count)
        shuffle(&indices)
        return indices
    }

    /// A standard normal sample (Box–Muller, one value of the pair).
    mutating func nextStandardNormalSample() -> Double {
        var u = nextDouble()
        while u == 0 { u = nextDouble() }
        return (-2 * log(u)).squareRoot() * cos(2 * Double.pi * nextDouble())
    }
}

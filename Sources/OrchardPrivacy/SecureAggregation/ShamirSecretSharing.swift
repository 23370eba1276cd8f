public import Foundation

/// One Shamir share: the holder's index (x ≥ 1) and the polynomials' values at it, one field element per chunk.
///
/// Encoded as `{"index": i, "data": base64}`, the data being the values as little-endian 8-byte words.
public struct ShamirShare: Sendable, Hashable, Codable {
    /// The evaluation point: the holding device's index, at least 1.
    public let index: Int
    /// One element of GF(2^61 − 1) per 7-byte chunk of the secret.
    public let values: [UInt64]

    enum CodingKeys: String, CodingKey { case index, data }

    /// Creates a share.
    public init(index: Int, values: [UInt64]) {
        self.index = index
        self.values = values
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        index = try container.decode(Int.self, forKey: .index)
        let data = try container.decode(Data.self, forKey: .data)
        guard let values = Self.values(from: data) else {
            throw DecodingError.dataCorruptedError(forKey: .data, in: container, debugDescription: "share data must be a whole number of 8-byte words")
        }
        self.values = values
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(index, forKey: .index)
        try container.encode(bytes, forKey: .data)
    }

    /// The values as little-endian 8-byte words.
    public var bytes: Data {
        var data = Data(capacity: values.count * 8)
        for value in values { data.appendLittleEndian(value) }
        return data
    }

    /// Values from little-endian 8-byte words; nil unless the length is a multiple of 8.
    static func values(from data: Data) -> [UInt64]? {
        guard data.count % 8 == 0 else { return nil }
        let bytes = [UInt8](data)
        return stride(from: 0, to: bytes.count, by: 8).map { start in
            (0..<8).reduce(UInt64(0)) { $0 | UInt64(bytes[start + $1]) << (8 * UInt64($1)) }
        }
    }
}

/// Shamir t-of-n secret sharing (Shamir 1979) over the prime field GF(p), p = 2^61 − 1 (a Mersenne prime, so
/// reduction is two shifts and an add).
///
/// A secret of L bytes is cut into ⌈L/7⌉ little-endian chunks of at most 7 bytes (each below 2^56 < p); each
/// chunk is the constant term of its own random polynomial of degree t − 1, evaluated at the holders' indices.
/// Any t shares give the polynomials back by Lagrange interpolation at 0; t − 1 shares reveal nothing about the
/// secret (every secret is equally likely), and interpolating from them gives a wrong value (a chunk above 2^56,
/// reported as `reconstruction_failed`, or simply a different secret).
public enum ShamirSecretSharing {
    /// The field's prime, 2^61 − 1.
    public static let prime: UInt64 = (1 << 61) - 1
    /// Bytes of secret per field element.
    public static let chunkByteCount = 7

    /// The number of field elements a share of a `byteCount`-byte secret carries.
    public static func chunkCount(byteCount: Int) -> Int { (byteCount + chunkByteCount - 1) / chunkByteCount }

    /// Splits `secret` into one share per index, any `threshold` of which reconstruct it.
    /// - Throws: `invalid_share` for a threshold outside 1…indices.count, an index below 1 or at least p, or an index
    ///   given twice.
    public static func split(_ secret: some DataProtocol, threshold: Int, indices: [Int], using generator: inout some RandomNumberGenerator)
        throws(SecureAggregationError) -> [ShamirShare]
    {
        guard threshold >= 1, threshold <= indices.count else {
            throw SecureAggregationError(.invalidShare, "threshold must be in 1...\(indices.count) (the number of shares), not \(threshold)")
        }
        let points = try checkedPoints(indices)
        let bytes = [UInt8](secret)
        var values = [[UInt64]](repeating: [], count: indices.count)
        for start in stride(from: 0, to: bytes.count, by: chunkByteCount) {
            let end = min(start + chunkByteCount, bytes.count)
            let constant = (start..<end).reduce(UInt64(0)) { $0 | UInt64(bytes[$1]) << (8 * UInt64($1 - start)) }
            let coefficients = [constant] + (1..<threshold).map { _ in UInt64.random(in: 0..<prime, using: &generator) }
            for (k, x) in points.enumerated() {
                // Horner's rule from the highest coefficient.
                var y: UInt64 = 0
                for c in coefficients.reversed() { y = add(multiply(y, x), c) }
                values[k].append(y)
            }
        }
        return zip(indices, values).map { ShamirShare(index: $0, values: $1) }
    }

    /// Reconstructs a `byteCount`-byte secret from the first `threshold` of `shares` (Lagrange interpolation at 0).
    /// - Throws: `invalid_share` for fewer than `threshold` shares, a bad or repeated index, or values of the wrong
    ///   count or outside the field; `reconstruction_failed` when a chunk comes out beyond its byte width (shares
    ///   from different secrets, or too few of them).
    public static func reconstruct(_ shares: [ShamirShare], threshold: Int, byteCount: Int) throws(SecureAggregationError) -> [UInt8] {
        guard threshold >= 1, shares.count >= threshold else {
            throw SecureAggregationError(.invalidShare, "\(shares.count) shares cannot reconstruct a secret of threshold \(threshold)")
        }
        let used = Array(shares.prefix(threshold))
        let points = try checkedPoints(used.map(\.index))
        let chunks = chunkCount(byteCount: byteCount)
        for share in used {
            guard share.values.count == chunks, share.values.allSatisfy({ $0 < prime }) else {
                throw SecureAggregationError(.invalidShare, "the share at index \(share.index) needs \(chunks) field elements below 2^61 - 1")
            }
        }
        // λ_j = Π_{m ≠ j} x_m / (x_m − x_j): the Lagrange basis at 0.
        let lambdas = points.indices.map { j in
            var numerator: UInt64 = 1, denominator: UInt64 = 1
            for m in points.indices where m != j {
                numerator = multiply(numerator, points[m])
                denominator = multiply(denominator, subtract(points[m], points[j]))
            }
            return multiply(numerator, inverse(denominator))
        }
        var secret: [UInt8] = []
        secret.reserveCapacity(byteCount)
        for c in 0..<chunks {
            var value: UInt64 = 0
            for (j, share) in used.enumerated() { value = add(value, multiply(lambdas[j], share.values[c])) }
            let width = min(chunkByteCount, byteCount - c * chunkByteCount)
            guard value >> (8 * UInt64(width)) == 0 else {
                throw SecureAggregationError(.reconstructionFailed, "chunk \(c) reconstructs beyond \(width) bytes: the shares do not belong to one secret")
            }
            for b in 0..<width { secret.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(b)))) }
        }
        return secret
    }

    static func checkedPoints(_ indices: [Int]) throws(SecureAggregationError) -> [UInt64] {
        var seen = Set<Int>()
        for index in indices {
            guard index >= 1, UInt64(index) < prime else { throw SecureAggregationError(.invalidShare, "share index \(index) must be in 1..<2^61 - 1") }
            guard seen.insert(index).inserted else { throw SecureAggregationError(.invalidShare, "share index \(index) appears twice") }
        }
        return indices.map { UInt64($0) }
    }

    // GF(2^61 − 1) arithmetic on values below p.

    static func add(_ a: UInt64, _ b: UInt64) -> UInt64 {
        let sum = a + b
        return sum >= prime ? sum - prime : sum
    }

    static func subtract(_ a: UInt64, _ b: UInt64) -> UInt64 { a >= b ? a - b : a + (prime - b) }

    static func multiply(_ a: UInt64, _ b: UInt64) -> UInt64 {
        // a·b < 2^122 = high·2^64 + low; 2^61 ≡ 1, so a·b ≡ (a·b >> 61) + (a·b mod 2^61).
        let (high, low) = a.multipliedFullWidth(by: b)
        let upper = (high << 3) | (low >> 61)
        return add(low & prime, upper == prime ? 0 : upper)
    }

    static func inverse(_ a: UInt64) -> UInt64 {
        // Fermat: a^(p − 2).
        var result: UInt64 = 1, base = a, exponent = prime - 2
        while exponent > 0 {
            if exponent & 1 == 1 { result = multiply(result, base) }
            base = multiply(base, base)
            exponent >>= 1
        }
        return result
    }
}

extension Data {
    mutating func appendLittleEndian(_ value: UInt64) {
        for b in 0..<8 { append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(b)))) }
    }

    mutating func appendLittleEndian(_ value: UInt32) {
        for b in 0..<4 { append(UInt8(truncatingIfNeeded: value >> (8 * UInt32(b)))) }
    }
}

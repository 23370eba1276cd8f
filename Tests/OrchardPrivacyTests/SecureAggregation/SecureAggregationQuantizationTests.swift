import Foundation
import OrchardPrivacy
import OrchardSupport
import Testing

/// Quantisation, configuration checks and the SecAgg+ neighbour ring.
@Suite struct SecureAggregationQuantizationTests {
    /// Dequantising Σ n_i q_i lands within Δ = 2c/(Q − 1) of the clipped weighted mean, and is unbiased.
    @Test(arguments: [UInt32(16), 1 << 10, 1 << 16])
    func dequantisedMeanIsWithinOneStep(levels: UInt32) throws {
        var generator = SplitMix64(seed: UInt64(levels))
        let c: Float = 2
        let inputs = SecAggFixture.inputs(devices: 20, length: 500, seed: UInt64(levels))
        var sum = [UInt32](repeating: 0, count: 500)
        var total = 0
        for device in 1...20 {
            let input = inputs[device]!
            let q = try SecureAggregationQuantization.quantize(input.update.map { $0 * 2 }, clippingRange: c, levels: levels, using: &generator)
            #expect(q.allSatisfy { $0 < levels })
            for i in q.indices { sum[i] &+= q[i] * UInt32(input.sampleCount) }
            total += input.sampleCount
        }
        let mean = SecureAggregationQuantization.mean(sum, totalSampleCount: total, clippingRange: c, levels: levels)
        let scaled = inputs.mapValues { SecureAggregationCycle.Input(update: $0.update.map { $0 * 2 }, sampleCount: $0.sampleCount) }
        let expected = SecAggFixture.expectedMean(scaled, devices: Array(1...20), clippingRange: c)
        let step = 2 * Double(c) / Double(levels - 1)
        let error = SecAggFixture.maximumError(mean, expected)
        #expect(error < step + 1e-5)
        // Coarse levels: the errors average out (unbiased), far below one step on average.
        if levels == 16 {
            let bias = zip(mean, expected).reduce(0.0) { $0 + (Double($1.0) - $1.1) } / 500
            #expect(abs(bias) < step / 20)
            #expect(error > step / 10)  // and the bound is not vacuous: the error is of the order of a step
        }
    }

    @Test func quantisationClipsAndRoundsToTheEnds() throws {
        var generator = SplitMix64(seed: 1)
        let q = try SecureAggregationQuantization.quantize([-5, -1, 0, 1, 7, .infinity, -.infinity], clippingRange: 1, levels: 101, using: &generator)
        #expect(q == [0, 0, 50, 100, 100, 100, 0])
        #expect(throws: SecureAggregationError.self) { try SecureAggregationQuantization.quantize([.nan], clippingRange: 1, levels: 3, using: &generator) }
        // A NaN among eight coordinates done together, in the pairs after them, or last: refused, naming the first.
        for (length, positions) in [(20, [5, 17]), (19, [17]), (19, [18]), (8, [7, 0])] {
            var update = [Float](repeating: 0.25, count: length)
            for position in positions { update[position] = .nan }
            do {
                _ = try SecureAggregationQuantization.quantize(update, clippingRange: 1, levels: 3, using: &generator)
                Issue.record("a NaN at \(positions) of \(length) was accepted")
            } catch {
                #expect(error.code == .invalidInput && error.message.contains("coordinate \(positions.min()!) "))
            }
        }
    }

    /// The loop as first written (floor() per coordinate), against which the faster one must agree level for level.
    static func referenceQuantize(_ values: [Float], clippingRange: Float, levels: UInt32, using generator: inout some RandomNumberGenerator) -> [UInt32] {
        let c = Double(clippingRange), top = Double(levels - 1), scale = top / (2 * c)
        var result = [UInt32](repeating: 0, count: values.count)
        var bits: UInt64 = 0
        for (i, value) in values.enumerated() {
            let x = min(max(Double(value), -c), c)
            let u = (x + c) * scale
            let floor = u.rounded(.down)
            if i & 1 == 0 { bits = generator.next() }
            let uniform = Double(UInt32(truncatingIfNeeded: i & 1 == 0 ? bits : bits >> 32)) * 0x1p-32
            let q = uniform < u - floor ? floor + 1 : floor
            result[i] = UInt32(min(max(q, 0), top))
        }
        return result
    }

    @Test(arguments: [UInt32(2), 4, 101, 1 << 16, UInt32.max])
    func quantisationMatchesTheReferenceLoop(levels: UInt32) throws {
        var values = SplitMix64(seed: UInt64(levels))
        for length in [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 1_001] {
            let c: Float = 1.5
            var update = (0..<length).map { _ in Float(Double(values.next() >> 11) * 0x1p-53 * 8 - 4) }
            if length > 3 { update[0] = c; update[1] = -c; update[2] = .infinity; update[3] = -.greatestFiniteMagnitude }
            // With 4 levels (scale 1) these land on halves and whole numbers of the level scale.
            if length > 7 { update[4] = 0; update[5] = 0.5; update[6] = -0.5; update[7] = 1 }
            var a = SplitMix64(seed: 99), b = SplitMix64(seed: 99)
            let fast = try SecureAggregationQuantization.quantize(update, clippingRange: c, levels: levels, using: &a)
            #expect(fast == Self.referenceQuantize(update, clippingRange: c, levels: levels, using: &b), "\(length) values")
            #expect(fast.allSatisfy { $0 <= levels - 1 })
            #expect(a.next() == b.next(), "as many draws as the reference")
        }
    }

    @Test func configurationValidationNamesTheProblem() throws {
        func code(_ configuration: SecureAggregationParameters, devices: Int = 10, samples: Int = 100) -> String? {
            do { try configuration.validate(devices: devices, maximumSampleCount: samples); return nil } catch { return error.message }
        }
        #expect(code(.init(threshold: 6)) == nil)
        #expect(code(.init(shares: 4, threshold: 3)) == nil)
        #expect(code(.init(shares: 9, threshold: 5)) == nil)  // shares = devices − 1 may be odd
        #expect(code(.init(threshold: 1))?.contains("at least 2") == true)
        #expect(code(.init(shares: 4, threshold: 5))?.contains("exceeds") == true)
        #expect(code(.init(shares: 4, threshold: 2))?.contains("above half") == true)
        #expect(code(.init(shares: 10, threshold: 6))?.contains("2...9") == true)
        #expect(code(.init(shares: 5, threshold: 3))?.contains("even") == true)
        #expect(code(.init(threshold: 6, clippingRange: 0))?.contains("clipping_range") == true)
        #expect(code(.init(threshold: 6, quantizationRange: 1))?.contains("quantization_range") == true)
        #expect(code(.init(threshold: 6, modulusBits: 33))?.contains("modulus_bits") == true)
        #expect(code(.init(threshold: 2), devices: 2)?.contains("at least 3 devices") == true)
        // (Q − 1) · devices · n_max against 2^bits: 65535 · 10 · 100 < 2^32 but not < 2^25.
        #expect(code(.init(threshold: 6, modulusBits: 25))?.contains("wrap") == true)
        #expect(code(.init(threshold: 6, quantizationRange: 1 << 22), samples: 1000)?.contains("wrap") == true)
        #expect(code(.init(threshold: 6, quantizationRange: 1 << 22), samples: 102) == nil)  // 4194303 · 10 · 102 < 2^32
        #expect(code(.init(threshold: 6, quantizationRange: 1 << 22), samples: 103)?.contains("wrap") == true)
        do {
            try SecureAggregationParameters(threshold: 1).validate(devices: 10, maximumSampleCount: 1)
            Issue.record("threshold 1 accepted")
        } catch {
            #expect(error.code == .invalidConfiguration)
        }
    }

    @Test func configurationUsesSnakeCaseKeys() throws {
        let configuration = SecureAggregationParameters(shares: 4, threshold: 3, clippingRange: 2, quantizationRange: 1000, modulusBits: 30)
        let json = try #require(String(data: JSONEncoder().encode(configuration), encoding: .utf8))
        for key in ["\"shares\"", "\"threshold\"", "\"clipping_range\"", "\"quantization_range\"", "\"modulus_bits\""] { #expect(json.contains(key)) }
        #expect(try JSONDecoder().decode(SecureAggregationParameters.self, from: Data(json.utf8)) == configuration)
    }

    @Test(arguments: [2, 4, 8])
    func ringNeighboursAreSymmetricAndCountK(k: Int) {
        let participants = [3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610]
        let graph = NeighbourGraph(participants: participants.reversed(), shares: k, seed: Data(repeating: 7, count: 32))
        #expect(graph.participants == participants)
        #expect(!graph.isComplete)
        for device in participants {
            let neighbours = graph.neighbours(of: device)
            #expect(neighbours.count == k && !neighbours.contains(device))
            for other in neighbours { #expect(graph.neighbours(of: other).contains(device)) }
        }
        // Another seed gives another ring; the same seed the same one.
        #expect(NeighbourGraph(participants: participants, shares: k, seed: Data(repeating: 8, count: 32)).ring != graph.ring)
        #expect(NeighbourGraph(participants: participants, shares: k, seed: Data(repeating: 7, count: 32)) == graph)
        #expect(graph.neighbours(of: 4).isEmpty)
    }

    @Test func completeGraphWhenSharesCoverEveryone() throws {
        let all = NeighbourGraph(participants: [1, 2, 3, 4, 5], shares: nil, seed: Data(count: 32))
        #expect(all.neighbours(of: 3) == [1, 2, 4, 5])
        let capped = NeighbourGraph(participants: [1, 2, 3, 4, 5], shares: 6, seed: Data(count: 32))
        #expect(capped.isComplete && capped.neighbours(of: 5) == [1, 2, 3, 4])
        let decoded = try JSONDecoder().decode(
            NeighbourGraph.self, from: JSONEncoder().encode(NeighbourGraph(participants: [1, 4, 9, 16, 25, 36], shares: 2, seed: Data(count: 32))))
        #expect(decoded.neighbours(of: 9) == NeighbourGraph(participants: [1, 4, 9, 16, 25, 36], shares: 2, seed: Data(count: 32)).neighbours(of: 9))
    }
}

import Foundation
@testable import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import Testing

/// The streaming report parser, without I/O: however a body is cut into chunks, the flat diff written and the
/// norm are the same, and every malformed body is refused with its code.
@Suite struct ReportStreamTests {
    let layout = try! ModelLayout(weights: Fixture.weights, model: Fixture.model)

    /// Runs a body through a stream in chunks of `size` bytes; returns the flat diff written and Σ value².
    func stream(_ body: [UInt8], chunk size: Int, maximumHeaderBytes: Int = Safetensors.maximumHeaderSize) throws -> (flat: [Float], squares: Double) {
        var stream = ReportStream(maximumHeaderBytes: maximumHeaderBytes)
        var flat = [UInt8](repeating: 0xFF, count: layout.totalCount * 4)
        var start = 0
        while start < body.count {
            let end = min(start + size, body.count)
            let chunk = Array(body[start..<end])
            try chunk.withUnsafeBytes { raw in
                var rest = raw
                if stream.header == nil {
                    guard let header = try stream.gatherHeader(&rest) else { return }
                    try stream.place(header, in: layout)
                }
                try stream.consume(rest) { bytes, offset throws(StoreError) in
                    for (i, byte) in bytes.enumerated() { flat[offset + i] = byte }
                }
            }
            start = end
        }
        try stream.finish()
        let values = flat.withUnsafeBytes { raw in
            (0..<layout.totalCount).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) }
        }
        return (values, stream.sumOfSquares)
    }

    func body(_ diff: [TensorRecord]) -> [UInt8] {
        ReportEnvelope.encode(diff: diff, metadata: ReportMetadata(workerID: "w", requestKey: "k", sampleCount: 1))
    }

    /// The flat diff the layout expects for `diff` (tensors by name, each at its layout offset).
    func expectedFlat(_ diff: [TensorRecord]) throws -> [Float] { try layout.flatten(diff) }

    @Test func everyChunkSizeGivesTheSameFlatDiffAndNorm() throws {
        let diff = Fixture.diff(0.37)
        let bytes = body(diff)
        let expected = try expectedFlat(diff)
        let squares = expected.reduce(0.0) { $0 + Double($1) * Double($1) }
        for size in [1, 2, 3, 5, 7, 8, 13, 64, bytes.count] {
            let (flat, sum) = try stream(bytes, chunk: size)
            #expect(flat == expected, "chunk size \(size)")
            #expect(abs(sum - squares) < 1e-9, "chunk size \(size)")
        }
    }

    /// A body whose tensors lie in another order than the layout's (reverse name order) is placed by name.
    @Test func tensorsInAnyOrderArePlacedByName() throws {
        let diff = Fixture.diff(1.5)
        var header = "{"
        var offset = 0
        var data: [UInt8] = []
        for (index, tensor) in diff.sorted(by: { $0.name > $1.name }).enumerated() {
            let count = tensor.values.count * 4
            header +=
                (index == 0 ? "" : ",") + "\"\(tensor.name)\":{\"dtype\":\"F32\",\"shape\":\(tensor.shape),\"data_offsets\":[\(offset),\(offset + count)]}"
            offset += count
            for value in tensor.values { withUnsafeBytes(of: value.bitPattern.littleEndian) { data.append(contentsOf: $0) } }
        }
        header += ",\"__metadata__\":{\"orchard.report\":\"{}\"}}"
        var bytes: [UInt8] = []
        withUnsafeBytes(of: UInt64(header.utf8.count).littleEndian) { bytes.append(contentsOf: $0) }
        bytes += Array(header.utf8) + data
        for size in [3, 11, bytes.count] {
            #expect(try stream(bytes, chunk: size).flat == expectedFlat(diff))
        }
    }

    @Test(arguments: [1, 4, 6])
    func aNonFiniteValueSplitAcrossChunksIsFound(size: Int) throws {
        var diff = Fixture.diff(0.1)
        let index = diff.firstIndex { $0.name == "out.weight" }!
        diff[index].values[1] = .nan
        #expect(throws: CoordinatorError(.nonFiniteValues, "tensor 'out.weight' holds NaN or infinity")) { try stream(body(diff), chunk: size) }
    }

    @Test func aChangedFrozenTensorIsRefused() throws {
        var diff = Fixture.diff(0.1)
        let index = diff.firstIndex { $0.name == "embed.weight" }!
        diff[index].values[5] = 1e-30
        #expect(performing: { try stream(body(diff), chunk: 5) }, throws: { ($0 as? CoordinatorError)?.code == .frozenTensorChanged })
    }

    @Test func truncatedAndOverlongBodiesAreRefused() throws {
        let bytes = body(Fixture.diff(0.2))
        for cut in [3, 8, 20, bytes.count - 1] {
            #expect(
                "cut at \(cut)", performing: { try stream(Array(bytes[0..<cut]), chunk: 4) },
                throws: { ($0 as? CoordinatorError)?.code == .malformedSafetensors })
        }
        #expect(performing: { try stream(bytes + [0, 0, 0, 0], chunk: 16) }, throws: { ($0 as? CoordinatorError)?.code == .malformedSafetensors })
    }

    @Test func aHeaderAboveTheLimitIsRefusedBeforeItArrives() {
        let bytes = body(Fixture.diff(0.2))
        // Only the 8-byte length is fed: the refusal comes from the announced length, not from reading it.
        #expect(
            performing: { try stream(Array(bytes[0..<8]), chunk: 8, maximumHeaderBytes: 64) }, throws: { ($0 as? CoordinatorError)?.code == .payloadTooLarge })
    }

    @Test func tensorsThatDoNotMatchTheModelAreRefused() throws {
        var wrongShape = Fixture.diff(0.1)
        wrongShape[0] = TensorRecord(name: wrongShape[0].name, shape: [wrongShape[0].values.count], values: wrongShape[0].values)
        #expect(performing: { try stream(body(wrongShape), chunk: 7) }, throws: { ($0 as? CoordinatorError)?.code == .shapeMismatch })
        let missing = Array(Fixture.diff(0.1).dropLast())
        #expect(performing: { try stream(body(missing), chunk: 7) }, throws: { ($0 as? CoordinatorError)?.code == .tensorMismatch })
        var renamed = Fixture.diff(0.1)
        renamed[0].name = "other.weight"
        #expect(performing: { try stream(body(renamed), chunk: 7) }, throws: { ($0 as? CoordinatorError)?.code == .tensorMismatch })
    }
}

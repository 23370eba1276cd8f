import Foundation
import OrchardFormats
import Testing

@Suite struct SafetensorsTests {
    let tensors = [
        TensorRecord(name: "b.bias", shape: [3], values: [1, -2, 3.5]),
        TensorRecord(name: "a.weight", shape: [2, 2], values: [0.25, 0.5, -0.75, 1e-8]),
        TensorRecord(name: "scalar", shape: [], values: [42]),
    ]

    @Test func roundTripPreservesNamesShapesValuesAndMetadata() throws {
        let bytes = Safetensors.encode(tensors, metadata: ["epoch": "3", "quote\"d": "x\ny"])
        let archive = try Safetensors.decode(bytes)
        #expect(archive.metadata == ["epoch": "3", "quote\"d": "x\ny"])
        for tensor in tensors {
            #expect(archive[tensor.name] == tensor)
        }
        #expect(archive.tensors.map(\.name) == ["a.weight", "b.bias", "scalar"])
    }

    @Test func indexLocatesEveryTensorsBytesWithoutDecodingThem() throws {
        let bytes = Safetensors.encode(tensors, metadata: ["k": "v"])
        let index = try Safetensors.index(bytes)
        #expect(index.metadata == ["k": "v"])
        #expect(index.entries.map(\.name) == ["a.weight", "b.bias", "scalar"])
        for entry in index.entries {
            let tensor = try #require(tensors.first { $0.name == entry.name })
            #expect(entry.shape == tensor.shape && entry.count == tensor.values.count && entry.dtype == .float32)
            let floats = stride(from: entry.byteRange.lowerBound, to: entry.byteRange.upperBound, by: 4).map { offset in
                Float(bitPattern: (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[offset + $1]) << (8 * UInt32($1)) })
            }
            #expect(floats == tensor.values)
        }
        #expect(index.entries.last?.byteRange.upperBound == bytes.count)
    }

    @Test func encodingIsStableAndHeaderIsAligned() {
        let a = Safetensors.encode(tensors)
        let b = Safetensors.encode(tensors.reversed())
        #expect(a == b)
        let headerLength = a[0..<8].enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
        #expect(headerLength % 8 == 0)
        #expect(a.count == 8 + headerLength + (4 + 3 + 1) * 4)
    }

    @Test func truncatedDataIsReported() {
        let bytes = Safetensors.encode(tensors)
        #expect(throws: FormatError.self) { try Safetensors.decode(bytes.dropLast(4)) }
        #expect(throws: FormatError.self) { try Safetensors.decode(bytes.prefix(5)) }
        do {
            _ = try Safetensors.decode(bytes.dropLast(4))
        } catch {
            #expect(error.code == .invalidOffsets || error.code == .truncated)
        }
    }

    @Test(arguments: [
        (#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, FormatError.Code.invalidOffsets),
        (#"{"x":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}"#, .unsupportedDType),
        (#"{"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#, .dtypeMismatch),
        (#"{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, .invalidHeader),
        (#"[1,2]"#, .invalidHeader),
        (#"{not json"#, .invalidHeader),
    ])
    func malformedHeadersAreRejectedWithACode(header: String, code: FormatError.Code) {
        var headerBytes = Array(header.utf8)
        while headerBytes.count % 8 != 0 { headerBytes.append(0x20) }
        var bytes = withUnsafeBytes(of: UInt64(headerBytes.count).littleEndian) { Array($0) }
        bytes += headerBytes + [UInt8](repeating: 0, count: 8)
        do {
            _ = try Safetensors.decode(bytes)
            Issue.record("expected \(code)")
        } catch {
            #expect(error.code == code, "\(error)")
        }
    }

    @Test func float16AndFloat64ConvertOnlyWhenAllowed() throws {
        let header = #"{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"d":{"dtype":"F64","shape":[1],"data_offsets":[4,12]}}"#
        var headerBytes = Array(header.utf8)
        while headerBytes.count % 8 != 0 { headerBytes.append(0x20) }
        var bytes = withUnsafeBytes(of: UInt64(headerBytes.count).littleEndian) { Array($0) }
        bytes += headerBytes
        bytes += [0x00, 0x3C, 0x00, 0xC0]  // 1.0, -2.0 in half precision
        bytes += withUnsafeBytes(of: (0.5 as Double).bitPattern.littleEndian) { Array($0) }
        #expect(throws: FormatError.self) { try Safetensors.decode(bytes) }
        let archive = try Safetensors.decode(bytes, allowConversion: true)
        #expect(archive["h"]?.values == [1, -2])
        #expect(archive["d"]?.values == [0.5])
    }

    @Test func validateNamesMissingExtraAndMisshapenTensors() throws {
        let archive = try Safetensors.decode(Safetensors.encode(tensors))
        try archive.validate(against: ["a.weight": [2, 2], "b.bias": [3], "scalar": []])
        #expect(throws: FormatError.self) { try archive.validate(against: ["a.weight": [4], "b.bias": [3], "scalar": []]) }
        #expect(throws: FormatError.self) { try archive.validate(against: ["a.weight": [2, 2], "b.bias": [3]]) }
        #expect(throws: FormatError.self) { try archive.validate(against: ["a.weight": [2, 2], "b.bias": [3], "scalar": [], "c": [1]]) }
    }
}

import OrchardFlower
import Testing

/// The `.npy` codec against numpy's own bytes, and every malformed file.
@Suite struct NPYTests {
    @Test func encodingGivesNumPysBytesForEveryDtypeAndShape() throws {
        let fixture = try FlowerFixtures.npy()
        #expect(Set(fixture.written.map(\.dtype)) == Set(NumPyDType.allCases.map(\.rawValue)))
        for item in fixture.written {
            let array = try item.array
            #expect(NPY.encode(array) == FlowerFixtures.bytes(item.npy), "\(item.name)")
            #expect(try NPY.decode(FlowerFixtures.bytes(item.npy)) == array, "\(item.name)")
            #expect(array.dtype.descr == item.descr, "\(item.name)")
        }
    }

    @Test func versionsOneTwoAndThreeAreReadAndWritten() throws {
        let fixture = try FlowerFixtures.npy()
        for (item, version) in zip(fixture.read, [NPY.Version.v1, .v2, .v3]) {
            let bytes = FlowerFixtures.bytes(item.npy)
            #expect(Int(bytes[6]) == [NPY.Version.v1, .v2, .v3].firstIndex(of: version)! + 1)
            #expect(try NPY.decode(bytes) == (try item.array), "\(item.name)")
            #expect(NPY.encode(try item.array, version: version) == bytes, "\(item.name)")
        }
    }

    /// A ServerApp's transposed or `np.asfortranarray` matrix reaches the node in Fortran order: it is read, into C order.
    @Test func fortranOrderArraysFromFlwrAreReadInCOrder() throws {
        let fortran = try FlowerFixtures.npy().fortran
        #expect(fortran.count == 4)
        for item in fortran {
            let bytes = FlowerFixtures.bytes(item.npy)
            #expect(String(decoding: bytes.prefix(128), as: UTF8.self).contains("'fortran_order': True"), "\(item.name)")
            #expect(try NPY.decode(bytes) == (try item.array), "\(item.name)")
        }
    }

    @Test func filesOrchardDoesNotReadAreRefusedWithTheirReason() throws {
        for item in try FlowerFixtures.npy().refused {
            let error = #expect(throws: FlowerError.self, "\(item.name)") { try NPY.decode(FlowerFixtures.bytes(item.npy)) }
            #expect(error?.code.description == item.code, "\(item.name): \(String(describing: error))")
        }
    }

    /// A v1.0 file with `header` (padded to 64 bytes) and `data`.
    func file(_ header: String, data: [UInt8] = [0, 0, 128, 63]) -> [UInt8] {
        let padded = header + String(repeating: " ", count: (64 - (10 + header.utf8.count + 1) % 64) % 64) + "\n"
        let length = padded.utf8.count
        return [0x93] + Array("NUMPY".utf8) + [1, 0, UInt8(length & 0xFF), UInt8(length >> 8)] + Array(padded.utf8) + data
    }

    @Test func headersOtherWritersProduceAreRead() throws {
        let one = FlowerArray([1], shape: [1])
        for header in [
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
            "{\"shape\": (1,), \"fortran_order\": False, \"descr\": \"<f4\"}",
            "{'descr':'<f4','fortran_order':False,'shape':(1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1L,), }",
            "{'descr': '<f4', 'shape': (1,), 'fortran_order': False, 'descr': '<f4'}",
        ] {
            #expect(try NPY.decode(file(header)) == one, "\(header)")
        }
        #expect(try NPY.decode(file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1,), }")) == FlowerArray([1], shape: [1, 1]))
        #expect(try NPY.decode(file("{'descr': '<f4', 'fortran_order': False, 'shape': (), }")) == FlowerArray([1], shape: []))
        #expect(try NPY.decode(file("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }")).dtype == .uint8)
    }

    @Test func malformedFilesAreRefused() throws {
        let good = NPY.encode(FlowerArray([1, 2, 3], shape: [3]))
        let cases: [(String, [UInt8], FlowerError.Code)] = [
            ("empty", [], .invalidNpy),
            ("bad magic", [0x93] + Array("NUMPX".utf8) + good.dropFirst(6), .invalidNpy),
            ("version 4.0", Array(good.prefix(6)) + [4, 0] + good.dropFirst(8), .invalidNpy),
            ("version 1.1", Array(good.prefix(6)) + [1, 1] + good.dropFirst(8), .invalidNpy),
            ("cut in the length", Array(good.prefix(9)), .invalidNpy),
            ("cut in the header", Array(good.prefix(40)), .invalidNpy),
            ("header length past the end", Array(good.prefix(8)) + [0xFF, 0xFF] + good.dropFirst(10), .invalidNpy),
            ("data one byte short", Array(good.dropLast()), .shapeMismatch),
            ("data one byte long", good + [0], .shapeMismatch),
            ("no data", Array(good.prefix(128)), .shapeMismatch),
            ("not a dict", file("[('descr', '<f4')]"), .invalidNpy),
            ("not a literal", file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } junk"), .invalidNpy),
            ("unterminated", file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,"), .invalidNpy),
            ("missing key", file("{'descr': '<f4', 'shape': (1,)}"), .invalidNpy),
            ("extra key", file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"), .invalidNpy),
            ("shape a list", file("{'descr': '<f4', 'fortran_order': False, 'shape': [1]}"), .invalidNpy),
            ("shape an int in parentheses", file("{'descr': '<f4', 'fortran_order': False, 'shape': (1)}"), .invalidNpy),
            ("negative dimension", file("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"), .invalidNpy),
            ("huge dimension", file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"), .invalidNpy),
            ("overflowing shape", file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"), .shapeMismatch),
            ("fortran order a string", file("{'descr': '<f4', 'fortran_order': 'no', 'shape': (1,)}"), .invalidNpy),
            (
                "fortran order, data one byte short", file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}", data: [UInt8](repeating: 0, count: 15)),
                .shapeMismatch
            ),
            ("structured dtype", file("{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (1,)}"), .unsupportedDtype),
            ("big-endian", file("{'descr': '>f4', 'fortran_order': False, 'shape': (1,)}"), .unsupportedDtype),
            ("unknown dtype", file("{'descr': '<f3', 'fortran_order': False, 'shape': (1,)}"), .unsupportedDtype),
            ("dtype and shape disagree", file("{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}"), .shapeMismatch),
        ]
        for (name, bytes, code) in cases {
            let error = #expect(throws: FlowerError.self, "\(name)") { try NPY.decode(bytes) }
            #expect(error?.code == code, "\(name): \(String(describing: error))")
        }
    }

    @Test func aHeaderLongerThanNumPyReadsIsRefused() {
        let long = file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }" + String(repeating: " ", count: 10_000))
        let error = #expect(throws: FlowerError.self) { try NPY.decode(long) }
        #expect(error?.code == .invalidNpy)
    }

    @Test func arraysCheckTheirDataAgainstTheirShape() {
        #expect(throws: FlowerError.self) { try FlowerArray(dtype: .float32, shape: [2, 2], data: [UInt8](repeating: 0, count: 15)) }
        #expect(throws: FlowerError.self) { try FlowerArray(dtype: .int64, shape: [-1], data: []) }
        #expect(throws: FlowerError.self) { try FlowerArray(dtype: .uint8, shape: [.max, 2], data: []) }
        #expect(throws: Never.self) { try FlowerArray(dtype: .int16, shape: [0, 5], data: []) }
    }

    @Test func floatsConvertFloat64AndKeepFloat32() throws {
        let values: [Float] = [0, -1.5, .greatestFiniteMagnitude, .leastNonzeroMagnitude, .infinity]
        #expect(try FlowerArray(values, shape: [5]).floats() == values)
        let doubles: [Double] = [0.1, -2.5, 1e300]
        var data: [UInt8] = []
        for value in doubles { withUnsafeBytes(of: value.bitPattern.littleEndian) { data += $0 } }
        #expect(try FlowerArray(dtype: .float64, shape: [3], data: data).floats() == doubles.map { Float($0) })
        let error = #expect(throws: FlowerError.self) { try FlowerArray(dtype: .int32, shape: [1], data: [1, 0, 0, 0]).floats() }
        #expect(error?.code == .unsupportedDtype)
    }

    @Test func descriptorsNameEachDtypeOnce() {
        for dtype in NumPyDType.allCases {
            #expect(NumPyDType(descr: dtype.descr) == dtype)
        }
        #expect(NumPyDType(descr: "<u1") == .uint8)
        #expect(NumPyDType(descr: "|f4") == nil)
        #expect(NumPyDType(descr: ">i8") == nil)
        #expect(NumPyDType(descr: "") == nil)
    }
}

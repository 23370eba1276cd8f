@testable import OrchardData
import Testing

/// The gzip reader's CRC-32 against values from zlib (`zlib.crc32` in Python), with and without a tail shorter
/// than the eight bytes folded in at a time.
@Suite struct CRC32Tests {
    @Test func matchesZlib() {
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)  // the standard check value
        #expect(CRC32.checksum((0..<1000).map { UInt8(($0 * 7 + 3) % 256) }) == 0x17BC_2A46)
        #expect(CRC32.checksum([]) == 0)
    }
}

import OrchardFormats
import Testing

/// What a file that is not safetensors is called when it is given where safetensors is expected (`--weights`): the
/// first 8 bytes read as a header length are absurd, and the message says what the file looks like instead.
@Suite struct SafetensorsHeaderErrorTests {
    @Test func aJSONFileIsNamedAsJSON() {
        let json = Array(#"{"format_version": 1, "name": "x"}"#.utf8)
        #expect { try Safetensors.decode(json) } throws: { "\($0)".contains("starts with '{', as JSON does") }
    }

    @Test func textIsNamedAsText() {
        let csv = Array("crim,zn,indus\n0.1,18,2.3\n".utf8)
        #expect { try Safetensors.decode(csv) } throws: { "\($0)".contains("starts with text") }
    }

    @Test func binaryWithAnAbsurdLengthSaysSo() {
        let bytes: [UInt8] = [0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x01, 0x80] + Array(repeating: 0, count: 16)
        #expect { try Safetensors.decode(bytes) } throws: { "\($0)".contains("exceeds") }
    }
}

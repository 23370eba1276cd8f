import Foundation
import Testing
import OrchardProtocol

@Suite struct VersionTests {
    @Test(arguments: [("1.0", "1.0.0"), ("1", "1.0.0"), ("2.1", "2.1.0"), ("0.0.1", "0.0.1"), ("1.0.0.0", "1")])
    func equivalentSpellingsAreEqual(a: String, b: String) throws {
        let x = try #require(SemanticVersion(a))
        let y = try #require(SemanticVersion(b))
        #expect(x == y)
        #expect(x.hashValue == y.hashValue)
        #expect(x.description == y.description)
    }

    @Test(arguments: ["", "1.", ".1", "1..0", "v1", "1.0-beta", "-1", "1.2.3.4.5", "１.0"])
    func malformedVersionsAreRejected(text: String) {
        #expect(SemanticVersion(text) == nil)
    }

    @Test func ordering() throws {
        let versions = ["1.10", "1.2", "1.2.1", "0.9", "2"].compactMap(SemanticVersion.init)
        #expect(versions.sorted().map(\.description) == ["0.9.0", "1.2.0", "1.2.1", "1.10.0", "2.0.0"])
    }

    @Test func decodesFromAndEncodesToString() throws {
        let decoded = try WireCoding.decoder().decode([SemanticVersion].self, from: Data(#"["1.0","1.0.0","3"]"#.utf8))
        #expect(decoded[0] == decoded[1])
        let encoded = String(decoding: try WireCoding.encoder().encode(decoded), as: UTF8.self)
        #expect(encoded == #"["1.0.0","1.0.0","3.0.0"]"#)
        #expect(throws: DecodingError.self) {
            try WireCoding.decoder().decode(SemanticVersion.self, from: Data(#""one""#.utf8))
        }
    }

    @Test func compatibilityFollowsTheMajorVersion() throws {
        #expect(WireProtocol.isCompatible(try #require(SemanticVersion("2.4"))))
        #expect(WireProtocol.isCompatible(try #require(SemanticVersion("2"))))
        #expect(!WireProtocol.isCompatible(try #require(SemanticVersion("3.0"))))
        // 1.x devices expect the client config in the assignment: refused at authentication.
        #expect(!WireProtocol.isCompatible(try #require(SemanticVersion("1.0"))))
    }
}

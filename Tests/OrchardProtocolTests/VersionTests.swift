import Foundation
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Short strings over digits, dots and a few characters a version must not contain (a letter, a sign, a space, an
/// Arabic-Indic digit, a fullwidth digit), runs of digits up to eleven long.
private let versionText = fuzzed { rng -> String in
    let pieces = ["0", "1", "7", "9", "12", "123456789", "1234567890", "00012345678", ".", ".", ".", "v", "-", " ", "\u{661}", "１", "+"]
    return (0..<Int.random(in: 0...9, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined()
}

/// The parser as it was first written, on Characters: the reference the byte parser must agree with.
private func referenceComponents(_ string: String) -> [Int]? {
    let parts = string.split(separator: ".", omittingEmptySubsequences: false)
    guard !parts.isEmpty, parts.count <= 4 else { return nil }
    var values: [Int] = []
    for part in parts {
        guard !part.isEmpty, part.count <= 9, part.allSatisfy({ $0.isASCII && $0.isNumber }), let value = Int(part) else { return nil }
        values.append(value)
    }
    return values
}

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

    @Test("the byte parser accepts and reads exactly what the Character parser did")
    func agreesWithTheCharacterParser() async {
        await propertyCheck(count: 2000, input: versionText) { text in
            #expect(SemanticVersion(text) == referenceComponents(text).map(SemanticVersion.init(components:)), "\(text)")
        }
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

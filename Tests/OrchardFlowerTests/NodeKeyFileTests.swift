import Crypto
import Foundation
@testable import OrchardFlower
import Testing

/// SuperNode key files as Flower's tools and ssh-keygen write and read them.
@Suite struct NodeKeyFileTests {
    func temporaryFile(_ text: String, mode: Int = 0o600) throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-node-key-\(UUID().uuidString)")
        try Data(text.utf8).write(to: url)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: url.path)
        return url
    }

    func failure(_ text: String) -> String? {
        do {
            _ = try NodeKeyFile.privateKey(fromText: text)
            return nil
        } catch {
            #expect(error.code == .invalidConfiguration)
            return error.message
        }
    }

    @Test func aKeyWrittenInOpenSSHFormatReadsBackAsTheSameKey() throws {
        for _ in 0..<20 {
            // Twenty keys: some private scalars have a leading zero byte or the top bit set (mpint's two edge cases).
            let identity = NodeIdentity()
            let text = NodeKeyFile.openSSHPrivateKey(identity, comment: "phone")
            let read = try NodeKeyFile.privateKey(fromText: text)
            #expect(read.privateKey.rawRepresentation == identity.privateKey.rawRepresentation)
            let line = NodeKeyFile.openSSHPublicKey(identity, comment: "phone")
            #expect(line.hasPrefix("ecdsa-sha2-nistp384 ") && line.hasSuffix(" phone\n"))
            #expect(try NodeKeyFile.publicKey(fromOpenSSH: line).x963Representation == identity.privateKey.publicKey.x963Representation)
            #expect(text.split(separator: "\n").dropFirst().dropLast().allSatisfy { $0.count <= 70 }, "base64 wrapped at 70 as ssh-keygen does")
        }
    }

    @Test func aKeyMadeBySSHKeygenIsReadAndMatchesItsPublicHalf() throws {
        let identity = try NodeKeyFile.privateKey(fromText: NodeKeyFixtures.sshP384)
        let publicKey = try NodeKeyFile.publicKey(fromOpenSSH: NodeKeyFixtures.sshP384Public)
        #expect(identity.privateKey.publicKey.x963Representation == publicKey.x963Representation)
        // And Orchard writes the public line exactly as ssh-keygen did (bar the comment).
        let written = NodeKeyFile.openSSHPublicKey(identity, comment: "fixture")
        #expect(written == NodeKeyFixtures.sshP384Public + "\n")
    }

    @Test func pemKeysAreRead() throws {
        let pkcs8 = try NodeKeyFile.privateKey(fromText: NodeKeyFixtures.pemPKCS8)
        let sec1 = try NodeKeyFile.privateKey(fromText: NodeKeyFixtures.pemSEC1)
        #expect(pkcs8.privateKey.rawRepresentation == sec1.privateKey.rawRepresentation)
    }

    @Test func keysOfOtherKindsAreRefusedNamingWhatTheyAre() throws {
        #expect(failure(NodeKeyFixtures.sshEncrypted)?.contains("is encrypted (aes256-ctr, bcrypt)") == true)
        #expect(failure(NodeKeyFixtures.sshEd25519)?.contains("holds a key of type ssh-ed25519") == true)
        #expect(failure(NodeKeyFixtures.sshP256)?.contains("holds a key of type ecdsa-sha2-nistp256") == true)
        #expect(failure(NodeKeyFixtures.pemP256)?.contains("not a P-384 private key") == true)
        #expect(failure(NodeKeyFixtures.sshP384Public)?.contains("neither an OpenSSH private key nor a PEM one") == true)
        #expect(failure("")?.contains("neither") == true)
        #expect((try? NodeKeyFile.publicKey(fromOpenSSH: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE ed")) == nil)
    }

    @Test func damagedOpenSSHKeysAreRefused() throws {
        let text = NodeKeyFile.openSSHPrivateKey(NodeIdentity())
        var lines = text.split(separator: "\n").map(String.init)
        // Truncated: the last base64 line dropped.
        var truncated = lines
        truncated.remove(at: truncated.count - 2)
        #expect(failure(truncated.joined(separator: "\n")) != nil)
        // Damaged base64.
        lines[1] = "!!!" + lines[1].dropFirst(3)
        #expect(failure(lines.joined(separator: "\n"))?.contains("base64 is damaged") == true)
        // The private scalar of one key under the public point of another.
        let body = Data(base64Encoded: text.split(separator: "\n").dropFirst().dropLast().joined())!
        let other = NodeIdentity().privateKey.publicKey.x963Representation
        let own = try NodeKeyFile.privateKey(fromText: text).privateKey.publicKey.x963Representation
        var swapped = body
        let range = swapped.lastRange(of: own)!
        swapped.replaceSubrange(range, with: other)
        let rewrapped = "-----BEGIN OPENSSH PRIVATE KEY-----\n\(swapped.base64EncodedString())\n-----END OPENSSH PRIVATE KEY-----\n"
        #expect(failure(rewrapped)?.contains("does not belong to its private scalar") == true)
    }

    @Test func everyTruncationOfAKeyIsAnErrorNotACrash() throws {
        let body = Data(base64Encoded: NodeKeyFixtures.sshP384.split(separator: "\n").dropFirst().dropLast().joined())!
        for length in 0..<body.count {
            let text = "-----BEGIN OPENSSH PRIVATE KEY-----\n\(body.prefix(length).base64EncodedString())\n-----END OPENSSH PRIVATE KEY-----"
            #expect(failure(text) != nil, "a key cut at \(length) bytes")
        }
    }

    @Test func aKeyFileReadableByOthersIsRefused() throws {
        let open = try temporaryFile(NodeKeyFixtures.sshP384, mode: 0o644)
        defer { try? FileManager.default.removeItem(at: open) }
        #expect { try NodeKeyFile.readPrivateKey(at: open) } throws: { error in
            "\(error)".contains("readable by others (mode 644)") && "\(error)".contains("chmod 600")
        }
        let owned = try temporaryFile(NodeKeyFixtures.sshP384)
        defer { try? FileManager.default.removeItem(at: owned) }
        _ = try NodeKeyFile.readPrivateKey(at: owned)
        let missing = FileManager.default.temporaryDirectory.appendingPathComponent("no-such-key-\(UUID().uuidString)")
        #expect { try NodeKeyFile.readPrivateKey(at: missing) } throws: { error in "\(error)".contains("no such file") }
    }
}

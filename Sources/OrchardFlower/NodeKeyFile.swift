public import Crypto
public import Foundation
import OrchardSupport

/// A SuperNode key in the files Flower's tools read and write: the private key as `flower-supernode
/// --auth-supernode-private-key` reads it (OpenSSH `openssh-key-v1`, unencrypted, or PEM PKCS#8 / SEC1), and the
/// public key as `flwr supernode register` reads it (`ecdsa-sha2-nistp384 AAAA… comment`). Only the container
/// format is parsed here; the key itself is swift-crypto's P-384.
public enum NodeKeyFile {
    private static let keyType = "ecdsa-sha2-nistp384"
    private static let curve = "nistp384"
    private static let magic = Array("openssh-key-v1".utf8) + [0]
    private static let scalarBytes = 48

    /// Reads a private key file: OpenSSH (as `ssh-keygen -t ecdsa -b 384` writes it) or PEM. The file must be
    /// readable by its owner only, as ssh requires of private keys.
    /// - Throws: ``FlowerError/Code/invalidConfiguration`` naming the file and what is wrong (missing, readable by
    ///   others, encrypted, not P-384, damaged).
    public static func readPrivateKey(at url: URL) throws(FlowerError) -> NodeIdentity {
        let path = url.path
        let data: Data
        do throws(FileAccessError) { data = try LocalFile.read(path) } catch {
            throw FlowerError(.invalidConfiguration, "the node key '\(path)': \(error.message)")
        }
        let attributes = (try? FileManager.default.attributesOfItem(atPath: path)) ?? [:]
        if let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue, mode & 0o077 != 0 {
            throw FlowerError(
                .invalidConfiguration,
                "the node key '\(path)' is readable by others (mode \(String(mode & 0o777, radix: 8))); make it owner-only with chmod 600"
            )
        }
        guard let text = String(data: data, encoding: .utf8) else { throw FlowerError(.invalidConfiguration, "the node key '\(path)': not UTF-8 text") }
        do throws(FlowerError) {
            return try privateKey(fromText: text)
        } catch {
            throw FlowerError(.invalidConfiguration, "the node key '\(path)' \(error.message)")
        }
    }

    /// Parses a private key's text (OpenSSH or PEM).
    public static func privateKey(fromText text: String) throws(FlowerError) -> NodeIdentity {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        if trimmed.hasPrefix("-----BEGIN OPENSSH PRIVATE KEY-----") {
            return try openSSHPrivateKey(trimmed)
        }
        if trimmed.hasPrefix("-----BEGIN ") {
            do {
                return NodeIdentity(privateKey: try P384.Signing.PrivateKey(pemRepresentation: trimmed))
            } catch {
                throw FlowerError(.invalidConfiguration, "is PEM but not a P-384 private key (PKCS#8 or SEC1): \(error)")
            }
        }
        throw FlowerError(.invalidConfiguration, "is neither an OpenSSH private key nor a PEM one (make one with `orchard flower keygen`)")
    }

    /// The private key in OpenSSH's format (unencrypted), as `ssh-keygen` writes it.
    public static func openSSHPrivateKey(_ identity: NodeIdentity, comment: String = "") -> String {
        let publicBlob = publicKeyBlob(identity.privateKey.publicKey)
        let check = UInt32.random(in: .min ... .max)
        var secret = SSHWriter()
        secret.uint32(check)
        secret.uint32(check)
        secret.string(keyType)
        secret.string(curve)
        secret.bytes(identity.privateKey.publicKey.x963Representation)
        secret.mpint(identity.privateKey.rawRepresentation)
        secret.string(comment)
        var pad: UInt8 = 1
        while secret.data.count % 8 != 0 {
            secret.data.append(pad)
            pad += 1
        }
        var file = SSHWriter()
        file.data.append(contentsOf: magic)
        file.string("none")
        file.string("none")
        file.string("")
        file.uint32(1)
        file.bytes(publicBlob)
        file.bytes(secret.data)
        let body = file.data.base64EncodedString()
        var lines = ["-----BEGIN OPENSSH PRIVATE KEY-----"]
        var index = body.startIndex
        while index < body.endIndex {
            let end = body.index(index, offsetBy: 70, limitedBy: body.endIndex) ?? body.endIndex
            lines.append(String(body[index..<end]))
            index = end
        }
        lines.append("-----END OPENSSH PRIVATE KEY-----")
        return lines.joined(separator: "\n") + "\n"
    }

    /// The public key line `flwr supernode register` reads: `ecdsa-sha2-nistp384 BASE64 comment`.
    public static func openSSHPublicKey(_ identity: NodeIdentity, comment: String = "") -> String {
        let line = "\(keyType) \(publicKeyBlob(identity.privateKey.publicKey).base64EncodedString())"
        return (comment.isEmpty ? line : "\(line) \(comment)") + "\n"
    }

    /// Reads a public key line (`ecdsa-sha2-nistp384 BASE64 [comment]`).
    public static func publicKey(fromOpenSSH line: String) throws(FlowerError) -> P384.Signing.PublicKey {
        let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" })
        guard fields.count >= 2, fields[0] == keyType, let blob = Data(base64Encoded: String(fields[1])) else {
            throw FlowerError(.invalidConfiguration, "is not an OpenSSH \(keyType) public key line")
        }
        var reader = SSHReader(blob)
        guard try reader.text() == keyType, try reader.text() == curve else {
            throw FlowerError(.invalidConfiguration, "the public key's blob is not \(keyType)")
        }
        let point = try reader.bytes()
        do { return try P384.Signing.PublicKey(x963Representation: point) } catch {
            throw FlowerError(.invalidConfiguration, "the public key's point is not on P-384")
        }
    }

    private static func publicKeyBlob(_ key: P384.Signing.PublicKey) -> Data {
        var blob = SSHWriter()
        blob.string(keyType)
        blob.string(curve)
        blob.bytes(key.x963Representation)
        return blob.data
    }

    private static func openSSHPrivateKey(_ text: String) throws(FlowerError) -> NodeIdentity {
        let body = text.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.hasPrefix("-----") }.joined()
        guard let data = Data(base64Encoded: body) else { throw FlowerError(.invalidConfiguration, "is an OpenSSH private key whose base64 is damaged") }
        var reader = SSHReader(data)
        guard Array(try reader.raw(magic.count)) == magic else { throw FlowerError(.invalidConfiguration, "is not an openssh-key-v1 private key") }
        let cipher = try reader.text()
        let kdf = try reader.text()
        _ = try reader.bytes()
        guard cipher == "none", kdf == "none" else {
            throw FlowerError(
                .invalidConfiguration,
                "is encrypted (\(cipher), \(kdf)); a SuperNode key is read without a passphrase, as Flower's SuperNode reads it: remove it with `ssh-keygen -p -N \"\" -f FILE` and keep the file owner-only"
            )
        }
        guard try reader.uint32() == 1 else { throw FlowerError(.invalidConfiguration, "holds more than one key; a SuperNode key file holds one") }
        var publicBlob = SSHReader(try reader.bytes())
        let type = try publicBlob.text()
        guard type == keyType else {
            throw FlowerError(.invalidConfiguration, "holds a key of type \(type); Flower's SuperNode keys are ECDSA P-384 (ssh-keygen -t ecdsa -b 384)")
        }
        var secret = SSHReader(try reader.bytes())
        guard try secret.uint32() == secret.uint32() else { throw FlowerError(.invalidConfiguration, "is damaged (its check numbers differ)") }
        guard try secret.text() == keyType, try secret.text() == curve else {
            throw FlowerError(.invalidConfiguration, "is damaged (its private part is not \(keyType))")
        }
        let point = try secret.bytes()
        let scalar = try secret.bytes().drop(while: { $0 == 0 })
        guard scalar.count <= scalarBytes else { throw FlowerError(.invalidConfiguration, "is damaged (its private scalar is longer than P-384's)") }
        let raw = Data(repeating: 0, count: scalarBytes - scalar.count) + scalar
        let key: P384.Signing.PrivateKey
        do { key = try P384.Signing.PrivateKey(rawRepresentation: raw) } catch {
            throw FlowerError(.invalidConfiguration, "is damaged (its private scalar is not a P-384 key)")
        }
        guard key.publicKey.x963Representation == point else {
            throw FlowerError(.invalidConfiguration, "is damaged (its public point does not belong to its private scalar)")
        }
        return NodeIdentity(privateKey: key)
    }
}

/// Writes SSH wire encoding (RFC 4251 §5): big-endian `uint32`, length-prefixed `string`, `mpint`.
private struct SSHWriter {
    var data = Data()

    mutating func uint32(_ value: UInt32) {
        withUnsafeBytes(of: value.bigEndian) { data.append(contentsOf: $0) }
    }

    mutating func bytes(_ value: Data) {
        uint32(UInt32(value.count))
        data.append(value)
    }

    mutating func string(_ value: String) { bytes(Data(value.utf8)) }

    /// A non-negative integer from its big-endian magnitude: leading zeros dropped, a zero prepended when the top
    /// bit is set.
    mutating func mpint(_ magnitude: Data) {
        var bytes = Data(magnitude.drop(while: { $0 == 0 }))
        if let first = bytes.first, first & 0x80 != 0 { bytes.insert(0, at: bytes.startIndex) }
        self.bytes(bytes)
    }
}

/// Reads SSH wire encoding; running past the end is a ``FlowerError``.
private struct SSHReader {
    private let data: Data
    private var offset: Int

    init(_ data: Data) {
        self.data = Data(data)
        offset = 0
    }

    mutating func raw(_ count: Int) throws(FlowerError) -> Data {
        guard count >= 0, data.count - offset >= count else { throw FlowerError(.invalidConfiguration, "is truncated") }
        defer { offset += count }
        return data.subdata(in: offset..<(offset + count))
    }

    mutating func uint32() throws(FlowerError) -> UInt32 {
        try raw(4).reduce(0) { $0 << 8 | UInt32($1) }
    }

    mutating func bytes() throws(FlowerError) -> Data { try raw(Int(try uint32())) }

    mutating func text() throws(FlowerError) -> String {
        guard let text = String(data: try bytes(), encoding: .utf8) else { throw FlowerError(.invalidConfiguration, "is damaged (a name is not text)") }
        return text
    }
}

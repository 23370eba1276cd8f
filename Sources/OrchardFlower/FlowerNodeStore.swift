import Crypto
package import Foundation
import OrchardSupport

/// What a Flower node keeps in its state directory across background windows and restarts: its key (the node's
/// identity to the SuperLink), whether the SuperLink knows it, a message fetched and confirmed but not yet handled,
/// and a reply not yet pushed. Every file is replaced atomically; the key file is readable by its owner only.
package struct FlowerNodeStore: Sendable {
    /// The state directory.
    package let directory: URL

    /// A message fetched from the SuperLink and confirmed (the SuperLink has deleted it): its objects by id.
    package struct KeptMessage: Codable, Sendable, Hashable {
        package var runID: UInt64
        package var messageID: String
        package var messageType: String
        /// The `Message` proto as pulled (metadata), serialised.
        package var message: Data
        /// Every object of the message's tree by id.
        package var objects: [String: Data]

        enum CodingKeys: String, CodingKey {
            case runID = "run_id", messageID = "message_id", messageType = "message_type", message, objects
        }
    }

    /// A reply made but not yet pushed.
    package struct KeptReply: Codable, Sendable, Hashable {
        package var runID: UInt64
        /// The id of the message it answers.
        package var replyTo: String
        /// The reply's `Message` proto (metadata, no content), serialised.
        package var message: Data
        /// The reply's `ObjectTree`, serialised.
        package var tree: Data
        /// Every object of the reply by id.
        package var objects: [String: Data]
        /// Object ids, children before parents.
        package var order: [String]

        enum CodingKeys: String, CodingKey {
            case runID = "run_id", replyTo = "reply_to", message, tree, objects, order
        }
    }

    private struct NodeFile: Codable {
        var superlink: String
        var registered: Bool
    }

    /// Opens (creating) the state directory.
    package init(directory: URL) throws(FlowerError) {
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            throw FlowerError(.storage, "cannot create the state directory \(directory.path): \(FileAccessError(error, writing: true).message)")
        }
        self.directory = directory
    }

    private var keyURL: URL { directory.appendingPathComponent("flower-node-key") }
    private var nodeURL: URL { directory.appendingPathComponent("flower-node.json") }
    private var messageURL: URL { directory.appendingPathComponent("flower-kept-message.json") }
    private var replyURL: URL { directory.appendingPathComponent("flower-kept-reply.json") }

    /// The node's identity: the saved key, or a new one saved now (mode 0600).
    package func identity() throws(FlowerError) -> NodeIdentity {
        if FileManager.default.fileExists(atPath: keyURL.path) {
            let raw = try read(keyURL)
            do {
                return NodeIdentity(privateKey: try P384.Signing.PrivateKey(rawRepresentation: raw))
            } catch {
                throw FlowerError(.storage, "\(keyURL.path) is not a P-384 private key (\(error)); delete it to make the node a new identity")
            }
        }
        let identity = NodeIdentity()
        // Created readable by its owner only, then renamed into place: the key is never readable by others.
        let temporary = directory.appendingPathComponent(".flower-node-key-\(UUID().uuidString)")
        // open(2) with the mode, not a write then a chmod: there is no moment when the file is readable by others.
        do throws(FileAccessError) { try LocalFile.createNew(identity.privateKey.rawRepresentation, at: temporary.path, permissions: 0o600) } catch {
            throw FlowerError(.storage, "cannot write the node's key into \(directory.path): \(error.message)")
        }
        guard rename(temporary.path, keyURL.path) == 0 else {
            try? FileManager.default.removeItem(at: temporary)
            throw FlowerError(.storage, "cannot move the node's key to \(keyURL.path) (errno \(errno))")
        }
        return identity
    }

    /// Whether `superlink` has registered the node's key.
    package func isRegistered(with superlink: String) throws(FlowerError) -> Bool {
        guard let node: NodeFile = try load(nodeURL) else { return false }
        return node.registered && node.superlink == superlink
    }

    /// Records whether `superlink` knows the node's key.
    package func setRegistered(_ registered: Bool, with superlink: String) throws(FlowerError) {
        try save(NodeFile(superlink: superlink, registered: registered), to: nodeURL)
    }

    /// The kept message, if any.
    package func keptMessage() throws(FlowerError) -> KeptMessage? { try load(messageURL) }
    /// Keeps a fetched message, or deletes the kept one (`nil`).
    package func keep(_ message: KeptMessage?) throws(FlowerError) { try save(message, to: messageURL) }
    /// The kept reply, if any.
    package func keptReply() throws(FlowerError) -> KeptReply? { try load(replyURL) }
    /// Keeps a reply, or deletes the kept one (`nil`).
    package func keep(_ reply: KeptReply?) throws(FlowerError) { try save(reply, to: replyURL) }

    /// Drops a kept message that the kept reply already answers (a stop between keeping the reply and dropping the
    /// message left both): it is not trained again, since the SuperLink would refuse a second reply to it.
    package func dropAnsweredMessage() throws(FlowerError) {
        guard let message = try keptMessage(), let reply = try keptReply(), reply.replyTo == message.messageID else { return }
        try keep(Optional<KeptMessage>.none)
    }

    private func load<T: Decodable>(_ url: URL) throws(FlowerError) -> T? {
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        let data = try read(url)
        do { return try JSONDecoder().decode(T.self, from: data) } catch {
            throw FlowerError(.storage, "\(url.path) is unreadable (\(error)); delete it to drop what it kept")
        }
    }

    private func save<T: Encodable>(_ value: T?, to url: URL) throws(FlowerError) {
        guard let value else {
            do {
                if FileManager.default.fileExists(atPath: url.path) { try FileManager.default.removeItem(at: url) }
            } catch {
                throw FlowerError(.storage, "cannot delete \(url.path): \(FileAccessError(error, writing: true).message)")
            }
            return
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let data: Data
        do { data = try encoder.encode(value) } catch { throw FlowerError(.storage, "cannot encode \(url.lastPathComponent): \(error)") }
        try write(data, to: url)
    }

    private func read(_ url: URL) throws(FlowerError) -> Data {
        do { return try Data(contentsOf: url) } catch {
            throw FlowerError(.storage, "cannot read \(url.path): \(FileAccessError(error).message)")
        }
    }

    private func write(_ data: Data, to url: URL) throws(FlowerError) {
        do { try data.write(to: url, options: .atomic) } catch {
            throw FlowerError(.storage, "cannot write \(url.path): \(FileAccessError(error, writing: true).message)")
        }
    }
}

import Foundation
@testable import OrchardFlower
import Testing

/// What a node keeps across windows: its key (owner-only), the registration, a kept message and reply.
@Suite struct FlowerNodeStoreTests {
    /// A store in a new directory (the caller removes it).
    func store() throws -> FlowerNodeStore {
        try FlowerNodeStore(directory: FileManager.default.temporaryDirectory.appendingPathComponent("orchard-flower-store-\(UUID().uuidString)"))
    }

    @Test func theKeyIsMadeOnceAndReadableByItsOwnerOnly() throws {
        let store = try store()
        defer { try? FileManager.default.removeItem(at: store.directory) }
        let first = try store.identity()
        let second = try store.identity()
        #expect(first.publicKeyPEM == second.publicKeyPEM)
        let path = store.directory.appendingPathComponent("flower-node-key").path
        let permissions = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(permissions == 0o600)
    }

    @Test func aDamagedKeyFileIsAnErrorNamingIt() throws {
        let store = try store()
        defer { try? FileManager.default.removeItem(at: store.directory) }
        try Data("not a key".utf8).write(to: store.directory.appendingPathComponent("flower-node-key"))
        #expect { try store.identity() } throws: { error in
            (error as? FlowerError)?.code == .storage && "\(error)".contains("flower-node-key")
        }
    }

    @Test func registrationIsPerSuperLinkAndKeptFilesRoundTrip() throws {
        let store = try store()
        defer { try? FileManager.default.removeItem(at: store.directory) }
        #expect(try !store.isRegistered(with: "http://a:1"))
        try store.setRegistered(true, with: "http://a:1")
        #expect(try store.isRegistered(with: "http://a:1"))
        #expect(try !store.isRegistered(with: "http://b:1"), "another SuperLink does not know the key")
        let message = FlowerNodeStore.KeptMessage(runID: 7, messageID: "ab", messageType: "train", message: Data([1, 2]), objects: ["ab": Data([3])])
        try store.keep(message)
        #expect(try store.keptMessage() == message)
        try store.keep(Optional<FlowerNodeStore.KeptMessage>.none)
        #expect(try store.keptMessage() == nil)
        let reply = FlowerNodeStore.KeptReply(runID: 7, replyTo: "ab", message: Data([1]), tree: Data([2]), objects: ["cd": Data([4])], order: ["cd"])
        try store.keep(reply)
        #expect(try store.keptReply() == reply)
        try Data("{".utf8).write(to: store.directory.appendingPathComponent("flower-kept-reply.json"))
        #expect { try store.keptReply() } throws: { error in (error as? FlowerError)?.code == .storage && "\(error)".contains("delete it") }
    }

    /// A stop between keeping a reply and dropping its message leaves both: the next window drops the message (its
    /// reply is pushed), and a message the reply does not answer stays.
    @Test func aMessageItsKeptReplyAnswersIsDropped() throws {
        let store = try store()
        defer { try? FileManager.default.removeItem(at: store.directory) }
        let message = FlowerNodeStore.KeptMessage(runID: 7, messageID: "ab", messageType: "train", message: Data([1, 2]), objects: [:])
        try store.keep(message)
        try store.keep(FlowerNodeStore.KeptReply(runID: 7, replyTo: "zz", message: Data([1]), tree: Data([2]), objects: [:], order: []))
        try store.dropAnsweredMessage()
        #expect(try store.keptMessage() == message, "another message's reply")
        try store.keep(FlowerNodeStore.KeptReply(runID: 7, replyTo: "ab", message: Data([1]), tree: Data([2]), objects: [:], order: []))
        try store.dropAnsweredMessage()
        #expect(try store.keptMessage() == nil && store.keptReply() != nil)
    }
}

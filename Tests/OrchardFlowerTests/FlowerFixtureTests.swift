import Foundation
import OrchardFlower
import OrchardSupport
import SwiftProtobuf
import Testing

/// The binary encoding with sorted map keys, as flwr's `SerializeToString(deterministic=True)`.
func deterministic(_ message: some SwiftProtobuf.Message) throws -> [UInt8] {
    var options = BinaryEncodingOptions()
    options.useDeterministicOrdering = true
    return try message.serializedBytes(options: options)
}

/// Orchard against the objects flwr 1.41.0 itself deflated.
@Suite struct FlowerFixtureTests {
    @Test(arguments: FlowerFixtures.messageNames)
    func flwrsObjectsInflateToTheValuesFlwrReadFromThem(_ name: String) throws {
        let fixture = try FlowerFixtures.message(name)
        let message = try FlowerObjects.inflate(messageID: fixture.messageID, objects: fixture.objectBytes)
        #expect(message == (try fixture.expected.message()))
        #expect(message.metadata.messageID == fixture.messageID)
    }

    @Test(arguments: FlowerFixtures.messageNames)
    func deflatingTheValuesGivesFlwrsBytesIdsTreeAndOrder(_ name: String) throws {
        let fixture = try FlowerFixtures.message(name)
        let deflated = FlowerObjects.deflate(try fixture.expected.message(), chunkSize: fixture.chunkSize)
        #expect(deflated.messageID == fixture.messageID)
        #expect(deflated.objects == fixture.objectBytes)
        #expect(deflated.pushOrder == fixture.pushOrder)
        #expect(try deterministic(deflated.objectTree) == FlowerFixtures.bytes(fixture.objectTree))
        #expect(try deterministic(deflated.pushedMessage) == FlowerFixtures.bytes(fixture.pushedMessage))
    }

    @Test(arguments: FlowerFixtures.messageNames)
    func theTreeFlwrSendsListsTheObjectsToPullChildrenFirst(_ name: String) throws {
        let fixture = try FlowerFixtures.message(name)
        let tree = try Flwr_Proto_ObjectTree(serializedBytes: FlowerFixtures.bytes(fixture.objectTree))
        #expect(FlowerObjects.objectIDs(in: tree) == fixture.pushOrder)
        #expect(FlowerObjects.objectIDs(in: tree).last == fixture.messageID)
    }

    @Test(arguments: ["train_reply", "error_reply"])
    func repliesAreTheMessagesFlwrMakesAtTheSameInstant(_ name: String) throws {
        let fixture = try FlowerFixtures.message(name)
        let original = try FlowerFixtures.message(try #require(fixture.replyTo))
        let received = try FlowerObjects.inflate(messageID: original.messageID, objects: original.objectBytes)
        let expected = try fixture.expected.message()
        let now = WallInstant(sinceEpoch: .microseconds(try #require(fixture.repliedAtMicroseconds)))
        var reply = FlowerMessage(replyingTo: received, with: expected.body, at: now)
        #expect(reply.metadata.messageID.isEmpty)
        #expect(FlowerObjects.deflate(reply).messageID == fixture.messageID)
        reply.metadata.messageID = fixture.messageID
        #expect(reply == expected)
    }

    @Test func floatArraysReadAsTheValuesNumPyHeld() throws {
        var checked = 0
        for name in FlowerFixtures.messageNames {
            for record in try FlowerFixtures.message(name).expected.content ?? [] where record.kind == "arrays" {
                for item in record.items {
                    let array = try FlowerArray(
                        dtype: try #require(NumPyDType(rawValue: item.dtype!)), shape: item.shape!, data: FlowerFixtures.bytes(item.data!))
                    guard let values = item.values else { continue }
                    #expect(try array.floats() == values.map { Float($0) }, "\(name): \(item.name!)")
                    checked += 1
                }
            }
        }
        #expect(checked >= 10)
    }

    @Test func integerAndBoolArraysHoldNoFloats() throws {
        let fixture = try FlowerFixtures.message("multichunk")
        let message = try FlowerObjects.inflate(messageID: fixture.messageID, objects: fixture.objectBytes)
        let arrays = try #require(message.content?["arrays"]?.arrayRecord)
        for name in ["steps", "mask", "bytes"] {
            let array = try #require(arrays[name])
            let error = #expect(throws: FlowerError.self) { try array.floats() }
            #expect(error?.code == .unsupportedDtype, "\(name)")
            #expect(error?.message.contains(array.dtype.rawValue) == true)
        }
        #expect(arrays["steps"]?.dtype == .int64)
        #expect(arrays["steps"]?.data == [255, 255, 255, 255, 255, 255, 255, 255] + [UInt8](repeating: 0, count: 8) + [1, 0, 0, 0, 0, 0, 0, 0])
    }

    @Test func theMultiChunkFixtureSharesChunksArraysAndRecords() throws {
        let fixture = try FlowerFixtures.message("multichunk")
        #expect(fixture.chunkSize == 256)
        let message = try FlowerObjects.inflate(messageID: fixture.messageID, objects: fixture.objectBytes)
        let content = try #require(message.content)
        #expect(content["cfg-é"] == content["cfg-copy"])
        #expect(content.arrayRecords.first?.value["zeros"] == content.arrayRecords.first?.value["twin"])
        #expect(content.metricRecords.map(\.name) == ["no-metrics"])
        #expect(content.configRecords.map(\.name) == ["cfg-é", "cfg-copy"])
    }
}

/// Orchard's own messages: what it deflates, it inflates back; chunking and canonical values.
@Suite struct FlowerRoundTripTests {
    static let metadata = FlowerMetadata(runID: 3, srcNodeID: 4, dstNodeID: 5, ttl: 60, messageType: "train", createdAt: 1_700_000_000.5)

    @Test(arguments: [1, 7, 64, 100_000])
    func arraysOfAnySizeSurviveAnyChunkSize(_ chunkSize: Int) throws {
        let values = (0..<300).map { Float($0) / 7 }
        let content: RecordDict = [
            "arrays": .arrays(["w": FlowerArray(values, shape: [3, 100]), "s": FlowerArray([2], shape: []), "e": FlowerArray([], shape: [0, 4])]),
            "config": .configs(["lr": .double(0.1), "name": .string("é\"\\\n")]),
        ]
        let message = FlowerMessage(metadata: Self.metadata, body: .content(content))
        let deflated = FlowerObjects.deflate(message, chunkSize: chunkSize)
        for (id, bytes) in deflated.objects where bytes.starts(with: Array("ArrayChunk ".utf8)) {
            #expect(bytes.count - bytes.firstIndex(of: 0)! - 1 <= chunkSize, "\(id)")
        }
        var expected = message
        expected.metadata.messageID = deflated.messageID
        #expect(try FlowerObjects.inflate(messageID: deflated.messageID, objects: deflated.objects) == expected)
        #expect(FlowerObjects.objectIDs(in: deflated.objectTree) == deflated.pushOrder)
        #expect(Set(deflated.pushOrder) == Set(deflated.objects.keys))
    }

    @Test func valuesAreEncodedAsFlwrWouldAndReadBackCanonically() throws {
        let config: ConfigRecord = ["u": .uint(5), "us": .uints([1, 2]), "big": .uints([1, .max]), "e": .strings([]), "i": .ints([])]
        let metrics: MetricRecord = ["u": .uint(7), "e": .ints([]), "big": .uint(.max)]
        let message = FlowerMessage(metadata: Self.metadata, body: .content(["c": .configs(config), "m": .metrics(metrics)]))
        let deflated = FlowerObjects.deflate(message)
        let content = try #require(try FlowerObjects.inflate(messageID: deflated.messageID, objects: deflated.objects).content)
        #expect(content["c"]?.configRecord == ["u": .int(5), "us": .ints([1, 2]), "big": .uints([1, .max]), "e": .bools([]), "i": .bools([])])
        #expect(content["m"]?.metricRecord == ["u": .int(7), "e": .doubles([]), "big": .uint(.max)])
    }

    @Test func aReplyTTLNeverOutlivesTheOriginal() {
        var original = FlowerMessage(metadata: Self.metadata, body: .content([:]))
        original.metadata.messageID = String(repeating: "a", count: 64)
        original.metadata.srcTaskID = 9
        let now = WallInstant(sinceEpoch: .seconds(1_700_000_010) + .milliseconds(500))
        func ttl(_ asked: Double?) -> Double {
            FlowerMessage(replyingTo: original, with: .error(code: 2, reason: ""), ttl: asked, at: now).metadata.ttl
        }
        #expect(ttl(nil) == 50)
        #expect(ttl(0) == 50)
        #expect(ttl(20) == 20)
        #expect(ttl(50.05) == 50.05)
        #expect(ttl(51) == 50)
        let reply = FlowerMessage(replyingTo: original, with: .error(code: 2, reason: "x"), at: now)
        #expect(reply.metadata.srcNodeID == 5 && reply.metadata.dstNodeID == 4)
        #expect(reply.metadata.replyToMessageID == original.metadata.messageID)
        #expect(reply.metadata.srcTaskID == nil && reply.metadata.dstTaskID == 9)
        #expect(reply.metadata.createdAt == 1_700_000_010.5)
    }

    @Test func recordsKeepInsertionOrder() {
        var record: MetricRecord = ["b": .int(1), "a": .int(2)]
        record["c"] = .double(3)
        record["b"] = .int(4)
        #expect(record.names == ["b", "a", "c"])
        record["a"] = nil
        #expect(record.map(\.name) == ["b", "c"])
        #expect(record != ["c": .double(3), "b": .int(4)])
        #expect(MetricRecord([("x", .int(1)), ("y", .int(2)), ("x", .int(3))]) == ["x": .int(3), "y": .int(2)])
    }
}

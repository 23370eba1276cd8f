import Foundation
import OrchardFlower
import Testing

/// The fixtures flwr 1.41.0 wrote (Tools/flower-proto/make_fixtures.py; see Fixtures/README.md).
enum FlowerFixtures {
    /// The message fixtures, by file name without `.json`.
    static let messageNames = ["train", "evaluate", "train_reply", "error_reply", "multichunk"]

    static func data(_ name: String) throws -> Data {
        let url = try #require(Bundle.module.url(forResource: name, withExtension: "json", subdirectory: "Fixtures"), "fixture \(name).json")
        return try Data(contentsOf: url)
    }

    static func message(_ name: String) throws -> MessageFixture {
        try JSONDecoder().decode(MessageFixture.self, from: data(name))
    }

    static func npy() throws -> NPYFixture {
        try JSONDecoder().decode(NPYFixture.self, from: data("npy"))
    }

    static func bytes(_ base64: String) -> [UInt8] { [UInt8](Data(base64Encoded: base64)!) }
}

/// One message as flwr deflated it, and the values flwr inflates from it.
struct MessageFixture: Decodable {
    let chunkSize: Int
    let messageID: String
    let objects: [String: String]
    let pushOrder: [String]
    let objectTree: String
    let pushedMessage: String
    let expected: ExpectedMessage
    let replyTo: String?
    let repliedAtMicroseconds: Int64?

    enum CodingKeys: String, CodingKey {
        case chunkSize = "chunk_size", messageID = "message_id", objects, pushOrder = "push_order", objectTree = "object_tree"
        case pushedMessage = "pushed_message", expected, replyTo = "reply_to", repliedAtMicroseconds = "replied_at_microseconds"
    }

    /// The objects' bytes by id.
    var objectBytes: [String: [UInt8]] { objects.mapValues(FlowerFixtures.bytes) }
}

/// A message's expected values, written by flwr from its own inflated objects (integers as strings).
struct ExpectedMessage: Decodable {
    struct Metadata: Decodable {
        let runID, messageID, srcNodeID, dstNodeID, replyToMessageID, groupID, messageType: String
        let ttl, createdAt: Double
        let srcTaskID, dstTaskID: String?

        enum CodingKeys: String, CodingKey {
            case runID = "run_id", messageID = "message_id", srcNodeID = "src_node_id", dstNodeID = "dst_node_id", ttl
            case replyToMessageID = "reply_to_message_id", groupID = "group_id", messageType = "message_type", createdAt = "created_at"
            case srcTaskID = "src_task_id", dstTaskID = "dst_task_id"
        }
    }

    struct Record: Decodable {
        let name, kind: String
        let items: [Item]
    }

    /// An array (`name`, `dtype`, `shape`, `data`, `values`) or a metric or config value (`key`, `type`, `value`).
    struct Item: Decodable {
        let name, dtype, data: String?
        let shape: [Int]?
        let values: [Double]?
        let key, type: String?
        let value: Value?
    }

    enum Value: Decodable {
        case bool(Bool), number(Double), string(String), list([Value])

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let value = try? container.decode(Bool.self) {
                self = .bool(value)
            } else if let value = try? container.decode(Double.self) {
                self = .number(value)
            } else if let value = try? container.decode(String.self) {
                self = .string(value)
            } else {
                self = .list(try container.decode([Value].self))
            }
        }
    }

    struct Failure: Decodable {
        let code: Int64
        let reason: String
    }

    let metadata: Metadata
    let content: [Record]?
    let error: Failure?

    /// The message as Swift values.
    func message() throws -> FlowerMessage {
        let m = metadata
        let swiftMetadata = FlowerMetadata(
            runID: UInt64(m.runID)!, messageID: m.messageID, srcNodeID: UInt64(m.srcNodeID)!, dstNodeID: UInt64(m.dstNodeID)!,
            replyToMessageID: m.replyToMessageID, groupID: m.groupID, ttl: m.ttl, messageType: m.messageType, createdAt: m.createdAt,
            srcTaskID: m.srcTaskID.flatMap { UInt64($0) }, dstTaskID: m.dstTaskID.flatMap { UInt64($0) }
        )
        if let error { return FlowerMessage(metadata: swiftMetadata, body: .error(code: error.code, reason: error.reason)) }
        var records = RecordDict()
        for record in try #require(content) {
            switch record.kind {
            case "arrays":
                records[record.name] = .arrays(
                    ArrayRecord(
                        try record.items.map { item in
                            let dtype = try #require(NumPyDType(rawValue: item.dtype ?? ""))
                            return (item.name!, try FlowerArray(dtype: dtype, shape: item.shape!, data: FlowerFixtures.bytes(item.data!)))
                        }))
            case "metrics":
                records[record.name] = .metrics(MetricRecord(try record.items.map { ($0.key!, try #require(try Self.value($0).metric)) }))
            default:
                records[record.name] = .configs(ConfigRecord(try record.items.map { ($0.key!, try Self.value($0)) }))
            }
        }
        return FlowerMessage(metadata: swiftMetadata, body: .content(records))
    }

    /// A record value from the protobuf field flwr chose and its value.
    static func value(_ item: Item) throws -> ConfigValue {
        let value = try #require(item.value)
        func list<T>(_ convert: (Value) -> T?) throws -> [T] {
            guard case .list(let values) = value else { throw FixtureFormatError(what: "\(item.key!) is not a list") }
            return try values.map { try #require(convert($0)) }
        }
        func text(_ value: Value) -> String? { if case .string(let text) = value { text } else { nil } }
        func number(_ value: Value) -> Double? { if case .number(let number) = value { number } else { nil } }
        func bool(_ value: Value) -> Bool? { if case .bool(let bool) = value { bool } else { nil } }
        func bytes(_ value: Value) -> [UInt8]? { text(value).map(FlowerFixtures.bytes) }
        switch item.type {
        case "double": return .double(try #require(number(value)))
        case "sint64": return .int(try #require(text(value).flatMap { Int64($0) }))
        case "uint64": return .uint(try #require(text(value).flatMap { UInt64($0) }))
        case "bool": return .bool(try #require(bool(value) as Bool?))
        case "string": return .string(try #require(text(value)))
        case "bytes": return .bytes(try #require(bytes(value)))
        case "double_list": return .doubles(try list(number))
        case "sint_list": return .ints(try list { text($0).flatMap { Int64($0) } })
        case "uint_list": return .uints(try list { text($0).flatMap { UInt64($0) } })
        case "bool_list": return .bools(try list(bool))
        case "string_list": return .strings(try list(text))
        case "bytes_list": return .bytesList(try list(bytes))
        default: throw FixtureFormatError(what: "unknown value type \(item.type ?? "nil")")
        }
    }
}

/// A fixture that does not have the expected form.
struct FixtureFormatError: Error {
    let what: String
}

/// numpy's own `.npy` bytes.
struct NPYFixture: Decodable {
    struct Case: Decodable {
        let name, dtype, descr, data, npy: String
        let shape: [Int]

        var array: FlowerArray {
            get throws { try FlowerArray(dtype: try #require(NumPyDType(rawValue: dtype)), shape: shape, data: FlowerFixtures.bytes(data)) }
        }
    }

    struct Refused: Decodable {
        let name, npy, code: String
    }

    /// Arrays as `np.save` writes them.
    let written: [Case]
    /// The same array written as versions 1.0, 2.0 and 3.0.
    let read: [Case]
    /// Fortran-order arrays as flwr serialises them (`ndarray_to_bytes`), their data in C order.
    let fortran: [Case]
    /// Files Orchard refuses, with the error code.
    let refused: [Refused]
}

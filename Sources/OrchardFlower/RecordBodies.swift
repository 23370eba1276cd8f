import Foundation
import SwiftProtobuf

/// The bodies of `MetricRecord` and `ConfigRecord` objects: their protobuf messages, items in record order.
///
/// `MetricRecordValue`'s fields are `ConfigRecordValue`'s numeric fields under the same numbers and types
/// (double 1, sint64 2, uint64 3, double/sint/uint lists 21–23), so a metric record is written and read through
/// the config message: the bytes are those of flwr's `MetricRecord` (the fixtures check it byte for byte).
enum RecordBodies {
    static func encode(_ record: ConfigRecord) -> [UInt8] {
        encode(record.map { ($0.name, $0.value.canonical(empty: .bools([]))) })
    }

    static func encode(_ record: MetricRecord) -> [UInt8] {
        encode(record.map { ($0.name, ConfigValue($0.value).canonical(empty: .doubles([]))) })
    }

    private static func encode(_ items: [(String, ConfigValue)]) -> [UInt8] {
        var message = Flwr_Proto_ConfigRecord()
        message.items = items.map { name, value in
            var item = Flwr_Proto_ConfigRecord.Item()
            item.key = name
            item.value.value = value.proto
            return item
        }
        return message.deterministicBytes()
    }

    static func config(_ body: ArraySlice<UInt8>) throws(FlowerError) -> ConfigRecord {
        try ConfigRecord(items(body, of: "ConfigRecord").map { ($0, $1.canonical(empty: .bools([]))) })
    }

    static func metrics(_ body: ArraySlice<UInt8>) throws(FlowerError) -> MetricRecord {
        var record = MetricRecord()
        for (name, value) in try items(body, of: "MetricRecord") {
            guard let metric = value.canonical(empty: .doubles([])).metric else {
                throw FlowerError(.invalidObject, "MetricRecord value '\(name)' is not a number or a list of numbers")
            }
            record[name] = metric
        }
        return record
    }

    private static func items(_ body: ArraySlice<UInt8>, of kind: String) throws(FlowerError) -> [(String, ConfigValue)] {
        let message: Flwr_Proto_ConfigRecord
        do { message = try Flwr_Proto_ConfigRecord(serializedBytes: Array(body)) } catch {
            throw FlowerError(.invalidObject, "the \(kind) body is not its protobuf message: \(error)")
        }
        var items: [(String, ConfigValue)] = []
        for item in message.items {
            guard let value = item.value.value else { throw FlowerError(.invalidObject, "\(kind) value '\(item.key)' is empty") }
            items.append((item.key, ConfigValue(proto: value)))
        }
        return items
    }
}

extension ConfigValue {
    init(proto: Flwr_Proto_ConfigRecordValue.OneOf_Value) {
        switch proto {
        case .bool(let value): self = .bool(value)
        case .sint64(let value): self = .int(value)
        case .uint64(let value): self = .uint(value)
        case .double(let value): self = .double(value)
        case .string(let value): self = .string(value)
        case .bytes(let value): self = .bytes([UInt8](value))
        case .boolList(let list): self = .bools(list.vals)
        case .sintList(let list): self = .ints(list.vals)
        case .uintList(let list): self = .uints(list.vals)
        case .doubleList(let list): self = .doubles(list.vals)
        case .stringList(let list): self = .strings(list.vals)
        case .bytesList(let list): self = .bytesList(list.vals.map { [UInt8]($0) })
        }
    }

    var proto: Flwr_Proto_ConfigRecordValue.OneOf_Value {
        switch self {
        case .bool(let value): .bool(value)
        case .int(let value): .sint64(value)
        case .uint(let value): .uint64(value)
        case .double(let value): .double(value)
        case .string(let value): .string(value)
        case .bytes(let value): .bytes(Data(value))
        case .bools(let values): .boolList(.with { $0.vals = values })
        case .ints(let values): .sintList(.with { $0.vals = values })
        case .uints(let values): .uintList(.with { $0.vals = values })
        case .doubles(let values): .doubleList(.with { $0.vals = values })
        case .strings(let values): .stringList(.with { $0.vals = values })
        case .bytesList(let values): .bytesList(.with { $0.vals = values.map { Data($0) } })
        }
    }
}

extension SwiftProtobuf.Message {
    /// The binary encoding with map keys sorted, as flwr's `SerializeToString(deterministic=True)`.
    func deterministicBytes() -> [UInt8] {
        var options = BinaryEncodingOptions()
        options.useDeterministicOrdering = true
        // Every message Orchard builds has its required parts set; encoding cannot fail.
        return try! serializedBytes(options: options)
    }
}

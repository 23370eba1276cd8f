import SwiftProtobuf

/// Reads the field numbers of the unknown fields swift-protobuf kept while decoding a message: the schema
/// subset leaves out most Core ML layer and model types, and this names them instead of failing silently.
enum UnknownFields {
    /// The field numbers present in `unknown`, in order of appearance, or an empty list if the bytes are not
    /// well-formed (swift-protobuf only keeps well-formed fields).
    static func fieldNumbers(in unknown: UnknownStorage) -> [Int] {
        let bytes = [UInt8](unknown.data)
        var numbers: [Int] = []
        var index = 0
        func varint() -> UInt64? {
            var result: UInt64 = 0
            var shift: UInt64 = 0
            while index < bytes.count, shift < 64 {
                let byte = bytes[index]
                index += 1
                result |= UInt64(byte & 0x7F) << shift
                if byte & 0x80 == 0 { return result }
                shift += 7
            }
            return nil
        }
        while index < bytes.count {
            guard let tag = varint() else { return numbers }
            let number = Int(tag >> 3)
            switch tag & 7 {
            case 0: guard varint() != nil else { return numbers }
            case 1: index += 8
            case 2:
                guard let length = varint(), length <= UInt64(bytes.count - index) else { return numbers }
                index += Int(length)
            case 5: index += 4
            default: return numbers
            }
            guard index <= bytes.count else { return numbers }
            numbers.append(number)
        }
        return numbers
    }

    /// The name, from `table`, of the first unknown field of `unknown` that `table` lists.
    static func caseName(in unknown: UnknownStorage, table: [Int: String]) -> String? {
        fieldNumbers(in: unknown).lazy.compactMap { table[$0] }.first
    }
}

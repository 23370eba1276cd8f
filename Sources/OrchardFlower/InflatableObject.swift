import Crypto

/// The classes of Flower's content-addressed objects, as their headers name them.
enum ObjectClass: String, CaseIterable {
    case message = "Message", recordDict = "RecordDict", arrayRecord = "ArrayRecord", metricRecord = "MetricRecord"
    case configRecord = "ConfigRecord", array = "Array", arrayChunk = "ArrayChunk"
}

/// One Flower object, as flwr's `InflatableObject` encodes it: the UTF-8 header `"<class> <child ids joined by
/// ','> <body length>"`, a NUL byte, then the body. Its id is the lowercase hex SHA-256 of all of that.
struct InflatableObject {
    /// The object's id.
    let id: String
    /// The object's class.
    let objectClass: ObjectClass
    /// The ids of its children, each once, in the order the header lists them.
    let children: [String]
    /// The body.
    let body: ArraySlice<UInt8>

    /// The bytes of an object.
    static func encode(_ objectClass: ObjectClass, children: [String], body: [UInt8]) -> [UInt8] {
        Array("\(objectClass.rawValue) \(children.joined(separator: ",")) \(body.count)".utf8) + [0] + body
    }

    /// Reads object `id` from `bytes`, checking that they hash to `id` and that the header is well formed and
    /// agrees with the body.
    /// - Throws: ``FlowerError`` `object_id_mismatch`, or `invalid_object` naming the defect.
    init(id: String, bytes: [UInt8]) throws(FlowerError) {
        func invalid(_ what: String) -> FlowerError { FlowerError(.invalidObject, what, objectID: id) }
        let actual = FlowerObjects.objectID(of: bytes)
        guard actual == id else {
            throw FlowerError(.objectIDMismatch, "the \(bytes.count) bytes given for object \(id) hash to \(actual)", objectID: id)
        }
        guard let divider = bytes.firstIndex(of: 0) else { throw invalid("the object has no NUL byte between header and body") }
        guard let header = String(strictUTF8: bytes[..<divider]) else { throw invalid("the object header is not UTF-8") }
        let fields = header.split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count == 3 else { throw invalid("the object header '\(header.prefix(80))' is not '<class> <children> <body length>'") }
        guard let objectClass = ObjectClass(rawValue: String(fields[0])) else {
            throw invalid("the object's class '\(fields[0].prefix(40))' is not one of \(ObjectClass.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        let children = fields[1].isEmpty ? [] : fields[1].split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        if let bad = children.first(where: { !FlowerObjects.isObjectID($0) }) {
            throw invalid("the \(objectClass.rawValue) lists a child '\(bad.prefix(80))' that is not an object id (64 lowercase hex digits)")
        }
        guard Set(children).count == children.count else { throw invalid("the \(objectClass.rawValue) lists a child twice") }
        let bodyCount = bytes.count - divider - 1
        guard fields[2].allSatisfy(\.isASCII), fields[2].allSatisfy(\.isNumber), Int(fields[2]) == bodyCount else {
            throw invalid("the \(objectClass.rawValue) header announces a body of '\(fields[2].prefix(40))' bytes, but \(bodyCount) follow")
        }
        self.id = id
        self.objectClass = objectClass
        self.children = children
        self.body = bytes[(divider + 1)...]
    }
}

/// Flower's content-addressed objects: a message travels as its object and the objects of its content (records,
/// arrays, array chunks), each under the SHA-256 of its bytes.
public enum FlowerObjects {
    /// The largest array chunk flwr 1.41 writes (5 MiB, its `FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`).
    public static let maximumChunkSize = 5_242_880
    /// The largest array a node assembles from its chunks (2 GiB): chunks are stored once and may be listed many
    /// times, so the array's size is counted before it is joined, not only the bytes fetched.
    public static let maximumArrayBytes = 2 << 30

    /// The id of an object: the lowercase hex SHA-256 of its bytes.
    public static func objectID(of bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var hex: [UInt8] = []
        hex.reserveCapacity(64)
        for byte in SHA256.hash(data: bytes) {
            hex.append(digits[Int(byte >> 4)])
            hex.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: hex, as: UTF8.self)
    }

    /// Whether `text` is an object id: 64 lowercase hex digits.
    public static func isObjectID(_ text: some StringProtocol) -> Bool {
        text.utf8.count == 64 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}

extension String {
    /// The text of `bytes` when they are valid UTF-8, nil otherwise (no replacement characters).
    init?(strictUTF8 bytes: some Collection<UInt8>) {
        var scalars = String.UnicodeScalarView()
        var iterator = bytes.makeIterator()
        var decoder = UTF8()
        while true {
            switch decoder.decode(&iterator) {
            case .scalarValue(let scalar): scalars.append(scalar)
            case .emptyInput:
                self = String(scalars)
                return
            case .error: return nil
            }
        }
    }
}

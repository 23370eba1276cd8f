import OrchardFlower
import Testing

/// A message's objects that can be edited while every id stays the hash of its bytes: an edited object gets its
/// new id, which replaces the old one in each object that refers to it, up to the message. So a decoder's checks
/// behind the hash check are reached.
struct ObjectSet {
    var root: String
    var objects: [String: [UInt8]]

    init(_ fixture: MessageFixture) {
        root = fixture.messageID
        objects = fixture.objectBytes
    }

    /// The ids of the objects of class `name`, sorted.
    func ids(of name: String) -> [String] {
        objects.filter { $0.value.starts(with: Array("\(name) ".utf8)) }.keys.sorted()
    }

    /// Stores `bytes` in place of object `id`, and re-hashes the objects that refer to it; returns the new id.
    /// (`levels` bounds the walk up, for edits that make an object refer to its own ancestor.)
    @discardableResult
    mutating func replace(_ id: String, with bytes: [UInt8], levels: Int = 6) -> String {
        let newID = FlowerObjects.objectID(of: bytes)
        objects[id] = nil
        objects[newID] = bytes
        if id == root { root = newID }
        guard newID != id, levels > 0 else { return newID }
        for parent in objects.keys where parent != newID {
            if let current = objects[parent], current.firstRange(of: Array(id.utf8)) != nil {
                replace(parent, with: current.replacing(Array(id.utf8), with: Array(newID.utf8)), levels: levels - 1)
            }
        }
        return newID
    }

    /// Edits object `id`'s header fields (class, children, body length) and body; returns the new id.
    @discardableResult
    mutating func edit(_ id: String, _ change: (inout [String], inout [UInt8]) -> Void) -> String {
        // An object damaged before may lack the NUL byte or a field: it then has an empty body or empty fields.
        let bytes = objects[id]!
        let divider = bytes.firstIndex(of: 0) ?? bytes.endIndex
        var fields = String(decoding: bytes[..<divider], as: UTF8.self).split(separator: " ", omittingEmptySubsequences: false).map(String.init)
        fields += Array(repeating: "", count: max(0, 3 - fields.count))
        var body = Array(bytes[min(divider + 1, bytes.endIndex)...])
        change(&fields, &body)
        return replace(id, with: Array(fields.joined(separator: " ").utf8) + [0] + body)
    }

    /// Edits object `id`'s body and sets the header's length to match; returns the new id.
    @discardableResult
    mutating func editBody(_ id: String, _ change: (inout [UInt8]) -> Void) -> String {
        edit(id) { fields, body in
            change(&body)
            fields[2] = String(body.count)
        }
    }

    /// Inflates the message, returning the error it throws (nil when it decodes).
    func error() -> FlowerError? {
        do throws(FlowerError) {
            _ = try FlowerObjects.inflate(messageID: root, objects: objects)
            return nil
        } catch {
            return error
        }
    }
}

/// Every defect of an object is refused with a `FlowerError` naming the object.
@Suite struct ObjectDecoderTests {
    func objects(_ name: String = "train") throws -> ObjectSet { ObjectSet(try FlowerFixtures.message(name)) }

    func expectRefusal(
        _ set: ObjectSet, _ code: FlowerError.Code, object: String?, mentioning text: String? = nil, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let error = set.error()
        #expect(error?.code == code, "\(String(describing: error))", sourceLocation: sourceLocation)
        if let object { #expect(error?.objectID == object, "\(String(describing: error))", sourceLocation: sourceLocation) }
        if let text { #expect(error?.message.contains(text) == true, "\(String(describing: error))", sourceLocation: sourceLocation) }
    }

    @Test func theUneditedFixtureDecodes() throws {
        #expect(try objects().error() == nil)
        var set = try objects()
        set.editBody(set.ids(of: "ConfigRecord")[0]) { _ in }
        #expect(set.error() == nil)
    }

    @Test func aTamperedBodyIsAnIdMismatch() throws {
        var set = try objects()
        let id = set.ids(of: "ArrayChunk")[0]
        set.objects[id]![set.objects[id]!.count - 1] ^= 1
        expectRefusal(set, .objectIDMismatch, object: id)
        #expect(set.error()?.code.description == "object_id_mismatch")
    }

    @Test func aTamperedMessageIsAnIdMismatch() throws {
        var set = try objects("error_reply")
        set.objects[set.root]!.append(0)
        expectRefusal(set, .objectIDMismatch, object: set.root)
    }

    @Test func aWrongBodyLengthIsRefused() throws {
        for delta in [-1, 1] {
            var set = try objects()
            let id = set.edit(set.ids(of: "ConfigRecord")[0]) { fields, _ in fields[2] = String(Int(fields[2])! + delta) }
            expectRefusal(set, .invalidObject, object: id, mentioning: "body")
        }
    }

    @Test func aTruncatedObjectIsRefused() throws {
        var set = try objects()
        let array = set.ids(of: "Array")[0]
        let truncated = set.replace(array, with: Array(set.objects[array]!.dropLast(3)))
        expectRefusal(set, .invalidObject, object: truncated, mentioning: "body")
        var headless = try objects()
        let chunk = headless.ids(of: "ArrayChunk")[0]
        let cut = headless.replace(chunk, with: Array(headless.objects[chunk]!.prefix(9)))
        expectRefusal(headless, .invalidObject, object: cut, mentioning: "NUL")
    }

    @Test func anUnknownClassIsRefused() throws {
        var set = try objects()
        let id = set.edit(set.ids(of: "ConfigRecord")[0]) { fields, _ in fields[0] = "Tensor" }
        expectRefusal(set, .invalidObject, object: id, mentioning: "'Tensor'")
    }

    @Test func aKnownClassInTheWrongPlaceIsRefused() throws {
        var set = try objects()
        let id = set.edit(set.ids(of: "ConfigRecord")[0]) { fields, _ in fields[0] = "ArrayChunk" }
        expectRefusal(set, .invalidObject, object: id, mentioning: "ArrayChunk where a ArrayRecord or MetricRecord or ConfigRecord is due")
    }

    @Test func aMissingChildIsNamed() throws {
        var set = try objects()
        let chunk = set.ids(of: "ArrayChunk")[1]
        set.objects[chunk] = nil
        expectRefusal(set, .missingObject, object: chunk, mentioning: chunk)
        var noMessage = try objects()
        noMessage.objects[noMessage.root] = nil
        expectRefusal(noMessage, .missingObject, object: noMessage.root)
    }

    @Test func aChildIdThatIsNotHexIsRefused() throws {
        for bad in [String(repeating: "z", count: 64), String(repeating: "A", count: 64), "abc", ""] {
            var set = try objects()
            let id = set.edit(set.ids(of: "Array")[0]) { fields, _ in fields[1] = bad + (bad.isEmpty ? "," : "") + fields[1] }
            expectRefusal(set, .invalidObject, object: id, mentioning: "not an object id")
        }
    }

    @Test func aChildListedTwiceIsRefused() throws {
        var set = try objects()
        let id = set.edit(set.ids(of: "Array")[0]) { fields, _ in fields[1] += "," + fields[1] }
        expectRefusal(set, .invalidObject, object: id, mentioning: "twice")
    }

    @Test func aHeaderWithoutThreeFieldsIsRefused() throws {
        var set = try objects()
        let id = set.edit(set.ids(of: "ConfigRecord")[0]) { fields, _ in fields.insert("x", at: 1) }
        expectRefusal(set, .invalidObject, object: id, mentioning: "<class> <children> <body length>")
    }

    @Test func recordBodiesMustBeJSONObjectsOfTheHeadersChildren() throws {
        let edits: [(String, (inout [UInt8]) -> Void, String)] = [
            ("RecordDict", { $0.removeLast() }, "JSON"),
            ("RecordDict", { $0 = Array("[]".utf8) }, "not a JSON object"),
            ("ArrayRecord", { $0 = Array("{\"a\": 3}".utf8) }, "not an object id"),
            ("ArrayRecord", { $0 = Array("{}".utf8) }, "other objects than its header lists"),
            ("ArrayRecord", { $0 = Array("{\"a\": \"\(String(repeating: "0", count: 64))\"}".utf8) }, "other objects than its header lists"),
        ]
        for (kind, change, text) in edits {
            var set = try objects()
            let id = set.editBody(set.ids(of: kind)[0], change)
            expectRefusal(set, .invalidObject, object: id, mentioning: text)
        }
    }

    @Test func arrayBodiesMustAgreeWithTheirChunksAndData() throws {
        func body(_ set: ObjectSet, _ id: String) -> String {
            let bytes = set.objects[id]!
            return String(decoding: bytes[(bytes.firstIndex(of: 0)! + 1)...], as: UTF8.self)
        }
        let edits: [(String, String, FlowerError.Code)] = [
            ("\"shape\": [2, 3, 5]", "\"shape\": [5, 3, 2]", .shapeMismatch),
            ("\"shape\": [2, 3, 5]", "\"shape\": [2, -3, 5]", .invalidObject),
            ("\"dtype\": \"float32\"", "\"dtype\": \"float64\"", .invalidObject),
            ("\"dtype\": \"float32\"", "\"dtype\": \"complex64\"", .unsupportedDtype),
            ("\"stype\": \"numpy.ndarray\"", "\"stype\": \"torch.Tensor\"", .unsupportedEncoding),
            ("\"arraychunk_ids\": [0]", "\"arraychunk_ids\": [1]", .invalidObject),
            ("\"arraychunk_ids\": [0]", "\"arraychunk_ids\": []", .invalidObject),
            ("\"arraychunk_ids\": [0]", "\"arraychunk_ids\": [0, 0]", .shapeMismatch),
            (", \"stype\": \"numpy.ndarray\"", "", .invalidObject),
        ]
        for (old, new, code) in edits {
            var set = try objects()
            let id = try #require(set.ids(of: "Array").first { body(set, $0).contains("[2, 3, 5]") })
            let edited = Array(body(set, id).replacing(old, with: new).utf8)
            let newID = set.editBody(id) { $0 = edited }
            expectRefusal(set, code, object: newID, mentioning: nil)
        }
    }

    /// A chunk stored once may be listed many times (flwr stores equal chunks once), but the array the list makes is
    /// counted before it is joined: a short list of repeats cannot make the node assemble gigabytes.
    @Test func anArrayWhoseChunkListAddsUpPastTheLimitIsRefusedBeforeItIsJoined() throws {
        var set = try objects()
        let id = try #require(set.ids(of: "Array").first)
        let bytes = set.objects[id]!
        let header = String(decoding: bytes[..<bytes.firstIndex(of: 0)!], as: UTF8.self).split(separator: " ")
        let chunkID = try #require(header[1].split(separator: ",").first.map(String.init))
        let chunk = set.objects[chunkID]!
        let chunkSize = chunk.count - (chunk.firstIndex(of: 0)! + 1)
        // The node's limit is 2 GiB; here it is three chunks' worth, and the list names the chunk four times.
        let limit = 3 * chunkSize
        let body = String(decoding: bytes[(bytes.firstIndex(of: 0)! + 1)...], as: UTF8.self)
        let edited = body.replacing(/"arraychunk_ids": \[[0-9, ]*\]/, with: "\"arraychunk_ids\": [0, 0, 0, 0]")
        #expect(edited != body)
        let newID = set.editBody(id) { $0 = Array(edited.utf8) }
        do throws(FlowerError) {
            _ = try FlowerObjects.inflate(messageID: set.root, objects: set.objects, maximumArrayBytes: limit)
            Issue.record("an array listing its chunk past the limit was joined")
        } catch {
            #expect(error.code == .invalidObject && error.objectID == newID && error.message.contains("add up to more than"), "\(error)")
        }
        // Within the limit the same list is joined (and then refused for its shape, as before).
        #expect(set.error()?.code == .shapeMismatch)
        #expect(FlowerObjects.maximumArrayBytes == 2 << 30)
    }

    @Test func aMessageBodyMustBeItsProtobufWithoutItsOwnId() throws {
        var garbage = try objects()
        garbage.editBody(garbage.root) { $0 = [0xFF, 0xFF, 0xFF] }
        expectRefusal(garbage, .invalidObject, object: garbage.root, mentioning: "protobuf")
        var withID = try objects("error_reply")
        // Field 1 (metadata) grows by the 4-byte field 2 (message_id = "ab").
        withID.editBody(withID.root) { body in
            body[1] += 4
            body.insert(contentsOf: [0x12, 0x02, 0x61, 0x62], at: 2)
        }
        expectRefusal(withID, .invalidObject, object: withID.root, mentioning: "message_id")
    }

    @Test func aMessageHasContentOrAnErrorNotBoth() throws {
        let train = try objects()
        var set = try objects("error_reply")
        let recordDict = train.ids(of: "RecordDict")[0]
        set.objects.merge(train.objects) { mine, _ in mine }
        set.edit(set.root) { fields, _ in fields[1] = recordDict }
        expectRefusal(set, .invalidObject, object: set.root, mentioning: "error and content")
        var empty = try objects()
        empty.edit(empty.root) { fields, _ in fields[1] = "" }
        expectRefusal(empty, .invalidObject, object: empty.root, mentioning: "0 children")
    }

    @Test func recordValuesMustBeTheirProtobuf() throws {
        var set = try objects()
        let config = set.editBody(set.ids(of: "ConfigRecord")[0]) { $0 = [0x0A, 0x05, 0x0A, 0x01, 0x78, 0x12, 0x00] }  // key "x", empty value
        expectRefusal(set, .invalidObject, object: config, mentioning: "'x' is empty")
        var metrics = try objects("train_reply")
        // A bool (config field 4) where a metric is due.
        let metric = metrics.editBody(metrics.ids(of: "MetricRecord")[0]) { $0 = [0x0A, 0x07, 0x0A, 0x01, 0x78, 0x12, 0x02, 0x20, 0x01] }
        expectRefusal(metrics, .invalidObject, object: metric, mentioning: "not a number")
        var chunked = try objects()
        let chunk = chunked.ids(of: "ArrayChunk")[0]
        let withChild = chunked.edit(chunked.ids(of: "ConfigRecord")[0]) { fields, _ in fields[1] = chunk }
        expectRefusal(chunked, .invalidObject, object: withChild, mentioning: "lists children")
    }

    @Test func badNPYDataInAChunkIsRefused() throws {
        var set = try objects()
        let chunk = set.ids(of: "ArrayChunk")[0]
        set.editBody(chunk) { $0[0] = 0x92 }
        expectRefusal(set, .invalidNpy, object: nil)
    }
}

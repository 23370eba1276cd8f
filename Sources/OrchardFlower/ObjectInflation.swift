import SwiftProtobuf

extension FlowerObjects {
    /// Rebuilds message `messageID` from its objects, as flwr's `inflate_object_from_contents` does, checking
    /// every object on the way: that its bytes hash to its id, its header (class, child ids, body length), that
    /// it has the class its parent expects, that its body (protobuf, JSON or `.npy`) is well formed and refers to
    /// exactly the children its header lists, and that every child is present. The metadata's `messageID` is set
    /// to `messageID`.
    /// - Parameters:
    ///   - messageID: The message's id (its `Message` object's id).
    ///   - objects: The message's objects by id, the `Message` object included (extra objects are ignored).
    ///   - maximumArrayBytes: The largest array joined from its chunks (chunks may be listed more than once).
    /// - Throws: ``FlowerError`` `missing_object`, `object_id_mismatch`, `invalid_object`, `unsupported_dtype`,
    ///   `unsupported_encoding`, `invalid_npy` or `shape_mismatch`, with the id of the object concerned.
    public static func inflate(messageID: String, objects: [String: [UInt8]], maximumArrayBytes: Int = maximumArrayBytes) throws(FlowerError)
        -> FlowerMessage
    {
        try Inflater(objects: objects, maximumArrayBytes: maximumArrayBytes).message(messageID)
    }
}

/// Reads a message's objects top down.
private struct Inflater {
    let objects: [String: [UInt8]]
    /// The largest array it joins from chunks.
    let maximumArrayBytes: Int

    /// Object `id`, checked to be of one of the classes `expected`; `parent` refers to it.
    func load(_ id: String, _ expected: [ObjectClass], parent: InflatableObject? = nil) throws(FlowerError) -> InflatableObject {
        let names = expected.map(\.rawValue).joined(separator: " or ")
        guard let bytes = objects[id] else {
            let referrer = parent.map { "\($0.objectClass.rawValue) \($0.id) refers to it" } ?? "it is the message"
            throw FlowerError(.missingObject, "\(names) \(id) is not among the \(objects.count) objects, but \(referrer)", objectID: id)
        }
        let object = try InflatableObject(id: id, bytes: bytes)
        guard expected.contains(object.objectClass) else {
            throw FlowerError(.invalidObject, "the object is a \(object.objectClass.rawValue) where a \(names) is due", objectID: id)
        }
        return object
    }

    /// `decode(object)`, with the object's id added to an error that names no object yet.
    func decode<T>(_ object: InflatableObject, _ decode: (InflatableObject) throws(FlowerError) -> T) throws(FlowerError) -> T {
        do { return try decode(object) } catch {
            var error = error
            if error.objectID == nil { error.objectID = object.id }
            throw error
        }
    }

    /// Each child of `parent` (the classes `expected`), decoded once, by id.
    func children<T>(of parent: InflatableObject, _ expected: [ObjectClass], _ read: (InflatableObject) throws(FlowerError) -> T) throws(FlowerError)
        -> [String: T]
    {
        var decoded: [String: T] = [:]
        for id in parent.children { decoded[id] = try decode(try load(id, expected, parent: parent), read) }
        return decoded
    }

    func message(_ id: String) throws(FlowerError) -> FlowerMessage {
        try decode(try load(id, [.message])) { object throws(FlowerError) in
            let proto: Flwr_Proto_Message
            do { proto = try Flwr_Proto_Message(serializedBytes: Array(object.body)) } catch {
                throw FlowerError(.invalidObject, "the Message body is not a protobuf Message: \(error)")
            }
            guard proto.metadata.messageID.isEmpty else {
                throw FlowerError(.invalidObject, "the Message body carries message_id '\(proto.metadata.messageID.prefix(80))'; flwr leaves it empty")
            }
            var metadata = FlowerMetadata(proto: proto.metadata)
            metadata.messageID = id
            if proto.hasError {
                guard object.children.isEmpty else { throw FlowerError(.invalidObject, "the Message carries an error and content") }
                return FlowerMessage(metadata: metadata, body: .error(code: proto.error.code, reason: proto.error.reason))
            }
            guard object.children.count == 1 else {
                throw FlowerError(.invalidObject, "the Message has \(object.children.count) children; one RecordDict is due when there is no error")
            }
            let records = try children(of: object, [.recordDict]) { object throws(FlowerError) in try recordDict(object) }
            return FlowerMessage(metadata: metadata, body: .content(records[object.children[0]]!))
        }
    }

    func recordDict(_ object: InflatableObject) throws(FlowerError) -> RecordDict {
        let records = try children(of: object, [.arrayRecord, .metricRecord, .configRecord]) { record throws(FlowerError) -> FlowerRecord in
            switch record.objectClass {
            case .arrayRecord: return .arrays(try arrayRecord(record))
            case .metricRecord: return .metrics(try RecordBodies.metrics(try leafBody(record)))
            default: return .configs(try RecordBodies.config(try leafBody(record)))
            }
        }
        return try references(object).compactMapValues { records[$0] }
    }

    func arrayRecord(_ object: InflatableObject) throws(FlowerError) -> ArrayRecord {
        let arrays = try children(of: object, [.array]) { object throws(FlowerError) in try array(object) }
        return try references(object).compactMapValues { arrays[$0] }
    }

    /// The names and child ids of a `RecordDict` or `ArrayRecord` body, checked against the header's children.
    func references(_ object: InflatableObject) throws(FlowerError) -> FlowerDict<String> {
        let kind = object.objectClass.rawValue
        guard case .object(let members) = try ObjectJSON.parse(object.body) else {
            throw FlowerError(.invalidObject, "the \(kind) body is not a JSON object", objectID: object.id)
        }
        var references = FlowerDict<String>()
        for (name, value) in members {
            guard let child = value.string, FlowerObjects.isObjectID(child) else {
                throw FlowerError(.invalidObject, "the \(kind) entry '\(name.prefix(80))' is not an object id", objectID: object.id)
            }
            references[name] = child
        }
        guard Set(references.map(\.value)) == Set(object.children) else {
            throw FlowerError(.invalidObject, "the \(kind) body refers to other objects than its header lists", objectID: object.id)
        }
        return references
    }

    /// The body of an object that has no children (`MetricRecord`, `ConfigRecord`, `ArrayChunk`).
    func leafBody(_ object: InflatableObject) throws(FlowerError) -> ArraySlice<UInt8> {
        guard object.children.isEmpty else {
            throw FlowerError(.invalidObject, "the \(object.objectClass.rawValue) lists children; it has none", objectID: object.id)
        }
        return object.body
    }

    /// An `Array`: JSON `{"dtype", "shape", "stype", "arraychunk_ids"}` whose ids index the header's children, the
    /// chunks joined in that order being the array's `.npy` file.
    func array(_ object: InflatableObject) throws(FlowerError) -> FlowerArray {
        guard case .object(let members) = try ObjectJSON.parse(object.body) else {
            throw FlowerError(.invalidObject, "the Array body is not a JSON object")
        }
        let fields = Dictionary(members, uniquingKeysWith: { _, last in last })
        guard let dtypeName = fields["dtype"]?.string, let stype = fields["stype"]?.string,
            case .array(let shapeJSON)? = fields["shape"], case .array(let indexJSON)? = fields["arraychunk_ids"]
        else { throw FlowerError(.invalidObject, "the Array body needs strings dtype and stype and lists shape and arraychunk_ids") }
        let shape = shapeJSON.compactMap(\.int)
        guard shape.count == shapeJSON.count, shape.allSatisfy({ $0 >= 0 }) else {
            throw FlowerError(.invalidObject, "the Array shape is not a list of non-negative integers")
        }
        let indices = indexJSON.compactMap(\.int)
        guard indices.count == indexJSON.count, Set(indices) == Set(object.children.indices) else {
            throw FlowerError(
                .invalidObject, "the Array's arraychunk_ids (\(indexJSON.count) entries) do not index each of its \(object.children.count) chunks")
        }
        guard stype == FlowerObjects.numpyStype else {
            throw FlowerError(.unsupportedEncoding, "the Array is serialised as '\(stype.prefix(80))'; Orchard reads '\(FlowerObjects.numpyStype)' only")
        }
        guard let dtype = NumPyDType(rawValue: dtypeName) else {
            throw FlowerError(
                .unsupportedDtype, "the Array's dtype '\(dtypeName.prefix(40))' is not one of \(NumPyDType.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        let chunks = try children(of: object, [.arrayChunk]) { chunk throws(FlowerError) in try leafBody(chunk) }
        var size = 0
        for index in indices {
            size += chunks[object.children[index]]!.count
            guard size <= maximumArrayBytes else {
                throw FlowerError(
                    .invalidObject, "the Array's \(indices.count) chunk references add up to more than \(maximumArrayBytes) bytes", objectID: object.id)
            }
        }
        var npy: [UInt8] = []
        npy.reserveCapacity(size)
        for index in indices { npy += chunks[object.children[index]]! }
        let array = try NPY.decode(npy)
        guard array.dtype == dtype else {
            throw FlowerError(.invalidObject, "the Array says dtype \(dtype) but its data is \(array.dtype)")
        }
        guard array.shape == shape else {
            throw FlowerError(.shapeMismatch, "the Array says shape \(shape) but its data has shape \(array.shape)")
        }
        return array
    }
}

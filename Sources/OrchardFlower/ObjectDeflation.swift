import SwiftProtobuf

/// A message deflated into Flower objects: what a SuperNode sends with `push-messages` and `push-object`.
public struct DeflatedMessage: Sendable {
    /// The message's id: the object id of its `Message` object.
    public let messageID: String
    /// Every object of the message, by id.
    public let objects: [String: [UInt8]]
    /// The object ids children before parents, each once, the message last: the order for `push-object`.
    public let pushOrder: [String]
    /// The object tree `push-messages` carries beside the message.
    package let objectTree: Flwr_Proto_ObjectTree
    /// The message as `push-messages` carries it: the metadata with `messageID`, and an empty `RecordDict` as
    /// content or the error (flwr's `message_to_proto(remove_content_from_message(message))`).
    package let pushedMessage: Flwr_Proto_Message
}

extension FlowerObjects {
    /// Deflates `message` into its objects, byte for byte as flwr 1.41 does (the metadata's `messageID` is left
    /// out of the `Message` object, whose id becomes the message's id).
    /// - Parameters:
    ///   - message: The message.
    ///   - chunkSize: The largest array chunk (flwr's default unless testing).
    public static func deflate(_ message: FlowerMessage, chunkSize: Int = maximumChunkSize) -> DeflatedMessage {
        precondition(chunkSize > 0, "chunk size must be positive")
        var deflater = Deflater(chunkSize: chunkSize)
        let tree = deflater.message(message)
        var pushed = Flwr_Proto_Message()
        pushed.metadata = message.metadata.proto
        pushed.metadata.messageID = tree.objectID
        switch message.body {
        case .content: pushed.content = Flwr_Proto_RecordDict()
        case .error(let code, let reason):
            pushed.error = .with {
                $0.code = code; $0.reason = reason
            }
        }
        return DeflatedMessage(messageID: tree.objectID, objects: deflater.objects, pushOrder: deflater.order, objectTree: tree, pushedMessage: pushed)
    }

    /// The ids of the objects a message's tree (from `pull-messages`) holds, children before parents, each once,
    /// the message last: what to fetch with `pull-object`.
    package static func objectIDs(in tree: Flwr_Proto_ObjectTree) -> [String] {
        var seen: Set<String> = []
        var ids: [String] = []
        func visit(_ node: Flwr_Proto_ObjectTree) {
            node.children.forEach(visit)
            if seen.insert(node.objectID).inserted { ids.append(node.objectID) }
        }
        visit(tree)
        return ids
    }
}

/// Writes a message's objects depth first, so that every child is written before its parent.
private struct Deflater {
    let chunkSize: Int
    var objects: [String: [UInt8]] = [:]
    var order: [String] = []

    /// Writes one object whose children are already written, and returns its tree. The header lists each child
    /// once, in first-seen order, as flwr's dict of children does; so does the tree.
    mutating func add(_ objectClass: ObjectClass, children: [Flwr_Proto_ObjectTree], body: [UInt8]) -> Flwr_Proto_ObjectTree {
        var seen: Set<String> = []
        let unique = children.filter { seen.insert($0.objectID).inserted }
        let bytes = InflatableObject.encode(objectClass, children: unique.map(\.objectID), body: body)
        let id = FlowerObjects.objectID(of: bytes)
        if objects.updateValue(bytes, forKey: id) == nil { order.append(id) }
        return .with {
            $0.objectID = id
            $0.children = unique
        }
    }

    mutating func message(_ message: FlowerMessage) -> Flwr_Proto_ObjectTree {
        var proto = Flwr_Proto_Message()
        proto.metadata = message.metadata.proto
        proto.metadata.messageID = ""
        var children: [Flwr_Proto_ObjectTree] = []
        switch message.body {
        case .content(let records): children = [recordDict(records)]
        case .error(let code, let reason):
            proto.error = .with {
                $0.code = code; $0.reason = reason
            }
        }
        return add(.message, children: children, body: proto.deterministicBytes())
    }

    /// A `RecordDict` or `ArrayRecord`: a JSON object from names to the children's ids.
    private mutating func references(_ objectClass: ObjectClass, _ children: [(String, Flwr_Proto_ObjectTree)]) -> Flwr_Proto_ObjectTree {
        let body = ObjectJSON.object(children.map { ($0, ObjectJSON.quoted($1.objectID)) })
        return add(objectClass, children: children.map(\.1), body: Array(body.utf8))
    }

    mutating func recordDict(_ records: RecordDict) -> Flwr_Proto_ObjectTree {
        references(.recordDict, records.map { ($0.name, record($0.value)) })
    }

    mutating func record(_ record: FlowerRecord) -> Flwr_Proto_ObjectTree {
        switch record {
        case .arrays(let arrays): references(.arrayRecord, arrays.map { ($0.name, array($0.value)) })
        case .metrics(let metrics): add(.metricRecord, children: [], body: RecordBodies.encode(metrics))
        case .configs(let configs): add(.configRecord, children: [], body: RecordBodies.encode(configs))
        }
    }

    /// An `Array`: its `.npy` bytes in chunks, and a JSON body whose `arraychunk_ids` index the header's children.
    mutating func array(_ array: FlowerArray) -> Flwr_Proto_ObjectTree {
        let npy = NPY.encode(array)
        let chunks = stride(from: 0, to: npy.count, by: chunkSize).map { start in
            add(.arrayChunk, children: [], body: Array(npy[start..<min(start + chunkSize, npy.count)]))
        }
        var indices: [String: Int] = [:]
        for chunk in chunks where indices[chunk.objectID] == nil { indices[chunk.objectID] = indices.count }
        let chunkIndices: [Int] = chunks.map { indices[$0.objectID]! }
        let body = ObjectJSON.object([
            ("dtype", ObjectJSON.quoted(array.dtype.rawValue)),
            ("shape", ObjectJSON.list(array.shape)),
            ("stype", ObjectJSON.quoted(FlowerObjects.numpyStype)),
            ("arraychunk_ids", ObjectJSON.list(chunkIndices)),
        ])
        return add(.array, children: chunks, body: Array(body.utf8))
    }
}

extension FlowerObjects {
    /// The `stype` of arrays serialised as `.npy` bytes, the only one flwr has.
    static let numpyStype = "numpy.ndarray"
}

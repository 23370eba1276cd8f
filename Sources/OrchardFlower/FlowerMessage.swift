public import OrchardSupport

/// A Flower message's metadata, field for field flwr's `Metadata` (and its protobuf).
public struct FlowerMetadata: Sendable, Hashable {
    /// The run the message belongs to.
    public var runID: UInt64
    /// The message's id: its object id (empty until the message is deflated).
    public var messageID: String
    /// The sending node (the SuperLink's ServerApp for instructions, the SuperNode for replies).
    public var srcNodeID: UInt64
    /// The receiving node.
    public var dstNodeID: UInt64
    /// The id of the message this one answers; empty for instructions.
    public var replyToMessageID: String
    /// A grouping of messages, typically the round number.
    public var groupID: String
    /// Seconds the message stays valid after `createdAt`.
    public var ttl: Double
    /// `train`, `evaluate`, `query`, optionally with `.<action>`.
    public var messageType: String
    /// Creation time, seconds since 1970 (microsecond precision, as Python's `datetime.timestamp()`).
    public var createdAt: Double
    /// The sending task, when flwr set one.
    public var srcTaskID: UInt64?
    /// The receiving task, when flwr set one.
    public var dstTaskID: UInt64?

    /// Creates metadata.
    public init(
        runID: UInt64, messageID: String = "", srcNodeID: UInt64, dstNodeID: UInt64, replyToMessageID: String = "",
        groupID: String = "", ttl: Double, messageType: String, createdAt: Double, srcTaskID: UInt64? = nil, dstTaskID: UInt64? = nil
    ) {
        self.runID = runID
        self.messageID = messageID
        self.srcNodeID = srcNodeID
        self.dstNodeID = dstNodeID
        self.replyToMessageID = replyToMessageID
        self.groupID = groupID
        self.ttl = ttl
        self.messageType = messageType
        self.createdAt = createdAt
        self.srcTaskID = srcTaskID
        self.dstTaskID = dstTaskID
    }

    init(proto: Flwr_Proto_Metadata) {
        self.init(
            runID: proto.runID, messageID: proto.messageID, srcNodeID: proto.srcNodeID, dstNodeID: proto.dstNodeID,
            replyToMessageID: proto.replyToMessageID, groupID: proto.groupID, ttl: proto.ttl, messageType: proto.messageType,
            createdAt: proto.createdAt, srcTaskID: proto.hasSrcTaskID ? proto.srcTaskID : nil, dstTaskID: proto.hasDstTaskID ? proto.dstTaskID : nil
        )
    }

    var proto: Flwr_Proto_Metadata {
        var proto = Flwr_Proto_Metadata()
        proto.runID = runID
        proto.messageID = messageID
        proto.srcNodeID = srcNodeID
        proto.dstNodeID = dstNodeID
        proto.replyToMessageID = replyToMessageID
        proto.groupID = groupID
        proto.ttl = ttl
        proto.messageType = messageType
        proto.createdAt = createdAt
        if let srcTaskID { proto.srcTaskID = srcTaskID }
        if let dstTaskID { proto.dstTaskID = dstTaskID }
        return proto
    }
}

/// A Flower message: metadata and either content (records) or an error.
public struct FlowerMessage: Sendable, Equatable {
    /// What a message carries.
    public enum Body: Sendable, Equatable {
        /// Records: the instruction's arrays and config, or the reply's results.
        case content(RecordDict)
        /// A failure to handle the message it replies to; `reason` is empty when there is none.
        case error(code: Int64, reason: String)
    }

    /// The metadata.
    public var metadata: FlowerMetadata
    /// The content or the error.
    public var body: Body

    /// Creates a message.
    public init(metadata: FlowerMetadata, body: Body) {
        self.metadata = metadata
        self.body = body
    }

    /// The content, when the message has content rather than an error.
    public var content: RecordDict? { if case .content(let records) = body { records } else { nil } }

    /// flwr's tolerance when it caps a reply's TTL (`MESSAGE_TTL_TOLERANCE`, seconds).
    public static let ttlTolerance = 0.1

    /// A reply to `original`, as flwr's `Message(content_or_error, reply_to=original, ttl=ttl)` makes it: the
    /// nodes and tasks swapped, the run, group and type kept, `replyToMessageID` set, created `now`, and a TTL
    /// that does not outlive the original (`ttl` when it fits, within ``ttlTolerance``, otherwise the rest of the
    /// original's).
    /// - Parameters:
    ///   - original: The received message (its `messageID` set).
    ///   - body: The reply's content or error.
    ///   - ttl: The TTL asked for; by default the rest of the original's.
    ///   - now: The current time (from the node's clock); kept to the microsecond, as Python's clock is.
    public init(replyingTo original: FlowerMessage, with body: Body, ttl: Double? = nil, at now: WallInstant) {
        let (seconds, attoseconds) = now.sinceEpoch.components
        let microseconds = seconds * 1_000_000 + attoseconds / 1_000_000_000_000
        let createdAt = Double(microseconds) / 1_000_000
        let remaining = original.metadata.createdAt + original.metadata.ttl - createdAt
        var replyTTL = remaining
        // flwr: `reply_ttl or max_allowed_ttl`, unless reply_ttl exceeds it by more than the tolerance.
        if let ttl, ttl != 0, ttl - remaining <= Self.ttlTolerance { replyTTL = ttl }
        self.init(
            metadata: FlowerMetadata(
                runID: original.metadata.runID, srcNodeID: original.metadata.dstNodeID, dstNodeID: original.metadata.srcNodeID,
                replyToMessageID: original.metadata.messageID, groupID: original.metadata.groupID, ttl: replyTTL,
                messageType: original.metadata.messageType, createdAt: createdAt,
                srcTaskID: original.metadata.dstTaskID, dstTaskID: original.metadata.srcTaskID
            ),
            body: body
        )
    }
}

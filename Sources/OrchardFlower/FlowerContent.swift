import Foundation
import OrchardFormats
import OrchardSupport
import SwiftProtobuf

/// The node's content handling between the Fleet calls and the local app: which objects a message needs, decoding
/// a kept message, the app's answer to `train` and `evaluate`, and the reply (or error reply) as objects to keep
/// and push.
enum FlowerContent {
    /// A decoded message.
    typealias Received = FlowerMessage

    /// Flower's error code for a failure of the app that handles a message (`CLIENT_APP_RAISED_EXCEPTION`).
    static let appErrorCode: Int64 = 2
    /// Flower's error code for a message whose content could not be received (`MESSAGE_UNAVAILABLE`).
    static let unavailableCode: Int64 = 3

    /// The app's answer to a message.
    struct Answer: Sendable {
        var arrays: [NamedArray]
        var metrics: [String: Double]
    }

    /// Runs `message` through the app: `train` → trained arrays and `num-examples`/`train_loss`; `evaluate` →
    /// `num-examples`/`eval_loss`/`eval_acc`.
    /// - Throws: ``FlowerError`` `.unsupportedMessage` (another type, no `ArrayRecord`), `.arrayMismatch`,
    ///   `.unsupportedDtype`, `.invalidConfiguration`, `.training`, `.cancelled`.
    static func answer(_ message: FlowerMessage, app: FlowerLocalApp) throws(FlowerError) -> Answer {
        let type = message.metadata.messageType
        let kind = type.split(separator: ".", maxSplits: 1).first.map(String.init) ?? type
        guard kind == "train" || kind == "evaluate" else {
            throw FlowerError(.unsupportedMessage, "message type '\(type)' is not handled by an Orchard device (it answers train and evaluate)")
        }
        guard let content = message.content else {
            throw FlowerError(.unsupportedMessage, "the \(type) message carries an error, not content")
        }
        let arrayRecords = content.arrayRecords
        guard let record = content["arrays"]?.arrayRecord ?? (arrayRecords.count == 1 ? arrayRecords.first?.value : nil) else {
            throw FlowerError(
                .unsupportedMessage, "the \(type) message has no ArrayRecord named 'arrays' (it has \(content.names.map { "'\($0)'" }.joined(separator: ", ")))"
            )
        }
        // Counted before any array is converted: names may share one array, and a record of many names would
        // otherwise be converted name by name before the model's count refused it.
        guard record.count == app.parameterCount else {
            throw FlowerError(.arrayMismatch, "the server sent \(record.count) arrays; model '\(app.model.name)' has \(app.parameterCount) parameters")
        }
        var arrays: [NamedArray] = []
        for (name, array) in record {
            let values: [Float]
            do { values = try array.floats() } catch {
                throw FlowerError(.arrayMismatch, "array '\(name)': \(error.message)")
            }
            arrays.append(NamedArray(name: name, shape: array.shape, values: values))
        }
        if kind == "evaluate" { return Answer(arrays: [], metrics: try app.evaluate(arrays)) }
        let config = content["config"]?.configRecord ?? content.configRecords.first?.value ?? ConfigRecord()
        let trained = try app.train(arrays, settings: try settings(config))
        return Answer(arrays: trained.arrays, metrics: trained.metrics)
    }

    /// The round's settings from the message's `ConfigRecord` (`lr`/`learning-rate`, `local-epochs`, `batch-size`,
    /// `server-round`); other keys are left to the model's training section.
    static func settings(_ config: ConfigRecord) throws(FlowerError) -> RoundSettings {
        func number(_ key: String) throws(FlowerError) -> Double? {
            guard let value = config[key] else { return nil }
            switch value {
            case .double(let v): return v
            case .int(let v): return Double(v)
            case .uint(let v): return Double(v)
            default: throw FlowerError(.invalidConfiguration, "config '\(key)' must be a number, not \(value)")
            }
        }
        func integer(_ key: String) throws(FlowerError) -> Int? {
            guard let value = try number(key) else { return nil }
            guard value.rounded() == value, abs(value) < 1e9 else {
                throw FlowerError(.invalidConfiguration, "config '\(key)' must be an integer, not \(value)")
            }
            return Int(value)
        }
        var learningRate = try number("lr")
        if learningRate == nil { learningRate = try number("learning-rate") }
        return RoundSettings(
            learningRate: learningRate, localEpochs: try integer("local-epochs"),
            batchSize: try integer("batch-size"), serverRound: try integer("server-round")
        )
    }

    /// The reply's content: the arrays as float32 `ArrayRecord` "arrays" (train) and the metrics as `MetricRecord`
    /// "metrics" (`num-examples` as an integer).
    static func replyContent(_ answer: Answer) -> RecordDict {
        var records = RecordDict()
        if !answer.arrays.isEmpty {
            records["arrays"] = .arrays(ArrayRecord(answer.arrays.map { ($0.name, FlowerArray($0.values, shape: $0.shape)) }))
        }
        var metrics = MetricRecord()
        for (key, value) in answer.metrics.sorted(by: { $0.key < $1.key }) {
            metrics[key] = key == "num-examples" ? .int(Int64(value)) : .double(value)
        }
        records["metrics"] = .metrics(metrics)
        return records
    }

    /// The object ids of a pulled message's tree, children before parents, the message last.
    static func objectIDs(in tree: Flwr_Proto_ObjectTree) -> [String] { FlowerObjects.objectIDs(in: tree) }

    /// Decodes a kept message from its objects, checking every object.
    static func decode(_ kept: FlowerNodeStore.KeptMessage) throws(FlowerError) -> FlowerMessage {
        try FlowerObjects.inflate(messageID: kept.messageID, objects: kept.objects.mapValues { [UInt8]($0) })
    }

    /// The reply to a decoded message carrying the app's answer, as objects to keep and push.
    static func reply(to kept: FlowerNodeStore.KeptMessage, message: FlowerMessage, answer: Answer, now: Date) throws(FlowerError) -> FlowerNodeStore.KeptReply
    {
        try keep(FlowerMessage(replyingTo: message, with: .content(replyContent(answer)), at: WallInstant(now)), replyTo: kept.messageID)
    }

    /// An error reply to a kept message (one that could not be decoded, or that the app could not handle).
    static func errorReply(to kept: FlowerNodeStore.KeptMessage, error: FlowerError, now: Date) throws(FlowerError) -> FlowerNodeStore.KeptReply {
        try errorReply(metadata: try parse(Flwr_Proto_Message.self, kept.message).metadata, messageID: kept.messageID, error: error, now: now)
    }

    /// An error reply to a pulled message whose objects could not be fetched or decoded.
    static func errorReply(to pulled: Flwr_Proto_Message, error: FlowerError, now: Date) throws(FlowerError) -> FlowerNodeStore.KeptReply {
        try errorReply(metadata: pulled.metadata, messageID: pulled.metadata.messageID, error: error, now: now)
    }

    private static func errorReply(metadata: Flwr_Proto_Metadata, messageID: String, error: FlowerError, now: Date) throws(FlowerError)
        -> FlowerNodeStore.KeptReply
    {
        var original = FlowerMetadata(proto: metadata)
        original.messageID = messageID
        let code = [.missingObject, .objectIDMismatch, .invalidObject].contains(error.code) ? unavailableCode : appErrorCode
        let body = FlowerMessage.Body.error(code: code, reason: "Orchard device: \(error.code): \(error.message)")
        let reply = FlowerMessage(replyingTo: FlowerMessage(metadata: original, body: .content(RecordDict())), with: body, at: WallInstant(now))
        return try keep(reply, replyTo: messageID)
    }

    /// A reply deflated into what the node keeps until it is pushed.
    private static func keep(_ reply: FlowerMessage, replyTo: String) throws(FlowerError) -> FlowerNodeStore.KeptReply {
        let deflated = FlowerObjects.deflate(reply)
        return FlowerNodeStore.KeptReply(
            runID: reply.metadata.runID, replyTo: replyTo, message: try serialize(deflated.pushedMessage), tree: try serialize(deflated.objectTree),
            objects: deflated.objects.mapValues { Data($0) }, order: deflated.pushOrder
        )
    }

    /// Parses a serialised protobuf message.
    static func parse<M: SwiftProtobuf.Message>(_ type: M.Type, _ data: Data) throws(FlowerError) -> M {
        do { return try M(serializedBytes: data) } catch {
            throw FlowerError(.storage, "a kept \(M.protoMessageName) is unreadable: \(error)")
        }
    }

    /// Serialises a protobuf message deterministically.
    static func serialize(_ message: some SwiftProtobuf.Message) throws(FlowerError) -> Data {
        do { return try message.serializedBytes(options: FleetClient.deterministic) } catch {
            throw FlowerError(.storage, "cannot serialise \(type(of: message).protoMessageName): \(error)")
        }
    }
}

import OrchardPrivacy

/// JSON written directly into bytes for the hottest messages (the check-in's answer; secure aggregation's polls and
/// waits), where Foundation's `JSONEncoder` costs more than the rest of the request. The output is the same JSON
/// object as ``WireCoding``'s encoder gives (same keys, sorted; same values after decoding), checked against it in
/// the tests.
enum DirectJSON {
    /// Appends `text` as a JSON string (quotes, `\"`, `\\`, and `\u00XX` for control characters).
    static func append(string text: String, to out: inout [UInt8]) {
        out.append(0x22)
        for byte in text.utf8 {
            switch byte {
            case 0x22: out.append(contentsOf: [0x5C, 0x22])
            case 0x5C: out.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: out.append(contentsOf: [0x5C, 0x6E])
            case 0x0D: out.append(contentsOf: [0x5C, 0x72])
            case 0x09: out.append(contentsOf: [0x5C, 0x74])
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                out.append(contentsOf: [0x5C, 0x75, 0x30, 0x30, hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            default: out.append(byte)
            }
        }
        out.append(0x22)
    }

    /// Appends a finite number in its shortest round-tripping form, byte for byte as the encoder writes it (`600`,
    /// `-0`, `0.5`, `1e-05`, `1e+16`: the description without a trailing `.0`); nil for NaN or infinity, which JSON
    /// cannot carry.
    static func append(number value: Double, to out: inout [UInt8]) -> Void? {
        guard value.isFinite else { return nil }
        let text = value.description.utf8
        out.append(contentsOf: text.count > 2 && text.suffix(2).elementsEqual(".0".utf8) ? text.dropLast(2) : text[...])
        return ()
    }

    /// Appends `"key":`.
    static func append(key: StaticString, to out: inout [UInt8]) {
        out.append(0x22)
        key.withUTF8Buffer { out.append(contentsOf: $0) }
        out.append(contentsOf: [0x22, 0x3A])
    }
}

/// One JSON object written member by member, in the order given (the caller gives the keys sorted); the commas
/// and braces are its business.
struct DirectJSONObject {
    private var out: [UInt8]
    private var empty = true

    init(capacity: Int) {
        out = []
        out.reserveCapacity(capacity)
        out.append(0x7B)
    }

    private mutating func key(_ key: StaticString) {
        if !empty { out.append(0x2C) }
        empty = false
        DirectJSON.append(key: key, to: &out)
    }

    mutating func add(_ key: StaticString, string: String) {
        self.key(key)
        DirectJSON.append(string: string, to: &out)
    }

    mutating func add(_ key: StaticString, int: Int) {
        self.key(key)
        out.append(contentsOf: String(int).utf8)
    }

    mutating func add(_ key: StaticString, bool: Bool) {
        self.key(key)
        out.append(contentsOf: (bool ? "true" : "false").utf8)
    }

    /// nil when `number` is not finite (the object is then unusable, as JSON cannot carry it).
    mutating func add(_ key: StaticString, number: Double) -> Void? {
        self.key(key)
        return DirectJSON.append(number: number, to: &out)
    }

    /// The object's bytes, closed.
    consuming func bytes() -> [UInt8] {
        out.append(0x7D)
        return out
    }
}

extension CycleResponse {
    /// The answer as JSON (keys sorted, as ``WireCoding/encoder()`` writes them), written directly; nil if a number
    /// is not finite (which ``WireCoding/encoder()`` refuses too).
    public func directJSON() -> [UInt8]? {
        var object = DirectJSONObject(capacity: 256)
        switch self {
        case .accepted(let assignment):
            object.add("checkpoint", int: assignment.checkpoint)
            object.add("cycle", int: assignment.cycle)
            object.add("model_id", string: assignment.modelID)
            object.add("plan_id", string: assignment.planID)
            object.add("process_id", string: assignment.processID)
            guard object.add("report_within", number: assignment.reportWithin) != nil else { return nil }
            object.add("request_key", string: assignment.requestKey)
            object.add("status", string: "accepted")
        case .evaluate(let assignment):
            object.add("checkpoint", int: assignment.checkpoint)
            object.add("model_id", string: assignment.modelID)
            object.add("plan_id", string: assignment.planID)
            object.add("process_id", string: assignment.processID)
            guard object.add("report_within", number: assignment.reportWithin) != nil else { return nil }
            object.add("request_key", string: assignment.requestKey)
            object.add("status", string: "evaluate")
        case .rejected(let rejection):
            object.add("reason", string: rejection.reason)
            guard object.add("retry_after", number: rejection.retryAfter) != nil else { return nil }
            object.add("status", string: "rejected")
        }
        return object.bytes()
    }
}

extension CycleRequest {
    /// Reads the check-in's body without `JSONDecoder` when it is plain: one object of the known keys, each once,
    /// ASCII strings without escapes, the speeds as finite numbers. Anything else — escapes, `null`, an unknown or
    /// repeated key, a missing one, a bad version, malformed JSON — returns nil, and the caller decodes with
    /// ``WireCoding/strictDecoder()`` for the exact answer and error. Where it answers, it answers what that
    /// decoder would (checked against it in the tests).
    public static func directDecode(_ bytes: UnsafeRawBufferPointer) -> CycleRequest? {
        var reader = DirectJSONReader(bytes)
        var worker: String?, name: String?, version: SemanticVersion?, download: Double?, upload: Double?, tasks: [DeviceTask]?
        guard reader.take(0x7B) else { return nil }
        if !reader.take(0x7D) {
            repeat {
                guard let key = reader.string(), reader.take(0x3A) else { return nil }
                switch key {
                case "worker_id":
                    guard worker == nil, let value = reader.string() else { return nil }
                    worker = value
                case "process_name":
                    guard name == nil, let value = reader.string() else { return nil }
                    name = value
                case "process_version":
                    guard version == nil, let value = reader.string(), let parsed = SemanticVersion(value) else { return nil }
                    version = parsed
                case "download_mbps":
                    guard download == nil, let value = reader.number() else { return nil }
                    download = value
                case "upload_mbps":
                    guard upload == nil, let value = reader.number() else { return nil }
                    upload = value
                case "tasks":
                    guard tasks == nil, reader.take(0x5B) else { return nil }
                    var list: [DeviceTask] = []
                    if !reader.take(0x5D) {
                        repeat {
                            guard let value = reader.string(), let task = DeviceTask(rawValue: value) else { return nil }
                            list.append(task)
                        } while reader.take(0x2C)
                        guard reader.take(0x5D) else { return nil }
                    }
                    tasks = list
                default:
                    return nil
                }
            } while reader.take(0x2C)
            guard reader.take(0x7D) else { return nil }
        }
        guard reader.atEnd, let worker, let name, let version else { return nil }
        return CycleRequest(workerID: worker, processName: name, processVersion: version, downloadMbps: download, uploadMbps: upload, tasks: tasks)
    }
}

/// A cursor over JSON bytes for the direct decoders (``CycleRequest/directDecode(_:)``): whitespace skipped before
/// each token.
struct DirectJSONReader {
    private let bytes: UnsafeRawBufferPointer
    private var index = 0

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    private mutating func skipWhitespace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 { index += 1 }
    }

    /// Whether only whitespace is left.
    var atEnd: Bool {
        mutating get {
            skipWhitespace()
            return index == bytes.count
        }
    }

    /// Consumes `byte` if it is the next token.
    mutating func take(_ byte: UInt8) -> Bool {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    /// An ASCII string without escapes or control characters; nil otherwise (other strings take the full decoder,
    /// which validates UTF-8 and unescapes).
    mutating func string() -> String? {
        guard take(0x22) else { return nil }
        let start = index
        while index < bytes.count {
            let byte = bytes[index]
            if byte == 0x22 {
                let text = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                index += 1
                return text
            }
            if byte == 0x5C || byte < 0x20 || byte >= 0x80 { return nil }
            index += 1
        }
        return nil
    }

    /// An integer written as JSON digits (`-? int`, no fraction or exponent) that fits an `Int`; nil otherwise.
    mutating func integer() -> Int? {
        skipWhitespace()
        let start = index
        if index < bytes.count, bytes[index] == 0x2D { index += 1 }
        let digitsStart = index
        while index < bytes.count, bytes[index] >= 0x30, bytes[index] <= 0x39 { index += 1 }
        let count = index - digitsStart
        guard count > 0, !(count > 1 && bytes[digitsStart] == 0x30) else { return nil }
        if index < bytes.count, bytes[index] == 0x2E || bytes[index] == 0x65 || bytes[index] == 0x45 { return nil }
        return Int(String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self))
    }

    /// `true` or `false`; nil otherwise.
    mutating func boolean() -> Bool? {
        skipWhitespace()
        for (word, value) in [("true", true), ("false", false)] {
            let utf8 = Array(word.utf8)
            if index + utf8.count <= bytes.count, bytes[index..<(index + utf8.count)].elementsEqual(utf8) {
                index += utf8.count
                return value
            }
        }
        return nil
    }

    /// A number in JSON's grammar (`-? int frac? exp?`) whose value is finite; nil otherwise.
    mutating func number() -> Double? {
        skipWhitespace()
        let start = index
        func digits() -> Int {
            let from = index
            while index < bytes.count, bytes[index] >= 0x30, bytes[index] <= 0x39 { index += 1 }
            return index - from
        }
        if index < bytes.count, bytes[index] == 0x2D { index += 1 }
        let integerStart = index
        let integerDigits = digits()
        guard integerDigits > 0, !(integerDigits > 1 && bytes[integerStart] == 0x30) else { return nil }
        if index < bytes.count, bytes[index] == 0x2E {
            index += 1
            guard digits() > 0 else { return nil }
        }
        if index < bytes.count, bytes[index] == 0x65 || bytes[index] == 0x45 {
            index += 1
            if index < bytes.count, bytes[index] == 0x2B || bytes[index] == 0x2D { index += 1 }
            guard digits() > 0 else { return nil }
        }
        guard let value = Double(String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)), value.isFinite else {
            return nil
        }
        return value
    }
}

extension SecureAggregationReply {
    /// The reply as JSON (keys sorted, as ``WireCoding/encoder()`` writes them), written directly when it carries no
    /// stage input (a `wait`, `done`, or a step whose input is only its name); nil otherwise, or if `retry_after` is not
    /// finite: the encoder writes those.
    public func directJSON() -> [UInt8]? {
        guard roster == nil, delivery == nil, consistencyRequest == nil, unmaskRequest == nil else { return nil }
        var object = DirectJSONObject(capacity: 128)
        object.add("cycle", int: cycle)
        object.add("cycle_closed", bool: cycleClosed)
        object.add("device", int: device)
        if let maskedInputFormat { object.add("masked_input_format", string: maskedInputFormat.rawValue) }
        object.add("next", string: next.rawValue)
        if let retryAfter { guard object.add("retry_after", number: retryAfter) != nil else { return nil } }
        object.add("stage", string: stage.rawValue)
        return object.bytes()
    }
}

extension SecureAggregationRequest {
    /// A poll (a request without a stage message) as JSON (keys sorted, as ``WireCoding/encoder()`` writes it),
    /// written directly; nil for a request carrying a message, which the encoder writes.
    public func directJSON() -> [UInt8]? {
        guard messageCount == 0 else { return nil }
        var object = DirectJSONObject(capacity: 32 + requestKey.utf8.count + workerID.utf8.count)
        object.add("request_key", string: requestKey)
        object.add("worker_id", string: workerID)
        return object.bytes()
    }
}

extension SecureAggregationReply {
    /// Reads a reply without `JSONDecoder` when it carries no stage input (what ``directJSON()`` writes: a wait, most of
    /// the replies): one object of those keys, each once, `retry_after` a finite number or absent, ASCII strings without
    /// escapes. Anything else returns nil and takes the decoder; where it answers, it answers what the decoder would
    /// (checked against it in the tests).
    public static func directDecode(_ bytes: UnsafeRawBufferPointer) -> SecureAggregationReply? {
        var reader = DirectJSONReader(bytes)
        var cycle: Int?, device: Int?, stage: SecureAggregationStage?, next: SecureAggregationNextStep?
        var retryAfter: Double?, sawRetryAfter = false, closed: Bool?, format: MaskedInputFormat?, sawFormat = false
        guard reader.take(0x7B), !reader.take(0x7D) else { return nil }
        repeat {
            guard let key = reader.string(), reader.take(0x3A) else { return nil }
            switch key {
            case "cycle":
                guard cycle == nil, let value = reader.integer() else { return nil }
                cycle = value
            case "device":
                guard device == nil, let value = reader.integer() else { return nil }
                device = value
            case "stage":
                guard stage == nil, let value = reader.string().flatMap(SecureAggregationStage.init(rawValue:)) else { return nil }
                stage = value
            case "next":
                guard next == nil, let value = reader.string().flatMap(SecureAggregationNextStep.init(rawValue:)) else { return nil }
                next = value
            case "retry_after":
                guard !sawRetryAfter, let value = reader.number() else { return nil }
                (retryAfter, sawRetryAfter) = (value, true)
            case "cycle_closed":
                guard closed == nil, let value = reader.boolean() else { return nil }
                closed = value
            case "masked_input_format":
                guard !sawFormat, let value = reader.string().flatMap(MaskedInputFormat.init(rawValue:)) else { return nil }
                (format, sawFormat) = (value, true)
            default:
                return nil
            }
        } while reader.take(0x2C)
        guard reader.take(0x7D), reader.atEnd, let cycle, let device, let stage, let next, let closed else { return nil }
        return SecureAggregationReply(
            cycle: cycle, device: device, stage: stage, next: next, retryAfter: retryAfter, cycleClosed: closed, maskedInputFormat: format)
    }
}

extension SecureAggregationRequest {
    /// Reads a poll (`request_key` and `worker_id`, each once, ASCII strings without escapes) without `JSONDecoder`;
    /// nil for anything else, which takes the strict decoder. Where it answers, it answers what that decoder would
    /// (checked against it in the tests).
    public static func directDecode(_ bytes: UnsafeRawBufferPointer) -> SecureAggregationRequest? {
        var reader = DirectJSONReader(bytes)
        var worker: String?, key: String?
        guard reader.take(0x7B), !reader.take(0x7D) else { return nil }
        repeat {
            guard let name = reader.string(), reader.take(0x3A) else { return nil }
            switch name {
            case "worker_id":
                guard worker == nil, let value = reader.string() else { return nil }
                worker = value
            case "request_key":
                guard key == nil, let value = reader.string() else { return nil }
                key = value
            default:
                return nil
            }
        } while reader.take(0x2C)
        guard reader.take(0x7D), reader.atEnd, let worker, let key else { return nil }
        return SecureAggregationRequest(workerID: worker, requestKey: key)
    }
}

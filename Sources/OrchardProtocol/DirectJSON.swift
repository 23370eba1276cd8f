/// JSON written directly into bytes for the coordinator's hottest answer (the check-in), where Foundation's
/// `JSONEncoder` costs more than the rest of the request. The output is the same JSON object as ``WireCoding``'s
/// encoder gives (same keys, sorted; same values after decoding), checked against it in the tests.
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

    /// Appends a finite number in its shortest round-tripping form (`600`, `0.5`, `1e-05`); nil for NaN or infinity,
    /// which JSON cannot carry.
    static func append(number value: Double, to out: inout [UInt8]) -> Void? {
        guard value.isFinite else { return nil }
        if value == value.rounded(), abs(value) < 1e15 {
            out.append(contentsOf: String(Int64(value)).utf8)
        } else {
            out.append(contentsOf: value.description.utf8)
        }
        return ()
    }

    /// Appends `"key":`.
    static func append(key: StaticString, to out: inout [UInt8]) {
        out.append(0x22)
        key.withUTF8Buffer { out.append(contentsOf: $0) }
        out.append(contentsOf: [0x22, 0x3A])
    }
}

extension CycleResponse {
    /// The answer as JSON (keys sorted, as ``WireCoding/encoder()`` writes them), written directly; nil if a number
    /// is not finite (which ``WireCoding/encoder()`` refuses too).
    public func directJSON() -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        out.append(0x7B)
        switch self {
        case .accepted(let assignment):
            DirectJSON.append(key: "checkpoint", to: &out)
            out.append(contentsOf: String(assignment.checkpoint).utf8)
            out.append(0x2C)
            DirectJSON.append(key: "cycle", to: &out)
            out.append(contentsOf: String(assignment.cycle).utf8)
            out.append(0x2C)
            DirectJSON.append(key: "model_id", to: &out)
            DirectJSON.append(string: assignment.modelID, to: &out)
            out.append(0x2C)
            DirectJSON.append(key: "plan_id", to: &out)
            DirectJSON.append(string: assignment.planID, to: &out)
            out.append(0x2C)
            DirectJSON.append(key: "process_id", to: &out)
            DirectJSON.append(string: assignment.processID, to: &out)
            out.append(0x2C)
            DirectJSON.append(key: "report_within", to: &out)
            guard DirectJSON.append(number: assignment.reportWithin, to: &out) != nil else { return nil }
            out.append(0x2C)
            DirectJSON.append(key: "request_key", to: &out)
            DirectJSON.append(string: assignment.requestKey, to: &out)
            out.append(0x2C)
            DirectJSON.append(key: "status", to: &out)
            DirectJSON.append(string: "accepted", to: &out)
        case .rejected(let rejection):
            DirectJSON.append(key: "reason", to: &out)
            DirectJSON.append(string: rejection.reason, to: &out)
            out.append(0x2C)
            DirectJSON.append(key: "retry_after", to: &out)
            guard DirectJSON.append(number: rejection.retryAfter, to: &out) != nil else { return nil }
            out.append(0x2C)
            DirectJSON.append(key: "status", to: &out)
            DirectJSON.append(string: "rejected", to: &out)
        }
        out.append(0x7D)
        return out
    }
}

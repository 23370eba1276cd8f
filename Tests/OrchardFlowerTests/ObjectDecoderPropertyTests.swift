import OrchardFlower
import OrchardSupport
import OrchardTesting
import PropertyBased
import Testing

/// Damage to a message's objects. All but `flipByte` and `dropObject` re-hash the damaged object (and the objects
/// above it), so they reach the checks behind the id check.
enum ObjectMutation: CaseIterable {
    case flipByte, dropObject, flipBodyByte, truncate, appendGarbage, headerClass, headerChildren, headerLength, bodyToken, arrayField

    static let classNames = ["Message", "RecordDict", "ArrayRecord", "MetricRecord", "ConfigRecord", "Array", "ArrayChunk", "Tensor", "", "array"]
    static let tokens = ["0", "1", "-1", "2", "99999999999999999999", "1.5", "1e3", "\"x\"", "null", "true", "[]", "{}", "0, 0", "\\ud800", "x"]
    static let arrayFields = [
        ("\"float32\"", "\"complex64\""), ("\"float32\"", "\"int8\""), ("\"float32\"", "\"float64\""), ("numpy.ndarray", "torch"),
        ("\"shape\": [", "\"shape\": [2, "), ("\"shape\": [", "\"shape\": [-1, "), ("\"arraychunk_ids\": [0", "\"arraychunk_ids\": [0, 0"),
    ]

    static func isWord(_ byte: UInt8) -> Bool { (0x30...0x39).contains(byte) || (0x61...0x7A).contains(byte | 0x20) }

    func apply(to set: inout ObjectSet, using rng: inout SplitMix64) {
        guard let id = set.objects.keys.sorted().randomElement(using: &rng), let bytes = set.objects[id], !bytes.isEmpty else { return }
        switch self {
        case .flipByte:
            set.objects[id]![Int.random(in: bytes.indices, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
        case .dropObject:
            set.objects[id] = nil
        case .flipBodyByte:
            var damaged = bytes
            damaged[Int.random(in: damaged.indices, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
            set.replace(id, with: damaged)
        case .truncate:
            set.replace(id, with: Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &rng))))
        case .appendGarbage:
            set.replace(id, with: bytes + Fuzz.bytes(maximum: 16, using: &rng))
        case .headerClass:
            set.edit(id) { fields, _ in fields[0] = Self.classNames.randomElement(using: &rng)! }
        case .headerChildren:
            let other = set.objects.keys.sorted().randomElement(using: &rng)!
            set.edit(id) { fields, _ in
                var children = fields[1].split(separator: ",").map(String.init)
                switch Int.random(in: 0...3, using: &rng) {
                case 0 where !children.isEmpty: children.remove(at: Int.random(in: children.indices, using: &rng))
                case 1: children.append(other)
                case 2: children.shuffle(using: &rng)
                default: children.append(String(repeating: "f", count: Int.random(in: 63...65, using: &rng)))
                }
                fields[1] = children.joined(separator: ",")
            }
        case .headerLength:
            set.edit(id) { fields, body in
                fields[2] = ["0", "-1", "", "+\(body.count)", "0\(body.count)", String(body.count + 1), "1e3"].randomElement(using: &rng)!
            }
        case .bodyToken:
            set.editBody(id) { body in
                // Replaces a run of digits or letters (a number, a dtype, a JSON keyword) by another token.
                let starts = body.indices.filter { Self.isWord(body[$0]) && ($0 == 0 || !Self.isWord(body[$0 - 1])) }
                guard let start = starts.randomElement(using: &rng) else { return }
                var end = start
                while end < body.count, Self.isWord(body[end]) || body[end] == UInt8(ascii: ".") { end += 1 }
                body.replaceSubrange(start..<end, with: Array(Self.tokens.randomElement(using: &rng)!.utf8))
            }
        case .arrayField:
            // A field of an Array body replaced by a valid but wrong one: another dtype, stype, shape or chunk list.
            guard let array = set.ids(of: "Array").randomElement(using: &rng) else { return }
            let (old, new) = Self.arrayFields.randomElement(using: &rng)!
            set.editBody(array) { body in
                if let range = body.firstRange(of: Array(old.utf8)) { body.replaceSubrange(range, with: Array(new.utf8)) }
            }
        }
    }
}

enum FlowerGen {
    /// A random message: an error, or records of every kind (arrays of every dtype and odd shapes, canonical values).
    static func message(using rng: inout SplitMix64) -> FlowerMessage {
        let metadata = FlowerMetadata(
            runID: rng.next(), srcNodeID: rng.next(), dstNodeID: rng.next(), replyToMessageID: Bool.random(using: &rng) ? "" : Fuzz.string(using: &rng),
            groupID: Fuzz.string(using: &rng), ttl: Fuzz.number(using: &rng), messageType: Fuzz.string(using: &rng),
            createdAt: Fuzz.number(using: &rng), srcTaskID: Bool.random(using: &rng) ? rng.next() : nil, dstTaskID: Bool.random(using: &rng) ? rng.next() : nil
        )
        if Int.random(in: 0...4, using: &rng) == 0 {
            return FlowerMessage(metadata: metadata, body: .error(code: Int64(bitPattern: rng.next()), reason: Fuzz.string(using: &rng)))
        }
        var records = RecordDict()
        for _ in 0..<Int.random(in: 0...3, using: &rng) {
            let name = Fuzz.string(using: &rng)
            switch Int.random(in: 0...2, using: &rng) {
            case 0:
                var arrays = ArrayRecord()
                for _ in 0..<Int.random(in: 0...3, using: &rng) { arrays[Fuzz.string(using: &rng)] = array(using: &rng) }
                records[name] = .arrays(arrays)
            case 1:
                var metrics = MetricRecord()
                for _ in 0..<Int.random(in: 0...4, using: &rng) { metrics[Fuzz.string(using: &rng)] = value(using: &rng, metric: true).metric! }
                records[name] = .metrics(metrics)
            default:
                var configs = ConfigRecord()
                for _ in 0..<Int.random(in: 0...4, using: &rng) { configs[Fuzz.string(using: &rng)] = value(using: &rng, metric: false) }
                records[name] = .configs(configs)
            }
        }
        return FlowerMessage(metadata: metadata, body: .content(records))
    }

    static func array(using rng: inout SplitMix64) -> FlowerArray {
        let dtype = NumPyDType.allCases.randomElement(using: &rng)!
        let shape = (0..<Int.random(in: 0...3, using: &rng)).map { _ in Int.random(in: 0...5, using: &rng) }
        let data = (0..<(shape.reduce(1, *) * dtype.itemSize)).map { _ in UInt8.random(in: 0...255, using: &rng) }
        return try! FlowerArray(dtype: dtype, shape: shape, data: data)
    }

    /// A value in the form flwr decodes it to: unsigned only above `Int64.max`, `[]` only as flwr's empty list.
    static func value(using rng: inout SplitMix64, metric: Bool) -> ConfigValue {
        let count = Int.random(in: 1...4, using: &rng)
        let big = { (rng: inout SplitMix64) in UInt64.random(in: (UInt64(Int64.max) + 1)...UInt64.max, using: &rng) }
        switch Int.random(in: 0...(metric ? 6 : 12), using: &rng) {
        case 0: return .int(Int64(bitPattern: rng.next()))
        case 1: return .uint(big(&rng))
        case 2: return .double(Fuzz.number(using: &rng))
        case 3: return .ints((0..<count).map { _ in Int64(bitPattern: rng.next()) })
        case 4: return .uints([big(&rng)] + (0..<count).map { _ in rng.next() })
        case 5: return .doubles((0..<count).map { _ in Fuzz.number(using: &rng) })
        case 6: return metric ? .doubles([]) : .bools([])
        case 7: return .bool(Bool.random(using: &rng))
        case 8: return .string(Fuzz.string(using: &rng))
        case 9: return .bytes(Fuzz.bytes(maximum: 8, using: &rng))
        case 10: return .bools((0..<count).map { _ in Bool.random(using: &rng) })
        case 11: return .strings((0..<count).map { _ in Fuzz.string(using: &rng) })
        default: return .bytesList((0..<count).map { _ in Fuzz.bytes(maximum: 8, using: &rng) })
        }
    }
}

// The generators do not shrink; with shrinking off every issue is reported as it happens.
@Suite(.shrinking(false)) struct ObjectDecoderPropertyTests {
    @Test func randomMessagesSurviveDeflatingAndInflatingWithAnyChunkSize() async {
        await propertyCheck(count: 300, input: fuzzed { rng in (FlowerGen.message(using: &rng), Int.random(in: 1...300, using: &rng)) }) { input throws in
            let (message, chunkSize) = input
            let deflated = FlowerObjects.deflate(message, chunkSize: chunkSize)
            var expected = message
            expected.metadata.messageID = deflated.messageID
            #expect(try FlowerObjects.inflate(messageID: deflated.messageID, objects: deflated.objects) == expected)
            #expect(FlowerObjects.objectIDs(in: deflated.objectTree) == deflated.pushOrder)
        }
    }

    @Test func arbitraryBytesAreAMessageOrAFlowerError() async {
        await propertyCheck(
            count: 500,
            input: fuzzed { rng in
                let body = Fuzz.bytes(maximum: 256, using: &rng)
                let prefix = ["", "Message  \(body.count)\u{0}", "Message \(String(repeating: "a", count: 64)) \(body.count)\u{0}"].randomElement(using: &rng)!
                return Array(prefix.utf8) + body
            }
        ) { bytes in
            // `inflate` throws only `FlowerError` (typed throws); the property is that it returns.
            _ = try? FlowerObjects.inflate(messageID: FlowerObjects.objectID(of: bytes), objects: [FlowerObjects.objectID(of: bytes): bytes])
            _ = try? NPY.decode(bytes)
        }
    }

    @Test func damagedFixturesAreAMessageOrAFlowerError() async throws {
        let fixtures = try FlowerFixtures.messageNames.map { ObjectSet(try FlowerFixtures.message($0)) }
        var codes: [String: Int] = [:]
        await propertyCheck(
            count: 1500,
            input: fuzzed { rng in
                var set = fixtures.randomElement(using: &rng)!
                for _ in 0..<Int.random(in: 1...2, using: &rng) { ObjectMutation.allCases.randomElement(using: &rng)!.apply(to: &set, using: &rng) }
                return set
            }
        ) { set in
            codes[set.error().map(\.code.description) ?? "ok", default: 0] += 1
        }
        // The damage reaches every layer: ids, headers, JSON and protobuf bodies, chunks, the .npy data.
        #expect(
            Set(codes.keys).isSuperset(of: [
                "ok", "object_id_mismatch", "missing_object", "invalid_object", "invalid_npy", "shape_mismatch", "unsupported_dtype",
            ]), "\(codes)")
    }

    @Test func damagedNPYFilesAreAnArrayOrAFlowerError() async throws {
        let files = try FlowerFixtures.npy().written.map { FlowerFixtures.bytes($0.npy) }
        await propertyCheck(
            count: 1000,
            input: fuzzed { rng in
                var bytes = files.randomElement(using: &rng)!
                switch Int.random(in: 0...2, using: &rng) {
                case 0: bytes[Int.random(in: bytes.indices, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
                case 1: bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &rng)))
                default:
                    // A character of the header text replaced, so the literal parser sees every kind of damage.
                    let index = Int.random(in: 10..<min(bytes.count, 128), using: &rng)
                    bytes[index] = Array("'\"(),:{}[] -0123456789TrueFalseL<|f\\\n".utf8).randomElement(using: &rng)!
                }
                return bytes
            }
        ) { bytes in
            do throws(FlowerError) {
                let array = try NPY.decode(bytes)
                #expect(array.data.count == array.count * array.dtype.itemSize)
            } catch {
                #expect(["invalid_npy", "shape_mismatch", "unsupported_dtype", "unsupported_encoding"].contains(error.code.description), "\(error)")
            }
        }
    }
}

import Foundation
public import OrchardProtocol

/// One way a JSON value breaks a schema: where (a JSON path such as `$.layers[0].units`) and what.
public struct SchemaViolation: Sendable, Hashable, CustomStringConvertible {
    /// The JSON path of the offending value.
    public var path: String
    /// What is wrong.
    public var message: String

    /// Creates a violation.
    public init(path: String, message: String) {
        self.path = path
        self.message = message
    }

    public var description: String { "\(path): \(message)" }
}

/// A JSON-Schema validator for the subset `openapi.json` uses (OpenAPI 3.0 schema objects): `type` (a string or an
/// array), `nullable`, `enum`, `properties`, `required`, `additionalProperties` (a boolean or a schema), `items`,
/// `minItems`/`maxItems`, `pattern`, `minLength`/`maxLength` (in Unicode scalars), `minimum`/`maximum` with
/// `exclusiveMinimum`/`exclusiveMaximum` (OpenAPI 3.0 booleans or JSON Schema numbers), `$ref` (local `#/…`
/// pointers), `oneOf`, `anyOf`, `allOf`. `format`, `default`, `description` and `x-…` extensions are annotations.
public struct JSONSchemaValidator: Sendable {
    /// The keywords the validator understands; ``unsupportedKeywords(in:)`` reports any other.
    public static let supportedKeywords: Set<String> = [
        "type", "nullable", "enum", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
        "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "$ref",
        "oneOf", "anyOf", "allOf", "format", "default", "description", "title", "example",
    ]

    /// The document `$ref`s resolve in.
    public let root: JSONValue
    private let patterns: PatternCache

    /// Creates a validator whose `$ref`s resolve in `root` (e.g. a whole OpenAPI document).
    public init(root: JSONValue) {
        self.root = root
        self.patterns = PatternCache()
    }

    /// The value a local JSON pointer (`#/components/schemas/X`) names, or nil.
    public func resolve(_ reference: String) -> JSONValue? {
        guard reference.hasPrefix("#") else { return nil }
        var node = root
        for raw in reference.dropFirst().split(separator: "/", omittingEmptySubsequences: true) {
            let token = raw.replacingOccurrences(of: "~1", with: "/").replacingOccurrences(of: "~0", with: "~")
            switch node {
            case .object(let object):
                guard let next = object[token] else { return nil }
                node = next
            case .array(let array):
                guard let index = Int(token), array.indices.contains(index) else { return nil }
                node = array[index]
            default:
                return nil
            }
        }
        return node
    }

    /// Every violation of `schema` by `instance` (empty when it conforms).
    public func validate(_ instance: JSONValue, against schema: JSONValue, at path: String = "$") -> [SchemaViolation] {
        var violations: [SchemaViolation] = []
        check(instance, schema, path, &violations, depth: 0)
        return violations
    }

    private func check(_ instance: JSONValue, _ schema: JSONValue, _ path: String, _ out: inout [SchemaViolation], depth: Int) {
        guard depth < 64 else {
            out.append(SchemaViolation(path: path, message: "schema nesting too deep (a $ref cycle?)"))
            return
        }
        guard case .object(let s) = schema else {
            if case .bool(false) = schema { out.append(SchemaViolation(path: path, message: "no value is allowed here")) }
            return
        }
        func fail(_ message: String) { out.append(SchemaViolation(path: path, message: message)) }

        if case .string(let reference)? = s["$ref"] {
            guard let target = resolve(reference) else { return fail("$ref '\(reference)' does not resolve") }
            check(instance, target, path, &out, depth: depth + 1)
            return
        }
        if case .null = instance, s["nullable"] == .bool(true) { return }

        if let type = s["type"] {
            let allowed: [String] =
                switch type {
                case .string(let one): [one]
                case .array(let many): many.compactMap(\.stringValue)
                default: []
                }
            if !allowed.contains(where: { Self.matches(instance, type: $0) }) {
                return fail("expected \(allowed.joined(separator: " or ")), found \(Self.kind(of: instance))")
            }
        }
        if case .array(let options)? = s["enum"], !options.contains(where: { Self.equal($0, instance) }) {
            fail("\(Self.render(instance)) is not one of \(options.map { Self.render($0) }.joined(separator: ", "))")
        }

        switch instance {
        case .string(let text):
            let length = text.unicodeScalars.count
            if let minimum = s["minLength"]?.numberValue, Double(length) < minimum {
                fail("length \(length) is below minLength \(Self.render(.number(minimum)))")
            }
            if let maximum = s["maxLength"]?.numberValue, Double(length) > maximum {
                fail("length \(length) is above maxLength \(Self.render(.number(maximum)))")
            }
            if case .string(let pattern)? = s["pattern"] {
                if let expression = patterns.expression(pattern) {
                    let range = NSRange(text.startIndex..<text.endIndex, in: text)
                    if expression.firstMatch(in: text, range: range) == nil { fail("\(Self.render(instance, limit: 60)) does not match /\(pattern)/") }
                } else {
                    fail("pattern /\(pattern)/ does not compile")
                }
            }
        case .number(let value):
            if let minimum = s["minimum"]?.numberValue {
                let exclusive = s["exclusiveMinimum"] == .bool(true)
                if exclusive ? !(value > minimum) : !(value >= minimum) {
                    fail("\(Self.render(instance)) is below the minimum \(Self.render(.number(minimum)))\(exclusive ? " (exclusive)" : "")")
                }
            }
            if let minimum = s["exclusiveMinimum"]?.numberValue, !(value > minimum) {
                fail("\(Self.render(instance)) is not above \(Self.render(.number(minimum)))")
            }
            if let maximum = s["maximum"]?.numberValue {
                let exclusive = s["exclusiveMaximum"] == .bool(true)
                if exclusive ? !(value < maximum) : !(value <= maximum) {
                    fail("\(Self.render(instance)) is above the maximum \(Self.render(.number(maximum)))\(exclusive ? " (exclusive)" : "")")
                }
            }
            if let maximum = s["exclusiveMaximum"]?.numberValue, !(value < maximum) {
                fail("\(Self.render(instance)) is not below \(Self.render(.number(maximum)))")
            }
        case .array(let items):
            if let minimum = s["minItems"]?.numberValue, Double(items.count) < minimum {
                fail("\(items.count) items, fewer than minItems \(Self.render(.number(minimum)))")
            }
            if let maximum = s["maxItems"]?.numberValue, Double(items.count) > maximum {
                fail("\(items.count) items, more than maxItems \(Self.render(.number(maximum)))")
            }
            if let itemSchema = s["items"] {
                for (index, item) in items.enumerated() { check(item, itemSchema, "\(path)[\(index)]", &out, depth: depth + 1) }
            }
        case .object(let members):
            if case .array(let required)? = s["required"] {
                for case .string(let key) in required where members[key] == nil { fail("required property '\(key)' is missing") }
            }
            var properties: [String: JSONValue] = [:]
            if case .object(let declared)? = s["properties"] { properties = declared }
            for key in members.keys.sorted() {
                let child = "\(path).\(key)"
                if let propertySchema = properties[key] {
                    check(members[key]!, propertySchema, child, &out, depth: depth + 1)
                } else if let additional = s["additionalProperties"] {
                    if additional == .bool(false) {
                        out.append(SchemaViolation(path: child, message: "property '\(key)' is not allowed"))
                    } else if case .object = additional {
                        check(members[key]!, additional, child, &out, depth: depth + 1)
                    }
                }
            }
        default:
            break
        }

        if case .array(let all)? = s["allOf"] {
            for part in all { check(instance, part, path, &out, depth: depth + 1) }
        }
        if case .array(let options)? = s["anyOf"] {
            let failures = options.map { validate(instance, against: $0, depth: depth + 1, path: path) }
            if !failures.contains(where: \.isEmpty) {
                fail("matches none of anyOf: " + failures.map { $0.map(\.description).joined(separator: "; ") }.joined(separator: " | "))
            }
        }
        if case .array(let one)? = s["oneOf"] {
            let failures = one.map { validate(instance, against: $0, depth: depth + 1, path: path) }
            let matching = failures.filter(\.isEmpty).count
            if matching == 0 {
                fail("matches none of oneOf: " + failures.map { $0.map(\.description).joined(separator: "; ") }.joined(separator: " | "))
            } else if matching > 1 {
                fail("matches \(matching) of oneOf, not exactly one")
            }
        }
    }

    private func validate(_ instance: JSONValue, against schema: JSONValue, depth: Int, path: String) -> [SchemaViolation] {
        var out: [SchemaViolation] = []
        check(instance, schema, path, &out, depth: depth)
        return out
    }

    /// Keywords in `schema` (and every schema nested in it, `$ref`s not followed) that this validator does not
    /// understand, as `path: keyword`.
    public static func unsupportedKeywords(in schema: JSONValue, at path: String = "$") -> [String] {
        guard case .object(let s) = schema else { return [] }
        var found: [String] = []
        for key in s.keys.sorted() where !supportedKeywords.contains(key) && !key.hasPrefix("x-") {
            found.append("\(path): \(key)")
        }
        if case .object(let properties)? = s["properties"] {
            for (name, child) in properties { found += unsupportedKeywords(in: child, at: "\(path).properties.\(name)") }
        }
        for key in ["items", "additionalProperties"] {
            if let child = s[key] { found += unsupportedKeywords(in: child, at: "\(path).\(key)") }
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            if case .array(let children)? = s[key] {
                for (index, child) in children.enumerated() { found += unsupportedKeywords(in: child, at: "\(path).\(key)[\(index)]") }
            }
        }
        return found
    }

    static func matches(_ value: JSONValue, type: String) -> Bool {
        switch (type, value) {
        case ("object", .object), ("array", .array), ("string", .string), ("boolean", .bool), ("null", .null): true
        case ("number", .number(let number)): number.isFinite
        case ("integer", .number(let number)): number.isFinite && number.rounded(.towardZero) == number
        default: false
        }
    }

    static func kind(of value: JSONValue) -> String {
        switch value {
        case .null: "null"
        case .bool: "boolean"
        case .number(let number): number.rounded(.towardZero) == number ? "integer" : "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }

    static func equal(_ a: JSONValue, _ b: JSONValue) -> Bool { a == b }

    static func render(_ value: JSONValue, limit: Int = 200) -> String {
        let text: String
        switch value {
        case .number(let number) where number.rounded(.towardZero) == number && abs(number) < 1e15: text = String(Int64(number))
        default:
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            text = (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "\(value)"
        }
        return text.count > limit ? String(text.prefix(limit)) + "…" : text
    }
}

extension JSONValue {
    /// The number this value holds, if it is one.
    public var numberValue: Double? {
        if case .number(let value) = self { return value }
        return nil
    }

    /// The string this value holds, if it is one.
    public var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    /// The members of this object, if it is one.
    public var objectValue: [String: JSONValue]? {
        if case .object(let value) = self { return value }
        return nil
    }

    /// The value of member `key`, if this is an object that has it.
    public subscript(key: String) -> JSONValue? { objectValue?[key] }

    /// Parses JSON text (any value at the top level).
    public static func parse(_ bytes: some Sequence<UInt8>) throws -> JSONValue {
        try JSONDecoder().decode(JSONValue.self, from: Data(bytes))
    }
}

/// Compiled regular expressions, shared by copies of a validator (an `NSRegularExpression` is immutable and safe to
/// match from any thread; the dictionary is guarded by the lock).
private final class PatternCache: @unchecked Sendable {
    private let lock = NSLock()
    private var cache: [String: NSRegularExpression?] = [:]

    func expression(_ pattern: String) -> NSRegularExpression? {
        lock.lock()
        defer { lock.unlock() }
        if let known = cache[pattern] { return known }
        let compiled = try? NSRegularExpression(pattern: pattern)
        cache[pattern] = compiled
        return compiled
    }
}

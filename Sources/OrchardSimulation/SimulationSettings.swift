/// A run's settings as the command line gave them, defaults filled in (`settings` in `summary.json`). In Swift each is
/// the text of its value; in the file numbers are JSON numbers and flags JSON booleans, so scripts read them as they are.
/// Two settings are equal when their texts are, or both are numbers of equal value (`60` and `60.0`).
public struct SimulationSettings: Sendable, Codable, Hashable, ExpressibleByDictionaryLiteral {
    /// Each setting's value as text.
    public var values: [String: String]

    /// Settings from their texts.
    public init(_ values: [String: String]) { self.values = values }

    /// A setting's name.
    public typealias Key = String
    /// A setting's text.
    public typealias Value = String

    /// Settings from a literal.
    public init(dictionaryLiteral elements: (String, String)...) {
        values = Dictionary(elements, uniquingKeysWith: { _, last in last })
    }

    /// A setting's value as text.
    public subscript(key: String) -> String? {
        get { values[key] }
        set { values[key] = newValue }
    }

    /// The settings' names.
    public var keys: Dictionary<String, String>.Keys { values.keys }

    /// A number, when the text is one (and finite).
    private static func number(_ text: String) -> Double? {
        guard let value = Double(text), value.isFinite else { return nil }
        return value
    }

    public static func == (a: SimulationSettings, b: SimulationSettings) -> Bool {
        guard a.values.count == b.values.count else { return false }
        for (key, x) in a.values {
            guard let y = b.values[key] else { return false }
            if x == y { continue }
            guard let u = number(x), let v = number(y), u == v else { return false }
        }
        return true
    }

    public func hash(into hasher: inout Hasher) {
        for key in values.keys.sorted() {
            hasher.combine(key)
            if let value = values[key].flatMap(Self.number) { hasher.combine(value) } else { hasher.combine(values[key]) }
        }
    }

    private struct Name: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Name.self)
        for (name, text) in values {
            let key = Name(stringValue: name)
            if let integer = Int(text) {
                try container.encode(integer, forKey: key)
            } else if let integer = UInt64(text) {
                try container.encode(integer, forKey: key)
            } else if let value = Self.number(text), text.first.map({ $0.isNumber || $0 == "-" || $0 == "." }) == true {
                try container.encode(value, forKey: key)
            } else if text == "true" || text == "false" {
                try container.encode(text == "true", forKey: key)
            } else {
                try container.encode(text, forKey: key)
            }
        }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Name.self)
        var values: [String: String] = [:]
        for key in container.allKeys {
            if let integer = try? container.decode(Int.self, forKey: key) {
                values[key.stringValue] = String(integer)
            } else if let integer = try? container.decode(UInt64.self, forKey: key) {
                values[key.stringValue] = String(integer)
            } else if let number = try? container.decode(Double.self, forKey: key) {
                values[key.stringValue] = String(number)
            } else if let flag = try? container.decode(Bool.self, forKey: key) {
                values[key.stringValue] = String(flag)
            } else {
                values[key.stringValue] = try container.decode(String.self, forKey: key)
            }
        }
        self.values = values
    }
}

/// A dictionary that keeps its names in insertion order, as Flower's records (Python dicts) do: the order is part
/// of the encoding, so it is part of equality too. Setting an existing name replaces its value in place; setting
/// `nil` removes it. As a collection it holds the `(name, value)` pairs in order.
public struct FlowerDict<Value: Sendable & Equatable>: Sendable, Equatable, RandomAccessCollection, ExpressibleByDictionaryLiteral {
    /// The names, in insertion order.
    public private(set) var names: [String] = []
    private var values: [String: Value] = [:]

    /// An empty dictionary.
    public init() {}

    /// The pairs in order; a repeated name keeps its first position and its last value.
    public init(_ items: some Sequence<(String, Value)>) {
        for (name, value) in items { self[name] = value }
    }

    /// The literal's pairs in order.
    public init(dictionaryLiteral elements: (String, Value)...) { self.init(elements) }

    /// The value of `name`; assigning appends a new name, replaces an existing one's value, or (`nil`) removes it.
    public subscript(name: String) -> Value? {
        get { values[name] }
        set {
            if let newValue {
                if values.updateValue(newValue, forKey: name) == nil { names.append(name) }
            } else if values.removeValue(forKey: name) != nil {
                names.removeAll { $0 == name }
            }
        }
    }

    /// The position of the first pair.
    public var startIndex: Int { 0 }
    /// The position after the last pair.
    public var endIndex: Int { names.count }

    /// The pair at `position`.
    public subscript(position: Int) -> (name: String, value: Value) { (names[position], values[names[position]]!) }

    /// The pairs whose value `transform` maps to a value, in order.
    public func compactMapValues<T>(_ transform: (Value) throws -> T?) rethrows -> FlowerDict<T> {
        var out = FlowerDict<T>()
        for (name, value) in self {
            if let mapped = try transform(value) { out[name] = mapped }
        }
        return out
    }
}

/// Flower's `ArrayRecord`: named arrays, typically a model's weights.
public typealias ArrayRecord = FlowerDict<FlowerArray>
/// Flower's `MetricRecord`: named numbers and lists of numbers, e.g. `num-examples` and `loss`.
public typealias MetricRecord = FlowerDict<MetricValue>
/// Flower's `ConfigRecord`: named settings of any scalar type, or lists of one type.
public typealias ConfigRecord = FlowerDict<ConfigValue>
/// Flower's `RecordDict`: a message's content, named records of the three kinds.
public typealias RecordDict = FlowerDict<FlowerRecord>

/// A value of a `MetricRecord`: an integer or a float, or a list of one of them.
///
/// Flower's integers are Python's: those above `Int64.max` travel as unsigned. ``uint(_:)`` and ``uints(_:)`` are
/// for those; a value that fits `Int64` is encoded and decoded as ``int(_:)``/``ints(_:)``, as flwr does, and an
/// empty list of any kind as ``doubles(_:)`` (flwr's first choice for `[]`).
public enum MetricValue: Sendable, Hashable {
    /// A number: an integer (signed, or unsigned above `Int64.max`) or a float.
    case int(Int64), uint(UInt64), double(Double)
    /// A list of numbers of one kind.
    case ints([Int64]), uints([UInt64]), doubles([Double])
}

/// A value of a `ConfigRecord`: a bool, integer, float, string or bytes, or a list of one of them.
///
/// As with ``MetricValue``, unsigned integers are for values above `Int64.max`; an empty list of any kind is
/// encoded and decoded as ``bools(_:)`` (flwr's first choice for `[]` in a config).
public enum ConfigValue: Sendable, Hashable {
    /// A scalar: a bool, an integer (signed, or unsigned above `Int64.max`), a float, a string or bytes.
    case bool(Bool), int(Int64), uint(UInt64), double(Double), string(String), bytes([UInt8])
    /// A list of scalars of one kind.
    case bools([Bool]), ints([Int64]), uints([UInt64]), doubles([Double]), strings([String]), bytesList([[UInt8]])

    /// The metric value as a config value.
    public init(_ metric: MetricValue) {
        switch metric {
        case .int(let value): self = .int(value)
        case .uint(let value): self = .uint(value)
        case .double(let value): self = .double(value)
        case .ints(let values): self = .ints(values)
        case .uints(let values): self = .uints(values)
        case .doubles(let values): self = .doubles(values)
        }
    }

    /// The value as a metric, when it is a number or a list of numbers.
    public var metric: MetricValue? {
        switch self {
        case .int(let value): .int(value)
        case .uint(let value): .uint(value)
        case .double(let value): .double(value)
        case .ints(let values): .ints(values)
        case .uints(let values): .uints(values)
        case .doubles(let values): .doubles(values)
        case .bool, .string, .bytes, .bools, .strings, .bytesList: nil
        }
    }

    /// The value as flwr writes it: unsigned integers that fit `Int64` as signed, and an empty list as `empty`.
    func canonical(empty: ConfigValue) -> ConfigValue {
        switch self {
        case .uint(let value) where value <= UInt64(Int64.max): .int(Int64(value))
        case .uints(let values) where values.allSatisfy({ $0 <= UInt64(Int64.max) }): values.isEmpty ? empty : .ints(values.map { Int64($0) })
        case .bools([]), .ints([]), .doubles([]), .strings([]), .bytesList([]): empty
        default: self
        }
    }
}

/// One record of a `RecordDict`.
public enum FlowerRecord: Sendable, Equatable {
    /// An `ArrayRecord`, a `MetricRecord` or a `ConfigRecord`.
    case arrays(ArrayRecord), metrics(MetricRecord), configs(ConfigRecord)

    /// The record when it is an `ArrayRecord`.
    public var arrayRecord: ArrayRecord? { if case .arrays(let record) = self { record } else { nil } }
    /// The record when it is a `MetricRecord`.
    public var metricRecord: MetricRecord? { if case .metrics(let record) = self { record } else { nil } }
    /// The record when it is a `ConfigRecord`.
    public var configRecord: ConfigRecord? { if case .configs(let record) = self { record } else { nil } }
}

extension FlowerDict where Value == FlowerRecord {
    /// The `ArrayRecord`s, in order (flwr's `array_records`).
    public var arrayRecords: FlowerDict<ArrayRecord> { compactMapValues(\.arrayRecord) }
    /// The `MetricRecord`s, in order (flwr's `metric_records`).
    public var metricRecords: FlowerDict<MetricRecord> { compactMapValues(\.metricRecord) }
    /// The `ConfigRecord`s, in order (flwr's `config_records`).
    public var configRecords: FlowerDict<ConfigRecord> { compactMapValues(\.configRecord) }
}

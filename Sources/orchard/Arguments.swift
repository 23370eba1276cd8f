// Public imports: a public library type's conformance to ExpressibleByArgument is public.
public import ArgumentParser
import Foundation
public import Logging
public import OrchardBenchmarks
public import OrchardCoordinator
public import OrchardCoreML
public import OrchardData
public import OrchardML
public import OrchardProtocol
public import OrchardSimulation

// Options with a fixed set of values take these types, so `--help` lists the values and a wrong value gets the
// parser's error ("The value 'x' is invalid for '--durability <durability>'. Please provide one of 'normal' and
// 'full'."). Library types are named by their `description`; they are conformed here rather than in their
// libraries, which do not depend on ArgumentParser (Logger.Level, from another package, retroactively).

/// The one of `T.allCases` whose `description` is `argument`.
func described<T: CaseIterable & CustomStringConvertible>(_ argument: String) -> T? {
    T.allCases.first { $0.description == argument }
}

extension SQLiteStore.Durability: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.normal, .full] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

extension CoordinatorBenchmark.CheckinTarget: ExpressibleByArgument {}

extension MatrixBackend: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.automatic, .avx2, .avx512, .blas, .portable] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension CoreMLArrayDataType: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.double, .float32] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension AggregationMode: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.synchronous, .buffered] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension AggregatorConfig.Kind: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.fedAvg, .fedAvgM, .fedAdam, .fedYogi] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension ModelChoice: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.housing, .mlp2nn, .cnn, .charLSTM] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension TransportChoice: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.http, .memory] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension TurnedAwayChoice: CaseIterable, ExpressibleByArgument {
    public static var allCases: [Self] { [.modeled, .fullStack] }

    public init?(argument: String) {
        guard let value: Self = described(argument) else { return nil }
        self = value
    }
}

extension DatasetChoice: ExpressibleByArgument {
    public init?(argument: String) {
        guard let value = try? DatasetChoice(parsing: argument) else { return nil }
        self = value
    }

    public static var allValueStrings: [String] { ["housing", "fashion-mnist", "kjv", "idx:PATH"] }
}

extension PartitionStrategy: ExpressibleByArgument {
    public init?(argument: String) {
        guard let value = try? PartitionStrategy(parsing: argument) else { return nil }
        self = value
    }

    public static var allValueStrings: [String] { ["iid", "shards", "dirichlet:α", "sampled:N"] }
}

/// `--availability`: `always`, `diurnal`, `realistic` or `trace:FILE`; the trace file is read when the command runs, so a
/// missing or malformed file is reported with its reason.
enum AvailabilityArgument: ExpressibleByArgument, CustomStringConvertible {
    case always
    case diurnal
    case realistic
    case trace(path: String)

    init?(argument: String) {
        switch argument {
        case "always": self = .always
        case "diurnal": self = .diurnal
        case "realistic": self = .realistic
        case _ where argument.hasPrefix("trace:") && argument.count > "trace:".count: self = .trace(path: String(argument.dropFirst("trace:".count)))
        default: return nil
        }
    }

    static var allValueStrings: [String] { ["always", "diurnal", "realistic", "trace:FILE"] }

    var description: String {
        switch self {
        case .always: "always"
        case .diurnal: "diurnal"
        case .realistic: "realistic"
        case .trace(let path): "trace:\(path)"
        }
    }

    /// The availability, reading a trace file.
    func availability() throws(SimulationError) -> Availability {
        switch self {
        case .always: .always
        case .diurnal: .diurnal
        case .realistic: .realistic
        case .trace(let path): .trace(try AvailabilityTrace.read(contentsOf: URL(fileURLWithPath: path)))
        }
    }
}

/// A library error message that starts with a configuration field's name, with that name replaced by the option
/// that sets it (`flags` maps field names to options); other messages are returned unchanged.
func namingOption(_ message: String, _ flags: [String: String]) -> String {
    guard let (field, flag) = flags.first(where: { message.hasPrefix($0.key + " ") }) else { return message }
    return flag + message.dropFirst(field.count)
}

/// Sends every logger's output to standard error from `level` up (standard output carries commands' status lines).
func bootstrapStandardErrorLogging(level: Logger.Level) {
    LoggingSystem.bootstrap { label in
        var handler = StreamLogHandler.standardError(label: label)
        handler.logLevel = level
        return handler
    }
}

/// A positive, finite number of seconds given for `option`, as a duration (a NaN or infinite `Double` cannot become one).
func positiveSeconds(_ value: Double, option: String) throws -> Duration {
    guard value > 0, value.isFinite else { throw ValidationError("\(option) must be a positive number of seconds, not \(value)") }
    return .seconds(value)
}

extension AttackKind: ExpressibleByArgument {}

extension RobustAggregationConfig: ExpressibleByArgument {
    public init?(argument: String) {
        guard let value = try? RobustAggregationConfig(parsing: argument) else { return nil }
        self = value
    }

    public static var allValueStrings: [String] { ["median", "trimmed-mean:β", "multi-krum:f", "multi-krum:f:m"] }
}

extension TextPartition: ExpressibleByArgument {}

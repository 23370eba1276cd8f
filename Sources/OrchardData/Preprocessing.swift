public import OrchardSupport
public import Foundation
public import OrchardML

/// What an ``OrdinalEncoder`` does with a category it did not see when it was fitted.
public struct UnknownCategoryPolicy: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable, Codable { case error, reservedIndex }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Encoding an unseen category throws ``DataError/Code/unknownCategory``.
    public static let error = UnknownCategoryPolicy(.error)
    /// Unseen categories map to one extra index, `categories.count`, which the model's embedding must hold
    /// (``OrdinalEncoder/vocabularySize`` counts it). Its row is never trained on the fitted data.
    public static let reservedIndex = UnknownCategoryPolicy(.reservedIndex)

    /// Whether an extra index is reserved for unseen categories.
    public var reservesIndex: Bool { kind == .reservedIndex }

    public var description: String { kind.rawValue }

    public init(from decoder: any Decoder) throws { kind = try Kind(from: decoder) }
    public func encode(to encoder: any Encoder) throws { try kind.encode(to: encoder) }
}

/// Maps category labels to indices `0..<count`, fitted on training data.
///
/// Categories are ordered numerically when every label is a number (so `RAD` 1…8, 24 keeps its order) and
/// lexicographically otherwise, so the mapping depends only on the set of labels, not on row order.
public struct OrdinalEncoder: Sendable, Hashable, Codable {
    /// The fitted categories; a category's index is its position here.
    public let categories: [String]
    /// What encoding an unseen category does.
    public let unknownPolicy: UnknownCategoryPolicy
    private let lookup: [String: Int]

    private enum CodingKeys: String, CodingKey { case categories, unknownPolicy }

    /// Fits the encoder to the labels of a training column.
    /// - Parameters:
    ///   - values: The training labels; at least one.
    ///   - unknownPolicy: What encoding an unseen category does.
    public init(fitting values: [String], unknownPolicy: UnknownCategoryPolicy = .error) throws(DataError) {
        guard !values.isEmpty else { throw DataError(.emptyData, "cannot fit categories to an empty column") }
        let unique = Array(Set(values))
        let numbers = unique.compactMap(Double.init)
        if numbers.count == unique.count {
            // By value, NaN last, ties ("1" and "01") by the text: never in the set's order, which varies run to run.
            categories = zip(numbers, unique).sorted { a, b in
                if a.0.isNaN != b.0.isNaN { return b.0.isNaN }
                if !a.0.isNaN && a.0 != b.0 { return a.0 < b.0 }
                return a.1 < b.1
            }.map(\.1)
        } else {
            categories = unique.sorted()
        }
        self.unknownPolicy = unknownPolicy
        self.lookup = Self.index(categories)
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        categories = try c.decode([String].self, forKey: .categories)
        unknownPolicy = try c.decode(UnknownCategoryPolicy.self, forKey: .unknownPolicy)
        guard !categories.isEmpty, Set(categories).count == categories.count else {
            throw DecodingError.dataCorruptedError(forKey: .categories, in: c, debugDescription: "categories must be non-empty and distinct")
        }
        lookup = Self.index(categories)
    }

    private static func index(_ categories: [String]) -> [String: Int] {
        Dictionary(uniqueKeysWithValues: categories.enumerated().map { ($1, $0) })
    }

    /// The number of indices the encoder produces: the categories, plus one when an index is reserved.
    public var vocabularySize: Int { categories.count + (unknownPolicy.reservesIndex ? 1 : 0) }

    /// The index of `label`.
    /// - Throws: ``DataError/Code/unknownCategory`` for an unseen label under the `.error` policy.
    public func encode(_ label: String) throws(DataError) -> Int {
        if let index = lookup[label] { return index }
        if unknownPolicy.reservesIndex { return categories.count }
        throw DataError(.unknownCategory, "category '\(label)' was not in the training data (known: \(categories.joined(separator: ", ")))")
    }

    /// Encodes a whole column.
    public func encode(_ labels: [String]) throws(DataError) -> [Int] {
        var out: [Int] = []
        out.reserveCapacity(labels.count)
        for label in labels {
            if let index = lookup[label] { out.append(index) } else { out.append(try encode(label)) }
        }
        return out
    }
}

/// Z-score standardisation with the sample standard deviation, fitted on training data.
///
/// `z = (x − mean) / s` with `s = sqrt(Σ(x − mean)² / (n − 1))`. A column whose training values are all equal
/// (s = 0) is only centred (divided by 1): it carries no information in training, and a different value at
/// inference still shows as a deviation instead of becoming infinite.
public struct Standardizer: Sendable, Hashable, Codable {
    /// Per-column means of the training data.
    public let means: [Double]
    /// Per-column sample standard deviations of the training data (0 for constant columns).
    public let standardDeviations: [Double]

    /// Fits means and sample standard deviations to training columns.
    /// - Parameter columns: One array per column, each with the same count, at least two values.
    public init(fitting columns: [[Double]]) throws(DataError) {
        var means: [Double] = []
        var deviations: [Double] = []
        for (i, column) in columns.enumerated() {
            guard column.count >= 2 else {
                throw DataError(.tooFewSamples, "column \(i) has \(column.count) values; a sample standard deviation needs at least 2")
            }
            guard column.count == columns[0].count else {
                throw DataError(.sizeMismatch, "column \(i) has \(column.count) values, column 0 has \(columns[0].count)")
            }
            let mean = column.reduce(0, +) / Double(column.count)
            let squares = column.reduce(0) { $0 + ($1 - mean) * ($1 - mean) }
            means.append(mean)
            deviations.append((squares / Double(column.count - 1)).squareRoot())
        }
        self.means = means
        self.standardDeviations = deviations
    }

    /// Standardises `value` as column `column`.
    public func transform(_ value: Double, column: Int) -> Double {
        let s = standardDeviations[column]
        return (value - means[column]) / (s > 0 ? s : 1)
    }

    /// Maps a standardised value of column `column` back to the original scale.
    public func inverse(_ value: Double, column: Int) -> Double {
        let s = standardDeviations[column]
        return value * (s > 0 ? s : 1) + means[column]
    }
}

/// A row split into training and test positions.
public struct TrainTestSplit: Sendable, Hashable {
    /// Positions of the training rows, in random order.
    public let train: [Int]
    /// Positions of the test rows, in random order.
    public let test: [Int]

    /// Splits `0..<count` at random: a uniform permutation (Fisher–Yates), the first `round(count × testFraction)`
    /// positions for testing.
    /// - Parameters:
    ///   - count: Number of rows.
    ///   - testFraction: Share of rows for testing, in `(0, 1)`; both parts must be non-empty.
    ///   - generator: The seeded source of randomness.
    public init(count: Int, testFraction: Double, using generator: inout OrchardRandom) throws(DataError) {
        guard testFraction > 0, testFraction < 1 else {
            throw DataError(.invalidArgument, "test fraction \(testFraction) is not in (0, 1)")
        }
        let testCount = Int((Double(count) * testFraction).rounded())
        guard testCount > 0, testCount < count else {
            throw DataError(.tooFewSamples, "\(count) rows cannot be split with test fraction \(testFraction)")
        }
        let order = generator.permutation(count)
        test = Array(order[..<testCount])
        train = Array(order[testCount...])
    }
}

/// The preprocessing of a tabular model: which columns feed which input, and the transforms fitted on the
/// training split. Saved with the model (``jsonData()``) so a device applies exactly the same transform.
///
/// Numeric features are standardised (``Standardizer``) and fed together to one input, ``numericInput``, of shape
/// `[numericFeatures.count]`; each categorical feature is ordinal-encoded (``OrdinalEncoder``) and fed to an
/// input of shape `[1]` named after the feature. The target is used as read (regression) and has shape `[1]`.
public struct TabularPreprocessor: Sendable, Hashable, Codable {
    /// The version of the JSON layout.
    public static let currentFormatVersion = 1

    /// The JSON layout version this preprocessor was written with.
    public let formatVersion: Int
    /// Numeric feature columns, in input order.
    public let numericFeatures: [String]
    /// Categorical feature columns; each feeds its own input of the same name.
    public let categoricalFeatures: [String]
    /// The target column.
    public let target: String
    /// The name of the input that receives the standardised numeric features.
    public let numericInput: String
    /// The standardisation of ``numericFeatures``, fitted on the training split.
    public let standardizer: Standardizer
    /// One encoder per categorical feature, parallel to ``categoricalFeatures``.
    public let encoders: [OrdinalEncoder]

    /// Fits the transforms to a training table.
    /// - Parameters:
    ///   - training: The training split only (fitting on all rows would leak test statistics).
    ///   - numeric: Numeric feature columns.
    ///   - categorical: Categorical feature columns.
    ///   - target: The target column.
    ///   - numericInput: The model input that receives the numeric features.
    ///   - unknownCategories: What encoding an unseen category does at inference.
    public init(
        fitting training: Table, numeric: [String], categorical: [String], target: String,
        numericInput: String = "numeric", unknownCategories: UnknownCategoryPolicy = .error
    ) throws(DataError) {
        let names = numeric + categorical + [target]
        guard Set(names).count == names.count else {
            throw DataError(.invalidArgument, "a column is used twice among features and target: \(names.joined(separator: ", "))")
        }
        guard !categorical.contains(numericInput) else {
            throw DataError(.invalidArgument, "numeric input name '\(numericInput)' collides with a categorical feature")
        }
        var columns: [[Double]] = []
        for name in numeric { columns.append(try training.numeric(name)) }
        _ = try training.numeric(target)
        var encoders: [OrdinalEncoder] = []
        for name in categorical {
            encoders.append(try OrdinalEncoder(fitting: try training.categories(name), unknownPolicy: unknownCategories))
        }
        self.formatVersion = Self.currentFormatVersion
        self.numericFeatures = numeric
        self.categoricalFeatures = categorical
        self.target = target
        self.numericInput = numericInput
        self.standardizer = try Standardizer(fitting: columns)
        self.encoders = encoders
    }

    /// The inputs the transformed data feeds: the numeric input first (if any numeric features), then one per
    /// categorical feature.
    public var inputSpecs: [FeatureSpec] {
        (numericFeatures.isEmpty ? [] : [FeatureSpec(name: numericInput, shape: [numericFeatures.count])])
            + categoricalFeatures.map { FeatureSpec(name: $0, shape: [1]) }
    }

    /// The vocabulary size of a categorical feature (what its embedding must hold).
    public func vocabularySize(of feature: String) throws(DataError) -> Int {
        guard let i = categoricalFeatures.firstIndex(of: feature) else {
            throw DataError(.unknownColumn, "'\(feature)' is not a categorical feature")
        }
        return encoders[i].vocabularySize
    }

    /// A value of a categorical feature that training never saw: encoded as the reserved index, which is worth a
    /// warning naming the row (a typo, or data the model was not trained for).
    public struct UnseenCategory: Sendable, Hashable {
        /// The data row (1-based, header and comments not counted).
        public var row: Int
        /// The feature.
        public var column: String
        /// The value.
        public var value: String

        /// Creates a report of an unseen value.
        public init(row: Int, column: String, value: String) {
            self.row = row
            self.column = column
            self.value = value
        }
    }

    /// The values of `table` that the fitted categories lack, where they are encoded as the reserved index (under the
    /// `.error` policy encoding refuses them instead).
    public func unseenCategories(in table: Table) throws(DataError) -> [UnseenCategory] {
        var unseen: [UnseenCategory] = []
        for (name, encoder) in zip(categoricalFeatures, encoders) where encoder.unknownPolicy.reservesIndex {
            let known = Set(encoder.categories)
            for (index, value) in try table.categories(name).enumerated() where !known.contains(value) {
                unseen.append(UnseenCategory(row: index + 1, column: name, value: value))
            }
        }
        return unseen.sorted { ($0.row, $0.column) < ($1.row, $1.column) }
    }

    /// Applies the fitted transforms to a table (training, test, or a device's own rows).
    /// - Returns: A dataset with the inputs of ``inputSpecs`` and the target, shape `[1]`, as read.
    public func transform(_ table: Table) throws(DataError) -> TensorDataset {
        let n = table.rowCount
        var inputs: [String: Tensor] = [:]
        if !numericFeatures.isEmpty {
            let width = numericFeatures.count
            var values = [Float](repeating: 0, count: n * width)
            for (j, name) in numericFeatures.enumerated() {
                let column = try table.numeric(name)
                for i in 0..<n {
                    let value = Float(standardizer.transform(column[i], column: j))
                    // A finite Double can overflow Float (1e39): refused here, never written as infinity.
                    guard value.isFinite else {
                        throw DataError(.malformedValue, "row \(i + 1): \(name) '\(column[i])' is out of the range of a 32-bit float once standardized")
                    }
                    values[i * width + j] = value
                }
            }
            inputs[numericInput] = Tensor(shape: [n, width], scalars: values)
        }
        for (name, encoder) in zip(categoricalFeatures, encoders) {
            let indices = try encoder.encode(try table.categories(name))
            inputs[name] = Tensor(shape: [n, 1], scalars: indices.map(Float.init))
        }
        let targetValues = try table.numeric(target)
        if let row = targetValues.firstIndex(where: { !Float($0).isFinite }) {
            throw DataError(.malformedValue, "row \(row + 1): \(target) '\(targetValues[row])' is out of the range of a 32-bit float")
        }
        let targets = Tensor(shape: [n, 1], scalars: targetValues.map(Float.init))
        do {
            return try TensorDataset(inputs: inputs, targets: targets)
        } catch {
            throw DataError(.sizeMismatch, "cannot build the dataset: \(error.message)")
        }
    }

    /// Encodes the preprocessor as stable JSON with sorted keys.
    public func jsonData() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        return try encoder.encode(self)
    }

    /// Decodes a preprocessor written by ``jsonData()``.
    public static func decode(json: Data) throws(DataError) -> TabularPreprocessor {
        let decoded: TabularPreprocessor
        do {
            decoded = try JSONDecoder().decode(TabularPreprocessor.self, from: json)
        } catch {
            throw DataError(.unreadable, "preprocessor JSON: \(error)")
        }
        guard decoded.formatVersion == currentFormatVersion else {
            throw DataError(.unreadable, "preprocessor format version \(decoded.formatVersion) is not supported (expected \(currentFormatVersion))")
        }
        guard decoded.encoders.count == decoded.categoricalFeatures.count,
            decoded.standardizer.means.count == decoded.numericFeatures.count,
            decoded.standardizer.standardDeviations.count == decoded.numericFeatures.count
        else {
            throw DataError(.sizeMismatch, "preprocessor JSON: fitted transforms do not match the feature lists")
        }
        return decoded
    }
}

extension Table {
    /// Splits the rows at random into training and test tables (see ``TrainTestSplit``).
    public func split(testFraction: Double, using generator: inout OrchardRandom) throws(DataError) -> (train: Table, test: Table) {
        let split = try TrainTestSplit(count: rowCount, testFraction: testFraction, using: &generator)
        return (rows(split.train), rows(split.test))
    }
}

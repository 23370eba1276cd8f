public import Foundation
import OrchardSupport
public import OrchardFormats
public import OrchardML

/// The file a device trains from (`orchard client --data`, `orchard agent --data`): safetensors holding one
/// batch-first F32 tensor per model input, named as the input, and the targets as `target`. `orchard data prepare`
/// writes it from a CSV file with the model's saved preprocessing (``TabularPreprocessor/deviceData(csv:targetColumn:onUnseen:)``).
public enum DeviceDataFile {
    /// The name of the targets' tensor.
    public static let targetName = "target"

    /// The dataset as a device data file.
    public static func encode(_ dataset: TensorDataset, metadata: [String: String] = [:]) -> [UInt8] {
        var records = zip(dataset.inputSpecs, dataset.inputs).map { spec, tensor in
            TensorRecord(name: spec.name, shape: tensor.shape, values: tensor.scalars)
        }
        records.append(TensorRecord(name: targetName, shape: dataset.targets.shape, values: dataset.targets.scalars))
        return Safetensors.encode(records, metadata: metadata)
    }

    /// Reads a device data file (F16/F64 tensors are converted to F32).
    /// - Throws: ``DataError``: `unreadable` (not safetensors), `unknown_column` (no `target`), `empty_data` (no input),
    ///   `size_mismatch` (tensors without the same first dimension).
    public static func decode(_ bytes: some Collection<UInt8>) throws(DataError) -> TensorDataset {
        let archive: SafetensorsArchive
        do throws(FormatError) {
            archive = try Safetensors.decode(bytes, allowConversion: true)
        } catch {
            throw DataError(.unreadable, "not a safetensors file: \(error.message)")
        }
        guard let target = archive[targetName] else {
            throw DataError(.unknownColumn, "no tensor named '\(targetName)' (it has \(archive.tensors.map(\.name).sorted()))")
        }
        var inputs: [String: Tensor] = [:]
        for record in archive.tensors where record.name != targetName {
            inputs[record.name] = Tensor(shape: record.shape, scalars: record.values)
        }
        guard !inputs.isEmpty else { throw DataError(.emptyData, "no input tensors besides '\(targetName)'") }
        do throws(EngineError) {
            return try TensorDataset(inputs: inputs, targets: Tensor(shape: target.shape, scalars: target.values))
        } catch {
            throw DataError(.sizeMismatch, error.message)
        }
    }

    /// Reads the device data file at `url`.
    public static func read(contentsOf url: URL) throws(DataError) -> TensorDataset {
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw DataError(.unreadable, "cannot read \(url.path): \(FileAccessError(error).message)")
        }
        return try decode(data)
    }
}

extension TabularPreprocessor {
    /// Checks that this preprocessing feeds exactly `model`'s inputs: every input it writes is one of the model's,
    /// with the same per-sample shape, and every model input is written.
    /// - Throws: ``DataError`` (`unknown_column`, `size_mismatch`) naming the input.
    public func checkFeeds(_ model: ModelSpec) throws(DataError) {
        let written = Dictionary(inputSpecs.map { ($0.name, $0.shape) }, uniquingKeysWith: { first, _ in first })
        let writes = inputSpecs.map { "\($0.name) \($0.shape)" }.joined(separator: ", ")
        for input in model.inputs {
            guard let shape = written[input.name] else {
                throw DataError(.unknownColumn, "the model's input '\(input.name)' is not written by its preprocessing (which writes \(writes))")
            }
            guard shape == input.shape else {
                throw DataError(.sizeMismatch, "the model's input '\(input.name)' has shape \(input.shape); its preprocessing writes \(shape)")
            }
        }
        let inputs = Set(model.inputs.map(\.name))
        if let extra = inputSpecs.first(where: { !inputs.contains($0.name) }) {
            throw DataError(.unknownColumn, "the preprocessing writes input '\(extra.name)', which the model '\(model.name)' does not have")
        }
    }

    /// How a CSV file with these columns must be read for this preprocessing: numeric features and the target as
    /// numbers, every other column as text — categorical features too (ids, notes, columns the model does not use).
    public func readerConfiguration(columns: [String], targetColumn: String? = nil) -> TabularReader.Configuration {
        let numeric = Set(numericFeatures + [targetColumn ?? target])
        return TabularReader.Configuration(textColumns: Set(columns.filter { !numeric.contains($0) }))
    }

    /// `table` with the labels of each categorical feature whose fitted categories are numbers in canonical form
    /// written canonically too (so `1.0` matches the category `1`); a label that is no finite number (`NA`, empty)
    /// stays as it is: an unseen category, which the encoder's policy decides on.
    func canonicalNumericCategories(_ table: Table) throws(DataError) -> Table {
        var columns = table.columns
        for (name, encoder) in zip(categoricalFeatures, encoders)
        where encoder.categories.allSatisfy({ Double($0).map(Table.categoryLabel) == $0 }) {
            let index = try table.columnIndex(name)
            guard case .text(let labels) = columns[index] else { continue }
            columns[index] = .text(labels.map { label in Double(label).flatMap { $0.isFinite ? Table.categoryLabel($0) : nil } ?? label })
        }
        return try Table(columnNames: table.columnNames, columns: columns)
    }

    /// A device's rows from a CSV file with a header line, transformed exactly as the training rows were.
    /// - Parameters:
    ///   - csv: The file: a header naming the columns, one row per sample.
    ///   - targetColumn: The column holding the target, when it is not named as in training (``target``).
    ///   - onUnseen: Told of each categorical value training never saw (encoded as the reserved index), once the rows
    ///     became data.
    /// - Returns: One tensor per model input (``inputSpecs``) and the targets.
    /// - Throws: ``DataError`` naming the line and column of a bad value, a missing column, an unknown category.
    public func deviceData(csv: URL, targetColumn: String? = nil, onUnseen: (UnseenCategory) -> Void = { _ in }) throws(DataError) -> TensorDataset {
        let data: Data
        do {
            data = try Data(contentsOf: csv)
        } catch {
            throw DataError(.unreadable, "cannot read \(csv.path): \(FileAccessError(error).message)")
        }
        guard let text = String(data: data, encoding: .utf8) else { throw DataError(.unreadable, "\(csv.path) is not UTF-8 text") }
        return try deviceData(csvText: text, targetColumn: targetColumn, onUnseen: onUnseen)
    }

    /// ``deviceData(csv:targetColumn:onUnseen:)`` on text in memory.
    public func deviceData(csvText text: String, targetColumn: String? = nil, onUnseen: (UnseenCategory) -> Void = { _ in }) throws(DataError) -> TensorDataset
    {
        // The header alone first, to know which columns to read as text.
        let configuration = TabularReader.Configuration()
        let headerLine = text.split(whereSeparator: \.isNewline).first { line in
            !line.allSatisfy(\.isWhitespace) && !(configuration.commentPrefix.map { line.drop(while: \.isWhitespace).hasPrefix($0) } ?? false)
        }
        guard let headerLine else { throw DataError(.emptyData, "the CSV file is empty (it needs a header line naming the columns)") }
        let columns = try TabularReader(configuration: configuration).read(text: String(headerLine)).columnNames
        var table = try canonicalNumericCategories(
            try TabularReader(configuration: readerConfiguration(columns: columns, targetColumn: targetColumn)).read(text: text))
        guard table.rowCount > 0 else { throw DataError(.emptyData, "the CSV file has a header but no rows") }
        if let targetColumn, targetColumn != target {
            _ = try table.columnIndex(targetColumn)
            guard !table.columnNames.contains(target) else {
                throw DataError(
                    .invalidArgument, "the CSV file has a column '\(target)' (the target in training) besides the target column '\(targetColumn)'; rename one")
            }
            table = try Table(columnNames: table.columnNames.map { $0 == targetColumn ? target : $0 }, columns: table.columns)
        }
        let data = try transform(table)
        // Warnings only for rows that became data: a file refused for another reason says that alone.
        for unseen in try unseenCategories(in: table) { onUnseen(unseen) }
        return data
    }
}

public import Foundation
import OrchardSupport
public import OrchardFormats

/// The difference between two models' parameters, by name: `trained − original`.
public struct ParameterDiff: Sendable, Hashable {
    /// Parameter name → element-wise difference.
    public var deltas: [String: Tensor]

    /// Creates a diff from deltas.
    public init(deltas: [String: Tensor]) { self.deltas = deltas }

    /// Creates a diff from safetensors records (as a server ships them).
    public init(records: [TensorRecord]) {
        deltas = Dictionary(uniqueKeysWithValues: records.map { ($0.name, Tensor(shape: $0.shape, scalars: $0.values)) })
    }

    /// The deltas as safetensors records, sorted by name.
    public var records: [TensorRecord] {
        deltas.keys.sorted().map { TensorRecord(name: $0, shape: deltas[$0]!.shape, values: deltas[$0]!.scalars) }
    }

    /// The deltas as one vector, parameters ordered by name.
    public var flat: [Float] { deltas.keys.sorted().flatMap { deltas[$0]!.scalars } }

    /// Euclidean norm of all deltas.
    public var norm: Double { flat.reduce(0.0) { $0 + Double($1) * Double($1) }.squareRoot() }
}

extension Model {
    /// `trained − original` for every parameter; both models must have the same parameter names and shapes.
    public static func diff(original: Model, trained: Model) throws(EngineError) -> ParameterDiff {
        let a = original.namedParameters, b = trained.namedParameters
        guard a.keys.sorted() == b.keys.sorted() else {
            throw EngineError(.incompatibleCheckpoint, "models have different parameters: \(a.keys.sorted()) vs \(b.keys.sorted())")
        }
        var deltas: [String: Tensor] = [:]
        for (name, t) in a {
            guard b[name]!.shape == t.shape else {
                throw EngineError(.shapeMismatch, "parameter '\(name)' has shape \(t.shape) and \(b[name]!.shape)")
            }
            deltas[name] = b[name]! - t
        }
        return ParameterDiff(deltas: deltas)
    }

    /// Adds `scale · diff` to the named parameters; every name must exist with the same shape.
    public mutating func apply(_ diff: ParameterDiff, scale: Float = 1) throws(EngineError) {
        let current = namedParameters
        for name in diff.deltas.keys.sorted() {
            guard let t = current[name] else {
                throw EngineError(.incompatibleCheckpoint, "diff names parameter '\(name)', which model '\(self.name)' does not have")
            }
            let d = diff.deltas[name]!
            guard d.shape == t.shape else {
                throw EngineError(.shapeMismatch, "diff for '\(name)' has shape \(d.shape), the parameter \(t.shape)")
            }
            try setParameter(name, to: t.zipWith(d) { $0 + scale * $1 })
        }
    }

    // MARK: Weights as safetensors

    /// The parameters as safetensors records, sorted by name.
    public var weightRecords: [TensorRecord] {
        let p = namedParameters
        return p.keys.sorted().map { TensorRecord(name: $0, shape: p[$0]!.shape, values: p[$0]!.scalars) }
    }

    /// The weights as safetensors bytes (F32, readable by Python's `safetensors`).
    public func weightsSafetensors() -> [UInt8] {
        Safetensors.encode(weightRecords, metadata: ["format": "pt", "orchard.model": name])
    }

    /// Loads weights from safetensors bytes, which must hold exactly this model's parameters as F32 with the
    /// same shapes.
    public mutating func loadWeights(safetensors bytes: some Collection<UInt8>) throws(EngineError) {
        let archive = try Self.decodeArchive(bytes)
        try loadWeights(from: archive)
    }

    /// Loads weights from a decoded archive holding exactly this model's parameters.
    public mutating func loadWeights(from archive: SafetensorsArchive) throws(EngineError) {
        do { try archive.validate(against: parameterShapes) } catch {
            throw EngineError(.incompatibleCheckpoint, "weights do not fit model '\(name)': \(error.message)")
        }
        for record in archive.tensors {
            try setParameter(record.name, to: Tensor(shape: record.shape, scalars: record.values))
        }
    }

    /// Writes the weights to a safetensors file atomically (a crash leaves the old file or the new one).
    public func writeWeights(to url: URL) throws(EngineError) {
        try writeAtomically(weightsSafetensors(), to: url)
    }

    /// Reads weights from a safetensors file.
    public mutating func readWeights(from url: URL) throws(EngineError) {
        try loadWeights(safetensors: try readBytes(url))
    }

    static func decodeArchive(_ bytes: some Collection<UInt8>) throws(EngineError) -> SafetensorsArchive {
        do { return try Safetensors.decode(bytes) } catch {
            throw EngineError(.incompatibleCheckpoint, "not a readable F32 safetensors file: \(error.message)")
        }
    }
}

func writeAtomically(_ bytes: [UInt8], to url: URL) throws(EngineError) {
    do { try Data(bytes).write(to: url, options: .atomic) } catch {
        throw EngineError(.unavailable, "cannot write \(url.path): \(FileAccessError(error, writing: true).message)")
    }
}

func readBytes(_ url: URL) throws(EngineError) -> Data {
    do { return try Data(contentsOf: url) } catch {
        throw EngineError(.unavailable, "cannot read \(url.path): \(FileAccessError(error).message)")
    }
}

extension TrainingState {
    /// Metadata key naming the file kind.
    static let kindKey = "orchard.kind"

    /// The state as one safetensors file: the weights under their names, optimizer slots as
    /// `optimizer.<parameter>.<slot>` (trainable parameters only), and position, seed and metrics as metadata.
    public func checkpoint() -> [UInt8] {
        var records = model.weightRecords
        let shapes = model.parameterShapes
        let names = model.parameterNames
        let trainable = Set(model.trainableParameterNames)
        var offset = 0
        for name in names {
            let count = shapes[name]!.reduce(1, *)
            if trainable.contains(name) {
                for slot in optimizer.slots.keys.sorted() {
                    let values = Array(optimizer.slots[slot]![offset..<(offset + count)])
                    records.append(TensorRecord(name: "optimizer.\(name).\(slot)", shape: shapes[name]!, values: values))
                }
            }
            offset += count
        }
        let metrics = (try? JSONEncoder().encode(completedEpochs)).map { String(decoding: $0, as: UTF8.self) } ?? "[]"
        let metadata: [String: String] = [
            "format": "pt",
            Self.kindKey: "training-state",
            "orchard.model": model.name,
            "optimizer.kind": optimizer.kind,
            "optimizer.step": String(optimizer.step),
            "optimizer.slots": optimizer.slots.keys.sorted().joined(separator: ","),
            "position.epoch": String(position.epoch),
            "position.batch": String(position.batch),
            "position.updates": String(position.updates),
            "position.epochLossSum": String(position.epochLossSum.bitPattern),
            "position.epochSamples": String(position.epochSamples),
            "position.epochUpdates": String(position.epochUpdates),
            "seed": String(seed),
            "dropoutRandom": dropoutRandom.map(String.init).joined(separator: ","),
            "completedEpochs": metrics,
        ]
        return Safetensors.encode(records, metadata: metadata)
    }

    /// Reads a state written by ``checkpoint()`` for `model` (whose architecture it must match).
    /// - Parameters:
    ///   - bytes: The safetensors bytes.
    ///   - model: The model the state belongs to; its weights are replaced by the checkpoint's.
    public init(checkpoint bytes: some Collection<UInt8>, model: Model) throws(EngineError) {
        let archive = try Model.decodeArchive(bytes)
        let meta = archive.metadata
        guard meta[Self.kindKey] == "training-state" else {
            throw EngineError(.incompatibleCheckpoint, "the file is not an Orchard training state (no '\(Self.kindKey)=training-state' metadata)")
        }
        func field<T: LosslessStringConvertible>(_ key: String, _ type: T.Type) throws(EngineError) -> T {
            guard let text = meta[key], let value = T(text) else {
                throw EngineError(.incompatibleCheckpoint, "training state metadata '\(key)' is missing or malformed")
            }
            return value
        }
        let kind = try field("optimizer.kind", String.self)
        let slotNames = (meta["optimizer.slots"] ?? "").split(separator: ",").map(String.init)
        let shapes = model.parameterShapes
        let trainable = Set(model.trainableParameterNames)
        var expected = shapes
        for name in trainable { for slot in slotNames { expected["optimizer.\(name).\(slot)"] = shapes[name]! } }
        do { try archive.validate(against: expected) } catch {
            throw EngineError(.incompatibleCheckpoint, "training state does not fit model '\(model.name)': \(error.message)")
        }
        let tensors = archive.byName
        var weights = model
        for name in model.parameterNames {
            let r = tensors[name]!
            try weights.setParameter(name, to: Tensor(shape: r.shape, scalars: r.values))
        }
        var slots: [String: [Float]] = [:]
        for slot in slotNames {
            var flat: [Float] = []
            for name in model.parameterNames {
                if trainable.contains(name) {
                    flat += tensors["optimizer.\(name).\(slot)"]!.values
                } else {
                    flat += [Float](repeating: 0, count: shapes[name]!.reduce(1, *))
                }
            }
            slots[slot] = flat
        }
        let words = (meta["dropoutRandom"] ?? "").split(separator: ",").compactMap { UInt64($0) }
        guard words.count == 4 else { throw EngineError(.incompatibleCheckpoint, "training state metadata 'dropoutRandom' is malformed") }
        let epochs: [EpochMetrics]
        do { epochs = try JSONDecoder().decode([EpochMetrics].self, from: Data((meta["completedEpochs"] ?? "").utf8)) } catch {
            throw EngineError(.incompatibleCheckpoint, "training state metadata 'completedEpochs' is malformed")
        }
        self.init(
            model: weights,
            optimizer: OptimizerState(kind: kind, step: try field("optimizer.step", Int.self), slots: slots),
            position: TrainingPosition(
                epoch: try field("position.epoch", Int.self), batch: try field("position.batch", Int.self),
                updates: try field("position.updates", Int.self),
                epochLossSum: Double(bitPattern: try field("position.epochLossSum", UInt64.self)),
                epochSamples: try field("position.epochSamples", Int.self), epochUpdates: try field("position.epochUpdates", Int.self)
            ),
            seed: try field("seed", UInt64.self), dropoutRandom: words, completedEpochs: epochs
        )
    }

    /// Writes ``checkpoint()`` to a file atomically.
    public func write(to url: URL) throws(EngineError) { try writeAtomically(checkpoint(), to: url) }

    /// Reads a state file for `model`.
    public init(contentsOf url: URL, model: Model) throws(EngineError) {
        try self.init(checkpoint: try readBytes(url), model: model)
    }
}

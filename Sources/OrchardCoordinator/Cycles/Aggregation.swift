public import OrchardFormats
public import OrchardProtocol

/// The names, shapes and frozen flags of a model's weights, in a fixed order (sorted by name), so a set of
/// tensors maps to one flat `Float` array.
public struct ModelLayout: Sendable, Hashable {
    /// One tensor's place in the flat array.
    public struct Entry: Sendable, Hashable {
        /// The tensor's name.
        public var name: String
        /// Its shape.
        public var shape: [Int]
        /// Its first element's index in the flat array.
        public var offset: Int
        /// Its element count.
        public var count: Int
        /// Whether it belongs to a frozen layer (its value never changes).
        public var frozen: Bool
    }

    /// The tensors, sorted by name.
    public let entries: [Entry]
    /// Elements in the flat array.
    public let totalCount: Int
    private let index: [String: Int]

    /// Metadata that describes one checkpoint only (which process and number, its privacy spend, its survivors).
    public static let perCheckpointMetadata: Set<String> = [
        "orchard.process", "orchard.checkpoint", "orchard.epsilon", "orchard.delta", "orchard.secure_aggregation_survivors",
        "orchard.robust_aggregation",
    ]

    /// The metadata a checkpoint passes on to the next (the model's preprocessing and format, anything the host set).
    public static func carriedMetadata(_ metadata: [String: String]) -> [String: String] {
        metadata.filter { !perCheckpointMetadata.contains($0.key) }
    }

    /// Derives the layout from a model's weights and its architecture (for frozen layers).
    /// - Throws: ``CoordinatorError`` when a tensor name does not start with a layer of the model.
    public init(weights: [TensorRecord], model: ModelSpec) throws(CoordinatorError) {
        let layers = Dictionary(model.layers.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        var entries: [Entry] = []
        var offset = 0
        for tensor in FlatOrder.sorted(weights) {
            let layerName = String(tensor.name.split(separator: ".", maxSplits: 1).first ?? "")
            guard let layer = layers[layerName] else {
                throw CoordinatorError(.invalidConfiguration, "weight '\(tensor.name)' does not belong to a layer of model '\(model.name)'")
            }
            entries.append(Entry(name: tensor.name, shape: tensor.shape, offset: offset, count: tensor.values.count, frozen: layer.frozen))
            offset += tensor.values.count
        }
        guard !entries.isEmpty else {
            throw CoordinatorError(.invalidConfiguration, "the initial weights hold no tensors")
        }
        self.entries = entries
        self.totalCount = offset
        self.index = Dictionary(uniqueKeysWithValues: entries.enumerated().map { ($1.name, $0) })
    }

    /// Flattens tensors that match the layout exactly (names and shapes) into one array.
    public func flatten(_ tensors: [TensorRecord]) throws(CoordinatorError) -> [Float] {
        guard tensors.count == entries.count else {
            let names = Set(tensors.map(\.name))
            if let missing = entries.first(where: { !names.contains($0.name) }) {
                throw CoordinatorError(.tensorMismatch, "tensor '\(missing.name)' is missing")
            }
            throw CoordinatorError(.tensorMismatch, "\(tensors.count) tensors given; the model has \(entries.count)")
        }
        var flat = [Float](repeating: 0, count: totalCount)
        for tensor in tensors {
            guard let position = index[tensor.name] else {
                throw CoordinatorError(.tensorMismatch, "tensor '\(tensor.name)' is not part of the model")
            }
            let entry = entries[position]
            guard tensor.shape == entry.shape else {
                throw CoordinatorError(.shapeMismatch, "tensor '\(tensor.name)' has shape \(tensor.shape); the model's is \(entry.shape)")
            }
            flat.withUnsafeMutableBufferPointer { destination in
                tensor.values.withUnsafeBufferPointer { source in
                    _ = UnsafeMutableBufferPointer(rebasing: destination[entry.offset..<(entry.offset + entry.count)]).initialize(from: source)
                }
            }
        }
        return flat
    }

    /// `values` (one per element, in layout order) with the elements of frozen tensors set to zero.
    public func zeroingFrozen(_ values: [Float]) -> [Float] {
        var values = values
        for entry in entries where entry.frozen {
            for i in entry.offset..<(entry.offset + entry.count) { values[i] = 0 }
        }
        return values
    }

    /// Elements of the tensors that are not frozen.
    public var trainableCount: Int { entries.reduce(0) { $0 + ($1.frozen ? 0 : $1.count) } }

    /// The entry of the tensor called `name`, if the model has one.
    public func entry(named name: String) -> Entry? { index[name].map { entries[$0] } }

    /// Checks a flat diff: finite values, and zeros in frozen tensors.
    public func checkDiff(_ flat: [Float]) throws(CoordinatorError) {
        precondition(flat.count == totalCount, "flat diff has \(flat.count) values; the layout has \(totalCount)")
        if let failure = flat.withUnsafeBufferPointer({ problem(in: $0) }) { throw failure }
    }

    private func problem(in flat: UnsafeBufferPointer<Float>) -> CoordinatorError? {
        if !FloatScan.allFinite(flat) {
            let entry = entries.first { entry in flat[entry.offset..<(entry.offset + entry.count)].contains { !$0.isFinite } }
            return CoordinatorError(.nonFiniteValues, "tensor '\(entry?.name ?? "?")' holds NaN or infinity")
        }
        for entry in entries where entry.frozen {
            if flat[entry.offset..<(entry.offset + entry.count)].contains(where: { $0 != 0 }) {
                return CoordinatorError(.frozenTensorChanged, "tensor '\(entry.name)' belongs to a frozen layer; its diff must be all zeros")
            }
        }
        return nil
    }

    /// Splits a flat array back into named tensors.
    public func records(_ flat: [Float]) -> [TensorRecord] {
        precondition(flat.count == totalCount, "flat array has \(flat.count) values; the layout has \(totalCount)")
        return entries.map { TensorRecord(name: $0.name, shape: $0.shape, values: Array(flat[$0.offset..<($0.offset + $0.count)])) }
    }
}

/// A running sample-weighted sum of diffs: each report is folded in and dropped, so memory is O(model).
public struct RunningSum: Sendable, Hashable {
    /// Σ sampleCount × scale × diff, per element (the scale is a buffered report's staleness factor, else 1).
    public private(set) var sum: [Double]
    /// Σ sampleCount.
    public private(set) var weight: Double
    /// Reports folded in.
    public private(set) var reports: Int
    /// Reports folded in whose norm was within the privacy clipping bound (adaptive clipping counts them).
    public private(set) var unclipped: Int

    /// An empty sum over `count` elements.
    public init(count: Int) {
        sum = [Double](repeating: 0, count: count)
        weight = 0
        reports = 0
        unclipped = 0
    }

    /// Restores a sum from its stored bytes (little-endian Float64).
    public init(bytes: [UInt8], weight: Double, reports: Int, unclipped: Int = 0, count: Int) throws(CoordinatorError) {
        guard bytes.count == count * 8 else {
            throw .internalError("stored running sum has \(bytes.count) bytes; expected \(count * 8)")
        }
        var sum = [Double](repeating: 0, count: count)
        sum.withUnsafeMutableBytes { $0.copyBytes(from: bytes) }
        #if _endian(big)
        for i in sum.indices { sum[i] = Double(bitPattern: UInt64(littleEndian: sum[i].bitPattern)) }
        #endif
        self.sum = sum
        self.weight = weight
        self.reports = reports
        self.unclipped = unclipped
    }

    /// Adds another running sum (another instance's partial sum of the same cycle).
    public mutating func add(_ other: RunningSum) {
        precondition(other.sum.count == sum.count, "the partial sum has \(other.sum.count) values; the sum has \(sum.count)")
        for i in sum.indices { sum[i] += other.sum[i] }
        weight += other.weight
        reports += other.reports
        unclipped += other.unclipped
    }

    /// Adds `weight × scale × diff` to the sum and `weight` to the total weight (a scale below 1 shrinks a stale
    /// buffered report's step without changing the denominator); `unclipped` counts it as within the privacy
    /// clipping bound.
    public mutating func add(_ diff: UnsafeBufferPointer<Float>, weight: Double, scale: Double = 1, unclipped: Bool = false) {
        precondition(diff.count == sum.count, "diff has \(diff.count) values; the sum has \(sum.count)")
        let factor = weight * scale
        sum.withUnsafeMutableBufferPointer { total in
            for i in 0..<total.count { total[i] += factor * Double(diff[i]) }
        }
        self.weight += weight
        reports += 1
        if unclipped { self.unclipped += 1 }
    }

    /// Adds `weight × diff` for a diff held as little-endian Float32 bytes.
    public mutating func add(bytes: [UInt8], weight: Double, scale: Double = 1, unclipped: Bool = false) {
        #if _endian(little)
        bytes.withUnsafeBytes { add($0.bindMemory(to: Float.self), weight: weight, scale: scale, unclipped: unclipped) }
        #else
        let floats = bytes.withUnsafeBytes { raw in
            (0..<(raw.count / 4)).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) }
        }
        floats.withUnsafeBufferPointer { add($0, weight: weight, scale: scale, unclipped: unclipped) }
        #endif
    }

    /// Adds `weight × scale × diff` for a staged diff: read whole first, so that a failed read leaves the sum untouched.
    public mutating func add(_ diff: any StagedDiff, weight: Double, scale: Double = 1, unclipped: Bool = false) throws(StoreError) {
        // Not zero-filled first: the read fills every value or throws (and the array is then discarded).
        let values: [Float]
        do {
            values = try [Float](unsafeUninitializedCapacity: sum.count) { buffer, initialized in
                try diff.read(into: UnsafeMutableRawBufferPointer(buffer), at: 0)
                initialized = buffer.count
            }
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(.io, "could not read the staged diff: \(error)")
        }
        #if _endian(big)
        let native = values.map { Float(bitPattern: UInt32(littleEndian: $0.bitPattern)) }
        native.withUnsafeBufferPointer { add($0, weight: weight, scale: scale, unclipped: unclipped) }
        #else
        values.withUnsafeBufferPointer { add($0, weight: weight, scale: scale, unclipped: unclipped) }
        #endif
    }

    /// The stored form of the sum (little-endian Float64).
    public var bytes: [UInt8] {
        #if _endian(big)
        let values = sum.map { Double(bitPattern: $0.bitPattern.littleEndian) }
        #else
        let values = sum
        #endif
        return values.withUnsafeBytes { Array($0) }
    }

    /// The weighted mean diff, Σ nᵢ dᵢ / Σ nᵢ.
    public func mean() -> [Float] {
        guard weight > 0 else { return [Float](repeating: 0, count: sum.count) }
        let scale = 1 / weight
        return sum.map { Float($0 * scale) }
    }
}

/// The server optimizer's state, durable between cycles (empty for FedAvg).
public struct ServerOptimizerState: Sendable, Hashable {
    /// Whether every moment is finite (a state that is not is never persisted).
    public var isFinite: Bool { FloatScan.allFinite(m) && FloatScan.allFinite(v) }

    /// First moment (FedAvgM's momentum buffer, FedAdam/FedYogi's m).
    public var m: [Float]
    /// Second moment (FedAdam/FedYogi's v).
    public var v: [Float]

    /// An empty state.
    public init(m: [Float] = [], v: [Float] = []) {
        self.m = m
        self.v = v
    }

    /// The stored form: an 8-byte count of m, then m and v as little-endian Float32.
    public var bytes: [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(8 + 4 * (m.count + v.count))
        withUnsafeBytes(of: UInt64(m.count).littleEndian) { out.append(contentsOf: $0) }
        for value in m { withUnsafeBytes(of: value.bitPattern.littleEndian) { out.append(contentsOf: $0) } }
        for value in v { withUnsafeBytes(of: value.bitPattern.littleEndian) { out.append(contentsOf: $0) } }
        return out
    }

    /// Restores a state from its stored form.
    public init(bytes: [UInt8]) throws(CoordinatorError) {
        guard bytes.count >= 8, (bytes.count - 8) % 4 == 0 else { throw .internalError("stored optimizer state is corrupt") }
        var mCount: UInt64 = 0
        for i in 0..<8 { mCount |= UInt64(bytes[i]) << (8 * UInt64(i)) }
        let total = (bytes.count - 8) / 4
        guard mCount <= UInt64(total) else { throw .internalError("stored optimizer state is corrupt") }
        var values = [Float](repeating: 0, count: total)
        for i in 0..<total {
            let b = 8 + 4 * i
            let bits = UInt32(bytes[b]) | UInt32(bytes[b + 1]) << 8 | UInt32(bytes[b + 2]) << 16 | UInt32(bytes[b + 3]) << 24
            values[i] = Float(bitPattern: bits)
        }
        m = Array(values[..<Int(mCount)])
        v = Array(values[Int(mCount)...])
    }
}

/// The server update of Reddi et al. 2021, "Adaptive Federated Optimization": the averaged diff Δ is the
/// negative pseudo-gradient; FedAvg steps `x += η Δ`, FedAvgM keeps momentum, FedAdam and FedYogi keep
/// first and second moments (v starts at τ²).
public enum ServerOptimizer {
    /// Applies the update for `delta` to `weights` in place, skipping frozen tensors.
    /// - Parameters:
    ///   - weights: The current checkpoint, flat.
    ///   - delta: The sample-weighted mean diff, flat.
    ///   - state: The optimizer's moments, updated in place.
    ///   - config: The aggregator configuration.
    ///   - layout: The layout (for frozen tensors).
    public static func step(weights: inout [Float], delta: [Float], state: inout ServerOptimizerState, config: AggregatorConfig, layout: ModelLayout) {
        precondition(weights.count == delta.count && weights.count == layout.totalCount, "weights, delta and layout disagree")
        let n = weights.count
        let eta = Float(config.serverLearningRate)
        var trainable = [Bool](repeating: true, count: n)
        for entry in layout.entries where entry.frozen {
            for i in entry.offset..<(entry.offset + entry.count) { trainable[i] = false }
        }
        switch config.kind {
        case .fedAvgM:
            if state.m.count != n { state.m = [Float](repeating: 0, count: n) }
            let beta = Float(config.momentum)
            for i in 0..<n where trainable[i] {
                state.m[i] = beta * state.m[i] + delta[i]
                weights[i] += eta * state.m[i]
            }
        case .fedAdam, .fedYogi:
            let tau = Float(config.tau)
            if state.m.count != n { state.m = [Float](repeating: 0, count: n) }
            if state.v.count != n { state.v = [Float](repeating: tau * tau, count: n) }
            let b1 = Float(config.beta1), b2 = Float(config.beta2)
            let yogi = config.kind == .fedYogi
            for i in 0..<n where trainable[i] {
                let d = delta[i]
                state.m[i] = b1 * state.m[i] + (1 - b1) * d
                let d2 = d * d
                if yogi {
                    let diff = state.v[i] - d2
                    state.v[i] -= (1 - b2) * d2 * (diff > 0 ? 1 : (diff < 0 ? -1 : 0))
                } else {
                    state.v[i] = b2 * state.v[i] + (1 - b2) * d2
                }
                weights[i] += eta * state.m[i] / (state.v[i].squareRoot() + tau)
            }
        default:
            for i in 0..<n where trainable[i] { weights[i] += eta * delta[i] }
        }
    }
}

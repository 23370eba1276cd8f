import OrchardFormats
import OrchardProtocol

/// A report body parsed as it arrives, without I/O: the safetensors header is gathered first
/// (``gatherHeader(_:)``); once the model's layout has placed its tensors (``place(_:in:)``), every data byte is
/// checked as it passes (F32 values finite, frozen tensors all zero, the L2 norm accumulated) and handed on with
/// its byte offset in the flat diff (``consume(_:write:)``); ``finish()`` checks the body covered every tensor.
///
/// Memory is O(header): tensor data is never held beyond the chunk being read.
struct ReportStream {
    /// Where a run of the body's data section goes in the flat diff.
    struct Segment: Equatable {
        /// The tensor's name.
        var name: String
        /// Its bytes in the data section.
        var data: Range<Int>
        /// The byte offset of its first value in the flat diff.
        var flatOffset: Int
        /// Whether its values must all be zero (a frozen layer).
        var frozen: Bool
    }

    /// The largest header accepted, in bytes.
    let maximumHeaderBytes: Int
    private var prefix: [UInt8] = []
    private var headerLength: Int?
    private var headerBytes: [UInt8] = []
    /// The parsed header, once complete.
    private(set) var header: Safetensors.Header?
    private var segments: [Segment] = []
    private var segment = 0
    /// Data bytes consumed so far.
    private(set) var dataReceived = 0
    /// Bytes of a value split across chunks.
    private var partial: [UInt8] = []
    /// Σ value² over the values consumed, in Double.
    private(set) var sumOfSquares = 0.0

    init(maximumHeaderBytes: Int = Safetensors.maximumHeaderSize) {
        self.maximumHeaderBytes = maximumHeaderBytes
    }

    /// Takes header bytes from the front of `chunk` (advancing it past them); returns the header once it is
    /// complete (and nil before), after which the rest of the body is tensor data.
    mutating func gatherHeader(_ chunk: inout UnsafeRawBufferPointer) throws(CoordinatorError) -> Safetensors.Header? {
        precondition(header == nil, "the header is already complete")
        if headerLength == nil {
            let take = min(8 - prefix.count, chunk.count)
            prefix.append(contentsOf: chunk.prefix(take))
            chunk = UnsafeRawBufferPointer(rebasing: chunk.dropFirst(take))
            guard prefix.count == 8 else { return nil }
            // A size refusal (413), decided on the announced length alone; nothing is reserved on its word: the
            // buffer grows only as header bytes arrive.
            let announced = try Self.formatted { () throws(FormatError) in try Safetensors.announcedHeaderLength(prefix) }
            guard announced <= UInt64(maximumHeaderBytes) else {
                throw CoordinatorError(.payloadTooLarge, "the report's safetensors header announces \(announced) bytes; the limit is \(maximumHeaderBytes)")
            }
            headerLength = Int(announced)
        }
        let length = headerLength!
        let take = min(length - headerBytes.count, chunk.count)
        headerBytes.append(contentsOf: chunk.prefix(take))
        chunk = UnsafeRawBufferPointer(rebasing: chunk.dropFirst(take))
        guard headerBytes.count == length else { return nil }
        let parsed = try Self.formatted { () throws(FormatError) in try Safetensors.header(headerBytes[...]) }
        header = parsed
        headerBytes = []
        return parsed
    }

    /// Runs a safetensors step, its format errors as the report's refusals.
    private static func formatted<T>(_ body: () throws(FormatError) -> T) throws(CoordinatorError) -> T {
        do throws(FormatError) {
            return try body()
        } catch {
            if error.code == .dtypeMismatch || error.code == .unsupportedDType {
                throw CoordinatorError(.dtypeMismatch, error.message)
            }
            throw CoordinatorError(.malformedSafetensors, error.message)
        }
    }

    /// Places the header's tensors in `layout`: the same names, F32, the model's shapes.
    mutating func place(_ header: Safetensors.Header, in layout: ModelLayout) throws(CoordinatorError) {
        let tensors = header.index.entries
        guard tensors.count == layout.entries.count else {
            let names = Set(tensors.map(\.name))
            if let missing = layout.entries.first(where: { !names.contains($0.name) }) {
                throw CoordinatorError(.tensorMismatch, "tensor '\(missing.name)' is missing")
            }
            throw CoordinatorError(.tensorMismatch, "\(tensors.count) tensors given; the model has \(layout.entries.count)")
        }
        var placed: [Segment] = []
        placed.reserveCapacity(tensors.count)
        for tensor in tensors {
            guard let entry = layout.entry(named: tensor.name) else {
                throw CoordinatorError(.tensorMismatch, "tensor '\(tensor.name)' is not part of the model")
            }
            guard tensor.dtype == .float32 else {
                throw CoordinatorError(.dtypeMismatch, "tensor '\(tensor.name)' is \(tensor.dtype.rawValue); diffs are F32")
            }
            guard tensor.shape == entry.shape else {
                throw CoordinatorError(.shapeMismatch, "tensor '\(tensor.name)' has shape \(tensor.shape); the model's is \(entry.shape)")
            }
            let start = tensor.byteRange.lowerBound - header.dataStart
            placed.append(Segment(name: tensor.name, data: start..<(start + entry.count * 4), flatOffset: entry.offset * 4, frozen: entry.frozen))
        }
        segments = placed.filter { !$0.data.isEmpty }
    }

    /// Checks the data bytes of `chunk` and hands each run to `write` with its byte offset in the flat diff (runs
    /// hold whole values; a value split across chunks is written once complete).
    mutating func consume(
        _ chunk: UnsafeRawBufferPointer, write: (UnsafeRawBufferPointer, Int) throws(StoreError) -> Void
    ) throws(CoordinatorError) {
        guard let header else { preconditionFailure("consume before the header is complete") }
        guard chunk.count <= header.dataSize - dataReceived else {
            throw CoordinatorError(.malformedSafetensors, "the body runs past its last tensor: the header covers \(header.dataSize) data bytes")
        }
        func emit(_ bytes: UnsafeRawBufferPointer, _ offset: Int) throws(CoordinatorError) {
            do throws(StoreError) {
                try write(bytes, offset)
            } catch {
                throw .internalError("could not spool the diff: \(error.message)")
            }
        }
        var rest = chunk
        if !partial.isEmpty {
            let take = min(4 - partial.count, rest.count)
            partial.append(contentsOf: rest.prefix(take))
            rest = UnsafeRawBufferPointer(rebasing: rest.dropFirst(take))
            guard partial.count == 4 else {
                dataReceived += take
                return
            }
            let position = dataReceived + take - 4
            let value = partial
            partial = []
            let raw = UnsafeMutableRawBufferPointer.allocate(byteCount: 4, alignment: 4)
            defer { raw.deallocate() }
            raw.copyBytes(from: value)
            try check(UnsafeRawBufferPointer(raw), at: position)
            try emit(UnsafeRawBufferPointer(raw), flatOffset(at: position))
            dataReceived += take
        }
        while rest.count >= 4 {
            let current = segments[segment]
            let inSegment = min(current.data.upperBound - dataReceived, rest.count / 4 * 4)
            let run = UnsafeRawBufferPointer(rebasing: rest.prefix(inSegment))
            try check(run, at: dataReceived)
            try emit(run, current.flatOffset + dataReceived - current.data.lowerBound)
            dataReceived += inSegment
            rest = UnsafeRawBufferPointer(rebasing: rest.dropFirst(inSegment))
            if dataReceived == current.data.upperBound { segment += 1 }
        }
        if !rest.isEmpty {
            partial.append(contentsOf: rest)
            dataReceived += rest.count
        }
    }

    /// Checks that the body held every tensor's bytes.
    func finish() throws(CoordinatorError) {
        guard let header else {
            throw CoordinatorError(.malformedSafetensors, "the body ends inside the safetensors header")
        }
        guard dataReceived == header.dataSize else {
            throw CoordinatorError(.malformedSafetensors, "the body ends after \(dataReceived) data bytes; the header covers \(header.dataSize)")
        }
    }

    /// The flat-diff byte offset of the value at `position` in the data section.
    private mutating func flatOffset(at position: Int) -> Int {
        let current = segments[segment]
        let offset = current.flatOffset + position - current.data.lowerBound
        if position + 4 == current.data.upperBound { segment += 1 }
        return offset
    }

    /// Checks whole values at data position `position` (within one segment): finite, zero in a frozen tensor.
    private mutating func check(_ run: UnsafeRawBufferPointer, at position: Int) throws(CoordinatorError) {
        let current = segments[segment]
        let scan = FloatScan.summary(littleEndian: run)
        if !scan.allFinite {
            throw CoordinatorError(.nonFiniteValues, "tensor '\(current.name)' holds NaN or infinity")
        }
        if current.frozen && !scan.allZero {
            throw CoordinatorError(.frozenTensorChanged, "tensor '\(current.name)' belongs to a frozen layer; its diff must be all zeros")
        }
        sumOfSquares += scan.sumOfSquares
    }
}

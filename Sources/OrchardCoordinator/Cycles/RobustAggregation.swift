public import Foundation
import OrchardSupport
public import OrchardProtocol
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A cycle's reports laid out for a robust rule: one row of Float32 per report in a scratch file that is unlinked
/// as soon as it is created (nothing is left behind by a crash), read back a band of columns at a time, so memory
/// stays O(model) plus one band however many reports the cycle holds.
public final class ReportMatrix: Sendable {
    /// Values per report.
    public let columns: Int
    private let appended = Mutex<[(worker: String, sampleCount: Int)]>([])
    private let descriptor: Int32

    /// Each row's worker and sample count, in the order the rows were appended.
    public var rows: [(worker: String, sampleCount: Int)] { appended.withLock { $0 } }

    /// Opens an empty matrix whose scratch file lives in `directory` (the system's temporary directory by default).
    public init(columns: Int, directory: URL = FileManager.default.temporaryDirectory) throws(CoordinatorError) {
        precondition(columns > 0, "a report matrix needs at least one column")
        self.columns = columns
        var template = Array(directory.appendingPathComponent("orchard-reports-XXXXXX").path.utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard fd >= 0 else {
            throw .internalError("cannot create a scratch file for the cycle's reports in \(directory.path): \(String(cString: strerror(errno)))")
        }
        let path = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        unlink(path)
        descriptor = fd
    }

    deinit { close(descriptor) }

    /// Appends one report's diff (little-endian Float32 bytes, one value per column).
    public func append(_ diff: [UInt8], worker: String, sampleCount: Int) throws(CoordinatorError) {
        guard diff.count == columns * 4 else {
            // Not transient: retrying would meet the same stored bytes (the caller abandons the cycle).
            throw CoordinatorError(.invalidConfiguration, "the stored diff of worker \(worker) has \(diff.count) bytes; the model has \(columns * 4)")
        }
        let failure = appended.withLock { rows -> CoordinatorError? in
            let offset = rows.count * columns * 4
            if let failure = diff.withUnsafeBytes({ transfer($0.baseAddress!, count: $0.count, at: offset, write: true) }) { return failure }
            rows.append((worker, sampleCount))
            return nil
        }
        if let failure { throw failure }
    }

    /// Row `row`'s values in `range` of columns, written into `destination` (at least `range.count` long).
    func read(row: Int, columns range: Range<Int>, into destination: UnsafeMutableBufferPointer<Float>) throws(CoordinatorError) {
        if let failure = transfer(
            UnsafeMutableRawPointer(destination.baseAddress!), count: range.count * 4, at: (row * columns + range.lowerBound) * 4, write: false)
        {
            throw failure
        }
        #if _endian(big)
        for i in 0..<range.count { destination[i] = Float(bitPattern: UInt32(littleEndian: destination[i].bitPattern)) }
        #endif
    }

    private func transfer(_ pointer: UnsafeRawPointer, count: Int, at offset: Int, write: Bool) -> CoordinatorError? {
        var done = 0
        while done < count {
            let moved =
                write
                ? pwrite(descriptor, pointer + done, count - done, off_t(offset + done))
                : pread(descriptor, UnsafeMutableRawPointer(mutating: pointer) + done, count - done, off_t(offset + done))
            if moved < 0 && errno == EINTR { continue }
            guard moved > 0 else {
                let reason = moved == 0 ? "unexpected end of file" : String(cString: strerror(errno))
                return .internalError("cannot \(write ? "write" : "read") the cycle's report scratch file: \(reason)")
            }
            done += moved
        }
        return nil
    }
}

/// A robust rule's outcome: the aggregate diff and which reports it drew on.
public struct RobustAggregate: Sendable {
    /// The aggregate diff, one value per column.
    public var delta: [Float]
    /// The workers whose reports Multi-Krum averaged (every worker for median and trimmed mean), sorted.
    public var selected: [String]
    /// Reports the rule saw.
    public var reports: Int
}

extension RobustAggregationConfig {
    /// Values of a band held at once by default: the columns per band are this divided by the number of reports.
    public static let defaultBandValues = 1 << 20

    /// Aggregates the reports in `matrix` by the rule. Every rule weighs each report once (a sample count is a device's
    /// own claim); Multi-Krum averages the reports it selects and breaks equal scores by worker id.
    /// `bandValues` bounds the values read at once (columns per band × reports).
    /// - Throws: ``CoordinatorError`` when the matrix holds fewer reports than the rule needs, or on a read failure.
    public func aggregate(_ matrix: ReportMatrix, bandValues: Int = defaultBandValues) throws(CoordinatorError) -> RobustAggregate {
        precondition(bandValues > 0, "a band holds at least one value")
        let rows = matrix.rows
        let n = rows.count
        guard n >= max(1, leastReports) else {
            throw CoordinatorError(.invalidConfiguration, "\(summary) needs at least \(max(1, leastReports)) reports; the cycle has \(n)")
        }
        let d = matrix.columns
        let width = max(1, min(d, bandValues / n))
        var band = [Float](repeating: 0, count: n * width)
        var delta = [Float](repeating: 0, count: d)
        // Rows sorted by worker id: ties broken the same way however the store returned them.
        let order = rows.indices.sorted { rows[$0].worker < rows[$1].worker }

        func load(_ range: Range<Int>, rows: [Int]) throws(CoordinatorError) {
            try band.withUnsafeMutableBufferPointer { buffer throws(CoordinatorError) in
                for (position, row) in rows.enumerated() {
                    try matrix.read(
                        row: row, columns: range, into: UnsafeMutableBufferPointer(rebasing: buffer[(position * width)..<(position * width + range.count)]))
                }
            }
        }

        switch rule {
        case .median, .trimmedMean:
            // ⌊β·n⌋, exact for products that floating point lands a hair below a whole number (0.29 × 100).
            // At most (n − 1)/2 from each end, so at least one value stays (a trim just under ½ rounded up to n/2).
            let cut = rule == .median ? 0 : min(Int((Double(n) * (trim ?? 0) + 1e-9).rounded(.down)), (n - 1) / 2)
            var column = [Float](repeating: 0, count: n)
            var start = 0
            while start < d {
                let range = start..<min(d, start + width)
                try load(range, rows: order)
                for j in 0..<range.count {
                    if n <= 64 {
                        column.withUnsafeMutableBufferPointer { values in
                            band.withUnsafeBufferPointer { band in
                                // Insertion sort: a few dozen values arrive in no order.
                                for i in 0..<n {
                                    let value = band[i * width + j]
                                    var k = i
                                    while k > 0 && values[k - 1] > value {
                                        values[k] = values[k - 1]
                                        k -= 1
                                    }
                                    values[k] = value
                                }
                            }
                        }
                    } else {
                        for i in 0..<n { column[i] = band[i * width + j] }
                        column.sort()
                    }
                    if rule == .median {
                        delta[start + j] = n % 2 == 1 ? column[n / 2] : Float((Double(column[n / 2 - 1]) + Double(column[n / 2])) / 2)
                    } else {
                        var total = 0.0
                        for i in cut..<(n - cut) { total += Double(column[i]) }
                        delta[start + j] = Float(total / Double(n - 2 * cut))
                    }
                }
                start = range.upperBound
            }
            return RobustAggregate(delta: delta, selected: order.map { rows[$0].worker }, reports: n)
        default:
            let f = byzantine ?? 0
            let m = selected ?? (n - f)
            guard (1...(n - f)).contains(m) else {
                throw CoordinatorError(.invalidConfiguration, "\(summary) cannot average \(m) of \(n) reports: at most n - f = \(n - f)")
            }
            // Pass 1: squared distances between every pair of reports, a band of columns at a time.
            var distances = [Double](repeating: 0, count: n * n)
            var start = 0
            while start < d {
                let range = start..<min(d, start + width)
                try load(range, rows: order)
                for a in 0..<n {
                    for b in (a + 1)..<n {
                        var sum = 0.0
                        for j in 0..<range.count {
                            let difference = Double(band[a * width + j]) - Double(band[b * width + j])
                            sum += difference * difference
                        }
                        distances[a * n + b] += sum
                        distances[b * n + a] += sum
                    }
                }
                start = range.upperBound
            }
            let neighbours = n - f - 2
            let scores = (0..<n).map { a -> Double in
                var others = (0..<n).filter { $0 != a }.map { distances[a * n + $0] }
                others.sort()
                return others.prefix(neighbours).reduce(0, +)
            }
            // Positions in `order` are already sorted by worker id, so a stable sort by score breaks ties by id.
            let chosen = (0..<n).sorted { scores[$0] < scores[$1] || (scores[$0] == scores[$1] && $0 < $1) }.prefix(m).sorted()
            let chosenRows = chosen.map { order[$0] }
            // Pass 2: the plain mean of the selected reports (each counts once, as in Blanchard et al.: a sample count is
            // the device's own claim, and weighting by it would let one selected report that claims many outweigh the rest).
            start = 0
            while start < d {
                let range = start..<min(d, start + width)
                try load(range, rows: chosenRows)
                for j in 0..<range.count {
                    var total = 0.0
                    for position in chosenRows.indices { total += Double(band[position * width + j]) }
                    delta[start + j] = Float(total / Double(chosenRows.count))
                }
                start = range.upperBound
            }
            return RobustAggregate(delta: delta, selected: chosenRows.map { rows[$0].worker }.sorted(), reports: n)
        }
    }
}

extension Coordinator {
    /// Reads every acknowledged report of a cycle from the store (every instance's, over a shared store sealed by the
    /// caller) into a scratch matrix and aggregates it by `rule`, off the actor's thread.
    func robustDelta(processID: String, cycle: Int, rule: RobustAggregationConfig, layout: ModelLayout) async throws -> RobustAggregate {
        let matrix = try ReportMatrix(columns: layout.totalCount, directory: configuration.scratchDirectory)
        // A stored diff of the wrong size is not transient: it is named after the read (a store may wrap what the
        // closure throws), and the caller abandons the cycle instead of retrying it on every tick.
        let misfits = Mutex<[String]>([])
        try await store.forEachPendingDiff(processID: processID, cycle: cycle) { pending in
            guard pending.diff.count == layout.totalCount * 4 else {
                misfits.withLock { $0.append("\(pending.workerID) (\(pending.diff.count) bytes)") }
                return
            }
            try matrix.append(pending.diff, worker: pending.workerID, sampleCount: pending.sampleCount)
        }
        if let misfit = misfits.withLock({ $0.first }) {
            throw CoordinatorError(.invalidConfiguration, "the stored diff of worker \(misfit) does not fit the model's \(layout.totalCount * 4) bytes")
        }
        return try await offCooperativePool { () throws(CoordinatorError) -> RobustAggregate in
            var result = try rule.aggregate(matrix)
            result.delta = layout.zeroingFrozen(result.delta)
            return result
        }
    }
}

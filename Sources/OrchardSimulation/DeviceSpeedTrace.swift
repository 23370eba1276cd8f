public import Foundation
import OrchardSupport

/// One client's entry of a device-capacity trace in FedScale's format (`client_device_capacity`).
///
/// FedScale's `ClientMetadata.get_completion_time` (fedscale/cloud/internal/client_metadata.py) reads `computation` as a
/// model's inference latency in milliseconds per sample, and counts a training step over a batch as three times its
/// forward pass: `3 × batch_size × local_steps × computation / 1000` seconds. It reads `communication` as the link's
/// bandwidth in kbit/s: a round's transfer takes `(upload_size + download_size) / communication` seconds, the sizes being
/// the model's pickled bytes / 1024 × 8 (fedscale/cloud/aggregation/aggregator.py), so one of its kbit is 1,024 bits.
public struct DeviceSpeed: Sendable, Hashable, Codable {
    /// The trace's client id.
    public var clientID: String
    /// FedScale's `computation`: milliseconds of one sample's forward pass on the device (positive).
    public var computation: Double
    /// FedScale's `communication`: the device's bandwidth in kbit/s of 1,024 bits (positive).
    public var communication: Double

    /// Creates an entry.
    public init(clientID: String, computation: Double, communication: Double) {
        self.clientID = clientID
        self.computation = computation
        self.communication = communication
    }

    /// The bandwidth in Mbit/s (10⁶ bits a second), the unit of ``FleetConditions/megabitsPerSecond``.
    public var megabitsPerSecond: Double { communication * 1024 / 1_000_000 }
}

/// Per-device compute and link speeds from a trace, for ``FleetConditions/deviceSpeeds``.
///
/// Device `i` of the fleet takes entry `i mod n` of the entries sorted by client id (numerically for numeric ids,
/// before the others in string order). A device's seconds per optimizer update is `medianSecondsPerUpdate` scaled by its
/// `computation` over the trace's median `computation`: FedScale's milliseconds are the latency of FedScale's own
/// benchmark model, so the trace sets how much faster or slower each device is, and the scenario's
/// ``SimulationConfiguration/secondsPerUpdate`` keeps setting what the median device takes for the model simulated. Its download speed is the trace's bandwidth
/// and its upload speed a quarter of that, as for the seeded draws (FedScale itself uses the one bandwidth both ways).
public struct DeviceSpeeds: Sendable, Hashable {
    /// The entries in the fleet's order (sorted by client id).
    public let entries: [DeviceSpeed]
    /// The median `computation` of the entries, milliseconds per sample.
    public let medianComputation: Double
    /// Where the entries were read from (a file's path), if anywhere.
    public var source: String?

    /// Sorts and checks `entries`: at least one, each `computation` and `communication` positive and finite.
    public init(_ entries: [DeviceSpeed], source: String? = nil) throws(SimulationError) {
        guard !entries.isEmpty else { throw SimulationError(.invalidTrace, "the device speed trace has no entries") }
        for entry in entries {
            for (name, value) in [("computation", entry.computation), ("communication", entry.communication)] where !(value > 0 && value.isFinite) {
                throw SimulationError(
                    .invalidTrace, "client \(entry.clientID): \(name) must be a positive, finite number, not \(value)")
            }
        }
        self.entries = entries.sorted(by: Self.precedes)
        let sorted = entries.map(\.computation).sorted()
        let middle = sorted.count / 2
        medianComputation = sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
        self.source = source
    }

    /// Numeric client ids first, by value, then the others in string order (ties by string).
    private static func precedes(_ a: DeviceSpeed, _ b: DeviceSpeed) -> Bool {
        switch (Int(a.clientID), Int(b.clientID)) {
        case let (x?, y?): x != y ? x < y : a.clientID < b.clientID
        case (.some, nil): true
        case (nil, .some): false
        case (nil, nil): a.clientID < b.clientID
        }
    }

    /// The entry of fleet device `device` (entry `device mod n`).
    public func speed(for device: Int) -> DeviceSpeed {
        let count = entries.count
        return entries[((device % count) + count) % count]
    }

    /// Fleet device `device`'s profile, its median device taking `medianSecondsPerUpdate` per optimizer update.
    public func profile(device: Int, medianSecondsPerUpdate: Double) -> DeviceProfile {
        let speed = speed(for: device)
        let bytesPerSecond = speed.megabitsPerSecond * 125_000
        return DeviceProfile(
            secondsPerUpdate: medianSecondsPerUpdate * speed.computation / medianComputation, downloadBytesPerSecond: bytesPerSecond,
            uploadBytesPerSecond: bytesPerSecond / 4)
    }
}

/// Reads device speed traces in FedScale's device-capacity format, `{client_id: {"computation": ms per sample,
/// "communication": kbit/s}}` (see ``DeviceSpeed``), as JSON or as CSV with a `client_id,computation,communication`
/// header.
///
/// FedScale ships the mapping pickled (`benchmark/dataset/data/device_info/client_device_capacity`); Orchard reads no
/// pickles, so convert it to JSON once:
///
/// ```python
/// import json, pickle
/// json.dump({str(k): {"computation": float(v["computation"]), "communication": float(v["communication"])} for k, v in pickle.load(open("client_device_capacity", "rb")).items()}, open("device_capacity.json", "w"))
/// ```
public enum DeviceSpeedTrace {
    /// Reads a trace file: JSON for a `.json` file or text starting with `{`, CSV otherwise.
    public static func read(contentsOf url: URL) throws(SimulationError) -> DeviceSpeeds {
        let data: Data
        do { data = try Data(contentsOf: url) } catch {
            throw SimulationError(.unreadable, "cannot read the device speed trace \(url.path): \(FileAccessError(error).message)")
        }
        let isJSON =
            url.pathExtension.lowercased() == "json" || data.first(where: { ![0x20, 0x09, 0x0A, 0x0D, 0xEF, 0xBB, 0xBF].contains($0) }) == UInt8(ascii: "{")
        var speeds: DeviceSpeeds
        do throws(SimulationError) {
            if isJSON {
                speeds = try parseJSON(data)
            } else {
                guard let text = String(data: data, encoding: .utf8) else {
                    throw SimulationError(.invalidTrace, "the file is not UTF-8 text")
                }
                speeds = try parseCSV(text)
            }
        } catch {
            throw SimulationError(error.code, "device speed trace \(url.path): \(error.message)")
        }
        speeds.source = url.path
        return speeds
    }

    /// Parses a JSON object mapping each client id to `{"computation": ms per sample, "communication": kbit/s}`.
    public static func parseJSON(_ data: Data) throws(SimulationError) -> DeviceSpeeds {
        struct Fields: Decodable {
            var computation: Double?
            var communication: Double?
        }
        let clients: [String: Fields]
        do { clients = try JSONDecoder().decode([String: Fields].self, from: data) } catch let error as DecodingError {
            throw SimulationError(.invalidTrace, message(error))
        } catch {
            throw SimulationError(.invalidTrace, "not valid JSON: \(error)")
        }
        var entries: [DeviceSpeed] = []
        entries.reserveCapacity(clients.count)
        for (id, fields) in clients {
            guard let computation = fields.computation else { throw SimulationError(.invalidTrace, "client \(id): missing \"computation\"") }
            guard let communication = fields.communication else { throw SimulationError(.invalidTrace, "client \(id): missing \"communication\"") }
            entries.append(DeviceSpeed(clientID: id, computation: computation, communication: communication))
        }
        return try DeviceSpeeds(entries)
    }

    /// A decoding error as a sentence about the trace: which client and field, or that the text is not JSON.
    private static func message(_ error: DecodingError) -> String {
        let expected = "expected a JSON object mapping client ids to {\"computation\": ms per sample, \"communication\": kbit/s}"
        switch error {
        case .typeMismatch(_, let context), .valueNotFound(_, let context):
            let path = context.codingPath.map(\.stringValue)
            switch path.count {
            case 0: return expected
            case 1: return "client \(path[0]): expected an object {\"computation\": ms per sample, \"communication\": kbit/s}"
            default: return "client \(path[0]): \"\(path[1])\" must be a number"
            }
        case .dataCorrupted(let context):
            let path = context.codingPath.map(\.stringValue)
            if path.count >= 2 { return "client \(path[0]): \"\(path[1])\" is not a usable number" }
            return "not valid JSON (\(context.debugDescription)); \(expected)"
        case .keyNotFound(let key, let context):
            return "client \(context.codingPath.first?.stringValue ?? "?"): missing \"\(key.stringValue)\""
        @unknown default:
            return "\(expected): \(error)"
        }
    }

    /// Parses CSV text with a `client_id,computation,communication` header (other columns are ignored; blank lines and
    /// lines starting with `#` too).
    public static func parseCSV(_ text: String) throws(SimulationError) -> DeviceSpeeds {
        let required = ["client_id", "computation", "communication"]
        var header: [String]?
        var entries: [DeviceSpeed] = []
        var lines: [String: Int] = [:]
        for (index, raw) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard let columns = header else {
                let names = fields.map { $0.lowercased() }
                guard required.allSatisfy(names.contains) else {
                    throw SimulationError(
                        .invalidTrace, "line \(index + 1): the header must name the columns client_id, computation and communication, not \(fields)")
                }
                header = names
                continue
            }
            guard fields.count == columns.count else {
                throw SimulationError(.invalidTrace, "line \(index + 1): \(fields.count) fields, the header has \(columns.count)")
            }
            func value(_ name: String) -> String { fields[columns.firstIndex(of: name)!] }
            let id = value("client_id")
            guard !id.isEmpty else { throw SimulationError(.invalidTrace, "line \(index + 1): the client_id is empty") }
            if let first = lines[id] {
                throw SimulationError(.invalidTrace, "line \(index + 1): client \(id) is listed twice (first on line \(first))")
            }
            lines[id] = index + 1
            func number(_ name: String) throws(SimulationError) -> Double {
                guard let number = Double(value(name)), number > 0, number.isFinite else {
                    throw SimulationError(.invalidTrace, "line \(index + 1): \(name) '\(value(name))' is not a positive, finite number")
                }
                return number
            }
            entries.append(DeviceSpeed(clientID: id, computation: try number("computation"), communication: try number("communication")))
        }
        guard header != nil else {
            throw SimulationError(.invalidTrace, "the trace is empty (a CSV trace needs a client_id,computation,communication header)")
        }
        return try DeviceSpeeds(entries)
    }
}

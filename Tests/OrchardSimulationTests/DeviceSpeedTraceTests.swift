import Foundation
import Testing
@testable import OrchardSimulation

/// SplitMix64: a small seeded generator, so the property tests' cases are the same on every run.
private struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite struct DeviceSpeedTraceTests {
    static let json =
        #"{"1": {"computation": 153.0, "communication": 2210.0}, "10": {"computation": 50, "communication": 10000}, "2": {"computation": 400.5, "communication": 800}}"#
    static let csv = "# FedScale device capacity\r\nclient_id,computation,communication\r\n2,400.5,800\r\n\r\n10,50,10000\r\n1,153.0,2210.0\r\n"

    static func error(_ body: () throws(SimulationError) -> DeviceSpeeds) -> SimulationError? {
        do {
            _ = try body()
            return nil
        } catch { return error }
    }

    @Test func parsesJSONAndCSVAlike() throws {
        let fromJSON = try DeviceSpeedTrace.parseJSON(Data(Self.json.utf8))
        let fromCSV = try DeviceSpeedTrace.parseCSV(Self.csv)
        #expect(fromJSON == fromCSV)
        // Sorted by numeric client id: 1, 2, 10 (not the string order 1, 10, 2).
        #expect(fromJSON.entries.map(\.clientID) == ["1", "2", "10"])
        #expect(fromJSON.entries[0] == DeviceSpeed(clientID: "1", computation: 153, communication: 2210))
        #expect(fromJSON.entries[1].computation == 400.5 && fromJSON.entries[2].communication == 10_000)
        #expect(fromJSON.medianComputation == 153)
        #expect(abs(fromJSON.entries[0].megabitsPerSecond - 2.26304) < 1e-12)
    }

    @Test func csvColumnsMayComeInAnyOrderBesideOthers() throws {
        let speeds = try DeviceSpeedTrace.parseCSV("communication, model ,client_id,computation\n2210,Pixel,7,153\n")
        #expect(speeds.entries == [DeviceSpeed(clientID: "7", computation: 153, communication: 2210)])
    }

    @Test func deviceIMapsToEntryIModNInClientIDOrder() throws {
        let speeds = try DeviceSpeedTrace.parseCSV("client_id,computation,communication\nb,1,1\n10,2,2\na,3,3\n2,4,4\n")
        // Numeric ids by value first, then the others in string order.
        #expect(speeds.entries.map(\.clientID) == ["2", "10", "a", "b"])
        #expect((0..<10).map { speeds.speed(for: $0).clientID } == ["2", "10", "a", "b", "2", "10", "a", "b", "2", "10"])
        #expect(speeds.speed(for: 4_000_001).clientID == "10")
    }

    @Test func aProfileTakesTheTracesNumbers() throws {
        let speeds = try DeviceSpeedTrace.parseJSON(Data(Self.json.utf8))
        // Median computation 153 ms: device 0 (client 1) is the median device, device 1 (client 2) is 400.5 / 153 times slower.
        let profile = speeds.profile(device: 1, medianSecondsPerUpdate: 0.5)
        #expect(abs(profile.secondsPerUpdate - 0.5 * 400.5 / 153) < 1e-12)
        #expect(abs(profile.downloadBytesPerSecond - 800 * 1024 / 8) < 1e-9)
        #expect(abs(profile.uploadBytesPerSecond - 800 * 1024 / 8 / 4) < 1e-9)
        #expect(speeds.profile(device: 3, medianSecondsPerUpdate: 0.5).secondsPerUpdate == 0.5)

        let conditions = FleetConditions(medianSecondsPerUpdate: 0.5, deviceSpeeds: speeds)
        for device in 0..<6 {
            #expect(conditions.profile(device: device, seed: 9) == speeds.profile(device: device, medianSecondsPerUpdate: 0.5))
        }
        // Without a trace, the seeded draws as before.
        let drawn = FleetConditions(medianSecondsPerUpdate: 0.5, speedSpread: 0.3, megabitsPerSecond: 5...10)
        #expect(drawn.deviceSpeeds == nil)
        #expect(
            drawn.profile(device: 4, seed: 9) == DeviceProfile.sample(device: 4, seed: 9, medianSecondsPerUpdate: 0.5, spread: 0.3, megabitsPerSecond: 5...10))
    }

    /// One round of one device (client 1 of `csv`) with 20 updates of a 3-number model, at a median second an update.
    static func oneDevicesRound(trace csv: String) async throws -> RoundMetrics {
        let conditions = FleetConditions(
            windowSeconds: 60, resumeDelay: 30...180, checkInSpread: 0, medianSecondsPerUpdate: 1, deviceSpeeds: try DeviceSpeedTrace.parseCSV(csv))
        let fleet = FleetSimulation(devices: 1, conditions: conditions, seed: 1, rounds: 1)
        let workload = FakeWorkload(optima: [[1, 2, 3]], samples: [10], updates: 20, step: 0.1)
        return try #require(try await FleetHarness.run(fleet, workload: workload, goal: 1).rounds.first)
    }

    @Test func aFleetDeviceRunsAtTheTracesSpeed() async throws {
        // Client 1 is 100 ms a sample against the median's 200: half the median second per update. Its 20 updates take
        // 10 virtual seconds; its 10 Gbit/s link makes the transfers of the 3-number model negligible.
        let r = try await Self.oneDevicesRound(trace: "client_id,computation,communication\n1,100,10000000\n2,300,10000000\n")
        #expect(r.participants == 1)
        #expect(r.virtualEnd > 10 && r.virtualEnd < 10.01, "\(r.virtualEnd)")
    }

    /// A trace outlier far faster than the median (1e-20 against 100): its updates' cost is so small that the updates
    /// fitting its window overflowed an Int and trapped; it now does its work in no time.
    @Test func aDeviceFarFasterThanTheMedianDoesNotTrap() async throws {
        let r = try await Self.oneDevicesRound(trace: "client_id,computation,communication\n1,1e-20,10000000\n2,100,10000000\n3,100,10000000\n")
        #expect(r.participants == 1)
    }

    @Test func theConfigurationCarriesTheTraceIntoConditionsAndSettings() throws {
        var c = SimulationConfiguration.housing
        #expect(c.deviceSpeeds == nil && c.conditions.deviceSpeeds == nil)
        #expect(c.settings["device_speeds"] == nil)
        var speeds = try DeviceSpeedTrace.parseJSON(Data(Self.json.utf8))
        c.deviceSpeeds = speeds
        #expect(c.conditions.deviceSpeeds == speeds)
        #expect(c.settings["device_speeds"] == "trace")
        speeds.source = "/data/device_capacity.json"
        c.deviceSpeeds = speeds
        #expect(c.settings["device_speeds"] == "/data/device_capacity.json")
        try c.validate()
    }

    @Test func readsFilesAsJSONOrCSV() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-speeds-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let json = dir.appendingPathComponent("speeds.json"), csv = dir.appendingPathComponent("speeds.csv")
        let bare = dir.appendingPathComponent("client_device_capacity")
        try Data(Self.json.utf8).write(to: json)
        try Data(Self.csv.utf8).write(to: csv)
        try Data(("\n  " + Self.json).utf8).write(to: bare)
        let a = try DeviceSpeedTrace.read(contentsOf: json), b = try DeviceSpeedTrace.read(contentsOf: csv)
        let c = try DeviceSpeedTrace.read(contentsOf: bare)
        #expect(a.entries == b.entries && b.entries == c.entries)
        #expect(a.source == json.path && c.source == bare.path)

        let missing = dir.appendingPathComponent("missing.json")
        let error = try #require(Self.error { () throws(SimulationError) in try DeviceSpeedTrace.read(contentsOf: missing) })
        #expect(error.code == .unreadable)
        #expect(error.message.contains("cannot read the device speed trace \(missing.path)"), "\(error.message)")

        let bad = dir.appendingPathComponent("bad.csv")
        try Data("client_id,computation,communication\n1,-5,10\n".utf8).write(to: bad)
        let malformed = try #require(Self.error { () throws(SimulationError) in try DeviceSpeedTrace.read(contentsOf: bad) })
        #expect(malformed.code == .invalidTrace)
        #expect(malformed.message.hasPrefix("device speed trace \(bad.path): line 2: computation '-5'"), "\(malformed.message)")
    }

    @Test(arguments: [
        ("", "not valid JSON"),
        ("{\"1\": {\"computation\": 1, \"communication\": 2", "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object mapping client ids"),
        ("42", "expected a JSON object mapping client ids"),
        ("{}", "has no entries"),
        ("{\"1\": 5}", "client 1: expected an object"),
        ("{\"1\": {\"communication\": 2}}", "client 1: missing \"computation\""),
        ("{\"1\": {\"computation\": 2}}", "client 1: missing \"communication\""),
        ("{\"1\": {\"computation\": \"fast\", \"communication\": 2}}", "client 1: \"computation\" must be a number"),
        ("{\"1\": {\"computation\": true, \"communication\": 2}}", "client 1: \"computation\" must be a number"),
        ("{\"1\": {\"computation\": null, \"communication\": 2}}", "client 1: missing \"computation\""),
        ("{\"1\": {\"computation\": 2, \"communication\": -1}}", "client 1: communication must be a positive, finite number, not -1.0"),
        ("{\"1\": {\"computation\": 0, \"communication\": 1}}", "client 1: computation must be a positive, finite number, not 0.0"),
        // Foundation's decoder refuses a number beyond Double's range as invalid JSON.
        ("{\"1\": {\"computation\": 1e999, \"communication\": 1}}", "not valid JSON"),
    ])
    func badJSONIsRefusedSayingWhy(_ text: String, _ reason: String) throws {
        let error = try #require(Self.error { () throws(SimulationError) in try DeviceSpeedTrace.parseJSON(Data(text.utf8)) })
        #expect(error.code == .invalidTrace)
        #expect(error.message.contains(reason), "\(error.message)")
    }

    @Test(arguments: [
        ("", "the trace is empty"),
        ("# only a comment\n\n", "the trace is empty"),
        ("client_id,computation,communication\n", "has no entries"),
        ("client,computation,communication\n1,2,3\n", "line 1: the header must name the columns client_id, computation and communication"),
        ("client_id,computation,communication\n1,2\n", "line 2: 2 fields, the header has 3"),
        ("client_id,computation,communication\n1,2,3\n2,3,4\n1,5,6\n", "line 4: client 1 is listed twice (first on line 2)"),
        ("client_id,computation,communication\n1,,3\n", "line 2: computation '' is not a positive, finite number"),
        ("client_id,computation,communication\n1,2,-3\n", "line 2: communication '-3' is not a positive, finite number"),
        ("client_id,computation,communication\n1,nan,3\n", "line 2: computation 'nan'"),
        ("client_id,computation,communication\n1,2,inf\n", "line 2: communication 'inf'"),
        ("client_id,computation,communication\n1,fast,3\n", "line 2: computation 'fast'"),
        ("client_id,computation,communication\n,2,3\n", "line 2: the client_id is empty"),
    ])
    func badCSVIsRefusedSayingWhy(_ text: String, _ reason: String) throws {
        let error = try #require(Self.error { () throws(SimulationError) in try DeviceSpeedTrace.parseCSV(text) })
        #expect(error.code == .invalidTrace)
        #expect(error.message.contains(reason), "\(error.message)")
    }

    /// Whatever the parser returns is usable: entries sorted, every number positive and finite.
    static func checkUsable(_ speeds: DeviceSpeeds) {
        #expect(!speeds.entries.isEmpty)
        #expect(speeds.medianComputation > 0 && speeds.medianComputation.isFinite)
        for entry in speeds.entries {
            #expect(entry.computation > 0 && entry.computation.isFinite && entry.communication > 0 && entry.communication.isFinite)
        }
        let profile = speeds.profile(device: 123, medianSecondsPerUpdate: 0.5)
        #expect(profile.secondsPerUpdate > 0 && profile.secondsPerUpdate.isFinite && profile.uploadBytesPerSecond > 0)
    }

    /// Both parsers on `bytes`: each either returns a usable trace or throws a `SimulationError` with a message.
    static func survive(_ bytes: [UInt8]) {
        switch Result(catching: { () throws(SimulationError) in try DeviceSpeedTrace.parseJSON(Data(bytes)) }) {
        case .success(let speeds): checkUsable(speeds)
        case .failure(let error): #expect(!error.message.isEmpty)
        }
        switch Result(catching: { () throws(SimulationError) in try DeviceSpeedTrace.parseCSV(String(decoding: bytes, as: UTF8.self)) }) {
        case .success(let speeds): checkUsable(speeds)
        case .failure(let error): #expect(!error.message.isEmpty)
        }
    }

    @Test func arbitraryGarbageNeverCrashesTheParsers() {
        var random = SplitMix(state: 0x5EED)
        let tokens: [String] = [
            "{", "}", "[", "]", ":", ",", "\"", "\n", "\r\n", " ", "#", "client_id", "computation", "communication", "\"1\"", "\"computation\"",
            "\"communication\"", "0", "-1", "1e999", "-0", "nan", "inf", "NaN", "1.5", "153.0", "2210", "null", "true", "\\u0000", "é", "\u{0}",
            "9999999999999999999999",
        ]
        for _ in 0..<1500 {
            // Random bytes.
            Self.survive((0..<Int.random(in: 0...64, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) })
            // Random sequences of the formats' own tokens, which reach far deeper into both parsers.
            Self.survive(Array((0..<Int.random(in: 0...40, using: &random)).map { _ in tokens.randomElement(using: &random)! }.joined().utf8))
        }
    }

    @Test func mutatedTracesNeverCrashTheParsers() {
        var random = SplitMix(state: 0xC0FFEE)
        for source in [Self.json, Self.csv] {
            for _ in 0..<1500 {
                var bytes = Array(source.utf8)
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    let at = Int.random(in: 0..<max(bytes.count, 1), using: &random)
                    switch Int.random(in: 0..<4, using: &random) {
                    case 0 where !bytes.isEmpty: bytes.remove(at: at)
                    case 1: bytes.insert(UInt8.random(in: 0...255, using: &random), at: min(at, bytes.count))
                    case 2 where !bytes.isEmpty: bytes[at] = Array("{}[],:\"-.e0123456789\n#".utf8).randomElement(using: &random)!
                    default: bytes = Array(bytes.prefix(at))
                    }
                }
                Self.survive(bytes)
            }
        }
    }

    @Test func randomValidTracesRoundTripThroughBothFormats() throws {
        var random = SplitMix(state: 42)
        for _ in 0..<200 {
            let count = Int.random(in: 1...30, using: &random)
            let ids = Set(
                (0..<count).map { _ in
                    Bool.random(using: &random) ? String(Int.random(in: 0...100_000, using: &random)) : "c\(UInt32.random(in: 0...UInt32.max, using: &random))"
                })
            let entries = ids.map {
                DeviceSpeed(
                    clientID: $0, computation: Double.random(in: 0.001...5_000, using: &random), communication: Double.random(in: 0.001...1e6, using: &random))
            }
            let csv = "client_id,computation,communication\n" + entries.map { "\($0.clientID),\($0.computation),\($0.communication)" }.joined(separator: "\n")
            let json = try JSONEncoder().encode(
                Dictionary(uniqueKeysWithValues: entries.map { ($0.clientID, ["computation": $0.computation, "communication": $0.communication]) }))
            let expected = try DeviceSpeeds(entries)
            #expect(try DeviceSpeedTrace.parseCSV(csv) == expected)
            #expect(try DeviceSpeedTrace.parseJSON(json) == expected)
            // Device i takes entry i mod n of the sorted entries.
            for device in 0..<(2 * count) { #expect(expected.speed(for: device) == expected.entries[device % expected.entries.count]) }
        }
    }
}

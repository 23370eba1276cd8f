import Foundation
import Testing
@testable import OrchardSimulation

@Suite struct AvailabilityTests {
    @Test func alwaysIsAlwaysAvailable() {
        for t in [0.0, 3_600, 1e7] { #expect(Availability.always.isAvailable(7, at: t, seed: 1)) }
    }

    @Test func diurnalPeaksAtNightAndIsReproducible() {
        let devices = 400
        // Time 0 is 18:00; 03:00 is 9 h later, 13:00 is 19 h later.
        let night = Availability.diurnal.availableFraction(devices: devices, at: 9 * 3600, seed: 42)
        let day = Availability.diurnal.availableFraction(devices: devices, at: 19 * 3600, seed: 42)
        #expect(night > 0.5 && night < 0.95)
        #expect(day < 0.15)
        #expect(Availability.diurnal.availableFraction(devices: devices, at: 9 * 3600, seed: 42) == night)
        #expect(Availability.diurnal.availableFraction(devices: devices, at: 9 * 3600, seed: 43) != night)
    }

    @Test func diurnalWindowLookupIsConsistent() {
        for device in 0..<50 {
            var t = 0.0
            while t < 3 * Availability.day {
                guard let w = Availability.diurnal.window(for: device, atOrAfter: t, seed: 7) else { break }
                #expect(w.end > t)
                #expect(w.start < w.end)
                #expect(Availability.diurnal.isAvailable(device, at: max(t, w.start), seed: 7))
                t = w.end + 1
            }
        }
    }

    @Test func traceCSVAndJSONLinesAgree() throws {
        let csv = "# a trace\ndevice,start,end\n0,0,100\n0,200,inf\n1,50,60\n"
        let jsonl = "{\"device\":0,\"start\":0,\"end\":100}\n{\"device\":0,\"start\":200}\n\n{\"device\":1,\"start\":50,\"end\":60}\n"
        let a = try AvailabilityTrace.parseCSV(csv), b = try AvailabilityTrace.parseJSONLines(jsonl)
        #expect(a == b)
        let trace = Availability.trace(a)
        #expect(trace.isAvailable(0, at: 99, seed: 0))
        #expect(!trace.isAvailable(0, at: 150, seed: 0))
        #expect(trace.window(for: 0, atOrAfter: 150, seed: 0) == AvailabilityWindow(device: 0, start: 200, end: .infinity))
        #expect(trace.window(for: 1, atOrAfter: 60, seed: 0) == nil)
        #expect(!trace.isAvailable(2, at: 0, seed: 0))
    }

    @Test(arguments: [
        "device,start\n0,1\n",
        "device,start,end\n0,5,5\n",
        "device,start,end\n-1,0,5\n",
        "device,start,end\n0,0,10\n0,5,20\n",
        "device,start,end\n0,zero,10\n",
        "",
    ])
    func malformedCSVTracesAreRejected(_ text: String) {
        #expect(throws: SimulationError.self) { try AvailabilityTrace.parseCSV(text) }
    }

    @Test func readsTraceFilesByExtension() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-trace-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let jsonl = dir.appendingPathComponent("t.jsonl")
        try Data("{\"device\":3,\"start\":1,\"end\":2}\n".utf8).write(to: jsonl)
        #expect(try AvailabilityTrace.read(contentsOf: jsonl) == [AvailabilityWindow(device: 3, start: 1, end: 2)])
        #expect(throws: SimulationError.self) { try AvailabilityTrace.read(contentsOf: dir.appendingPathComponent("missing.csv")) }
    }
}

/// One device's round through its own scheduler and job, on its virtual clock: the window arithmetic, expiry and
/// resumption, the deadline, and dropout.
@Suite struct DeviceRoundTests {
    static func conditions(_ availability: Availability = .always, windowSeconds: Double, resumeDelay: ClosedRange<Double> = 30...180, dropout: Double = 0)
        -> FleetConditions
    {
        FleetConditions(
            availability: availability, dropout: dropout, windowSeconds: windowSeconds, resumeDelay: resumeDelay, checkInSpread: 0,
            medianSecondsPerUpdate: 1, speedSpread: 0
        )
    }

    static func workload(devices: Int) -> FakeWorkload {
        FakeWorkload(optima: Array(repeating: [1, 2, 3], count: devices), samples: Array(repeating: 10, count: devices), updates: 20, step: 0.1)
    }

    @Test func finishesInsideOneWindow() async throws {
        let fleet = FleetSimulation(devices: 1, conditions: Self.conditions(windowSeconds: 60), seed: 1, rounds: 1)
        let r = try #require(try await FleetHarness.run(fleet, workload: Self.workload(devices: 1), goal: 1).rounds.first)
        #expect(r.selected == 1 && r.participants == 1 && r.expirations == 0 && r.resumed == 0)
        // 20 updates of one virtual second, plus the transfers of a 3-number model.
        #expect(r.virtualEnd > 20 && r.virtualEnd < 20.01)
    }

    @Test func expiresAndResumesAcrossBackgroundWindows() async throws {
        let fleet = FleetSimulation(devices: 1, conditions: Self.conditions(windowSeconds: 8, resumeDelay: 100...100), seed: 1, rounds: 1)
        let r = try #require(try await FleetHarness.run(fleet, workload: Self.workload(devices: 1), goal: 1).rounds.first)
        // The download takes a sliver of the first window, so 7 updates fit; the window expires at 8, the next opens
        // at 108 (the cycle request returns the same assignment, the model is cached) and runs 8 more to 116, the
        // third opens at 216 and runs the last 5: the report arrives just after 221.
        #expect(r.selected == 1 && r.participants == 1)
        #expect(r.expirations == 2 && r.resumed == 2)
        #expect(r.virtualEnd > 221 && r.virtualEnd < 221.01)
        #expect(r.bytesDown > 0 && r.bytesUp > 0)
    }

    @Test func aDownloadCutByTheWindowResumesFromItsLastByte() async throws {
        // 0.001 Mbit/s is 125 bytes a second down and a quarter of that up: the coordinator's checkpoint of the fake
        // model (a safetensors file of over 124 bytes) takes longer than two 0.5-second windows to download, so the
        // windows cut it and each later one continues from the last byte received. The report then never fits a
        // window: the device is late.
        var conditions = Self.conditions(windowSeconds: 0.5, resumeDelay: 1...1)
        conditions.megabitsPerSecond = 0.001...0.001
        conditions.medianSecondsPerUpdate = 0.01
        let fleet = FleetSimulation(devices: 1, conditions: conditions, seed: 1, rounds: 1)
        var model = 0
        let r = try #require(try await FleetHarness.run(fleet, workload: Self.workload(devices: 1), goal: 1, cycleSeconds: 60) { model = $0 }.rounds.first)
        #expect(model > 2 * 62)
        // Every byte came down exactly once, across the windows (a restarted download would count bytes again).
        #expect(r.bytesDown == model)
        #expect(r.bytesUp == 0 && r.late == 1 && r.expirations >= 3)
    }

    @Test func missesTheDeadlineWhenWindowsRunOut() async throws {
        let trace = Availability.trace([AvailabilityWindow(device: 0, start: 0, end: 15)])
        let fleet = FleetSimulation(devices: 1, conditions: Self.conditions(trace, windowSeconds: 60), seed: 1, rounds: 1)
        let r = try #require(try await FleetHarness.run(fleet, workload: Self.workload(devices: 1), goal: 1, cycleSeconds: 300).rounds.first)
        #expect(r.selected == 1 && r.participants == 0 && r.late == 1)
        #expect(r.expirations == 1 && r.resumed == 0)
        #expect(r.virtualEnd == 300 && !r.aggregated)
    }

    @Test func aDeviceThatGoesAwayBetweenWindowsDropsOutThere() async throws {
        // Certain dropout at a point of a 20-second job, with 3-second windows 100 seconds apart: most devices go
        // away while no window is open; they are dropouts, not late devices.
        let fleet = FleetSimulation(devices: 12, conditions: Self.conditions(windowSeconds: 3, resumeDelay: 100...100, dropout: 1), seed: 4, rounds: 1)
        let r = try #require(try await FleetHarness.run(fleet, workload: Self.workload(devices: 12), goal: 12).rounds.first)
        #expect(r.selected == 12 && r.dropouts == 12 && r.late == 0 && r.participants == 0)
        #expect(r.expirations > 0)
    }

    @Test func dropoutRateFollowsProbability() async throws {
        let devices = 150
        let fleet = FleetSimulation(devices: devices, conditions: Self.conditions(windowSeconds: 60, dropout: 0.3), seed: 9, rounds: 1)
        let r = try #require(try await FleetHarness.run(fleet, workload: Self.workload(devices: devices), goal: devices).rounds.first)
        #expect(r.selected == devices)
        #expect(abs(Double(r.dropouts) / Double(devices) - 0.3) < 0.1)
        #expect(r.participants == 0 || r.participants == devices - r.dropouts)
        #expect(r.late == 0)
    }
}

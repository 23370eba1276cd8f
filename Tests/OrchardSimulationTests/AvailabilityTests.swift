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

@Suite struct DeviceScheduleTests {
    let profile = DeviceProfile(secondsPerUpdate: 1, downloadBytesPerSecond: 1e9, uploadBytesPerSecond: 1e9)

    @Test func finishesInsideOneWindow() {
        let s = DeviceSchedule.plan(
            device: 0, checkIn: 10, updates: 20, downloadBytes: 0, uploadBytes: 0, deadline: 1000, round: 1,
            profile: profile, conditions: FleetConditions(windowSeconds: 60), seed: 1
        )
        #expect(s.updatesPerWindow == [20])
        #expect(s.expirations.isEmpty && s.resumptions.isEmpty)
        #expect(s.outcome == .reports(at: 30))
    }

    @Test func expiresAndResumesAcrossBackgroundWindows() {
        let conditions = FleetConditions(windowSeconds: 8, resumeDelay: 100...100)
        let s = DeviceSchedule.plan(
            device: 0, checkIn: 0, updates: 20, downloadBytes: 0, uploadBytes: 0, deadline: 1000, round: 1,
            profile: profile, conditions: conditions, seed: 1
        )
        #expect(s.updatesPerWindow == [8, 8, 4])
        #expect(s.expirations == [8, 116])
        #expect(s.resumptions == [108, 216])
        #expect(s.outcome == .reports(at: 220))
        #expect(s.updatesPerWindow.reduce(0, +) == 20)
    }

    @Test func missesTheDeadlineWhenWindowsRunOut() {
        let trace = Availability.trace([AvailabilityWindow(device: 0, start: 0, end: 5)])
        let s = DeviceSchedule.plan(
            device: 0, checkIn: 0, updates: 20, downloadBytes: 0, uploadBytes: 0, deadline: 1000, round: 1,
            profile: profile, conditions: FleetConditions(availability: trace, windowSeconds: 60), seed: 1
        )
        #expect(s.outcome == .missesDeadline)
        #expect(s.expirations == [5])
        #expect(s.resumptions.isEmpty)
    }

    @Test func dropoutRateFollowsProbability() {
        let conditions = FleetConditions(dropout: 0.3)
        var drops = 0
        for device in 0..<2000 {
            let s = DeviceSchedule.plan(
                device: device, checkIn: 0, updates: 10, downloadBytes: 0, uploadBytes: 0, deadline: 1000, round: 3,
                profile: profile, conditions: conditions, seed: 9
            )
            if case .dropsOut(let at) = s.outcome {
                drops += 1
                #expect(at >= 0 && at <= 10)
            }
        }
        #expect(abs(Double(drops) / 2000 - 0.3) < 0.04)
    }
}

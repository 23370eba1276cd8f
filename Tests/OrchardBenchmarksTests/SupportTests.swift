import Foundation
import OrchardBenchmarks
import Testing

@Suite struct PercentileTests {
    @Test func nearestRankOnAHundredValues() {
        let values = (1...100).map(Double.init).shuffled()
        #expect(Percentile.nearestRank(0.5, of: values) == 50)
        #expect(Percentile.nearestRank(0.99, of: values) == 99)
        #expect(Percentile.nearestRank(0.999, of: values) == 100)
        #expect(Percentile.nearestRank(1, of: values) == 100)
        #expect(Percentile.nearestRank(0, of: values) == 1)
        #expect(Percentile.nearestRank(0.011, of: values) == 2)
    }

    @Test func fewValues() {
        #expect(Percentile.nearestRank(0.5, of: []) == nil)
        #expect(Percentile.nearestRank(0.99, of: [7]) == 7)
        #expect(Percentile.nearestRank(0.5, of: [3, 1, 2]) == 2)
        #expect(Percentile.nearestRank(0.5, of: [4, 1, 3, 2]) == 2)
        #expect(Percentile.nearestRank(0.99, of: [4, 1, 3, 2]) == 4)
    }
}

@Suite struct PeakMemoryTests {
    @Test func readsTheHighWaterMarkInKibibytes() {
        let status = "Name:\torchard\nVmPeak:\t  999999 kB\nVmHWM:\t   12345 kB\nVmRSS:\t   12000 kB\n"
        #expect(PeakMemory.highWaterMark(status) == 12345 * 1024)
        #expect(PeakMemory.highWaterMark("Name:\torchard\n") == nil)
        #expect(PeakMemory.highWaterMark("VmHWM:\tmany kB\n") == nil)
    }

    #if os(Linux)
    @Test func thePeakIsAtLeastTheCurrentResidentSetInMiB() throws {
        // 32 MiB written now, so resident now; the high-water mark can only be higher.
        let buffer = [UInt8](repeating: 1, count: 32 << 20)
        let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
        let rssLine = try #require(status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") })
        let rssKiB = try #require(rssLine.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap { Double($0) })
        let peak = try #require(PeakMemory.residentMiB())
        #expect(peak >= rssKiB / 1024)
        #expect(peak >= 32)
        #expect(buffer.count == 32 << 20)
    }
    #endif
}

@Suite struct JSONLineTests {
    struct Sample: Encodable {
        var samplesPerSecond = 12.5
        var peakRSSMiB = 3.25
        var path = "/tmp/x"
        var automaticRunsOn = "avx2"
        var note: String? = nil

        enum CodingKeys: String, CodingKey {
            case samplesPerSecond, peakRSSMiB = "peak_rss_mib", path, automaticRunsOn, note
        }
    }

    @Test func snakeCaseSortedKeysOnOneLine() throws {
        #expect(try JSONLine.encode(Sample()) == #"{"automatic_runs_on":"avx2","path":"/tmp/x","peak_rss_mib":3.25,"samples_per_second":12.5}"#)
        #expect(try JSONLine.encode(["b": 1, "a": 2]) == #"{"a":2,"b":1}"#)
        #expect(try JSONLine.encode(["text": "two\nlines"]) == #"{"text":"two\nlines"}"#)
    }

    @Test func writesOneTerminatedLinePerValue() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("jsonline-\(UUID().uuidString)")
        _ = FileManager.default.createFile(atPath: url.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: url) }
        let handle = try FileHandle(forWritingTo: url)
        try JSONLine.write(["event": "started"], to: handle)
        try JSONLine.write(Sample(), to: handle)
        try handle.close()
        let lines = try String(contentsOf: url, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count == 3 && lines[2].isEmpty)
        #expect(lines[0] == #"{"event":"started"}"#)
        #expect(lines[1].hasPrefix(#"{"automatic_runs_on""#))
    }
}

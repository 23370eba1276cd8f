import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The process's memory high-water mark, as every benchmark reports it: in MiB (2²⁰ bytes), under keys named
/// `…_mib`.
public enum PeakMemory {
    /// Bytes in a MiB.
    public static let bytesPerMiB = 1_048_576.0

    /// This process's peak resident set size in MiB: `VmHWM` from `/proc/self/status` on Linux, `ru_maxrss`
    /// elsewhere; nil when neither can be read.
    public static func residentMiB() -> Double? {
        #if os(Linux)
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
        return highWaterMark(status).map { Double($0) / bytesPerMiB }
        #else
        var usage = rusage()
        guard getrusage(RUSAGE_SELF, &usage) == 0 else { return nil }
        return Double(usage.ru_maxrss) / bytesPerMiB  // bytes on Darwin
        #endif
    }

    /// The `VmHWM` line of a `/proc/<pid>/status` text, in bytes (the kernel writes it in kB, i.e. KiB).
    public static func highWaterMark(_ status: String) -> Int? {
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
            let kibibytes = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap({ Int($0) })
        else { return nil }
        return kibibytes * 1024
    }
}

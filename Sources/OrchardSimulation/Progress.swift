import Foundation
import OrchardProtocol
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Shows a run's progress on the terminal: a redrawn bar when the stream is a terminal, one plain line a round
/// otherwise (logs, CI).
public struct ProgressDisplay: Sendable {
    /// Whether to draw a bar (true) or print lines (false).
    public let interactive: Bool
    private let write: @Sendable (String) -> Void

    /// A display on standard error, interactive when standard error is a terminal.
    public static func standardError() -> ProgressDisplay {
        ProgressDisplay(interactive: isatty(2) == 1) { text in FileHandle.standardError.write(Data(text.utf8)) }
    }

    /// A display writing to a closure (tests).
    public init(interactive: Bool, write: @escaping @Sendable (String) -> Void) {
        self.interactive = interactive
        self.write = write
    }

    /// Reports that `record.round` of `total` rounds finished.
    public func update(_ record: RoundMetrics, total: Int) {
        let test =
            record.testAccuracy.map { "acc \(format($0, 4))" } ?? record.testRMSE.map { "rmse \(format($0, 4))" } ?? record.testLoss.map {
                "loss \(format($0, 4))"
            } ?? "not evaluated"
        let federated =
            record.federatedEvaluation.map { e in
                let value =
                    e.metrics["accuracy"].map { "acc \(format($0, 4))" } ?? e.metrics["rmse"].map { "rmse \(format($0, 4))" }
                    ?? "loss \(format(e.metrics["loss"] ?? .nan, 4))"
                return " (devices: \(value) on checkpoint \(e.checkpoint))"
            } ?? ""
        let quality = test + federated
        let counts =
            "\(record.participants)/\(record.selected) aggregated, \(record.dropouts) dropped\(record.diverged.map { " (\($0) diverged)" } ?? ""), \(record.expirations) expired, \(record.resumed) resumed"
        if interactive {
            let width = 30
            let filled = total > 0 ? width * record.round / total : width
            let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
            write("\r\u{1B}[2K\(bar) round \(record.round)/\(total)  \(quality)  \(counts)")
            if record.round == total { write("\n") }
        } else {
            write("round \(record.round)/\(total): \(quality), \(counts), \(format(record.wallSeconds, 2)) s\n")
        }
    }

    /// Prints a line of its own (clearing the bar first when interactive).
    public func note(_ text: String) {
        write(interactive ? "\r\u{1B}[2K\(text)\n" : "\(text)\n")
    }

    private func format(_ value: Double, _ digits: Int) -> String {
        var scale = 1.0
        for _ in 0..<digits { scale *= 10 }
        let rounded = (value * scale).rounded() / scale
        var text = "\(rounded)"
        if let dot = text.firstIndex(of: ".") {
            let decimals = text.distance(from: dot, to: text.endIndex) - 1
            if decimals < digits { text += String(repeating: "0", count: digits - decimals) }
        }
        return text
    }
}

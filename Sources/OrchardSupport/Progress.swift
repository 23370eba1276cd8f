import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What a long job's progress looks like, without any I/O: given how far the job is and when, the text to write
/// (or nothing yet). ``ProgressReporter`` writes it to standard error.
///
/// On a terminal it is one line redrawn in place (`\r`) at most ten times a second — title, bar, percentage,
/// units done, elapsed time, a detail — and cleared when the job completes, so that what the command prints next
/// starts on a clean line. Elsewhere (a log, CI, a pipe) it is a plain line at most every 10 % and no more often
/// than once a second, a line at least every 10 seconds while the job advances, and a last line at completion when
/// the job took a second or more; a job shorter than that writes nothing.
public struct ProgressMeter: Sendable {
    /// How the progress is drawn.
    public enum Style: Sendable, Hashable {
        /// One line redrawn in place, cut to `width` columns.
        case terminal(width: Int)
        /// Plain lines at a low rate.
        case plain
    }

    /// What the job is (`train housing`, `bench gemm`).
    public let title: String
    /// Units the whole job takes; at least 1.
    public let total: Int
    /// The units' name, plural (`epochs`, `runs`).
    public let unit: String
    /// How the progress is drawn.
    public let style: Style

    /// Shortest time between two redraws of the terminal line, in seconds.
    public static let redrawInterval = 0.1
    /// Shortest time between two plain lines, in seconds.
    public static let plainInterval = 1.0
    /// Longest time without a plain line while the job advances, in seconds.
    public static let heartbeatInterval = 10.0
    /// Share of the job between two plain lines.
    public static let plainStep = 0.1

    private var lastWrite = 0.0
    private var lastCompleted = 0
    private var lastPlainFraction = 0.0
    private var drawn = false
    private var done = false

    /// A meter for a job of `total` units.
    public init(_ title: String, total: Int, unit: String, style: Style) {
        self.title = title
        self.total = max(1, total)
        self.unit = unit
        self.style = style
    }

    /// Whether a terminal line is on the screen that neither completion nor ``interruption()`` has ended.
    public var isDrawn: Bool { drawn }

    /// The text to write now that `completed` units are done, `seconds` after the job started; nil for nothing.
    /// `detail` says what is going on (`central model, loss 12.3`). Updates after completion are ignored.
    public mutating func update(_ completed: Int, detail: String = "", at seconds: Double) -> String? {
        guard !done else { return nil }
        let completed = min(max(0, completed), total)
        let fraction = Double(completed) / Double(total)
        if completed == total { done = true }
        defer { lastCompleted = completed }
        switch style {
        case .terminal(let width):
            if done {
                guard drawn else { return nil }
                drawn = false
                return "\r\u{1B}[2K"
            }
            guard !drawn || seconds - lastWrite >= Self.redrawInterval else { return nil }
            drawn = true
            lastWrite = seconds
            return "\r\u{1B}[2K" + String(terminalLine(completed, fraction: fraction, detail: detail, seconds: seconds).prefix(max(1, width - 1)))
        case .plain:
            let sinceLast = seconds - lastWrite
            let due =
                done
                ? seconds >= Self.plainInterval
                : (fraction - lastPlainFraction >= Self.plainStep - 1e-9 && sinceLast >= Self.plainInterval)
                    || (sinceLast >= Self.heartbeatInterval && completed > lastCompleted)
            guard due else { return nil }
            lastWrite = seconds
            lastPlainFraction = fraction
            return plainLine(completed, fraction: fraction, detail: detail, seconds: seconds) + "\n"
        }
    }

    /// The text that ends a terminal line left drawn by a job that stopped early (an error follows it); nil when
    /// there is none.
    public mutating func interruption() -> String? {
        guard drawn else { return nil }
        drawn = false
        done = true
        return "\n"
    }

    /// `train housing  [██████░░░░░░░░░░░░░░░░░░]   25%  75/300 epochs  1.5 s  central model, loss 12.3` (the detail
    /// last, where a narrow terminal cuts the line).
    func terminalLine(_ completed: Int, fraction: Double, detail: String, seconds: Double) -> String {
        let width = 24
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
        let percent = percent(fraction)
        let aligned = String(repeating: " ", count: 4 - percent.count) + percent
        return [title, "[\(bar)]", aligned, "\(completed)/\(total) \(unit)", Self.duration(seconds), detail]
            .filter { !$0.isEmpty }.joined(separator: "  ")
    }

    /// `train housing: 25% (75/300 epochs), central model, loss 12.3, 1.5 s`.
    func plainLine(_ completed: Int, fraction: Double, detail: String, seconds: Double) -> String {
        let parts = ["\(percent(fraction)) (\(completed)/\(total) \(unit))", detail, Self.duration(seconds)]
        return "\(title): " + parts.filter { !$0.isEmpty }.joined(separator: ", ")
    }

    /// Whole per cent, rounded down: `99%` until the job completes.
    private func percent(_ fraction: Double) -> String { "\(Int((fraction * 100).rounded(.down)))%" }

    /// `0.4 s`, `12.0 s`, `2 min 05 s`, `1 h 02 min`.
    static func duration(_ seconds: Double) -> String {
        if seconds < 60 { return "\((max(0, seconds) * 10).rounded() / 10) s" }
        let whole = Int(seconds.rounded())
        func two(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }
        if whole < 3600 { return "\(whole / 60) min \(two(whole % 60)) s" }
        return "\(whole / 3600) h \(two(whole / 60 % 60)) min"
    }
}

/// A ``ProgressMeter`` on standard error, timed by the wall clock: drawn as a terminal line when standard error is
/// a terminal, as plain lines otherwise. Standard output is left to the command's results.
public final class ProgressReporter: Sendable {
    private let meter: Mutex<ProgressMeter>
    private let start = ContinuousClock.now
    private let write: @Sendable (String) -> Void

    /// A reporter for a job of `total` units on standard error.
    public convenience init(_ title: String, total: Int, unit: String) {
        let style: ProgressMeter.Style = isatty(STDERR_FILENO) == 1 ? .terminal(width: Terminal.width(of: STDERR_FILENO)) : .plain
        self.init(ProgressMeter(title, total: total, unit: unit, style: style)) { text in
            FileHandle.standardError.write(Data(text.utf8))
        }
    }

    /// A reporter writing `meter`'s text to `write`.
    public init(_ meter: ProgressMeter, write: @escaping @Sendable (String) -> Void) {
        self.meter = Mutex(meter)
        self.write = write
    }

    /// Reports that `completed` units are done (from any task).
    public func update(_ completed: Int, detail: String = "") {
        let seconds = (ContinuousClock.now - start).inSeconds
        if let text = meter.withLock({ $0.update(completed, detail: detail, at: seconds) }) { write(text) }
    }

    /// Ends a terminal line still drawn, so that an error printed after an early stop starts on a line of its own.
    deinit {
        if let text = meter.withLock({ $0.interruption() }) { write(text) }
    }

    /// Writes one line of its own to standard error (a job without steps: `reading 'big.mlmodel' (1.2 GiB)`).
    public static func note(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }
}

/// The controlling terminal's size.
public enum Terminal {
    /// Columns of the terminal behind `descriptor`; 80 when it is not a terminal or does not say.
    public static func width(of descriptor: Int32) -> Int {
        var size = winsize()
        #if canImport(Glibc)
        let asked = ioctl(descriptor, UInt(TIOCGWINSZ), &size)
        #else
        let asked = ioctl(descriptor, TIOCGWINSZ, &size)
        #endif
        return asked == 0 && size.ws_col > 0 ? Int(size.ws_col) : 80
    }
}

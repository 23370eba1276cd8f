import OrchardSupport
public import Foundation
import OrchardML
import Synchronization

/// When and how often the client repeats a call that failed for a transient reason (a network error or a 5xx
/// answer): exponential backoff with jitter, so a fleet that lost its coordinator does not return in step.
public struct RequestRetryPolicy: Sendable, Hashable {
    /// Attempts per call, the first included (1 disables retries).
    public var maximumAttempts: Int
    /// The delay before the first retry, before jitter.
    public var initialDelay: Duration
    /// The largest delay between attempts, before jitter.
    public var maximumDelay: Duration
    /// The fraction of each delay that is random: 0 waits exactly, 1 waits anywhere in 0…delay.
    public var jitter: Double

    /// Creates a policy.
    public init(maximumAttempts: Int = 5, initialDelay: Duration = .milliseconds(500), maximumDelay: Duration = .seconds(30), jitter: Double = 0.5) {
        self.maximumAttempts = maximumAttempts
        self.initialDelay = initialDelay
        self.maximumDelay = maximumDelay
        self.jitter = jitter
    }

    /// No retries.
    public static let none = RequestRetryPolicy(maximumAttempts: 1)

    /// The wait before retry number `retry` (1 for the first retry), given a uniform random number in 0..<1.
    public func delay(beforeRetry retry: Int, random: Double) -> Duration {
        let exponent = min(max(retry - 1, 0), 30)
        let base = min(initialDelay.inSeconds * Double(1 << exponent), maximumDelay.inSeconds)
        let fraction = min(max(jitter, 0), 1)
        let seconds = base * (1 - fraction) + base * fraction * random
        return .nanoseconds(Int64(seconds * 1e9))
    }

}

/// Throws ``OrchardClientError/Code/cancelled`` when the current task is cancelled.
func checkCancellation() throws(OrchardClientError) {
    if Task.isCancelled { throw cancelledError() }
}

/// The error for work stopped by task cancellation.
func cancelledError() -> OrchardClientError {
    OrchardClientError(.cancelled, "the task was cancelled")
}

/// The `Retry-After` field of a 429 or 503 answer (RFC 9110 §10.2.3).
public enum RetryAfter {
    /// The longest wait a coordinator's answer can impose (a week): a longer `retry_after` or `Retry-After`, or
    /// one that is not a finite number, is heard as this, so no answer can park a device forever or overflow a date.
    public static let longest: Double = 7 * 86_400

    /// `seconds` within 0 and ``longest`` (0 for a negative value or NaN).
    public static func bounded(_ seconds: Double) -> Double {
        guard !seconds.isNaN else { return 0 }
        return min(max(seconds, 0), longest)
    }

    /// The seconds from `now` that `value` asks to wait: delta-seconds (`120`), or an HTTP-date (`Sun, 06 Nov 1994
    /// 08:49:37 GMT`, or the obsolete RFC 850 and asctime forms) where a date already past means 0; nil for anything
    /// else.
    public static func seconds(_ value: String, now: Date) -> Double? {
        let text = value.trimmingCharacters(in: .whitespaces)
        guard !text.isEmpty else { return nil }
        if text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            return Double(text).map(bounded)
        }
        for format in ["EEE, dd MMM yyyy HH:mm:ss 'GMT'", "EEEE, dd-MMM-yy HH:mm:ss 'GMT'", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: text.replacingOccurrences(of: "  ", with: " ")) {
                return bounded(date.timeIntervalSince(now))
            }
        }
        return nil
    }
}

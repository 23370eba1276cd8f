public import Foundation
import Synchronization

/// Asks a running simulation to stop after the round in progress (what Ctrl-C does in `orchard simulate`): the rounds
/// run so far are reported as usual, and the run's scratch files are removed.
public final class SimulationStop: Sendable {
    private let requested = Mutex(false)
    private let scratch = Mutex<Set<URL>>([])
    private let running = Mutex(false)

    /// A stop not requested yet.
    public init() {}

    /// Requests the stop; returns `false` when it had been requested already.
    @discardableResult
    public func request() -> Bool {
        requested.withLock { done in
            defer { done = true }
            return !done
        }
    }

    /// Whether the stop was requested.
    public var isRequested: Bool { requested.withLock { $0 } }

    /// Marks the run's devices as started: from now on a stop is a stop after the work in progress.
    public func markRunning() { running.withLock { $0 = true } }

    /// Whether the run's devices have started (before that, setting up, there is nothing to finish).
    public var isRunning: Bool { running.withLock { $0 } }

    /// Records a scratch directory the run removes when it ends, so that a forced quit can remove it too.
    public func register(scratch directory: URL) { _ = scratch.withLock { $0.insert(directory) } }

    /// Forgets a scratch directory the run has removed.
    public func unregister(scratch directory: URL) { _ = scratch.withLock { $0.remove(directory) } }

    /// The scratch directories registered now.
    var registeredScratch: Set<URL> { scratch.withLock { $0 } }

    /// Removes every registered scratch directory now (what a second Ctrl-C does before it quits, since the run's own
    /// clean-up never runs then).
    public func removeRegisteredScratch() {
        for directory in scratch.withLock({ $0 }) { try? FileManager.default.removeItem(at: directory) }
    }
}

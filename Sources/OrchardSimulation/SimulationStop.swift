import Synchronization

/// Asks a running simulation to stop after the round in progress (what Ctrl-C does in `orchard simulate`): the rounds
/// run so far are reported as usual, and the run's scratch files are removed.
public final class SimulationStop: Sendable {
    private let requested = Mutex(false)

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
}

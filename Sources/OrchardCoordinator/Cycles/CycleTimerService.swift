public import ServiceLifecycle

/// A service that drives every process's cycle timer: it ticks the coordinator at a fixed interval until
/// graceful shutdown.
public struct CycleTimerService: Service {
    private let coordinator: Coordinator
    private let interval: Duration

    /// Creates the service.
    /// - Parameters:
    ///   - coordinator: The coordinator to tick.
    ///   - interval: Time between ticks.
    public init(coordinator: Coordinator, interval: Duration = .milliseconds(250)) {
        self.coordinator = coordinator
        self.interval = interval
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                await coordinator.tick()
                try? await Task.sleep(for: interval)
            }
        }
    }
}

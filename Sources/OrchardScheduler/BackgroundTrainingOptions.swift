/// How a job (an Orchard device's federated job, a Flower node's windows) runs as a background processing task.
public struct BackgroundTrainingOptions: Sendable {
    /// The task identifier (must be among the scheduler's permitted identifiers).
    public var identifier: String
    /// Conditions the scheduler waits for: external power and network by default.
    public var constraints: TaskConstraints
    /// When to run again after a report the coordinator gave no `retry_after` for.
    public var defaultInterval: Duration
    /// The task's priority among competing tasks.
    public var priority: TaskPriorityLevel

    /// Creates options.
    public init(
        identifier: String, constraints: TaskConstraints = .powerAndNetwork, defaultInterval: Duration = .seconds(3600), priority: TaskPriorityLevel = .normal
    ) {
        self.identifier = identifier
        self.constraints = constraints
        self.defaultInterval = defaultInterval
        self.priority = priority
    }
}

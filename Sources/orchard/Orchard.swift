import ArgumentParser

/// The `orchard` command-line tool.
@main
struct Orchard: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "orchard",
        abstract: "Federated learning in Swift: train on devices, aggregate on a coordinator.",
        version: "0.1.0",
        subcommands: [Serve.self, Bench.self, SchedulerCommand.self, ClientCommand.self, AgentCommand.self]
    )
}

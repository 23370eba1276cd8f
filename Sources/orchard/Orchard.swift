import ArgumentParser

/// The `orchard` command-line tool.
@main
struct Orchard: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "orchard",
        abstract: "Federated learning in Swift: train on devices, aggregate on a coordinator.",
        version: "0.1.0",
        subcommands: [
            SimulateCommand.self, Serve.self, ClientCommand.self, AgentCommand.self, TrainCommand.self, Bench.self,
            CoreMLCommand.self, SchedulerCommand.self, PrivacyCommand.self, ProcessCommand.self, DataCommand.self, FlowerCommand.self,
        ]
    )
}

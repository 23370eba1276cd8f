import ArgumentParser

/// The `orchard` command-line tool.
@main
struct Orchard: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "orchard",
        abstract: "Federated learning in Swift: train on devices, aggregate on a coordinator.",
        discussion: "`orchard --version` prints the tool's version.",
        subcommands: [
            SimulateCommand.self, Serve.self, ClientCommand.self, AgentCommand.self, TrainCommand.self, Bench.self,
            CoreMLCommand.self, SchedulerCommand.self, PrivacyCommand.self, ProcessCommand.self, DataCommand.self, FlowerCommand.self,
            TokenCommand.self, EvaluateCommand.self,
        ]
    )

    /// The tool's version.
    static let version = "0.1.0"

    /// `orchard --version` prints the tool's version; everything else is parsed as usual. The version is not
    /// ArgumentParser's `version:` setting: that adds `--version` to every subcommand, where `client`, `agent` and
    /// `process create` take `--version V`, a process's version.
    static func main() async {
        let arguments = Array(CommandLine.arguments.dropFirst())
        if arguments == ["--version"] {
            print(version)
            return
        }
        await main(arguments)
    }
}

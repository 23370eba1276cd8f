import ArgumentParser
import Foundation
import Logging
import OrchardClient
import OrchardScheduler
import ServiceLifecycle
import UnixSignals

/// `orchard agent`: the device daemon — the background scheduler trains whenever the device's conditions hold.
struct AgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "agent",
        abstract: "Run as a device daemon: train a cycle whenever power and network conditions allow.",
        discussion: """
        Conditions are read from sysfs and procfs (power supplies, network interfaces, CPU idleness, thermal \
        zones). A window that closes mid-training (conditions lost, time limit, SIGTERM) saves a checkpoint that \
        the next window resumes. Stops gracefully on SIGINT or SIGTERM.
        """
    )

    @OptionGroup var device: DeviceOptions

    @Flag(inversion: .prefixedNo, help: "Train only on external power.")
    var requiresPower = true

    @Flag(help: "Train only on an unmetered network.")
    var requiresUnmetered = false

    @Option(help: "Interfaces to count as metered (repeatable).")
    var meteredInterface: [String] = []

    @Option(help: "Seconds one background window may last.")
    var window: Int = 600

    @Option(help: "Seconds between cycles when the coordinator gives no retry-after.")
    var interval: Int = 3600

    func validate() throws {
        guard window > 0 else { throw ValidationError("--window must be positive") }
        guard interval > 0 else { throw ValidationError("--interval must be positive") }
    }

    func run() async throws {
        let logger = Logger(label: "orchard.agent")
        let conditions = LinuxConditionsProvider(configuration: .init(meteredInterfaces: Set(meteredInterface)))
        let job = try device.makeJob(logger: logger, conditions: conditions)
        let identifier = "dev.orchard.train.\(device.model)"
        let scheduler = try BackgroundScheduler(
            configuration: SchedulerConfiguration(permittedIdentifiers: [identifier], processingBudget: .seconds(window)),
            startDate: Date(), conditions: conditions, logger: logger
        )
        let options = BackgroundTrainingOptions(
            identifier: identifier,
            constraints: TaskConstraints(requiresExternalPower: requiresPower, requiresNetworkConnectivity: true, requiresUnmeteredNetwork: requiresUnmetered),
            defaultInterval: .seconds(interval)
        )
        let device = self.device
        try await job.scheduleBackgroundTraining(on: scheduler, options: options, data: { try device.loadDataset() }) { result in
            switch result {
            case .success(let outcome): logger.info("cycle finished", metadata: ["outcome": "\(ClientCommand.describe(outcome))"])
            case .failure(let error): logger.warning("cycle failed", metadata: ["error": "\(error)"])
            }
        }
        logger.info("agent started", metadata: ["server": "\(device.server)", "model": "\(device.model)", "version": "\(device.version)"])
        let group = ServiceGroup(services: [scheduler], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await group.run()
    }
}

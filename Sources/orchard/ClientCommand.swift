import ArgumentParser
import Foundation
import Logging
import OrchardHTTPClient
import OrchardSupport
import OrchardClient
import OrchardData
import OrchardML
import OrchardOperator
import OrchardScheduler

/// `orchard client`: runs one device's cycle against a coordinator.
struct ClientCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "client",
        abstract: "Run one federated cycle as a device: authenticate, download, train locally, report.",
        discussion: """
            The data file is safetensors holding one batch-first tensor per model input (named as the input) and the \
            targets as a tensor named 'target'. State (session, training checkpoint, pending report, model download) \
            lives in --state-directory, so an interrupted run resumes where it stopped.
            """
    )

    @OptionGroup var device: DeviceOptions

    @Flag(help: "Keep running cycles, waiting the coordinator's retry-after between them.")
    var loop = false

    func run() async throws {
        let logger = Logger(label: "orchard.client")
        let job = try device.makeJob(logger: logger)
        let dataset = try device.loadDataset()
        let events = Task {
            for await event in job.events() {
                switch event {
                case .phase(let phase): logger.info("phase", metadata: ["phase": "\(phase)"])
                case .trained(let step) where step.batch + 1 == step.batchesPerEpoch:
                    logger.info("epoch done", metadata: ["epoch": "\(step.epoch)", "loss": "\(step.loss)"])
                case .retrying(let attempt, let error): logger.warning("retrying", metadata: ["attempt": "\(attempt)", "error": "\(error)"])
                case .resumedTraining: logger.info("resuming training from a saved checkpoint")
                default: break
                }
            }
        }
        do {
            repeat {
                let outcome = try await job.train(on: dataset)
                print(Self.describe(outcome))
                guard loop, let wait = outcome.retryAfter else { break }
                try await Task.sleep(for: .seconds(max(wait, 1)))
            } while !Task.isCancelled
        } catch {
            // The event log's last line is written before the error is printed, not in the middle of it.
            events.cancel()
            await events.value
            throw error
        }
        events.cancel()
        await events.value
    }

    static func describe(_ outcome: CycleOutcome) -> String {
        switch outcome {
        case .reported(let receipt):
            let retry = receipt.retryAfter.map { ", next request in \($0) s" } ?? ""
            return "reported to cycle \(receipt.cycle)\(receipt.fromEarlierWindow ? " (kept from an earlier run)" : "")\(retry)"
        case .rejected(let retryAfter, let reason):
            return "rejected (\(reason)); retry after \(retryAfter) s"
        case .conditionsNotMet(let unmet):
            return "conditions not met: \(unmet.joined(separator: ", "))"
        case .evaluated(let receipt):
            return "evaluated checkpoint \(receipt.checkpoint) on \(receipt.samples) held-out samples: loss \(receipt.metrics["loss"] ?? .nan)"
        }
    }
}

/// Options shared by `orchard client` and `orchard agent`.
struct DeviceOptions: ParsableArguments {
    @Option(help: "The coordinator's base URL, e.g. https://fl.example.com or http://127.0.0.1:8080 (required, except for `agent --flower-superlink`).")
    var server: String?

    @Option(
        help: ArgumentHelp("Trust only the CA certificates in this PEM file for an https --server (a private CA); default: the system's.", valueName: "pem"))
    var caCert: String?

    @Option(help: "The FL process's name (as hosted on the coordinator; required with --server).")
    var process: String?

    @Option(help: "The FL process's version, e.g. 1.0 (required with --server).")
    var version: String?

    @Option(help: "The local training data (safetensors: one tensor per model input, plus 'target').")
    var data: String

    @Option(
        name: [.customLong("state-directory"), .customLong("state")],
        help: ArgumentHelp(
            "The directory for the device's durable state: session, checkpoint, pending report, model download, and the agent's scheduler queue (--state is the older spelling).",
            valueName: "directory"
        )
    )
    var state: String = DeviceOptions.defaultStateDirectory

    /// `$XDG_STATE_HOME/orchard`, else `~/.local/state/orchard` (the XDG base directory for state that should
    /// survive restarts), else `.orchard-device` in the working directory when there is no home.
    static var defaultStateDirectory: String {
        let environment = ProcessInfo.processInfo.environment
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return state + "/orchard" }
        if let home = environment["HOME"], home.hasPrefix("/") { return home + "/.local/state/orchard" }
        return FileManager.default.currentDirectoryPath + "/.orchard-device"
    }

    @Option(
        help: ArgumentHelp(
            "A file holding the device's JWT (omit for coordinators in open mode); or set ORCHARD_DEVICE_TOKEN.", valueName: "file"))
    var tokenFile: String?

    @Option(help: ArgumentHelp("Deprecated: the device's JWT on the command line, where every local user can read it; use --token-file.", visibility: .hidden))
    var token: String?

    @Option(
        parsing: .unconditional, help: "The seed of local training and of the held-out split (keep it fixed for a device: another seed holds out other rows).")
    var seed: UInt64 = 0

    @Option(parsing: .unconditional, help: "Seconds an HTTP request may wait to connect and for each piece of data.")
    var timeout: Double = DeviceConfiguration.defaultRequestTimeout.inSeconds

    /// `--server`, `--process` and `--version`, each required for a job of an Orchard coordinator.
    func coordinator() throws -> (server: String, process: String, version: String) {
        guard let server else { throw ValidationError("--server is required: the coordinator's URL, e.g. http://127.0.0.1:8080") }
        guard let process else { throw ValidationError("--process is required: the FL process's name on the coordinator") }
        guard let version else { throw ValidationError("--version is required: the FL process's version, e.g. 1.0") }
        return (server, process, version)
    }

    func makeJob(logger: Logger, conditions: (any DeviceConditionsProvider)? = nil) throws -> FederatedJob {
        let (server, process, version) = try coordinator()
        var configuration = DeviceConfiguration(
            storageDirectory: URL(fileURLWithPath: state, isDirectory: true), requestTimeout: try positiveSeconds(timeout, option: "--timeout"),
            trainingSeed: seed, logger: logger)
        configuration.conditions = conditions
        if let caCert {
            do throws(ConnectionError) {
                configuration.trustRoots = try TrustRoots.certificateFile(caCert)
            } catch {
                throw ValidationError(namingOption(error.message, ["CA certificate file": "--ca-cert"]))
            }
        }
        let resolved: (token: String?, warnings: [String])
        do throws(AdminTokenError) {
            resolved = try DeviceTokenSource.resolve(
                file: tokenFile, environment: ProcessInfo.processInfo.environment[DeviceTokenSource.environmentVariable], argument: token)
        } catch {
            throw ValidationError(error.message)
        }
        for warning in resolved.warnings { logger.warning("\(warning)") }
        let client: CoordinatorConnection
        do throws(OrchardClientError) {
            client = try CoordinatorConnection(url: server, authToken: resolved.token, configuration: configuration)
        } catch {
            throw ValidationError(namingOption(error.message, ["CA certificate file": "--ca-cert"]))
        }
        return try client.newJob(processName: process, version: version)
    }

    /// The data file, read as `orchard data prepare` writes it (``DeviceDataFile``).
    func loadDataset() throws -> TensorDataset {
        do throws(DataError) {
            return try DeviceDataFile.read(contentsOf: URL(fileURLWithPath: data))
        } catch {
            throw ValidationError("--data \(data): \(error.message)")
        }
    }
}

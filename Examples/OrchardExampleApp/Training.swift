#if os(iOS) || os(Linux)
import Foundation
import Logging
import OrchardClient
import OrchardScheduler
import OrchardSchedulerApple

/// Everything Orchard needs in the app, in one place: the BGTaskScheduler identifier, the background transfers, the
/// device token, the local samples, and the job that trains in background windows.
@MainActor
final class Training {
    /// The app's instance.
    static let shared = Training(configuration: .app)

    /// What the app trains, and where.
    struct Configuration: Sendable {
        /// The coordinator.
        var coordinator: URL
        /// The process the app's model is trained in, and the version of the app's model code.
        var processName: String
        var processVersion: String
        /// The identifier in Info.plist's `BGTaskSchedulerPermittedIdentifiers`.
        var taskIdentifier: String
        /// Where the device token comes from.
        var tokens: any DeviceTokenProvider
        /// Where the app keeps Orchard's files (the job's state, finished transfers).
        var directory: URL
        /// The local samples' file.
        var samples: URL
        /// The client's clock, sleep and randomness (the system's in the app).
        var environment: ClientEnvironment = .system
        /// The phone's power and network state (the system's, through `AppleConditionsProvider`, in the app).
        var conditions: any DeviceConditionsProvider = AppleConditionsProvider()

        /// The app's configuration (replace the URLs with your own).
        static var app: Configuration {
            let support = LocalSamples.applicationSupport.appendingPathComponent("orchard", isDirectory: true)
            return Configuration(
                coordinator: URL(string: "https://fl.example.com")!, processName: "keyboard", processVersion: "1.0",
                taskIdentifier: "com.example.trainer.train",
                tokens: BackendTokenProvider(endpoint: URL(string: "https://api.example.com/orchard/device-token")!, appSession: "app-session"),
                directory: support, samples: LocalSamples.file()
            )
        }
    }

    let configuration: Configuration
    /// The BGTaskScheduler adapter (`BGTaskScheduler.shared` unless a test gives another).
    let scheduler: AppleBackgroundScheduler
    /// Model downloads and report uploads through a background URLSession; `nil` if its directory cannot be made.
    let transfers: BackgroundTransferTransport?
    /// What happened last, for the screen.
    private(set) var lastEvent = "not started"
    /// Everything that happened, in order (for a debugging screen, or a test).
    let events: AsyncStream<String>
    private let eventSink: AsyncStream<String>.Continuation
    private let logger = Logger(label: "dev.orchard.example")

    init(configuration: Configuration, scheduler: AppleBackgroundScheduler = AppleBackgroundScheduler()) {
        self.configuration = configuration
        self.scheduler = scheduler
        (events, eventSink) = AsyncStream<String>.makeStream()
        do {
            transfers = try BackgroundTransferTransport(
                baseURL: configuration.coordinator, inner: try HTTPTransport(url: configuration.coordinator.absoluteString),
                directory: configuration.directory.appendingPathComponent("transfers", isDirectory: true)
            )
        } catch {
            transfers = nil
            Logger(label: "dev.orchard.example").error("background transfers are off: \(error)")
        }
    }

    /// Registers the training identifier with BGTaskScheduler. Call it before the app finishes launching
    /// (`App.init`); a missing Info.plist entry is a programming error, reported loudly.
    func registerAtLaunch() {
        do {
            try scheduler.registerAtLaunch([configuration.taskIdentifier])
        } catch {
            record("cannot register \(configuration.taskIdentifier): \(error) — add it to BGTaskSchedulerPermittedIdentifiers", error: true)
        }
    }

    /// Schedules background training, asynchronously (a device token is fetched first). Errors are logged and shown.
    func start() {
        Task { await schedule() }
    }

    /// Creates the job and schedules its background runs. The device token is asked for each time the device
    /// authenticates, so one that expired between windows is replaced, not fatal.
    func schedule() async {
        do {
            let settings = DeviceConfiguration(
                storageDirectory: configuration.directory, environment: configuration.environment, conditions: configuration.conditions, logger: logger
            )
            let client: CoordinatorConnection
            if let transfers {
                client = CoordinatorConnection(
                    transport: transfers, server: configuration.coordinator.absoluteString, tokenProvider: configuration.tokens, configuration: settings
                )
            } else {
                client = try CoordinatorConnection(url: configuration.coordinator.absoluteString, tokenProvider: configuration.tokens, configuration: settings)
            }
            let job = try client.newJob(processName: configuration.processName, version: configuration.processVersion)
            let samples = configuration.samples
            try await job.scheduleBackgroundTraining(
                on: scheduler, options: BackgroundTrainingOptions(identifier: configuration.taskIdentifier),  // on power, online
                data: { try LocalSamples.load(from: samples) },
                onOutcome: { [weak self] outcome in Task { @MainActor in self?.finished(outcome) } }
            )
            record("background training scheduled as \(configuration.taskIdentifier)")
        } catch {
            record("cannot schedule background training: \(error)", error: true)
        }
    }

    /// A background run ended. The next run is already scheduled (retried with a backoff after a failure); the app
    /// may be suspended by now, so this only records what happened.
    private func finished(_ outcome: Result<CycleOutcome, OrchardClientError>) {
        switch outcome {
        case .success(let cycle):
            record("a background run ended: \(cycle)")
        case .failure(let error) where error.code == .authenticationFailed:
            record("the coordinator refused the device token (\(error.message)); the next window asks the backend again", error: true)
        case .failure(let error):
            record("a background run failed: \(error)", error: true)
        }
    }

    private func record(_ event: String, error: Bool = false) {
        lastEvent = event
        eventSink.yield(event)
        if error { logger.error("\(event)") } else { logger.info("\(event)") }
    }
}
#endif

// The example iPhone app's code, as an iPhone compiles it, against the simulated system and a real coordinator on
// loopback HTTP: registration at launch, a background launch whose device token has expired, and the next launch that
// trains and reports. Linux only (the simulated system has no Apple counterpart).
#if os(Linux)
import AppleShimTesting
import BackgroundTasks
import Foundation
@testable import OrchardClient
import OrchardCoordinator
import OrchardCoordinatorTesting
import OrchardData
@testable import OrchardExampleApp
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardScheduler
import OrchardSchedulerApple
import OrchardSupport
import Testing
import SwiftUI
import UIKit

@Suite(.timeLimit(.minutes(2))) @MainActor struct ExampleAppTests {
    static let identifier = "com.example.trainer.train"
    nonisolated static let secret = "an-hs256-secret-of-at-least-32-bytes!"

    static let spec = ModelSpec(
        name: "keyboard", inputs: [InputSpec(name: "x", shape: [3])],
        layers: [LayerSpec(name: "out", type: .dense, inputs: ["x"], units: 1, inputSize: 3)],
        training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.05), epochs: 1, batchSize: 4)
    )

    /// Tokens from the "backend": the first already expired on the coordinator's clock, the rest valid for an hour.
    final class Backend: DeviceTokenProvider, @unchecked Sendable {
        let issuer: DeviceTokenIssuer
        let clock: ManualClock
        private let lock = NSLock()
        private var issued = 0
        init(clock: ManualClock) throws {
            issuer = try DeviceTokenIssuer(hs256Secret: ExampleAppTests.secret)
            self.clock = clock
        }
        var count: Int { lock.withLock { issued } }
        func deviceToken() async throws -> String {
            let first = lock.withLock { () -> Bool in
                issued += 1
                return issued == 1
            }
            let now = first ? clock.date.addingTimeInterval(-7200) : clock.date
            return try await issuer.issue(subject: "phone-1", lifetime: .seconds(3600), now: now).token
        }
    }

    @Test func theAppRegistersAtLaunchAndTrainsInABackgroundWindowAfterItsTokenExpired() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-example-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let clock = ManualClock()
        let coordinator = try await LoopbackCoordinator.start(configuration: CoordinatorConfiguration(), clock: clock)
        let (instance, server) = (coordinator.instance, coordinator.server)
        let status = try await instance.coordinator.host(
            HostProcessRequest(
                name: "keyboard", version: SemanticVersion(1, 0), model: Self.spec, initialWeights: try Model(spec: Self.spec, seed: 1).weightsSafetensors(),
                clientConfig: ClientConfig(batchSize: 4, learningRate: 0.05, localEpochs: 1),
                serverConfig: ServerConfig(cycleLength: 3600, goalCount: 1, overSelection: 1, minimumReports: 1, authentication: .hs256(secret: Self.secret))
            ))

        // The samples the app collected, in its Application Support directory.
        let samples = LocalSamples.file(in: directory)
        try FileManager.default.createDirectory(at: samples.deletingLastPathComponent(), withIntermediateDirectories: true)
        let x: [Float] = (0..<24).map { Float($0 % 7) / 7 }
        let y: [Float] = (0..<8).map { Float($0) / 8 }
        try Data(DeviceDataFile.encode(try TensorDataset(inputs: ["x": Tensor(shape: [8, 3], scalars: x)], targets: Tensor(shape: [8, 1], scalars: y))))
            .write(to: samples)

        let backend = try Backend(clock: clock)
        let system = BGTaskScheduler.simulated(permittedIdentifiers: [Self.identifier])
        let training = Training(
            configuration: Training.Configuration(
                coordinator: URL(string: "http://127.0.0.1:\(server.port)")!, processName: "keyboard", processVersion: "1.0",
                taskIdentifier: Self.identifier, tokens: backend, directory: directory.appendingPathComponent("orchard"), samples: samples,
                conditions: ScriptedConditionsProvider(.ideal)
            ),
            scheduler: AppleBackgroundScheduler(scheduler: system, clock: clock)
        )
        var events = training.events.makeAsyncIterator()

        // Launch: `App.init` registers, the launch ends, the delegate schedules.
        training.registerAtLaunch()
        system.simulateFinishLaunching()
        await training.schedule()
        #expect(await events.next() == "background training scheduled as \(Self.identifier)")
        #expect(await training.scheduler.pendingRequests().map(\.identifier) == [Self.identifier])
        #expect(backend.count == 0, "no token is asked for before the device authenticates")

        // The first background window: the backend's token has expired, the coordinator refuses it.
        let first = try #require(system.simulateLaunch(forTaskWithIdentifier: Self.identifier))
        let refused = await events.next()
        #expect(refused?.contains("refused the device token") == true, "\(refused ?? "nil")")
        #expect(await first.waitForCompletion() == false)
        #expect(system.isSimulatedAppSuspended)
        #expect(await training.scheduler.pendingRequests().map(\.identifier) == [Self.identifier], "the retry reached the system before the app was suspended")

        // The next window asks the backend again, trains on the local samples and reports.
        let second = try #require(system.simulateLaunch(forTaskWithIdentifier: Self.identifier))
        let ended = await events.next()
        #expect(ended?.contains("a background run ended") == true, "\(ended ?? "nil")")
        #expect(await second.waitForCompletion() == true)
        #expect(backend.count == 2)
        let after = try await instance.coordinator.status(processID: status.processID)
        #expect(after.cyclesCompleted == 1 && after.latestCheckpoint == 1, "the one report closed the cycle: \(after)")
        #expect(await training.scheduler.pendingRequests().map(\.identifier) == [Self.identifier], "the next run is scheduled")
        #expect(system.simulatedViolations.isEmpty, "\(system.simulatedViolations)")
        training.transfers?.invalidate()
        await coordinator.stop()
    }

    @Test func theDelegateForwardsTheBackgroundSessionsEventsAndCompletesOthersAtOnce() async throws {
        let delegate = AppDelegate()
        var calls: [String] = []
        // Another session's events are not Orchard's: completed at once.
        delegate.application(UIApplication.shared, handleEventsForBackgroundURLSession: "someone.else") { calls.append("other") }
        #expect(calls == ["other"])
        // Orchard's transfers: completed once the session delivered its events.
        let transfers = try #require(Training.shared.transfers)
        delegate.application(UIApplication.shared, handleEventsForBackgroundURLSession: transfers.identifier) { calls.append("orchard") }
        #expect(calls == ["other"])
        transfers.sessionFinishedEvents()
        #expect(calls == ["other", "orchard"])
    }

    /// The app's entry point as UIKit runs it (a child process: the launch bootstraps logging and uses the shared
    /// scheduler once per process): `App.init` registers before the launch ends, so the launch completes.
    @Test func theAppLaunchesAndRegistersBeforeItsLaunchEnds() async {
        await #expect(processExitsWith: .success) {
            await MainActor.run { ExampleApp.main() }
        }
    }

    /// The same app with its launch already ended (a registration moved out of `App.init`, say) ends as on a phone.
    @Test func aRegistrationAfterTheLaunchEndedEndsTheApp() async {
        await #expect(processExitsWith: .failure) {
            await MainActor.run {
                BGTaskScheduler.shared.simulateFinishLaunching()
                ExampleApp.main()
            }
        }
    }
}
#endif

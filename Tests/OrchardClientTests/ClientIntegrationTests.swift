import OrchardSupport
import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardFormats
import OrchardML
import OrchardProtocol
import OrchardScheduler
import OrchardTesting
import Synchronization
import Testing

/// Runs `body` against a fresh coordinator on loopback HTTP and a real SQLite file, then stops it.
func withHarness(_ body: (ClientHarness) async throws -> Void) async throws {
    try await withCleanup(try await ClientHarness.start(), stop: { await $0.stop() }, body)
}

@Suite("Client against a loopback coordinator", .serialized)
struct ClientIntegrationTests {
    static let config = ClientConfig(batchSize: 8, learningRate: 0.05, localEpochs: 3)

    @Test("a full cycle reports the diff the engine computes, with observable progress")
    func fullCycle() async throws {
        try await withHarness { harness in
            let process = try await harness.host(Fixture.host(clientConfig: Self.config))
            let (client, transport) = try harness.httpClient(device: "a")
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let events = collectEvents(job)
            let outcome = try await job.train(on: Fixture.dataset())

            guard case .reported(let receipt) = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(receipt.cycle == 1)
            #expect(receipt.reportsReceived == 1)
            #expect(!receipt.fromEarlierWindow)
            let status = try await harness.coordinator.status(processID: process.processID)
            #expect(status.currentCycle?.reported == 1)

            let reports = transport.log.withLock { $0.reports }
            #expect(reports.count == 1)
            let reported = try diffOf(try #require(reports.first))
            let expected = try referenceDiff(clientConfig: Self.config, seed: 42 &+ 1)
            #expect(reported == expected)
            #expect(reported.values.contains { $0.contains { $0 != 0 } })

            let seen = await events.value
            let phases = seen.compactMap { if case .phase(let p) = $0 { p } else { nil } }
            #expect(phases == [.authenticating, .requestingCycle, .downloadingPlan, .downloadingModel, .training, .reporting, .finished])
            let steps = seen.compactMap { if case .trained(let s) = $0 { s } else { nil } }
            #expect(steps.count == 3 * 12)
            #expect(steps.last?.updates == 36)
            #expect(steps.allSatisfy { $0.loss.isFinite })
            #expect(seen.last == .finished(outcome))

            // The same worker asking again in the same cycle is turned away: its report counted.
            let again = try await job.train(on: Fixture.dataset())
            guard case .rejected(_, let reason) = again else {
                Issue.record("expected a rejection, got \(again)")
                return
            }
            #expect(reason == "already_reported")
        }
    }

    @Test("a rejection reaches onRejected with the server's retry-after, and only onRejected fires")
    func rejection() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host(goal: 1, overSelection: 1))
            // Another device takes the only place in the cycle.
            let other = try await harness.coordinator.authenticate(AuthenticateRequest(processName: "regressor", processVersion: SemanticVersion(1, 0)))
            _ = try await harness.coordinator.requestCycle(
                CycleRequest(workerID: other.workerID, processName: "regressor", processVersion: SemanticVersion(1, 0)),
                session: await harness.coordinator.session(forToken: other.sessionToken)
            )

            var configuration = harness.configuration(device: "b")
            configuration.conditions = ScriptedConditionsProvider(.ideal)
            let (client, transport) = try harness.httpClient(device: "b", configuration: configuration)
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let counter = Counter()
            let retryAfter = Mutex<Double?>(nil)
            job.onReady { _, _, _, _ in counter.hit("ready") }
            job.onReported { _ in counter.hit("reported") }
            job.onError { _ in counter.hit("error") }
            job.onRejected { seconds in
                counter.hit("rejected")
                retryAfter.withLock { $0 = seconds }
            }
            await job.start(requiresCharging: true, requiresUnmeteredNetwork: true).value

            guard case .rejected(let sent) = try #require(transport.log.withLock { $0.cycleResponses.last }) else {
                Issue.record("the coordinator did not reject")
                return
            }
            #expect(sent.reason == "cycle_full")
            #expect(retryAfter.withLock { $0 } == sent.retryAfter)
            #expect(sent.retryAfter > 0)
            #expect(counter["rejected"] == 1)
            #expect(counter["ready"] == 0)
            #expect(counter["reported"] == 0)
            #expect(counter["error"] == 0)
        }
    }

    @Test("a bad credential is an authentication failure, through the async API and onError")
    func authenticationFailure() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host(authentication: .hs256(secret: "device-secret-0123456789abcdef-0123456789")))
            let (client, _) = try harness.httpClient(device: "c", authToken: "not-a-valid-jwt")
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let error = await #expect(throws: OrchardClientError.self) { try await job.train(on: Fixture.dataset()) }
            #expect(error?.code == .authenticationFailed)
            #expect(error?.httpStatus == 401)

            let counter = Counter()
            let code = Mutex<OrchardClientError.Code?>(nil)
            var configuration = harness.configuration(device: "c2")
            configuration.conditions = ScriptedConditionsProvider(.ideal)
            let (callbackClient, _) = try harness.httpClient(device: "c2", authToken: "not-a-valid-jwt", configuration: configuration)
            let callbackJob = try callbackClient.newJob(processName: "regressor", version: "1.0")
            callbackJob.onReady { _, _, _, _ in counter.hit("ready") }
            callbackJob.onError { error in
                counter.hit("error")
                code.withLock { $0 = error.code }
            }
            await callbackJob.start(requiresCharging: false, requiresUnmeteredNetwork: false).value
            #expect(counter["error"] == 1)
            #expect(counter["ready"] == 0)
            #expect(code.withLock { $0 } == .authenticationFailed)
        }
    }

    @Test("SwiftSyft-style callbacks: onReady then onReported, each exactly once; charging includes a full battery")
    func callbacksFireOnce() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host())
            var configuration = harness.configuration(device: "d")
            // On the charger with a full battery that no longer charges: "charging" holds.
            configuration.conditions = ScriptedConditionsProvider(
                DeviceConditions(
                    onExternalPower: true, hasBattery: true, batteryLevel: 1, batteryCharging: false, networkConnected: true, networkMetered: false
                ))
            let (client, transport) = try harness.httpClient(device: "d", configuration: configuration)
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let counter = Counter()
            let secondReport = Mutex<Bool?>(nil)
            job.onReady { model, plan, clientConfig, report in
                counter.hit("ready")
                #expect(plan.model == Fixture.spec)
                #expect(clientConfig == plan.clientConfig)
                let diff = model.weights.map { TensorRecord(name: $0.name, shape: $0.shape, values: $0.values.map { _ in 0.01 }) }
                #expect(report(diff, sampleCount: 10))
                secondReport.withLock { $0 = report(diff, sampleCount: 10) }
            }
            job.onReported { receipt in
                counter.hit("reported")
                #expect(receipt.cycle == 1)
            }
            job.onError { error in
                counter.hit("error")
                Issue.record("unexpected error \(error)")
            }
            job.onRejected { _ in counter.hit("rejected") }
            await job.start(requiresCharging: true, requiresUnmeteredNetwork: true).value

            #expect(counter["ready"] == 1)
            #expect(counter["reported"] == 1)
            #expect(counter["error"] == 0)
            #expect(counter["rejected"] == 0)
            #expect(secondReport.withLock { $0 } == false)
            #expect(transport.log.withLock { $0.reports.count } == 1)
        }
    }

    @Test("unmet conditions stop a started cycle before any network call")
    func conditionsNotMet() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host())
            var configuration = harness.configuration(device: "e")
            configuration.conditions = ScriptedConditionsProvider(
                DeviceConditions(
                    onExternalPower: false, hasBattery: true, batteryLevel: 0.9, batteryCharging: false, networkConnected: true, networkMetered: true
                ))
            let (client, transport) = try harness.httpClient(device: "e", configuration: configuration)
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let outcome = try await job.train(
                on: Fixture.dataset(),
                constraints: TaskConstraints(requiresExternalPower: true, requiresNetworkConnectivity: true, requiresUnmeteredNetwork: true))
            #expect(outcome == .conditionsNotMet(["externalPower", "unmeteredNetwork"]))
            #expect(transport.log.withLock { $0.cycleResponses.isEmpty })
        }
    }

    @Test("a server restart during the model download resumes with a Range request and verifies the model")
    func restartDuringDownload() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host(clientConfig: Self.config))
            let restarted = Mutex(false)
            let configuration = harness.configuration(
                device: "f",
                onSleep: {
                    // The first backoff after the cut connection: restart the coordinator on the same database and port.
                    guard !restarted.withLock({ $0 }) else { return }
                    restarted.withLock { $0 = true }
                    try await harness.restart()
                })
            let (client, transport) = try harness.httpClient(device: "f", configuration: configuration)
            transport.downloadFaults.withLock { $0 = [.cutDownload(after: 100)] }
            let job = try client.newJob(processName: "regressor", version: "1.0")
            let outcome = try await job.train(on: Fixture.dataset())

            guard case .reported = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(restarted.withLock { $0 })
            let (requests, heads) = transport.log.withLock { ($0.modelRequests, $0.downloadHeads) }
            #expect(requests.count == 2)
            #expect(requests.first?.offset == 0)
            #expect(requests.last?.offset == 100)
            #expect(requests.last?.etag != nil)
            #expect(requests.last?.etag == heads.first?.etag)
            #expect(heads.last?.start == 100)
            #expect(heads.first?.totalLength != nil)
            #expect(heads.last?.totalLength == heads.first?.totalLength)
            // The resumed model is the original: the diff equals a direct engine run's.
            let reported = try diffOf(try #require(transport.log.withLock { $0.reports.first }))
            #expect(reported == (try referenceDiff(clientConfig: Self.config, seed: 42 &+ 1)))
        }
    }

    @Test("cancelling mid-training saves a checkpoint; the next run resumes and reports the uninterrupted diff")
    func cancellationAndResume() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host(clientConfig: Self.config))
            // First window: the task is cancelled after 7 updates (the scheduler's expiry does the same).
            let interrupted = harness.configuration(device: "g", trainer: InterruptingTrainer(cancelAfterUpdates: 7))
            let (first, firstTransport) = try harness.httpClient(device: "g", configuration: interrupted)
            let firstJob = try first.newJob(processName: "regressor", version: "1.0")
            let dataset = try Fixture.dataset()
            // The trainer cancels the task it runs in, so run the window in a task of its own.
            let window = Task { try await firstJob.train(on: dataset) }
            let error = await #expect(throws: OrchardClientError.self) { try await window.value }
            #expect(error?.code == .cancelled)
            #expect(firstTransport.log.withLock { $0.reportAttempts } == 0)
            let checkpoint = firstJob.directory.appendingPathComponent("training-checkpoint.bin")
            #expect(FileManager.default.fileExists(atPath: checkpoint.path))

            // Second window, a new process: resumes from the checkpoint.
            let (second, secondTransport) = try harness.httpClient(device: "g")
            let secondJob = try second.newJob(processName: "regressor", version: "1.0")
            let events = collectEvents(secondJob)
            let outcome = try await secondJob.train(on: Fixture.dataset())
            guard case .reported = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            let seen = await events.value
            #expect(seen.contains(.resumedTraining))
            let steps = seen.compactMap { if case .trained(let s) = $0 { s } else { nil } }
            #expect(steps.first?.updates == 8)
            #expect(steps.count == 36 - 7)
            // The model was cached by the first window: no second download.
            #expect(secondTransport.log.withLock { $0.modelRequests.isEmpty })
            #expect(!FileManager.default.fileExists(atPath: checkpoint.path))
            let reported = try diffOf(try #require(secondTransport.log.withLock { $0.reports.first }))
            #expect(reported == (try referenceDiff(clientConfig: Self.config, seed: 42 &+ 1)))
        }
    }

    @Test("a checkpoint of a closed cycle is discarded")
    func staleCheckpointDiscarded() async throws {
        try await withHarness { harness in
            _ = try await harness.host(Fixture.host(clientConfig: Self.config))
            let interrupted = harness.configuration(device: "h", trainer: InterruptingTrainer(cancelAfterUpdates: 5))
            let (first, _) = try harness.httpClient(device: "h", configuration: interrupted)
            let firstJob = try first.newJob(processName: "regressor", version: "1.0")
            let dataset = try Fixture.dataset()
            let window = Task { try await firstJob.train(on: dataset) }
            await #expect(throws: OrchardClientError.self) { try await window.value }
            #expect(FileManager.default.fileExists(atPath: firstJob.directory.appendingPathComponent("training-checkpoint.bin").path))

            // The cycle's deadline passes; the coordinator closes it and opens the next.
            harness.clock.advance(bySeconds: 3601)
            await harness.coordinator.tick()
            await harness.coordinator.tick()

            let (second, _) = try harness.httpClient(device: "h")
            let secondJob = try second.newJob(processName: "regressor", version: "1.0")
            let events = collectEvents(secondJob)
            let outcome = try await secondJob.train(on: Fixture.dataset())
            let seen = await events.value
            #expect(!seen.contains(.resumedTraining))
            if case .reported(let receipt) = outcome {
                #expect(receipt.cycle >= 2)
            } else {
                Issue.record("expected a report in the next cycle, got \(outcome)")
            }
        }
    }

    @Test("a report whose answer was lost is kept across a process restart, uploaded once and counted once")
    func pendingReportAcrossRestart() async throws {
        try await withHarness { harness in
            let process = try await harness.host(Fixture.host())
            let (first, firstTransport) = try harness.httpClient(device: "i", configuration: harness.configuration(device: "i", retry: .none))
            firstTransport.reportFaults.withLock { $0 = [.dropAnswer] }
            let firstJob = try first.newJob(processName: "regressor", version: "1.0")
            let error = await #expect(throws: OrchardClientError.self) { try await firstJob.train(on: Fixture.dataset()) }
            #expect(error?.code == .network)
            let pending = firstJob.directory.appendingPathComponent("pending-report.safetensors")
            #expect(FileManager.default.fileExists(atPath: pending.path))

            // A new process: the kept report goes first; the coordinator already has it (idempotent by key).
            let (second, secondTransport) = try harness.httpClient(device: "i")
            let secondJob = try second.newJob(processName: "regressor", version: "1.0")
            let outcome = try await secondJob.train(on: Fixture.dataset())
            #expect(secondTransport.log.withLock { $0.reportAttempts } == 1)
            #expect(!FileManager.default.fileExists(atPath: pending.path))
            guard case .rejected(_, let reason) = outcome else {
                Issue.record("expected the already-reported rejection, got \(outcome)")
                return
            }
            #expect(reason == "already_reported")
            let status = try await harness.coordinator.status(processID: process.processID)
            #expect(status.currentCycle?.reported == 1)
        }
    }

    @Test("a report that never left is uploaded first in the next window, exactly once")
    func pendingReportUploadedNextWindow() async throws {
        try await withHarness { harness in
            let process = try await harness.host(Fixture.host())
            let (first, firstTransport) = try harness.httpClient(device: "j", configuration: harness.configuration(device: "j", retry: .none))
            firstTransport.reportFaults.withLock { $0 = [.dropRequest] }
            let firstJob = try first.newJob(processName: "regressor", version: "1.0")
            await #expect(throws: OrchardClientError.self) { try await firstJob.train(on: Fixture.dataset()) }
            #expect(firstTransport.log.withLock { $0.reports.isEmpty })

            let (second, secondTransport) = try harness.httpClient(device: "j")
            let secondJob = try second.newJob(processName: "regressor", version: "1.0")
            let events = collectEvents(secondJob)
            let outcome = try await secondJob.train(on: Fixture.dataset())
            guard case .reported(let receipt) = outcome else {
                Issue.record("expected the kept report to be accepted, got \(outcome)")
                return
            }
            #expect(receipt.fromEarlierWindow)
            #expect(receipt.reportsReceived == 1)
            let phases = await events.value.compactMap { if case .phase(let p) = $0 { p } else { nil } }
            #expect(phases == [.uploadingPendingReport, .finished])
            #expect(secondTransport.log.withLock { $0.reports.count } == 1)
            #expect(secondTransport.log.withLock { $0.cycleResponses.isEmpty })
            let status = try await harness.coordinator.status(processID: process.processID)
            #expect(status.currentCycle?.reported == 1)
        }
    }
}

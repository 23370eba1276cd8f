import Foundation
import OrchardCoordinator
import OrchardCoordinatorPostgres
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Testing

/// Several coordinator instances over one shared store, driven in process with one manual clock: any instance serves
/// any device, admission is exact, the cycle closes once with every acknowledged report, and a dead instance's
/// share is not lost.
@Suite struct MultiInstanceTests {
    /// A one-layer model (3 → 2 with bias).
    static let model = ModelSpec(
        name: "multi", inputs: [InputSpec(name: "x", shape: [3])],
        layers: [
            LayerSpec(name: "out", type: .dense, inputs: ["x"], units: 2, inputSize: 3, useBias: true)
        ])
    static let weights = [
        TensorRecord(name: "out.weight", shape: [2, 3], values: [0.5, -0.5, 0.25, 1, 2, -1]),
        TensorRecord(name: "out.bias", shape: [2], values: [0, 0.1]),
    ]

    static func diff(_ scale: Float) -> [TensorRecord] {
        weights.map { TensorRecord(name: $0.name, shape: $0.shape, values: $0.values.indices.map { scale * Float($0 + 1) }) }
    }

    /// `initial + Σ nᵢ dᵢ / Σ nᵢ`, in Double.
    static func fedAvg(_ reports: [(scale: Float, samples: Int)]) -> [String: [Float]] {
        let total = Double(reports.reduce(0) { $0 + $1.samples })
        var out: [String: [Float]] = [:]
        for tensor in weights {
            out[tensor.name] = tensor.values.indices.map { i in
                let mean = reports.reduce(0.0) { $0 + Double($1.samples) * Double($1.scale) * Double(i + 1) } / total
                return Float(Double(tensor.values[i]) + mean)
            }
        }
        return out
    }

    static func host(goal: Int, minimum: Int = 1, overSelection: Double = 1.5, cycleLength: Double = 600) -> HostProcessRequest {
        HostProcessRequest(
            name: "multi", version: SemanticVersion(1, 0), model: model, initialWeights: Safetensors.encode(weights),
            clientConfig: ClientConfig(batchSize: 4, learningRate: 0.05, localEpochs: 1),
            serverConfig: ServerConfig(
                cycleLength: cycleLength, goalCount: goal, overSelection: overSelection, minimumReports: minimum, paceSteeringWindow: 20, checkpointRetention: 3
            )
        )
    }

    /// Coordinators sharing one store.
    final class Group: Sendable {
        let clock = ManualClock()
        let coordinators: [Coordinator]
        let store: any CoordinatorStore

        init(stores: [any CoordinatorStore], foldInterval: Int) async throws {
            store = stores[0]
            var coordinators: [Coordinator] = []
            for (index, store) in stores.enumerated() {
                let coordinator = Coordinator(
                    store: store,
                    configuration: CoordinatorConfiguration(
                        adminToken: "admin", foldInterval: foldInterval, instanceID: "instance-\(index)", sealLease: .seconds(30)),
                    clock: clock, random: SplitMix64(seed: UInt64(index + 1))
                )
                try await coordinator.start()
                coordinators.append(coordinator)
            }
            self.coordinators = coordinators
        }

        /// Runs `body` with `instances` coordinators over a fresh store of `kind`: one SQLite store shared in process, or
        /// one PostgreSQL database with a connection pool per instance (as separate processes would have).
        static func with(_ kind: StoreKind, instances: Int, foldInterval: Int = 2, _ body: (Group) async throws -> Void) async throws {
            switch kind {
            case .sqlite:
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-multi-\(UUID().uuidString)")
                try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                defer { try? FileManager.default.removeItem(at: directory) }
                let store = try SQLiteStore(path: directory.appendingPathComponent("shared.sqlite").path, sharedByInstances: true)
                try await body(try await Group(stores: Array(repeating: store, count: instances), foldInterval: foldInterval))
            case .postgres:
                try await TestDatabase.withDatabase { configuration in
                    var stores: [PostgresStore] = []
                    let result: Result<Void, any Error>
                    do {
                        for _ in 0..<instances { stores.append(try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)) }
                        result = .success(try await body(try await Group(stores: stores, foldInterval: foldInterval)))
                    } catch {
                        result = .failure(error)
                    }
                    for store in stores { await store.shutdown() }
                    try result.get()
                }
            }
        }

        subscript(index: Int) -> Coordinator { coordinators[index] }

        /// A device authenticated at `instance`.
        func device(at instance: Int) async throws -> (response: AuthenticateResponse, session: DeviceSession) {
            let response = try await self[instance].authenticate(AuthenticateRequest(processName: "multi", processVersion: SemanticVersion(1, 0)))
            return (response, try await self[instance].session(forToken: response.sessionToken))
        }

        func requestCycle(_ device: (response: AuthenticateResponse, session: DeviceSession), at instance: Int) async throws -> CycleResponse {
            try await self[instance].requestCycle(
                CycleRequest(workerID: device.response.workerID, processName: "multi", processVersion: SemanticVersion(1, 0)), session: device.session
            )
        }

        func report(
            _ device: (response: AuthenticateResponse, session: DeviceSession), _ assignment: CycleAssignment, scale: Float, samples: Int, at instance: Int
        ) async throws -> ReportResponse {
            let body = ReportEnvelope.encode(
                diff: MultiInstanceTests.diff(scale),
                metadata: ReportMetadata(workerID: device.response.workerID, requestKey: assignment.requestKey, sampleCount: samples, metrics: ["loss": 0.5])
            )
            // The session the device would present at that instance: tokens are signed with the shared secret.
            let session = try await self[instance].session(forToken: device.response.sessionToken)
            return try await self[instance].report(body, session: session)
        }

        func checkpoint(_ processID: String, at instance: Int) async throws -> [String: [Float]] {
            let (_, bytes) = try await self[instance].checkpoint(processID: processID, number: nil)
            return try Safetensors.decode(bytes).byName.mapValues(\.values)
        }
    }

    static func accepted(_ response: CycleResponse) throws -> CycleAssignment {
        guard case .accepted(let assignment) = response else { throw HarnessFailure("the device was turned away: \(response)") }
        return assignment
    }

    struct HarnessFailure: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    static func expectClose(_ actual: [String: [Float]], _ expected: [String: [Float]], sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(Set(actual.keys) == Set(expected.keys), sourceLocation: sourceLocation)
        for (name, values) in expected {
            let got = actual[name] ?? []
            #expect(got.count == values.count, "\(name)", sourceLocation: sourceLocation)
            for (a, b) in zip(got, values) where abs(a - b) > 1e-5 {
                Issue.record("\(name): \(got) != \(values)", sourceLocation: sourceLocation)
                break
            }
        }
    }

    @Test(arguments: StoreKind.underTest) func reportsAtEveryInstanceAreAveragedOnceAndADeadInstancesShareIsKept(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 3) { group in
            let hosted = try await group[0].host(Self.host(goal: 6))
            let scales: [Float] = [0.5, -1, 2, 0.25, 1.5, -0.75]
            let samples = [3, 7, 2, 5, 11, 4]
            var devices: [(response: AuthenticateResponse, session: DeviceSession)] = []
            var assignments: [CycleAssignment] = []
            for i in 0..<6 {
                // Checked in at one instance …
                let device = try await group.device(at: i % 3)
                devices.append(device)
                assignments.append(try Self.accepted(try await group.requestCycle(device, at: i % 3)))
            }
            // … a device asking again at another instance gets the same assignment.
            let again = try Self.accepted(try await group.requestCycle(devices[0], at: 1))
            #expect(again.requestKey == assignments[0].requestKey)
            // Instance 2 acknowledges three reports (one folded into its partial sum, with fold interval 2, and one pending)
            // and dies: it is never called again.
            for i in [0, 1, 2] {
                let response = try await group.report(devices[i], assignments[i], scale: scales[i], samples: samples[i], at: 2)
                #expect(response.cycle == 1 && !response.cycleClosed)
            }
            // A second report of the same key at another instance is refused.
            await #expect(throws: CoordinatorError.self) {
                _ = try await group.report(devices[0], assignments[0], scale: 9, samples: 1, at: 0)
            }
            var closedBy: [Int] = []
            for i in [3, 4, 5] {
                let response = try await group.report(devices[i], assignments[i], scale: scales[i], samples: samples[i], at: i % 2)
                if response.cycleClosed { closedBy.append(i % 2) }
            }
            #expect(closedBy.count == 1, "the goal's report closes the cycle once")
            let expected = Self.fedAvg(Array(zip(scales, samples)).map { (scale: $0.0, samples: $0.1) })
            for instance in [0, 1] {
                await group[instance].tick()
                let status = try await group[instance].status(processID: hosted.processID)
                #expect(status.latestCheckpoint == 1 && status.cyclesCompleted == 1 && status.currentCycle?.number == 2, "instance \(instance)")
                Self.expectClose(try await group.checkpoint(hosted.processID, at: instance), expected)
            }
        }
    }

    /// A buffer released by one instance: another instance, which has not ticked since, refuses a report of the
    /// released buffer once (503 `buffer_releasing`, the commit refused) and has taken up the release when the device
    /// sends it again a moment later, so the report goes into the next buffer at once instead of after the next tick.
    @Test(arguments: StoreKind.underTest) func anInstanceTakesUpAReleaseMadeElsewhereWhenAReportMeetsIt(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            var request = Self.host(goal: 1)
            request.serverConfig.aggregationMode = .buffered
            request.serverConfig.buffered = BufferedAggregationConfig(bufferSize: 2, maxConcurrency: 10)
            let hosted = try await group[0].host(request)
            func report(_ device: (response: AuthenticateResponse, session: DeviceSession), _ assignment: CycleAssignment, at instance: Int)
                async throws -> ReportResponse
            {
                let body = ReportEnvelope.encode(
                    diff: Self.diff(1),
                    metadata: ReportMetadata(workerID: device.response.workerID, requestKey: assignment.requestKey, sampleCount: 2, checkpoint: 0))
                return try await group[instance].report(body, session: try await group[instance].session(forToken: device.response.sessionToken))
            }
            var devices: [(response: AuthenticateResponse, session: DeviceSession)] = []
            var assignments: [CycleAssignment] = []
            for instance in [0, 0, 1] {
                let device = try await group.device(at: instance)
                devices.append(device)
                assignments.append(try Self.accepted(try await group.requestCycle(device, at: instance)))
            }
            _ = try await report(devices[0], assignments[0], at: 0)
            #expect(try await report(devices[1], assignments[1], at: 0).cycleClosed, "buffer 1 released at instance 0")
            // Instance 1 has not ticked: the report of its device meets the release at the commit.
            let refused = await #expect(throws: CoordinatorError.self) { _ = try await report(devices[2], assignments[2], at: 1) }
            #expect(refused?.code == .bufferReleasing && refused?.retryAfter == 1)
            // Sent again (still without a tick there): admitted into buffer 2, one checkpoint stale.
            let accepted = try await report(devices[2], assignments[2], at: 1)
            #expect(accepted.cycle == 2 && !accepted.cycleClosed)
            #expect(try await group[1].status(processID: hosted.processID).latestCheckpoint == 1)
        }
    }

    @Test(arguments: StoreKind.underTest) func aKeyFromAnotherInstanceServesOnlyItsOwnWorkerAndProcess(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            _ = try await group[0].host(Self.host(goal: 3))
            var other = Self.host(goal: 3)
            other.name = "other"
            _ = try await group[0].host(other)
            let owner = try await group.device(at: 0)
            let assignment = try Self.accepted(try await group.requestCycle(owner, at: 0))
            let body = ReportEnvelope.encode(
                diff: Self.diff(1), metadata: ReportMetadata(workerID: owner.response.workerID, requestKey: assignment.requestKey, sampleCount: 2)
            )
            // Another worker of the same process presents the key at the instance that did not issue it.
            let thief = try await group.device(at: 1)
            let stolen = await #expect(throws: CoordinatorError.self) { _ = try await group[1].report(body, session: thief.session) }
            #expect(stolen?.code == .forbidden || stolen?.code == .invalidRequestKey, "\(String(describing: stolen))")
            // A session of another process, for the same worker id, is refused too.
            let foreign = try await group[1].authenticate(AuthenticateRequest(processName: "other", processVersion: SemanticVersion(1, 0)))
            let foreignSession = try await group[1].session(forToken: foreign.sessionToken)
            let crossed = await #expect(throws: CoordinatorError.self) { _ = try await group[1].report(body, session: foreignSession) }
            #expect(crossed != nil)
            // The owner's report at that instance is accepted.
            #expect(try await group.report(owner, assignment, scale: 1, samples: 2, at: 1).cycle == 1)
        }
    }

    @Test(arguments: StoreKind.underTest) func admissionIsExactHoweverInstancesRace(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 3) { group in
            _ = try await group[0].host(Self.host(goal: 10, overSelection: 1.3))
            var devices: [(response: AuthenticateResponse, session: DeviceSession)] = []
            for i in 0..<40 { devices.append(try await group.device(at: i % 3)) }
            let admitted = try await withThrowingTaskGroup(of: Bool.self) { tasks in
                for (i, device) in devices.enumerated() {
                    tasks.addTask {
                        if case .accepted = try await group.requestCycle(device, at: (i * 7) % 3) { return true }
                        return false
                    }
                }
                var count = 0
                for try await accepted in tasks where accepted { count += 1 }
                return count
            }
            // ⌈10 × 1.3⌉ = 13 across the three instances, never more.
            #expect(admitted == 13)
            let processes = try await group[0].processList().processes
            let processID = try #require(processes.first).processID
            let progress = try #require(try await group.store.cycleProgress(processID: processID))
            #expect(progress.assigned == 13)
        }
    }

    @Test(arguments: StoreKind.underTest) func aCycleSealedByAnInstanceThatDiedIsClosedByAnotherAfterTheLease(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let hosted = try await group[0].host(Self.host(goal: 5))
            var reports: [(scale: Float, samples: Int)] = []
            for i in 0..<3 {
                let device = try await group.device(at: i % 2)
                let assignment = try Self.accepted(try await group.requestCycle(device, at: i % 2))
                _ = try await group.report(device, assignment, scale: Float(i + 1), samples: i + 2, at: (i + 1) % 2)
                reports.append((Float(i + 1), i + 2))
            }
            // An instance sealed the cycle to close it and died before publishing.
            #expect(try await group.store.sealCycle(processID: hosted.processID, cycle: 1, at: group.clock.date))
            let late = try await group.device(at: 1)
            let turnedAway = try await group.requestCycle(late, at: 1)
            guard case .rejected = turnedAway else { Issue.record("a sealed cycle admitted a device: \(turnedAway)"); return }
            group.clock.advance(by: .seconds(29))
            await group[1].tick()
            #expect(try await group[1].status(processID: hosted.processID).latestCheckpoint == 0, "within the lease the sealing instance may still publish")
            group.clock.advance(by: .seconds(1))
            await group[1].tick()
            let status = try await group[1].status(processID: hosted.processID)
            #expect(status.latestCheckpoint == 1 && status.currentCycle?.number == 2)
            Self.expectClose(try await group.checkpoint(hosted.processID, at: 0), Self.fedAvg(reports))
        }
    }

    @Test(arguments: StoreKind.underTest) func theDeadlineClosesTheCycleAtAnInstanceThatDidNotOpenIt(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 3) { group in
            let hosted = try await group[0].host(Self.host(goal: 10, minimum: 2, cycleLength: 60))
            var reports: [(scale: Float, samples: Int)] = []
            for i in 0..<2 {
                let device = try await group.device(at: 1)
                let assignment = try Self.accepted(try await group.requestCycle(device, at: 1))
                _ = try await group.report(device, assignment, scale: Float(i) - 0.5, samples: 3 + i, at: 1)
                reports.append((Float(i) - 0.5, 3 + i))
            }
            group.clock.advance(by: .seconds(61))
            // Instance 0 opened the cycle and instance 1 took its reports; instance 2 alone notices the deadline.
            await group[2].tick()
            let status = try await group[0].status(processID: hosted.processID)
            #expect(status.latestCheckpoint == 1 && status.cyclesCompleted == 1 && status.currentCycle?.number == 2)
            Self.expectClose(try await group.checkpoint(hosted.processID, at: 1), Self.fedAvg(reports))
            // The others take the next cycle up on their tick without closing it again.
            await group[0].tick()
            await group[1].tick()
            #expect(try await group[1].status(processID: hosted.processID).cyclesCompleted == 1)
        }
    }

    @Test(arguments: StoreKind.underTest) func aProcessHostedAtOneInstanceIsServedByTheOthers(kind: StoreKind) async throws {
        try await Group.with(kind, instances: 2) { group in
            let hosted = try await group[0].host(Self.host(goal: 2))
            // Instance 1 learns of it when a device asks for it.
            let device = try await group.device(at: 1)
            #expect(device.session.processID == hosted.processID)
            // Secure aggregation is hosted over a shared store too (SecureMultiInstanceTests runs it).
            var secure = SecureMultiInstanceTests.host(goal: 6, minimum: 4)
            secure.name = "secure"
            let status = try await group[1].host(secure)
            #expect(status.currentCycle?.secureAggregation?.stage == .advertiseKeys)
            #expect(try await group[0].status(processID: status.processID).currentCycle?.secureAggregation?.stage == .advertiseKeys)
        }
    }

}

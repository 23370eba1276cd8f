import Foundation
import OrchardCoordinator
import OrchardCoordinatorPostgres
import OrchardFormats
import OrchardPrivacy
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Testing

/// A device of a secure-aggregation process, driven by hand with the protocol's device state machine: it makes the
/// requests and reads the replies; the caller chooses the instance each one goes to.
struct SecureDeviceDriver {
    let workerID: String
    let sessionToken: String
    let assignment: CycleAssignment
    let update: [Float]
    let samples: Int
    let parameters: SecureAggregationParameters
    let maximumSampleCount: Int
    var secrets: SecureAggregationSecrets
    var generator: SplitMix64
    var machine: SecureAggregationDevice?

    init(
        workerID: String, sessionToken: String, assignment: CycleAssignment, scale: Float, samples: Int, seed: UInt64,
        parameters: SecureAggregationParameters, maximumSampleCount: Int
    ) {
        self.workerID = workerID
        self.sessionToken = sessionToken
        self.assignment = assignment
        // The coordinator's flat order: tensors by name.
        update = MultiInstanceTests.diff(scale).sorted { $0.name < $1.name }.flatMap(\.values)
        self.samples = samples
        self.parameters = parameters
        self.maximumSampleCount = maximumSampleCount
        generator = SplitMix64(seed: seed)
        secrets = SecureAggregationSecrets(using: &generator)
    }

    /// A request carrying nothing (a poll), or `change` applied to it.
    func request(_ change: (inout SecureAggregationRequest) -> Void = { _ in }) -> SecureAggregationRequest {
        var request = SecureAggregationRequest(workerID: workerID, requestKey: assignment.requestKey)
        change(&request)
        return request
    }

    /// The advertisement of the device's keys.
    func advertisement() throws -> SecureAggregationRequest {
        let keys = try secrets.publicKeys()
        return request { $0.advertiseKeys = SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask) }
    }

    /// Takes the index the advertisement's reply gave.
    mutating func advertised(_ reply: SecureAggregationReply) throws {
        machine = try SecureAggregationDevice(
            index: reply.device, configuration: parameters,
            context: SecureAggregationPlan.context(processID: assignment.processID, cycle: assignment.cycle), maximumSampleCount: maximumSampleCount,
            modelLength: update.count, secrets: secrets)
        _ = try machine!.advertiseKeys()
    }

    /// The message answering `reply`'s next step (the masked input as JSON), or nil when it says wait or done.
    mutating func answer(_ reply: SecureAggregationReply) throws -> SecureAggregationRequest? {
        switch reply.next {
        case .shareKeys:
            let message = try machine!.shareKeys(try #require(reply.roster), using: &generator)
            return request { $0.shareKeys = message }
        case .maskedInput:
            let message = try machine!.maskedInput(try #require(reply.delivery), update: update, sampleCount: samples, using: &generator)
            return request {
                $0.maskedInput = message
                $0.maskedInputFormat = .json
            }
        case .consistencyCheck:
            let message = try machine!.consistencyCheck(try #require(reply.consistencyRequest))
            return request { $0.consistencyCheck = message }
        case .unmask:
            let message = try machine!.unmask(try #require(reply.unmaskRequest))
            return request { $0.unmask = message }
        case .wait, .done:
            return nil
        }
    }
}

/// Secure aggregation over a store several coordinator instances share (in process, one manual clock): devices spread
/// over the instances, each stage served by any of them, an instance dying between stages, and the checkpoint within
/// one quantisation step of FedAvg of exactly the devices that finished.
@Suite struct SecureMultiInstanceTests {
    static let parameters = SecureAggregationParameters(threshold: 3)
    static let inputs: [(scale: Float, samples: Int)] = [(0.1, 3), (-0.3, 1), (0.2, 7), (0.5, 2), (-0.4, 4), (0.3, 5)]

    static func host(goal: Int, minimum: Int) -> HostProcessRequest {
        var request = MultiInstanceTests.host(goal: goal, minimum: minimum, overSelection: 1)
        request.name = "multi"
        request.serverConfig.maximumSampleCount = 100
        request.serverConfig.secureAggregation = SecureAggregationConfig(parameters: parameters, stageTimeout: 30)
        return request
    }

    /// The aggregate's error bound per coordinate.
    static var step: Float { Float(parameters.quantizationStep) }

    static func expectWithinStep(_ actual: [String: [Float]], _ expected: [String: [Float]], sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(Set(actual.keys) == Set(expected.keys), sourceLocation: sourceLocation)
        for (name, values) in expected {
            let got = actual[name] ?? []
            #expect(got.count == values.count, sourceLocation: sourceLocation)
            for (a, b) in zip(got, values) where abs(a - b) > step {
                Issue.record("\(name): \(got) is not within \(step) of \(values)", sourceLocation: sourceLocation)
                break
            }
        }
    }

    /// Instances that can be replaced (a dead one restarted on a store handle of its own, as a new process would).
    final class Instances: @unchecked Sendable {
        let group: MultiInstanceTests.Group
        let kind: StoreKind
        var replaced: [Int: Coordinator] = [:]
        var extraStores: [PostgresStore] = []
        let configuration: PostgresStoreConfiguration?

        init(group: MultiInstanceTests.Group, kind: StoreKind, configuration: PostgresStoreConfiguration?) {
            self.group = group
            self.kind = kind
            self.configuration = configuration
        }

        subscript(index: Int) -> Coordinator { replaced[index] ?? group[index] }

        /// Starts instance `index` again (same instance name) on a new store handle; the old one is never called again.
        func restart(_ index: Int) async throws {
            let store: any CoordinatorStore
            if let configuration {
                let opened = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
                extraStores.append(opened)
                store = opened
            } else {
                store = group.store
            }
            let coordinator = Coordinator(
                store: store,
                configuration: CoordinatorConfiguration(adminToken: "admin", foldInterval: 2, instanceID: "instance-\(index)", sealLease: .seconds(30)),
                clock: group.clock, random: SplitMix64(seed: UInt64(100 + index)))
            try await coordinator.start()
            replaced[index] = coordinator
        }

        /// Sends a device's request to instance `index`, with the session that instance makes of its token.
        func send(_ request: SecureAggregationRequest, of device: SecureDeviceDriver, at index: Int) async throws -> SecureAggregationReply {
            let session = try await self[index].session(forToken: device.sessionToken)
            return try await self[index].secureAggregation(request, session: session)
        }

        /// Polls at instance `index` and sends the answer to instance `answerAt`; returns the reply to the answer (or to
        /// the poll when there is nothing to answer).
        func step(_ device: inout SecureDeviceDriver, pollAt index: Int, answerAt answerIndex: Int) async throws -> SecureAggregationReply {
            let polled = try await send(device.request(), of: device, at: index)
            guard let message = try device.answer(polled) else { return polled }
            return try await send(message, of: device, at: answerIndex)
        }

        /// The latest checkpoint as instance `index` serves it.
        func checkpoint(_ processID: String, at index: Int) async throws -> [String: [Float]] {
            let (_, bytes) = try await self[index].checkpoint(processID: processID, number: nil)
            return try Safetensors.decode(bytes).byName.mapValues(\.values)
        }

        func shutdown() async {
            for store in extraStores { await store.shutdown() }
        }
    }

    /// Runs `body` with three instances over a fresh shared store of `kind`.
    static func with(_ kind: StoreKind, _ body: (Instances) async throws -> Void) async throws {
        switch kind {
        case .sqlite:
            try await MultiInstanceTests.Group.with(kind, instances: 3) { group in
                try await body(Instances(group: group, kind: kind, configuration: nil))
            }
        case .postgres:
            try await TestDatabase.withDatabase { configuration in
                var stores: [PostgresStore] = []
                var instances: Instances?
                let result: Result<Void, any Error>
                do {
                    for _ in 0..<3 { stores.append(try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)) }
                    let made = Instances(
                        group: try await MultiInstanceTests.Group(stores: stores, foldInterval: 2), kind: kind, configuration: configuration)
                    instances = made
                    result = .success(try await body(made))
                } catch {
                    result = .failure(error)
                }
                await instances?.shutdown()
                for store in stores { await store.shutdown() }
                try result.get()
            }
        }
    }

    /// `count` devices, device i authenticated at instance i % 3 and admitted at instance (i + 1) % 3.
    static func fleet(_ instances: Instances, count: Int) async throws -> [SecureDeviceDriver] {
        var devices: [SecureDeviceDriver] = []
        for i in 0..<count {
            let device = try await instances.group.device(at: i % 3)
            let assignment = try MultiInstanceTests.accepted(try await instances.group.requestCycle(device, at: (i + 1) % 3))
            devices.append(
                SecureDeviceDriver(
                    workerID: device.response.workerID, sessionToken: device.response.sessionToken, assignment: assignment, scale: inputs[i].scale,
                    samples: inputs[i].samples, seed: UInt64(200 + i), parameters: parameters, maximumSampleCount: 100))
        }
        return devices
    }

    @Test(arguments: StoreKind.underTest) func everyStageIsServedByAnyInstanceAndTheCheckpointIsFedAvgWithinOneStep(kind: StoreKind) async throws {
        try await Self.with(kind) { instances in
            let hosted = try await instances[0].host(Self.host(goal: 6, minimum: 4))
            var devices = try await Self.fleet(instances, count: 6)
            // Advertisements at instance (i + 2) % 3: the sixth reaches the goal, counted across the instances.
            for i in devices.indices {
                let reply = try await instances.send(try devices[i].advertisement(), of: devices[i], at: (i + 2) % 3)
                #expect(reply.device == i + 1, "indices are handed out in one order across the instances")
                #expect(reply.next == (i < 5 ? .wait : .shareKeys))
                try devices[i].advertised(reply)
            }
            // Another instance, which took no advertisement since, knows the stage.
            let status = try await instances[1].status(processID: hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .shareKeys)
            #expect(status.currentCycle?.secureAggregation?.advertised == 6)
            // A device turned up late is not admitted at any instance.
            for index in 0..<3 {
                let late = try await instances.group.device(at: index)
                guard case .rejected = try await instances.group.requestCycle(late, at: index) else {
                    Issue.record("admitted after advertise_keys closed at instance \(index)")
                    continue
                }
            }
            // Each later stage: polled at one instance, answered at another.
            var closedBy: [Int] = []
            for stage in [SecureAggregationStage.shareKeys, .maskedInput, .unmask] {
                for i in devices.indices {
                    let reply = try await instances.step(&devices[i], pollAt: i % 3, answerAt: (i + 1) % 3)
                    if stage == .unmask {
                        #expect(reply.next == .done)
                        if reply.cycleClosed { closedBy.append(i) }
                    }
                }
            }
            #expect(closedBy == [5], "the last unmask closes the cycle, once")
            let expected = MultiInstanceTests.fedAvg(Self.inputs)
            for index in 0..<3 {
                await instances[index].tick()
                let status = try await instances[index].status(processID: hosted.processID)
                #expect(status.latestCheckpoint == 1 && status.cyclesCompleted == 1, "instance \(index)")
                #expect(status.currentCycle?.number == 2 && status.currentCycle?.secureAggregation?.stage == .advertiseKeys, "instance \(index)")
                Self.expectWithinStep(try await instances.checkpoint(hosted.processID, at: index), expected)
            }
        }
    }

    @Test(arguments: StoreKind.underTest) func anInstanceDyingBetweenStagesLosesNothingAcknowledgedAndCountsNothingTwice(kind: StoreKind) async throws {
        try await Self.with(kind) { instances in
            let hosted = try await instances[0].host(Self.host(goal: 6, minimum: 4))
            var devices = try await Self.fleet(instances, count: 6)
            for i in devices.indices {
                try devices[i].advertised(try await instances.send(try devices[i].advertisement(), of: devices[i], at: i % 3))
            }
            for i in devices.indices { _ = try await instances.step(&devices[i], pollAt: (i + 1) % 3, answerAt: (i + 2) % 3) }
            // Instance 2 acknowledges two masked inputs, then dies.
            var acknowledged: [SecureAggregationRequest] = []
            for i in [0, 1] {
                let polled = try await instances.send(devices[i].request(), of: devices[i], at: 2)
                let message = try #require(try devices[i].answer(polled))
                _ = try await instances.send(message, of: devices[i], at: 2)
                acknowledged.append(message)
            }
            // The same masked input at a survivor is refused: it is in the sum once.
            await #expect(throws: CoordinatorError.self) { _ = try await instances.send(acknowledged[0], of: devices[0], at: 0) }
            do {
                _ = try await instances.send(acknowledged[1], of: devices[1], at: 1)
                Issue.record("a masked input acknowledged by the dead instance was taken again")
            } catch let error as CoordinatorError {
                #expect(error.code == .duplicateMessage)
            }
            // Device 5 never sends its masked input: it is dropped at the stage's deadline.
            for i in [2, 3, 4] { _ = try await instances.step(&devices[i], pollAt: i % 2, answerAt: (i + 1) % 2) }
            var status = try await instances[0].status(processID: hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .maskedInput)
            #expect(status.currentCycle?.secureAggregation?.masked == 5)
            // The dead instance comes back (a new process, same name) while the stage times out; instance 1 notices first.
            try await instances.restart(2)
            instances.group.clock.advance(bySeconds: 31)
            await instances[1].tick()
            status = try await instances[2].status(processID: hosted.processID)
            #expect(status.currentCycle?.secureAggregation?.stage == .unmask)
            #expect(status.currentCycle?.secureAggregation?.dropped == 1)
            // Unmasking, spread over the three, the restarted one among them.
            var closed = 0
            for i in 0..<5 {
                let reply = try await instances.step(&devices[i], pollAt: (i + 2) % 3, answerAt: i % 3)
                #expect(reply.next == .done)
                if reply.cycleClosed { closed += 1 }
            }
            #expect(closed == 1)
            let expected = MultiInstanceTests.fedAvg(Array(Self.inputs.prefix(5)))
            for index in 0..<3 {
                await instances[index].tick()
                #expect(try await instances[index].status(processID: hosted.processID).latestCheckpoint == 1, "instance \(index)")
                Self.expectWithinStep(try await instances.checkpoint(hosted.processID, at: index), expected)
            }
        }
    }

    /// Every device's message of a stage sent at once, each to an instance of its own choosing: the instances take the
    /// store's lock in turn, so each message is applied once, in one order, and none is refused.
    @Test(arguments: StoreKind.underTest) func devicesRacingAcrossInstancesAreEachCountedOnce(kind: StoreKind) async throws {
        try await Self.with(kind) { instances in
            let hosted = try await instances[0].host(Self.host(goal: 6, minimum: 4))
            var devices = try await Self.fleet(instances, count: 6)
            let advertised = try await withThrowingTaskGroup(of: (Int, SecureAggregationReply).self) { group in
                for i in devices.indices {
                    let device = devices[i]
                    group.addTask { (i, try await instances.send(try device.advertisement(), of: device, at: (i * 5) % 3)) }
                }
                var replies: [Int: SecureAggregationReply] = [:]
                for try await (i, reply) in group { replies[i] = reply }
                return replies
            }
            #expect(Set(advertised.values.map(\.device)) == Set(1...6), "six distinct indices")
            for i in devices.indices { try devices[i].advertised(try #require(advertised[i])) }
            for stage in [SecureAggregationStage.shareKeys, .maskedInput, .unmask] {
                // Each device's answer, worked out from a poll, then all sent together.
                var messages: [(Int, SecureAggregationRequest)] = []
                for i in devices.indices {
                    let polled = try await instances.send(devices[i].request(), of: devices[i], at: i % 3)
                    messages.append((i, try #require(try devices[i].answer(polled), "device \(i) has a message at \(stage.rawValue)")))
                }
                let closed = try await withThrowingTaskGroup(of: Bool.self) { group in
                    for (i, message) in messages {
                        let device = devices[i]
                        group.addTask { try await instances.send(message, of: device, at: (i + 1) % 3).cycleClosed }
                    }
                    var count = 0
                    for try await cycleClosed in group where cycleClosed { count += 1 }
                    return count
                }
                #expect(closed == (stage == .unmask ? 1 : 0), "\(stage.rawValue)")
            }
            for index in 0..<3 {
                await instances[index].tick()
                #expect(try await instances[index].status(processID: hosted.processID).latestCheckpoint == 1)
                Self.expectWithinStep(try await instances.checkpoint(hosted.processID, at: index), MultiInstanceTests.fedAvg(Self.inputs))
            }
        }
    }
}

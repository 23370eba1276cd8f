import Foundation
import OrchardData

import OrchardFlower
import OrchardFormats
import OrchardML
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// Orchard devices in a real Flower federation: `flower-superlink` on loopback, the test app's ServerApp (FedAvg over
/// the MLP in FlowerApp/orchardflowertest/mlp.py) submitted with `flwr run`, and Orchard nodes (in this process, or
/// the `orchard flower join` executable) beside Python SuperNodes.
@Suite(.serialized, FlowerInstallation.requirement, .timeLimit(.minutes(10)))
struct FlowerFederationTests {
    /// The Orchard twin of mlp.py's model: dense 4→8, ReLU, dense 8→3, softmax; cross-entropy, SGD.
    static let modelJSON = #"""
        {"format_version":2,"name":"flower-mlp","inputs":[{"name":"x","shape":[4],"categorical":false}],
         "layers":[{"name":"fc1","type":"dense","inputs":["x"],"units":8,"input_size":4},
                   {"name":"act","type":"relu","inputs":["fc1"]},
                   {"name":"fc2","type":"dense","inputs":["act"],"units":3,"input_size":8},
                   {"name":"probs","type":"softmax","inputs":["fc2"]}],
         "output":"probs",
         "training":{"loss":"crossEntropy","optimizer":{"type":"sgd","learning_rate":0.1},"epochs":1,"batch_size":8}}
        """#

    static func model() throws -> ModelSpec { try ModelSpec.decode(json: Data(modelJSON.utf8)) }

    /// A seeded 3-class problem like mlp.py's (class centres plus noise), `samples` rows.
    static func dataset(seed: UInt64, samples: Int) throws -> TensorDataset {
        var random = OrchardRandom(seed: seed)
        let centres: [[Float]] = [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0]]
        var x: [Float] = []
        var y: [Float] = []
        for _ in 0..<samples {
            let label = Int.random(in: 0..<3, using: &random)
            y.append(Float(label))
            x += centres[label].map { $0 + Float.random(in: -0.5...0.5, using: &random) }
        }
        return try TensorDataset(inputs: ["x": Tensor(shape: [samples, 4], scalars: x)], targets: Tensor(shape: [samples, 1], scalars: y))
    }

    /// What a node did, in order.
    final class Recorder: Sendable {
        private let events = Mutex<[FlowerNodeEvent]>([])
        func record(_ event: FlowerNodeEvent) { events.withLock { $0.append(event) } }
        var all: [FlowerNodeEvent] { events.withLock { $0 } }
        var nodeID: UInt64? {
            all.compactMap { if case .activated(let id) = $0 { id } else { nil } }.last
        }
        /// The arrays of each `train` answer, in order (round r is the r-th).
        var trainAnswers: [(arrays: [NamedArray], samples: Double)] {
            all.compactMap {
                if case .answered(_, "train", let arrays, let metrics) = $0 { (arrays, metrics["num-examples"] ?? 0) } else { nil }
            }
        }
    }

    static func node(_ link: SuperLinkFixture, state: URL, data: TensorDataset, maximumMessageObjects: Int = 100_000) throws -> (FlowerNode, Recorder) {
        let recorder = Recorder()
        let app = try FlowerLocalApp(model: try model(), dataset: data)
        var configuration = FlowerNodeConfiguration(
            superlink: try SuperLinkAddress(link.address, trustRoots: nil), stateDirectory: state, pollInterval: .milliseconds(200)
        )
        configuration.maximumMessageObjects = maximumMessageObjects
        return (try FlowerNode(configuration: configuration, app: app) { recorder.record($0) }, recorder)
    }

    /// A new directory for a test's SuperLink and nodes (the caller removes it, after stopping them).
    static func temporaryDirectory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-flower-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    /// The values of a JSON array of numbers.
    static func floats(_ value: Any?) -> [Double] { (value as? [Any] ?? []).compactMap { ($0 as? NSNumber)?.doubleValue } }

    @Test func twoOrchardDevicesRunThreeFedAvgRoundsAndTheGlobalModelIsTheWeightedAverage() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory)
        // Different data sizes, so that the weighting matters.
        let (first, firstEvents) = try Self.node(link, state: directory.appendingPathComponent("a"), data: try Self.dataset(seed: 1, samples: 40))
        let (second, secondEvents) = try Self.node(link, state: directory.appendingPathComponent("b"), data: try Self.dataset(seed: 2, samples: 24))
        let windows = [Task { try await first.runWindow() }, Task { try await second.runWindow() }]
        let result = try await link.run(config: ["num-server-rounds": "3"], output: directory.appendingPathComponent("result.json"))
        for window in windows { window.cancel() }
        for window in windows { try await window.value }
        await link.stop()

        let rounds = try #require(result["rounds"] as? [[String: Any]])
        #expect(rounds.count == 3)
        let devices = [(firstEvents, 40.0), (secondEvents, 24.0)]
        for (recorder, samples) in devices {
            #expect(recorder.trainAnswers.count == 3, "each device answered every round's train message")
            #expect(recorder.trainAnswers.allSatisfy { $0.samples == samples })
            #expect(recorder.all.contains { if case .deactivated = $0 { true } else { false } })
        }
        // What the ServerApp aggregated is, bit for bit, what each device sent.
        for (index, round) in rounds.enumerated() {
            let replies = try #require(round["replies"] as? [[String: Any]])
            #expect(replies.count == 2)
            for (recorder, samples) in devices {
                let id = try #require(recorder.nodeID)
                let reply = try #require(replies.first { $0["node_id"] as? String == String(id) }, "round \(index + 1) has node \(id)'s reply")
                #expect((reply["num_examples"] as? NSNumber)?.doubleValue == samples)
                let arrays = try #require(reply["arrays"] as? [String: Any])
                for sent in recorder.trainAnswers[index].arrays {
                    // As float32: Foundation's JSON reader may be off in a double's last digit, never by a float32 ulp.
                    #expect(Self.floats(arrays[sent.name]).map { Float($0) } == sent.values, "round \(index + 1), \(sent.name)")
                }
            }
        }
        // The final global arrays are the sample-weighted average of the devices' last updates.
        let final = try #require(result["final"] as? [String: Any])
        let lastA = firstEvents.trainAnswers[2].arrays
        let lastB = secondEvents.trainAnswers[2].arrays
        for (a, b) in zip(lastA, lastB) {
            let expected = zip(a.values, b.values).map { (Double($0) * 40 + Double($1) * 24) / 64 }
            let global = Self.floats(final[a.name])
            #expect(global.count == expected.count)
            let worst = zip(global, expected).map { abs($0 - $1) }.max() ?? .infinity
            #expect(worst < 1e-6, "\(a.name): largest difference \(worst)")
        }
        // The devices learned something: the last round's training loss is below the first's.
        let losses = firstEvents.all.compactMap { if case .answered(_, "train", _, let m) = $0 { m["train_loss"] } else { nil } }
        #expect(losses.count == 3 && losses[2] < losses[0])
    }

    @Test func devicesJoinASuperLinkServingHTTPSFromAPrivateCA() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory, tls: true)
        let ca = try #require(link.caCertificate)
        var windows: [Task<Void, any Error>] = []
        var recorders: [Recorder] = []
        for (index, samples) in [40, 24].enumerated() {
            let recorder = Recorder()
            let configuration = FlowerNodeConfiguration(
                superlink: try SuperLinkAddress(link.address, trustRoots: try TrustRoots.certificateFile(ca.path)),
                stateDirectory: directory.appendingPathComponent("node-\(index)"), pollInterval: .milliseconds(200)
            )
            let app = try FlowerLocalApp(model: try Self.model(), dataset: try Self.dataset(seed: UInt64(index), samples: samples))
            let node = try FlowerNode(configuration: configuration, app: app) { recorder.record($0) }
            recorders.append(recorder)
            windows.append(Task { try await node.runWindow() })
        }
        let result = try await link.run(config: ["num-server-rounds": "1"], output: directory.appendingPathComponent("result.json"))
        for window in windows { window.cancel() }
        for window in windows { try await window.value }
        await link.stop()
        let rounds = try #require(result["rounds"] as? [[String: Any]])
        #expect(rounds.count == 1)
        #expect((rounds.first?["replies"] as? [[String: Any]])?.count == 2)
        for recorder in recorders { #expect(recorder.trainAnswers.count == 1) }
    }

    @Test func aNodeThatDoesNotTrustTheSuperLinksCAIsRefusedByTLS() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory, tls: true)
        // Another CA than the one that signed the SuperLink's certificate.
        let other = try TestCertificates.make(commonName: "Someone else's CA").write(to: directory.appendingPathComponent("other"))
        let recorder = Recorder()
        let configuration = FlowerNodeConfiguration(
            superlink: try SuperLinkAddress(link.address, trustRoots: try TrustRoots.certificateFile(other.ca)),
            stateDirectory: directory.appendingPathComponent("node"), pollInterval: .milliseconds(200)
        )
        let node = try FlowerNode(
            configuration: configuration, app: try FlowerLocalApp(model: try Self.model(), dataset: try Self.dataset(seed: 1, samples: 8))
        ) {
            recorder.record($0)
        }
        let window = Task { try await node.runWindow() }
        while !recorder.all.contains(where: { if case .retrying = $0 { true } else { false } }) { try await Task.sleep(for: .milliseconds(50)) }
        window.cancel()
        try await window.value
        await link.stop()
        let failure = try #require(recorder.all.compactMap { if case .retrying(let error) = $0 { error } else { nil } }.first)
        #expect(failure.code == .superlinkUnreachable)
        #expect(failure.message.contains("TLS"), "\(failure.message)")
        #expect(!recorder.all.contains { if case .registered = $0 { true } else { false } })
    }

    @Test func anOrchardDeviceAndAPythonSuperNodeShareARun() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory)
        try link.startPythonNode(partition: 1, directory: directory)
        // The Orchard device through the CLI: `orchard flower join`.
        let data = directory.appendingPathComponent("data.safetensors")
        try Data(DeviceDataFile.encode(try Self.dataset(seed: 3, samples: 32))).write(to: data)
        let model = directory.appendingPathComponent("model.json")
        try Self.modelJSON.write(to: model, atomically: true, encoding: .utf8)
        let join = ChildProcess()
        join.executableURL = try OrchardExecutable.url()
        join.arguments = [
            "flower", "join", "--superlink", link.address, "--insecure", "--model", model.path, "--data", data.path,
            "--state-directory", directory.appendingPathComponent("node").path, "--poll-interval", "0.2", "--node-config", "seed=5",
        ]
        let output = directory.appendingPathComponent("join.out")
        _ = FileManager.default.createFile(atPath: output.path, contents: nil)
        join.standardOutput = try FileHandle(forWritingTo: output)
        join.standardError = FileHandle.nullDevice
        try join.run()
        defer { if join.isRunning { join.terminate() } }

        let result = try await link.run(config: ["num-server-rounds": "3"], output: directory.appendingPathComponent("result.json"))
        join.terminate()
        while join.isRunning { try await Task.sleep(for: .milliseconds(20)) }
        await link.stop()
        let lines = try String(contentsOf: output, encoding: .utf8).split(separator: "\n").compactMap {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        let events = lines.compactMap { $0["event"] as? String }
        #expect(events.first == "started")
        #expect(events.last == "stopped", "SIGTERM ends the node cleanly: \(events)")
        #expect(events.contains("deactivated"))
        let nodeID = try #require(lines.first { $0["event"] as? String == "activated" }?["node_id"] as? NSNumber).stringValue
        #expect(lines.filter { $0["event"] as? String == "answered" && $0["message_type"] as? String == "train" }.count == 3)

        let rounds = try #require(result["rounds"] as? [[String: Any]])
        #expect(rounds.count == 3)
        for round in rounds {
            let replies = try #require(round["replies"] as? [[String: Any]])
            #expect(replies.count == 2)
            #expect(replies.contains { $0["node_id"] as? String == nodeID }, "the Orchard device answered")
            #expect(replies.allSatisfy { $0["error"] == nil })
        }
        // FedAvg over one Orchard and one Python reply: the final arrays are their weighted average.
        let last = try #require(rounds.last?["replies"] as? [[String: Any]])
        let final = try #require(result["final"] as? [String: Any])
        let weights = last.map { ($0["num_examples"] as? NSNumber)?.doubleValue ?? 0 }
        #expect(weights.contains(32) && weights.contains(40))
        for name in ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"] {
            let parts = last.map { Self.floats(($0["arrays"] as? [String: Any])?[name]) }
            let expected = (0..<parts[0].count).map { i in zip(parts, weights).map { $0[i] * $1 }.reduce(0, +) / weights.reduce(0, +) }
            let worst = zip(Self.floats(final[name]), expected).map { abs($0 - $1) }.max() ?? .infinity
            #expect(worst < 1e-6, "\(name): largest difference \(worst)")
        }
    }

    @Test func badMessagesGetErrorRepliesAndTheNodeKeepsServing() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory)
        // A message of more than 60 objects is refused unfetched (the good ones have about a dozen).
        let (node, events) = try Self.node(
            link, state: directory.appendingPathComponent("a"), data: try Self.dataset(seed: 1, samples: 16), maximumMessageObjects: 60
        )
        let window = Task { try await node.runWindow() }
        let result = try await link.run(config: ["mode": "'probe'"], output: directory.appendingPathComponent("result.json"))
        window.cancel()
        try await window.value
        await link.stop()

        let cases = try #require(result["cases"] as? [String: [String: Any]])
        func error(_ name: String) -> String { cases[name]?["error"] as? String ?? "no error reply: \(cases[name] ?? [:])" }
        #expect(error("unknown_type").contains("unsupported_message") && error("unknown_type").contains("'query'"))
        #expect(error("wrong_shape").contains("array_mismatch") && error("wrong_shape").contains("fc1.weight"))
        #expect(error("wrong_count").contains("array_mismatch") && error("wrong_count").contains("3 arrays"))
        #expect(error("wrong_dtype").contains("fc1.weight"))
        #expect(error("no_arrays").contains("no ArrayRecord"))
        #expect(error("bad_learning_rate").contains("learning rate"))
        #expect(error("missing_object").contains("missing_object") && error("missing_object").contains("stayed unavailable"))
        #expect(error("too_many_objects").contains("objects, more than the 60 a node fetches"))
        #expect((cases["missing_object"]?["error_code"] as? NSNumber)?.intValue == 3, "a message whose object never arrives is MESSAGE_UNAVAILABLE")
        for name in ["unknown_type", "wrong_shape", "wrong_count", "wrong_dtype", "no_arrays", "bad_learning_rate"] {
            #expect((cases[name]?["error_code"] as? NSNumber)?.intValue == 2, "\(name) is an app error (CLIENT_APP_RAISED_EXCEPTION)")
        }
        let metrics = try #require(cases["good"]?["metrics"] as? [String: Any], "after eight bad messages the node still trains: \(cases["good"] ?? [:])")
        #expect((metrics["num-examples"] as? NSNumber)?.intValue == 16)
        #expect(events.all.filter { if case .answeredWithError = $0 { true } else { false } }.count == 8)
    }
}

/// A background window that ends in the middle of a round (in the same serialized suite: one SuperLink at a time).
extension FlowerFederationTests {
    /// Holds the task of a node's current window, so that an event can end it.
    final class WindowHolder: Sendable {
        let task = Mutex<Task<Void, any Error>?>(nil)
        let ended = Mutex(false)
        func endOnce() {
            guard
                ended.withLock({ done in
                    defer { done = true }; return !done
                })
            else { return }
            task.withLock { $0?.cancel() }
        }
    }

    @Test func aWindowEndingMidRoundKeepsTheMessageAndTheNextWindowAnswersItOnce() async throws {
        let directory = try FlowerFederationTests.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory)
        let state = directory.appendingPathComponent("a")
        let holder = WindowHolder()
        let firstWindow = Recorder()
        let address = try SuperLinkAddress(link.address, trustRoots: nil)
        let app = try FlowerLocalApp(model: try FlowerFederationTests.model(), dataset: try FlowerFederationTests.dataset(seed: 1, samples: 40))
        let configuration = FlowerNodeConfiguration(superlink: address, stateDirectory: state, pollInterval: .milliseconds(200))
        // The first window ends as soon as its first train message has been fetched (before it is confirmed).
        let first = try FlowerNode(configuration: configuration, app: app) { event in
            firstWindow.record(event)
            if case .received(_, _, "train") = event { holder.endOnce() }
        }
        let (other, _) = try FlowerFederationTests.node(
            link, state: directory.appendingPathComponent("b"), data: try FlowerFederationTests.dataset(seed: 2, samples: 24))
        let otherWindow = Task { try await other.runWindow() }
        let window = Task { try await first.runWindow() }
        holder.task.withLock { $0 = window }
        let output = directory.appendingPathComponent("result.json")
        let run = Task { () async throws -> Int in (try await link.run(config: ["num-server-rounds": "2"], output: output)).count }
        try await window.value
        let kept = try #require(firstWindow.all.compactMap { if case .received(_, let id, "train") = $0 { id } else { nil } }.first)
        #expect(!firstWindow.all.contains { if case .answered = $0 { true } else { false } }, "the window ended before answering")
        #expect(FileManager.default.fileExists(atPath: state.appendingPathComponent("flower-kept-message.json").path))

        // The next window (a new node object on the same state, as after a relaunch) answers the kept message first.
        let secondWindow = Recorder()
        let second = try FlowerNode(configuration: configuration, app: app) { secondWindow.record($0) }
        let next = Task { try await second.runWindow() }
        _ = try await run.value
        let result = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: output)) as? [String: Any])
        next.cancel()
        otherWindow.cancel()
        try await next.value
        try await otherWindow.value
        await link.stop()

        let answered = secondWindow.all.compactMap { if case .answered(let id, "train", _, _) = $0 { id } else { nil } }
        #expect(answered.first == kept, "the kept message is answered first")
        #expect(answered.filter { $0 == kept }.count == 1, "and only once")
        let pushed = secondWindow.all.compactMap { if case .pushed(let id) = $0 { id } else { nil } }
        #expect(pushed.filter { $0 == kept }.count == 1)
        #expect(!FileManager.default.fileExists(atPath: state.appendingPathComponent("flower-kept-message.json").path))
        #expect(!FileManager.default.fileExists(atPath: state.appendingPathComponent("flower-kept-reply.json").path))
        let rounds = try #require(result["rounds"] as? [[String: Any]])
        #expect(rounds.count == 2)
        // Whether the ServerApp counts the late reply is Flower's: a node that was inactive when the round's replies
        // were collected may be counted as failed. The run goes on either way.
    }
}

/// The SuperLink going away in the middle of a round.
extension FlowerFederationTests {
    @Test func theSuperLinkGoingAwayMidRoundLeavesTheReplyKeptAndTheNodeRetrying() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory)
        let state = directory.appendingPathComponent("a")
        let recorder = Recorder()
        let superlink = link.superlink.process.processIdentifier
        let configuration = FlowerNodeConfiguration(
            superlink: try SuperLinkAddress(link.address, trustRoots: nil), stateDirectory: state, pollInterval: .milliseconds(200)
        )
        let app = try FlowerLocalApp(model: try Self.model(), dataset: try Self.dataset(seed: 1, samples: 16))
        // The SuperLink dies (SIGKILL, its whole process group) once the node has trained, before it pushes.
        let node = try FlowerNode(configuration: configuration, app: app) { event in
            recorder.record(event)
            if case .answered(_, "train", _, _) = event { kill(-superlink, SIGKILL) }
        }
        let window = Task { try await node.runWindow() }
        let output = directory.appendingPathComponent("result.json")
        let run = Task { () async -> Bool in (try? await link.run(config: ["min-nodes": "1", "num-server-rounds": "1"], output: output)) != nil }
        while !recorder.all.contains(where: { if case .retrying(let error) = $0 { error.code == .superlinkUnreachable } else { false } }) {
            try await Task.sleep(for: .milliseconds(50))
        }
        // The reply is kept for the next window while the node backs off and retries.
        #expect(FileManager.default.fileExists(atPath: state.appendingPathComponent("flower-kept-reply.json").path))
        window.cancel()
        try await window.value
        #expect(await run.value == false, "the run cannot finish without its SuperLink")
        await link.stop()
        #expect(FileManager.default.fileExists(atPath: state.appendingPathComponent("flower-kept-reply.json").path), "still kept after the window")
        #expect(!recorder.all.contains { if case .pushed = $0 { true } else { false } })
        #expect(recorder.all.contains { if case .deactivated = $0 { true } else { false } }, "the window ends even though deactivate-node fails")
    }
}

/// A SuperLink that admits only SuperNodes its operator registered (`--enable-supernode-auth`).
extension FlowerFederationTests {
    @Test func aSuperLinkThatAdmitsOnlyRegisteredKeysRunsARoundWithAPreRegisteredOrchardNode() async throws {
        let directory = try Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let link = try await SuperLinkFixture(directory: directory, tls: true, nodeAuthentication: true)
        let ca = try #require(link.caCertificate)
        let address = try SuperLinkAddress(link.address, trustRoots: try TrustRoots.certificateFile(ca.path))
        let app = try FlowerLocalApp(model: try Self.model(), dataset: try Self.dataset(seed: 3, samples: 24))
        func node(_ name: String, key: NodeIdentity?, recorder: Recorder) throws(FlowerError) -> FlowerNode {
            var configuration = FlowerNodeConfiguration(
                superlink: address, stateDirectory: directory.appendingPathComponent(name), pollInterval: .milliseconds(200), authenticationKey: key
            )
            configuration.activationPatience = .seconds(3)
            return try FlowerNode(configuration: configuration, app: app) { recorder.record($0) }
        }

        // A node that registers itself is refused with what to do instead, at once (no retrying forever).
        let selfRegistering = try node("self", key: nil, recorder: Recorder())
        do {
            try await selfRegistering.runWindow()
            Issue.record("a self-registering node joined a SuperLink with --enable-supernode-auth")
        } catch {
            #expect(error.code == .registrationRefused)
            #expect(error.message.contains("--auth-key") && error.message.contains("HTTP 412"), "\(error.message)")
        }

        // A key nobody registered: activation is refused until the patience runs out, then a clear error.
        let key = NodeIdentity()
        let unregistered = Recorder()
        do {
            try await node("unregistered", key: key, recorder: unregistered).runWindow()
            Issue.record("an unregistered key was activated")
        } catch {
            #expect(error.code == .registrationRefused)
            #expect(error.message.contains("flwr supernode register"), "\(error.message)")
        }
        #expect(!unregistered.all.contains { if case .registered = $0 { true } else { false } }, "a pre-registered node never registers itself")

        // The operator registers the key's public half (the line `orchard flower keygen` writes to KEY.pub).
        let publicKey = directory.appendingPathComponent("node.pub")
        try NodeKeyFile.openSSHPublicKey(key, comment: "orchard-test").write(to: publicKey, atomically: true, encoding: .utf8)
        try await link.register(publicKey: publicKey)
        let recorder = Recorder()
        let registered = try node("registered", key: key, recorder: recorder)
        let window = Task { try await registered.runWindow() }
        let result = try await link.run(config: ["num-server-rounds": "1", "min-nodes": "1"], output: directory.appendingPathComponent("result.json"))
        window.cancel()
        try await window.value
        await link.stop()
        let rounds = try #require(result["rounds"] as? [[String: Any]])
        let replies = try #require(rounds.first?["replies"] as? [[String: Any]])
        #expect(replies.count == 1)
        #expect(replies.first?["node_id"] as? String == recorder.nodeID.map(String.init), "the round's reply came from the registered node")
        #expect(recorder.trainAnswers.count == 1)
        #expect(!recorder.all.contains { if case .registered = $0 { true } else { false } })
        #expect(recorder.all.contains { if case .deactivated = $0 { true } else { false } })
    }
}

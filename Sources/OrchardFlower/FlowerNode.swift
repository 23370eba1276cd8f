public import Foundation
public import Logging

public import OrchardSupport
import SwiftProtobuf
import Synchronization

/// How a Flower node reaches its SuperLink and keeps its state.
public struct FlowerNodeConfiguration: Sendable {
    /// The SuperLink's Fleet API.
    public var superlink: SuperLinkAddress
    /// Where the node keeps its key, a fetched message and an unpushed reply across windows.
    public var stateDirectory: URL
    /// The heartbeat interval the node announces (Flower's default 30 s; sent in whole milliseconds); a heartbeat
    /// goes out every 0.8 × this while the node is active, as Flower's SuperNode sends them.
    public var heartbeatInterval: Duration
    /// The wait between `pull-messages` calls when none is offered.
    public var pollInterval: Duration
    /// How long a Fleet call may wait to connect and for each piece of data.
    public var timeout: Duration
    /// Where the node logs.
    public var logger: Logger
    /// The key the SuperLink's operator registered (`flwr supernode register`) for a SuperLink started with
    /// `--enable-supernode-auth`; the node then never registers or unregisters itself. `nil`: the node makes its own
    /// key (kept in the state directory) and registers it.
    public var authenticationKey: NodeIdentity?
    /// How long a node with an ``authenticationKey`` waits out refused activations before it concludes the
    /// SuperLink does not know its key (``FlowerError/Code/registrationRefused``); `nil`: 2 × the heartbeat interval
    /// + 5 s, the time an earlier activation of the node takes to lapse.
    public var activationPatience: Duration?
    /// The most objects one message may have before the node answers it with an error instead of fetching it (a
    /// 400 MB model is ~100 array chunks of 5 MiB).
    public var maximumMessageObjects = 100_000
    /// The most bytes one message's objects may hold together.
    public var maximumMessageBytes = 2 << 30

    /// Flower's heartbeat interval.
    public static let defaultHeartbeatInterval: Duration = .seconds(30)
    /// The default wait between pulls.
    public static let defaultPollInterval: Duration = .seconds(1)
    /// The default wait for a Fleet call.
    public static let defaultTimeout: Duration = .seconds(30)

    /// Creates a configuration.
    public init(
        superlink: SuperLinkAddress, stateDirectory: URL, heartbeatInterval: Duration = defaultHeartbeatInterval, pollInterval: Duration = defaultPollInterval,
        timeout: Duration = defaultTimeout,
        authenticationKey: NodeIdentity? = nil, logger: Logger = Logger(label: "orchard.flower")
    ) {
        self.superlink = superlink
        self.authenticationKey = authenticationKey
        self.stateDirectory = stateDirectory
        self.heartbeatInterval = heartbeatInterval
        self.pollInterval = pollInterval
        self.timeout = timeout
        self.logger = logger
    }
}

/// What a Flower node did, for status lines and tests.
public enum FlowerNodeEvent: Sendable {
    /// The SuperLink registered the node's key.
    case registered
    /// The node is active under this id.
    case activated(nodeID: UInt64)
    /// A message arrived (fetched and confirmed).
    case received(runID: UInt64, messageID: String, messageType: String)
    /// The local app answered a message: the arrays it sends back (train) and its metrics.
    case answered(messageID: String, messageType: String, arrays: [NamedArray], metrics: [String: Double])
    /// The node answers a message with an error reply (a bad message, a mismatch, a failed training).
    case answeredWithError(messageID: String, error: FlowerError)
    /// The reply to a message was pushed.
    case pushed(replyTo: String)
    /// The SuperLink refused a reply for good; it was dropped.
    case discarded(replyTo: String, error: FlowerError)
    /// A call failed; the node waits and retries.
    case retrying(FlowerError)
    /// The node deactivated at the end of the window.
    case deactivated
}

/// An Orchard device as a Flower SuperNode: in each background window it activates, pulls messages, answers `train`
/// and `evaluate` with the Orchard engine (``FlowerLocalApp``), pushes the replies, sends heartbeats, and deactivates
/// when the window ends. The round's logic is `FlowerNodeMachine`; this type performs its actions.
public actor FlowerNode {
    /// The configuration.
    public let configuration: FlowerNodeConfiguration
    private let app: FlowerLocalApp
    private let store: FlowerNodeStore
    private let client: FleetClient
    /// The heartbeats' client: a short timeout, so a hung call is retried long before the SuperLink's patience
    /// (2 × the heartbeat interval) runs out.
    private let heartbeatClient: FleetClient
    private let identity: NodeIdentity
    let clock: any WallClock
    private let onEvent: @Sendable (FlowerNodeEvent) -> Void

    /// Creates a node; its key is the configuration's authentication key, else read from (or made in) the state
    /// directory.
    /// - Throws: ``FlowerError`` `.invalidConfiguration` (TLS trust roots), `.storage` (state directory).
    public init(
        configuration: FlowerNodeConfiguration, app: FlowerLocalApp, clock: any WallClock = SystemClock(),
        onEvent: @escaping @Sendable (FlowerNodeEvent) -> Void = { _ in }
    ) throws(FlowerError) {
        self.configuration = configuration
        self.app = app
        self.clock = clock
        self.onEvent = onEvent
        store = try FlowerNodeStore(directory: configuration.stateDirectory)
        if let key = configuration.authenticationKey { identity = key } else { identity = try store.identity() }
        client = try FleetClient(address: configuration.superlink, identity: identity, timeout: configuration.timeout, clock: clock)
        heartbeatClient = try FleetClient(
            address: configuration.superlink, identity: identity, timeout: min(configuration.timeout, Self.heartbeatTimeout), clock: clock)
    }

    /// How long one heartbeat may take (Flower's own client allows 5 s).
    static let heartbeatTimeout: Duration = .seconds(5)

    /// Runs one window: until the task is cancelled (the window ended; a training in progress stops at a batch
    /// boundary and its message is kept for the next window), then deactivates.
    /// - Throws: ``FlowerError/Code/storage`` when the state directory fails, ``FlowerError/Code/registrationRefused``
    ///   when the SuperLink will not admit the node as configured; everything else is retried or answered.
    public func runWindow() async throws(FlowerError) {
        let superlink = configuration.superlink.description
        try store.dropAnsweredMessage()
        var machine = FlowerNodeMachine(
            registered: try store.isRegistered(with: superlink),
            keptMessage: try store.keptMessage().map { OfferedMessage(runID: $0.runID, messageID: $0.messageID, messageType: $0.messageType) },
            hasKeptReply: try store.keptReply() != nil,
            preRegistered: configuration.authenticationKey != nil,
            timing: .init(
                pollInterval: configuration.pollInterval,
                activationPatience: configuration.activationPatience ?? configuration.heartbeatInterval * 2 + .seconds(5)
            )
        )
        var heartbeat: Task<Void, Never>?
        defer { heartbeat?.cancel() }
        let forgotten = Mutex(false)
        var action = machine.next(after: .started)
        while true {
            if Task.isCancelled, action != .deactivate, action != .finish { action = machine.next(after: .windowEnding) }
            let event: FlowerNodeMachine.Event
            // A heartbeat the SuperLink answered `success = false` (it no longer knows the node): activated again, as
            // after a 401, before the next call (Flower's own client stops on it).
            let lost =
                action != .deactivate && action != .finish
                && forgotten.withLock { lost in
                    defer { lost = false }; return lost
                }
            switch action {
            case _ where lost:
                event = .failed(
                    FlowerError(.unauthorized, "the SuperLink no longer recognises node \(machine.nodeID.map(String.init) ?? "?") in its heartbeat"))
            case .finish:
                return
            case .stop(let error):
                configuration.logger.error("flower: the SuperLink does not admit the node", metadata: ["error": "\(error)"])
                throw error
            case .deactivate:
                heartbeat?.cancel()
                event = await deactivate(machine.nodeID)
            default:
                do throws(FlowerError) {
                    event = try await perform(action, machine: machine)
                } catch  where error.code == .storage {
                    throw error
                } catch {
                    if error.code == .cancelled {
                        configuration.logger.debug("flower: the window ended during \(action)")
                    } else {
                        onEvent(.retrying(error))
                        configuration.logger.warning("flower: \(action) failed", metadata: ["error": "\(error)"])
                    }
                    event = .failed(error)
                }
            }
            if case .registered = event { try store.setRegistered(true, with: superlink) }
            if case .failed(let error) = event, error.code == .unauthorized {
                try store.setRegistered(false, with: superlink)
                // The machine activates again: the old activation must not be kept alive by its heartbeats (the SuperLink
                // activates only a node that is offline), so they stop, and the old node is deactivated at once.
                if let heartbeating = heartbeat {
                    heartbeating.cancel()
                    heartbeat = nil
                    _ = await deactivate(machine.nodeID, announce: false)
                }
            }
            if case .activated(let id) = event {
                heartbeat?.cancel()
                heartbeat = startHeartbeats(nodeID: id) { forgotten.withLock { $0 = true } }
            }
            action = machine.next(after: event)
        }
    }

    /// Performs one action of the machine and returns what happened.
    private func perform(_ action: FlowerNodeMachine.Action, machine: FlowerNodeMachine) async throws(FlowerError) -> FlowerNodeMachine.Event {
        let node = Flwr_Proto_Node.with { $0.nodeID = machine.nodeID ?? 0 }
        switch action {
        case .register:
            _ = try await client.send(.registerNode, .with { $0.publicKey = identity.publicKeyPEM })
            onEvent(.registered)
            return .registered
        case .activate:
            let answer = try await client.send(
                .activateNode,
                .with {
                    $0.publicKey = identity.publicKeyPEM
                    $0.heartbeatInterval = configuration.heartbeatInterval.inSeconds
                })
            onEvent(.activated(nodeID: answer.nodeID))
            return .activated(nodeID: answer.nodeID)
        case .pull:
            let answer = try await client.send(.pullMessages, .with { $0.node = node })
            guard let message = answer.messagesList.first, let tree = answer.messageObjectTrees.first else { return .pulled(nil) }
            let offered = OfferedMessage(runID: message.metadata.runID, messageID: message.metadata.messageID, messageType: message.metadata.messageType)
            pending = (message, tree)
            return .pulled(offered)
        case .fetch(let offered):
            guard let (message, tree) = pending, message.metadata.messageID == offered.messageID else {
                return .fetchFailed(FlowerError(.missingObject, "message \(offered.messageID) is no longer at hand; pulling again"))
            }
            do {
                let kept = try await fetch(message, tree: tree, node: node)
                try store.keep(kept)
                pending = nil
                onEvent(.received(runID: offered.runID, messageID: offered.messageID, messageType: offered.messageType))
                return .fetched
            } catch  where [.superlinkUnreachable, .cancelled, .storage, .unauthorized].contains(error.code) || error.isTransient {
                throw error
            } catch {
                return .fetchFailed(error)
            }
        case .confirm(let offered):
            _ = try await client.send(
                .confirmReceived,
                .with {
                    $0.node = node
                    $0.runID = offered.runID
                    $0.messageObjectID = offered.messageID
                })
            return .confirmed
        case .handle:
            guard let kept = try store.keptMessage() else { return .handled }
            let reply = try await handle(kept)
            try store.keep(reply)
            try store.keep(Optional<FlowerNodeStore.KeptMessage>.none)
            return .handled
        case .replyWithError(let offered, let error):
            guard let (message, _) = pending else { return .handled }
            onEvent(.answeredWithError(messageID: offered.messageID, error: error))
            let reply = try FlowerContent.errorReply(to: message, error: error, now: clock.date)
            try store.keep(reply)
            pending = nil
            return .handled
        case .push:
            guard let reply = try store.keptReply() else { return .pushed }
            try await push(reply, node: node)
            try store.keep(Optional<FlowerNodeStore.KeptReply>.none)
            onEvent(.pushed(replyTo: reply.replyTo))
            return .pushed
        case .discardReply(let error):
            if let reply = try store.keptReply() { onEvent(.discarded(replyTo: reply.replyTo, error: error)) }
            try store.keep(Optional<FlowerNodeStore.KeptReply>.none)
            return .discarded
        case .wait(let duration):
            do { try await clock.sleep(for: duration) } catch { throw FlowerError(.cancelled, "the window ended while waiting") }
            return .waited
        case .deactivate, .finish, .stop:
            return .deactivated
        }
    }

    /// The message offered by the last pull, until its objects are fetched.
    private var pending: (Flwr_Proto_Message, Flwr_Proto_ObjectTree)?

    /// Pulls every object of the message's tree (retrying an object the SuperLink has not made available yet) and
    /// checks that they decode.
    private func fetch(_ message: Flwr_Proto_Message, tree: Flwr_Proto_ObjectTree, node: Flwr_Proto_Node) async throws(FlowerError)
        -> FlowerNodeStore.KeptMessage
    {
        let runID = message.metadata.runID
        var objects: [String: Data] = [:]
        let ids = FlowerContent.objectIDs(in: tree)
        guard ids.count <= configuration.maximumMessageObjects else {
            throw FlowerError(
                .invalidObject,
                "message \(message.metadata.messageID) has \(ids.count) objects, more than the \(configuration.maximumMessageObjects) a node fetches"
            )
        }
        var total = 0
        for id in ids where objects[id] == nil {
            var attempts = 0
            while true {
                let answer = try await client.send(
                    .pullObject,
                    .with {
                        $0.node = node
                        $0.runID = runID
                        $0.objectID = id
                    })
                guard answer.objectFound else {
                    throw FlowerError(.missingObject, "the SuperLink has no object \(id) of message \(message.metadata.messageID)")
                }
                if answer.objectAvailable {
                    total += answer.objectContent.count
                    guard total <= configuration.maximumMessageBytes else {
                        throw FlowerError(
                            .invalidObject,
                            "message \(message.metadata.messageID) holds more than the \(configuration.maximumMessageBytes) bytes a node fetches"
                        )
                    }
                    objects[id] = answer.objectContent
                    break
                }
                attempts += 1
                guard attempts < 50 else { throw FlowerError(.missingObject, "object \(id) of message \(message.metadata.messageID) stayed unavailable") }
                do { try await clock.sleep(for: .milliseconds(100)) } catch { throw FlowerError(.cancelled, "the window ended while fetching") }
            }
        }
        let kept = FlowerNodeStore.KeptMessage(
            runID: runID, messageID: message.metadata.messageID, messageType: message.metadata.messageType,
            message: try FlowerContent.serialize(message), objects: objects
        )
        _ = try FlowerContent.decode(kept)
        return kept
    }

    /// Runs a kept message through the app: the reply to keep (an error reply when the message is bad or the app fails).
    private func handle(_ kept: FlowerNodeStore.KeptMessage) async throws(FlowerError) -> FlowerNodeStore.KeptReply {
        let message: FlowerContent.Received
        do {
            message = try FlowerContent.decode(kept)
        } catch {
            onEvent(.answeredWithError(messageID: kept.messageID, error: error))
            return try FlowerContent.errorReply(to: kept, error: error, now: clock.date)
        }
        do {
            let answer = try FlowerContent.answer(message, app: app)
            onEvent(.answered(messageID: kept.messageID, messageType: kept.messageType, arrays: answer.arrays, metrics: answer.metrics))
            return try FlowerContent.reply(to: kept, message: message, answer: answer, now: clock.date)
        } catch  where error.code == .cancelled {
            throw error
        } catch {
            onEvent(.answeredWithError(messageID: kept.messageID, error: error))
            return try FlowerContent.errorReply(to: kept, error: error, now: clock.date)
        }
    }

    /// `push-messages` with the reply's metadata and tree, then `push-object` for each object the SuperLink asks
    /// for, children before parents.
    private func push(_ reply: FlowerNodeStore.KeptReply, node: Flwr_Proto_Node) async throws(FlowerError) {
        let message = try FlowerContent.parse(Flwr_Proto_Message.self, reply.message)
        let tree = try FlowerContent.parse(Flwr_Proto_ObjectTree.self, reply.tree)
        let answer = try await client.send(
            .pushMessages,
            .with {
                $0.node = node
                $0.messagesList = [message]
                $0.messageObjectTrees = [tree]
                $0.clientappRuntimeList = [0]
            })
        let wanted = Set(answer.objectsToPush)
        for id in reply.order where wanted.contains(id) {
            guard let content = reply.objects[id] else { throw FlowerError(.storage, "the kept reply lacks object \(id)") }
            let stored = try await client.send(
                .pushObject,
                .with {
                    $0.node = node
                    $0.runID = reply.runID
                    $0.objectID = id
                    $0.objectContent = content
                    $0.sessionID = answer.sessionID
                })
            // Not stored: the push session lapsed (the SuperLink then drops the reply). Pushed again from push-messages,
            // with a new session, after the machine's backoff; the reply stays kept meanwhile.
            guard stored.stored else {
                throw FlowerError(.missingObject, "the SuperLink did not store object \(id) of the reply to \(reply.replyTo): its push session lapsed")
            }
        }
    }

    /// `deactivate-node`, outside the window's cancellation (bounded by the client's timeout); `announce` reports it
    /// (the window's end does, a re-activation's does not).
    private func deactivate(_ nodeID: UInt64?, announce: Bool = true) async -> FlowerNodeMachine.Event {
        guard let nodeID else { return .deactivated }
        let client = self.client
        let logger = configuration.logger
        await Task.detached {
            do { _ = try await client.send(.deactivateNode, .with { $0.nodeID = nodeID }) } catch {
                logger.info("flower: deactivate-node failed; the SuperLink will expire the node", metadata: ["error": "\(error)"])
            }
        }.value
        if announce { onEvent(.deactivated) }
        return .deactivated
    }

    /// Sends heartbeats every 0.8 × the interval while the node is active; a failed one is tried again after 1, 2, 4 …
    /// seconds (at most 20, as Flower's client does), each bounded by ``heartbeatTimeout``, so one lost heartbeat does
    /// not let the SuperLink mark the node offline mid-training.
    private func startHeartbeats(nodeID: UInt64, onForgotten: @escaping @Sendable () -> Void) -> Task<Void, Never> {
        let client = self.heartbeatClient
        let clock = self.clock
        let interval = configuration.heartbeatInterval
        let logger = configuration.logger
        return Task {
            var failures = 0
            while !Task.isCancelled {
                let pause = failures == 0 ? interval * 0.8 : min(.seconds(20), interval * 0.8, .seconds(1 << min(failures - 1, 5)))
                do { try await clock.sleep(for: pause) } catch { return }
                do throws(FlowerError) {
                    let answer = try await client.send(
                        .heartbeat,
                        .with {
                            $0.node = .with { $0.nodeID = nodeID }
                            $0.heartbeatInterval = interval.inSeconds
                        })
                    if !answer.success {
                        logger.warning("flower: the SuperLink does not recognise node \(nodeID) in its heartbeat; activating again")
                        onForgotten()
                        return
                    }
                    failures = 0
                } catch {
                    if error.code == .cancelled { return }
                    failures += 1
                    logger.info("flower: heartbeat failed; trying again soon", metadata: ["error": "\(error)", "failures": "\(failures)"])
                }
            }
        }
    }
}

import OrchardSupport

/// A message the SuperLink offered in `pull-messages`: its run and id, and the object ids of its tree.
package struct OfferedMessage: Sendable, Hashable {
    /// The run the message belongs to.
    package var runID: UInt64
    /// The message's id (its object id).
    package var messageID: String
    /// `train`, `evaluate`, …
    package var messageType: String

    package init(runID: UInt64, messageID: String, messageType: String) {
        self.runID = runID
        self.messageID = messageID
        self.messageType = messageType
    }
}

/// The SuperNode's round as a state machine without I/O: events in (answers of the Fleet API, the window's end),
/// actions out (the next call to make). The driver (``FlowerNode``) performs each action and feeds back its result.
///
/// One message at a time, as Flower's SuperNode does: pull → fetch its objects → confirm receipt → handle (train or
/// evaluate; a bad message becomes an error reply) → push the reply → pull again. A message whose objects were
/// fetched is kept (the SuperLink deletes it once confirmed) and a reply is kept until pushed, so a
/// window that ends at any point loses neither: the next window handles the kept message or pushes the kept reply
/// (once) before it pulls again. Connection failures wait with exponential backoff and retry the same step; a 401
/// (the SuperLink no longer knows the node, e.g. it restarted) registers the node again.
///
/// A node whose key its operator registered (`flwr supernode register`, for a SuperLink started with
/// `--enable-supernode-auth`) never registers or unregisters itself: it activates, and a 401 activates again. A
/// SuperLink that refuses registration, or does not know a pre-registered key, ends the window with
/// ``FlowerError/Code/registrationRefused``: retrying cannot help until the operator acts.
package struct FlowerNodeMachine: Sendable {
    /// The next thing the driver does.
    package enum Action: Sendable, Hashable {
        /// `register-node` with the node's public key.
        case register
        /// `activate-node`.
        case activate
        /// `pull-messages`.
        case pull
        /// `pull-object` for every object of the message (and decode it).
        case fetch(OfferedMessage)
        /// `confirm-message-received`.
        case confirm(OfferedMessage)
        /// Run the kept message through the local app, producing the reply to keep.
        case handle
        /// Turn the failure to fetch a message into an error reply to keep.
        case replyWithError(OfferedMessage, FlowerError)
        /// `push-messages` and `push-object` for the kept reply.
        case push
        /// Delete the kept reply: the SuperLink refuses it for good (its run ended, its message expired).
        case discardReply(FlowerError)
        /// Sleep, then report ``Event/waited``.
        case wait(Duration)
        /// `deactivate-node` (the window is ending).
        case deactivate
        /// The window's work is done.
        case finish
        /// The window ends with this error: the SuperLink will not admit the node as configured.
        case stop(FlowerError)
    }

    /// What happened.
    package enum Event: Sendable, Hashable {
        /// A new window began.
        case started
        /// `register-node` succeeded.
        case registered
        /// `activate-node` answered the node id.
        case activated(nodeID: UInt64)
        /// `pull-messages` offered a message, or none.
        case pulled(OfferedMessage?)
        /// The message's objects are fetched, decoded and kept.
        case fetched
        /// A message's objects could not be fetched or decoded.
        case fetchFailed(FlowerError)
        /// Receipt confirmed.
        case confirmed
        /// The reply is made and kept.
        case handled
        /// The reply and its objects were pushed.
        case pushed
        /// The kept reply was deleted.
        case discarded
        /// The wait is over.
        case waited
        /// `deactivate-node` answered (or failed; the window ends anyway).
        case deactivated
        /// The background window is ending: stop at the next step.
        case windowEnding
        /// The step failed (connection, refusal, cancellation).
        case failed(FlowerError)
    }

    /// Timing.
    package struct Timing: Sendable, Hashable {
        /// The wait between pulls when no message is offered.
        package var pollInterval: Duration = .seconds(1)
        /// The first wait after a connection failure; doubles up to ``maximumBackoff``.
        package var initialBackoff: Duration = .seconds(1)
        /// The longest wait after failures.
        package var maximumBackoff: Duration = .seconds(30)
        /// How long a pre-registered node waits out refused activations before it concludes its key is unknown: a
        /// node's earlier activation lapses after 2 × its heartbeat interval (Flower's `HEARTBEAT_PATIENCE`).
        package var activationPatience: Duration = .seconds(65)

        package init(
            pollInterval: Duration = .seconds(1), initialBackoff: Duration = .seconds(1), maximumBackoff: Duration = .seconds(30),
            activationPatience: Duration = .seconds(65)
        ) {
            self.pollInterval = pollInterval
            self.initialBackoff = initialBackoff
            self.maximumBackoff = maximumBackoff
            self.activationPatience = activationPatience
        }
    }

    private enum Phase: Sendable, Hashable {
        case idle, registering, activating, pulling, fetching(OfferedMessage), confirming(OfferedMessage), handling, pushing
        indirect case waiting(then: Phase)
        case deactivating, finished
    }

    /// Whether the SuperLink knows the node's key (kept across windows).
    package private(set) var registered: Bool
    /// The fetched message waiting to be handled (kept across windows).
    package private(set) var keptMessage: OfferedMessage?
    /// Whether a fetched message waits to be handled.
    package var hasKeptMessage: Bool { keptMessage != nil }
    /// Whether a reply waits to be pushed (kept across windows).
    package private(set) var hasKeptReply: Bool
    /// The node id of this window's activation.
    package private(set) var nodeID: UInt64?
    /// Consecutive failures of the current step.
    package private(set) var failures = 0
    private var phase: Phase = .idle
    private var ending = false
    /// How long activation has been refused in a row (a pre-registered node gives up after the activation patience).
    private var refusedActivationWait: Duration = .zero
    private let timing: Timing
    /// Whether the SuperLink's operator registered the node's key (the node never registers itself).
    package let preRegistered: Bool

    /// A machine starting from what the node kept.
    package init(registered: Bool, keptMessage: OfferedMessage?, hasKeptReply: Bool, preRegistered: Bool = false, timing: Timing = Timing()) {
        self.registered = registered || preRegistered
        self.preRegistered = preRegistered
        self.keptMessage = keptMessage
        self.hasKeptReply = hasKeptReply
        self.timing = timing
    }

    /// Whether the window's work is done.
    package var isFinished: Bool { phase == .finished }

    /// The next action after `event`.
    package mutating func next(after event: Event) -> Action {
        switch event {
        case .started:
            return begin(registered ? .activating : .registering)
        case .registered:
            registered = true
            failures = 0
            return begin(.activating)
        case .activated(let id):
            nodeID = id
            failures = 0
            refusedActivationWait = .zero
            return afterActivation()
        case .pulled(let offered):
            failures = 0
            guard let offered else { return wait(timing.pollInterval, then: .pulling) }
            return begin(.fetching(offered))
        case .fetched:
            failures = 0
            guard case .fetching(let offered) = phase else { return unexpected() }
            keptMessage = offered
            return begin(.confirming(offered))
        case .fetchFailed(let error):
            guard case .fetching(let offered) = phase else { return unexpected() }
            failures = 0
            phase = .handling
            return .replyWithError(offered, error)
        case .confirmed:
            failures = 0
            return begin(.handling)
        case .handled:
            keptMessage = nil
            hasKeptReply = true
            return begin(.pushing)
        case .pushed, .discarded:
            failures = 0
            hasKeptReply = false
            return begin(.pulling)
        case .waited:
            guard case .waiting(let then) = phase else { return unexpected() }
            return begin(then)
        case .deactivated:
            nodeID = nil
            phase = .finished
            return .finish
        case .windowEnding:
            ending = true
            return endWindow()
        case .failed(let error):
            return failed(error)
        }
    }

    /// After activation: push a kept reply, else confirm and handle a kept message (the window that fetched it may
    /// have ended before its confirmation; confirming again is harmless), else pull.
    private mutating func afterActivation() -> Action {
        if hasKeptReply { return begin(.pushing) }
        if let keptMessage { return begin(.confirming(keptMessage)) }
        return begin(.pulling)
    }

    private mutating func begin(_ next: Phase) -> Action {
        if ending { return endWindow() }
        phase = next
        switch next {
        case .registering: return .register
        case .activating: return .activate
        case .pulling: return .pull
        case .fetching(let offered): return .fetch(offered)
        case .confirming(let offered): return .confirm(offered)
        case .handling: return .handle
        case .pushing: return .push
        case .waiting(let then): return wait(timing.pollInterval, then: then)
        case .idle: return .pull
        case .deactivating: return .deactivate
        case .finished: return .finish
        }
    }

    private mutating func wait(_ duration: Duration, then next: Phase) -> Action {
        if ending { return endWindow() }
        phase = .waiting(then: next)
        return .wait(duration)
    }

    private mutating func endWindow() -> Action {
        ending = true
        switch phase {
        case .finished: return .finish
        case .deactivating: return .deactivate
        default:
            if nodeID != nil {
                phase = .deactivating
                return .deactivate
            }
            phase = .finished
            return .finish
        }
    }

    private mutating func failed(_ error: FlowerError) -> Action {
        if phase == .deactivating {
            // The SuperLink will expire the node; the window ends either way.
            nodeID = nil
            phase = .finished
            return .finish
        }
        if error.code == .cancelled || ending { return endWindow() }
        // A 4xx refuses; a 408 or 429 (a proxy, a rate limit) is tried again like a 5xx.
        let refused = error.code == .superlinkRefused && error.httpStatus.map({ (400..<500).contains($0) }) == true && !error.isTransient
        switch phase {
        case .waiting(let then):
            return begin(then)
        case .pushing where refused:
            return .discardReply(error)
        case .registering where error.apiCode == FlowerAPICode.registrationDisabled:
            phase = .finished
            return .stop(
                FlowerError(
                    .registrationRefused,
                    "the SuperLink refuses to register the node (\(error.message)): it admits only SuperNodes its operator registered "
                        + "(flower-superlink --enable-supernode-auth). Make a key with `orchard flower keygen --output KEY`, have KEY.pub registered "
                        + "with `flwr supernode register KEY.pub`, and start the node with --auth-key KEY",
                    httpStatus: error.httpStatus, apiCode: error.apiCode
                ))
        case .registering where error.apiCode == FlowerAPICode.publicKeyInUse:
            // The SuperLink knows the key already (it kept the registration the node's own record lost): activate.
            registered = true
            failures += 1
            return failures > 3 ? wait(backoff(), then: .activating) : begin(.activating)
        case .activating where refused && error.apiCode == FlowerAPICode.activationFailed:
            // Either the SuperLink does not know the key, or the node's last activation has not lapsed yet (a window
            // that could not deactivate; it lapses after 2 × the heartbeat interval). Wait; a self-registered node
            // registers again (the SuperLink answers "already in use" if it knows the key).
            failures += 1
            let pause = backoff()
            if preRegistered {
                if refusedActivationWait + pause > timing.activationPatience {
                    phase = .finished
                    return .stop(
                        FlowerError(
                            .registrationRefused,
                            "the SuperLink refused to activate the node for \(refusedActivationWait) (\(error.message)): it does not know this node's "
                                + "key. Have the key's public half registered with `flwr supernode register KEY.pub`",
                            httpStatus: error.httpStatus, apiCode: error.apiCode
                        ))
                }
                refusedActivationWait += pause
                return wait(pause, then: .activating)
            }
            registered = false
            return wait(pause, then: .registering)
        case .activating where refused:
            // The SuperLink refuses the activation itself (e.g. a heartbeat interval out of its bounds).
            phase = .finished
            return .stop(error)
        default:
            break
        }
        failures += 1
        if error.code == .unauthorized {
            nodeID = nil
            if preRegistered {
                // The operator's registration stands; the node's activation lapsed (or the clock is off): activate again.
                return failures > 3 ? wait(backoff(), then: .activating) : begin(.activating)
            }
            // The SuperLink no longer recognises the node (restarted, or it expired the node): register again.
            registered = false
            if failures > 3 { return wait(backoff(), then: .registering) }
            return begin(.registering)
        }
        // Connection lost or refused: wait and retry the same step (a kept message or reply is not lost).
        let retry: Phase
        switch phase {
        case .idle, .waiting, .deactivating, .finished: retry = .pulling
        case .confirming where error.code == .superlinkRefused && error.httpStatus.map({ (400..<500).contains($0) }) == true:
            // The SuperLink refuses the confirmation (the run ended, the message expired): handle what was fetched.
            retry = .handling
        default: retry = phase
        }
        return wait(backoff(), then: retry)
    }

    /// The wait after the current run of failures: initial × 2^(failures−1), at most the maximum.
    private func backoff() -> Duration {
        var wait = timing.initialBackoff
        for _ in 1..<max(failures, 1) where wait < timing.maximumBackoff { wait *= 2 }
        return min(wait, timing.maximumBackoff)
    }

    private mutating func unexpected() -> Action {
        // An event that does not fit the phase (a driver bug): start the round over from pulling.
        begin(.pulling)
    }
}

@testable import OrchardFlower
import Testing

/// The node's round without I/O: which Fleet call follows which answer, what is kept across windows, and how
/// failures and the window's end are handled.
@Suite struct FlowerNodeMachineTests {
    typealias Machine = FlowerNodeMachine
    let offered = OfferedMessage(runID: 7, messageID: String(repeating: "a", count: 64), messageType: "train")
    let unreachable = FlowerError(.superlinkUnreachable, "connection refused")

    func active(registered: Bool = true, message: Bool = false, reply: Bool = false) -> Machine {
        var machine = Machine(registered: registered, keptMessage: message ? offered : nil, hasKeptReply: reply)
        _ = machine.next(after: .started)
        if !registered { _ = machine.next(after: .registered) }
        return machine
    }

    @Test func aFirstWindowRegistersActivatesPullsAndRunsARound() {
        var machine = Machine(registered: false, keptMessage: nil, hasKeptReply: false)
        #expect(machine.next(after: .started) == .register)
        #expect(machine.next(after: .registered) == .activate)
        #expect(machine.registered)
        #expect(machine.next(after: .activated(nodeID: 42)) == .pull)
        #expect(machine.nodeID == 42)
        #expect(machine.next(after: .pulled(nil)) == .wait(.seconds(1)))
        #expect(machine.next(after: .waited) == .pull)
        #expect(machine.next(after: .pulled(offered)) == .fetch(offered))
        #expect(machine.next(after: .fetched) == .confirm(offered))
        #expect(machine.hasKeptMessage)
        #expect(machine.next(after: .confirmed) == .handle)
        #expect(machine.next(after: .handled) == .push)
        #expect(!machine.hasKeptMessage && machine.hasKeptReply)
        #expect(machine.next(after: .pushed) == .pull)
        #expect(!machine.hasKeptReply)
    }

    @Test func aKnownNodeActivatesWithoutRegistering() {
        var machine = Machine(registered: true, keptMessage: nil, hasKeptReply: false)
        #expect(machine.next(after: .started) == .activate)
    }

    @Test func aKeptReplyIsPushedBeforeAnythingElse() {
        var machine = Machine(registered: true, keptMessage: offered, hasKeptReply: true)
        #expect(machine.next(after: .started) == .activate)
        #expect(machine.next(after: .activated(nodeID: 1)) == .push)
        #expect(machine.next(after: .pushed) == .pull)
    }

    @Test func aKeptMessageIsConfirmedAndHandledBeforePulling() {
        var machine = Machine(registered: true, keptMessage: offered, hasKeptReply: false)
        _ = machine.next(after: .started)
        #expect(machine.next(after: .activated(nodeID: 1)) == .confirm(offered))
        #expect(machine.next(after: .confirmed) == .handle)
        #expect(machine.next(after: .handled) == .push)
        #expect(machine.next(after: .pushed) == .pull)
    }

    @Test func aMessageThatCannotBeFetchedIsAnsweredWithAnError() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        _ = machine.next(after: .pulled(offered))
        let missing = FlowerError(.missingObject, "no object")
        #expect(machine.next(after: .fetchFailed(missing)) == .replyWithError(offered, missing))
        #expect(machine.next(after: .handled) == .push)
    }

    @Test func connectionFailuresRetryTheSameStepWithGrowingWaits() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        _ = machine.next(after: .pulled(offered))
        _ = machine.next(after: .fetched)
        _ = machine.next(after: .confirmed)
        #expect(machine.next(after: .handled) == .push)
        #expect(machine.next(after: .failed(unreachable)) == .wait(.seconds(1)))
        #expect(machine.next(after: .waited) == .push)
        #expect(machine.next(after: .failed(unreachable)) == .wait(.seconds(2)))
        #expect(machine.next(after: .waited) == .push)
        #expect(machine.next(after: .failed(unreachable)) == .wait(.seconds(4)))
        #expect(machine.hasKeptReply, "the reply is kept while the SuperLink is away")
        #expect(machine.next(after: .waited) == .push)
        #expect(machine.next(after: .pushed) == .pull)
        #expect(machine.failures == 0)
    }

    @Test func backoffStopsAtItsMaximum() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        var last = Machine.Action.pull
        for _ in 0..<12 {
            last = machine.next(after: .failed(unreachable))
            _ = machine.next(after: .waited)
        }
        #expect(last == .wait(.seconds(30)))
    }

    @Test func aRefusedReplyIsDiscardedNotRetriedForever() {
        var machine = active(reply: true)
        #expect(machine.next(after: .activated(nodeID: 1)) == .push)
        let refused = FlowerError(.superlinkRefused, "run finished", httpStatus: 400)
        #expect(machine.next(after: .failed(refused)) == .discardReply(refused))
        #expect(machine.next(after: .discarded) == .pull)
        #expect(!machine.hasKeptReply)
    }

    @Test func aServerErrorOnPushIsRetried() {
        var machine = active(reply: true)
        _ = machine.next(after: .activated(nodeID: 1))
        #expect(machine.next(after: .failed(FlowerError(.superlinkRefused, "busy", httpStatus: 503))) == .wait(.seconds(1)))
        #expect(machine.hasKeptReply)
    }

    /// A proxy's 408 or a 429 while pushing or fetching is tried again like a 5xx: the reply stays kept, the message is
    /// fetched again, and neither is given up as a refusal.
    @Test func aRateLimitOrTimeoutFromAProxyIsRetriedNotTakenForARefusal() {
        for status in [408, 429, 502, 503, 504] {
            let transient = FlowerError(.superlinkRefused, "busy", httpStatus: status)
            #expect(transient.isTransient)
            var pushing = active(reply: true)
            _ = pushing.next(after: .activated(nodeID: 1))
            #expect(pushing.next(after: .failed(transient)) == .wait(.seconds(1)), "push \(status)")
            #expect(pushing.hasKeptReply)
            var fetching = active()
            _ = fetching.next(after: .activated(nodeID: 1))
            #expect(fetching.next(after: .pulled(offered)) == .fetch(offered))
            #expect(fetching.next(after: .failed(transient)) == .wait(.seconds(1)), "fetch \(status)")
            #expect(fetching.next(after: .waited) == .fetch(offered))
        }
        #expect(!FlowerError(.superlinkRefused, "gone", httpStatus: 404).isTransient)
        #expect(!FlowerError(.superlinkUnreachable, "down").isTransient)
    }

    @Test func unauthorizedRegistersAgain() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        #expect(machine.next(after: .failed(FlowerError(.unauthorized, "unknown node"))) == .register)
        #expect(!machine.registered)
        #expect(machine.nodeID == nil)
        #expect(machine.next(after: .registered) == .activate)
    }

    @Test func theWindowEndingMidTrainingKeepsTheMessageAndDeactivates() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        _ = machine.next(after: .pulled(offered))
        _ = machine.next(after: .fetched)
        #expect(machine.next(after: .confirmed) == .handle)
        #expect(machine.next(after: .failed(FlowerError(.cancelled, "window ended"))) == .deactivate)
        #expect(machine.hasKeptMessage)
        #expect(machine.next(after: .deactivated) == .finish)
        #expect(machine.isFinished)
    }

    @Test func theWindowEndingWhileWaitingDeactivates() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        #expect(machine.next(after: .pulled(nil)) == .wait(.seconds(1)))
        #expect(machine.next(after: .windowEnding) == .deactivate)
        #expect(machine.next(after: .deactivated) == .finish)
    }

    @Test func theWindowEndingBeforeActivationFinishesWithoutDeactivating() {
        var machine = Machine(registered: true, keptMessage: nil, hasKeptReply: false)
        _ = machine.next(after: .started)
        #expect(machine.next(after: .windowEnding) == .finish)
    }

    @Test func aFailedDeactivationStillFinishes() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        #expect(machine.next(after: .windowEnding) == .deactivate)
        #expect(machine.next(after: .failed(unreachable)) == .finish)
    }

    @Test func aRefusedConfirmationStillHandlesTheFetchedMessage() {
        var machine = active()
        _ = machine.next(after: .activated(nodeID: 1))
        _ = machine.next(after: .pulled(offered))
        _ = machine.next(after: .fetched)
        #expect(machine.next(after: .failed(FlowerError(.superlinkRefused, "gone", httpStatus: 404))) == .wait(.seconds(1)))
        #expect(machine.next(after: .waited) == .handle)
    }

    // MARK: Registration and SuperNode authentication

    func refused(_ status: Int, _ apiCode: Int?) -> FlowerError {
        FlowerError(.superlinkRefused, "refused", httpStatus: status, apiCode: apiCode)
    }

    @Test func aSuperLinkThatAdmitsOnlyRegisteredNodesEndsTheWindowWithAClearError() {
        var machine = Machine(registered: false, keptMessage: nil, hasKeptReply: false)
        #expect(machine.next(after: .started) == .register)
        let action = machine.next(after: .failed(refused(412, FlowerAPICode.registrationDisabled)))
        guard case .stop(let error) = action else { Issue.record("expected stop, got \(action)"); return }
        #expect(error.code == .registrationRefused)
        #expect(error.message.contains("--auth-key") && error.message.contains("flwr supernode register"))
        #expect(machine.isFinished)
    }

    @Test func aKeyTheSuperLinkAlreadyKnowsActivates() {
        var machine = Machine(registered: false, keptMessage: nil, hasKeptReply: false)
        _ = machine.next(after: .started)
        #expect(machine.next(after: .failed(refused(412, FlowerAPICode.publicKeyInUse))) == .activate)
        #expect(machine.registered)
    }

    @Test func aSelfRegisteredNodeWhoseActivationIsRefusedWaitsAndRegistersAgain() {
        var machine = Machine(registered: true, keptMessage: nil, hasKeptReply: false)
        #expect(machine.next(after: .started) == .activate)
        #expect(machine.next(after: .failed(refused(412, FlowerAPICode.activationFailed))) == .wait(.seconds(1)))
        #expect(!machine.registered)
        #expect(machine.next(after: .waited) == .register)
        // Still active from a window that could not deactivate: the SuperLink knows the key; wait longer, activate.
        #expect(machine.next(after: .failed(refused(412, FlowerAPICode.publicKeyInUse))) == .activate)
        #expect(machine.next(after: .failed(refused(412, FlowerAPICode.activationFailed))) == .wait(.seconds(4)))
        #expect(machine.next(after: .waited) == .register)
        #expect(machine.next(after: .registered) == .activate)
        #expect(machine.next(after: .activated(nodeID: 9)) == .pull)
        #expect(machine.failures == 0)
    }

    @Test func aPreRegisteredNodeNeverRegistersItself() {
        var machine = Machine(registered: false, keptMessage: nil, hasKeptReply: false, preRegistered: true)
        #expect(machine.next(after: .started) == .activate)
        #expect(machine.next(after: .activated(nodeID: 5)) == .pull)
        // A 401 (the activation lapsed) activates again rather than registering.
        #expect(machine.next(after: .failed(FlowerError(.unauthorized, "invalid node id"))) == .activate)
        #expect(machine.nodeID == nil)
    }

    @Test func aPreRegisteredNodeWaitsOutALingeringActivationThenGivesUp() {
        let timing = Machine.Timing(activationPatience: .seconds(10))
        var machine = Machine(registered: false, keptMessage: nil, hasKeptReply: false, preRegistered: true, timing: timing)
        _ = machine.next(after: .started)
        var waited: [Duration] = []
        while true {
            let action = machine.next(after: .failed(refused(412, FlowerAPICode.activationFailed)))
            if case .wait(let duration) = action {
                waited.append(duration)
                #expect(machine.next(after: .waited) == .activate)
                continue
            }
            guard case .stop(let error) = action else { Issue.record("expected stop, got \(action)"); return }
            #expect(error.code == .registrationRefused && error.message.contains("flwr supernode register"))
            break
        }
        #expect(waited == [.seconds(1), .seconds(2), .seconds(4)], "1 + 2 + 4 s within the 10 s patience; the next 8 s would exceed it")
    }

    @Test func aLingeringActivationThatLapsesWithinThePatienceActivates() {
        var machine = Machine(registered: false, keptMessage: nil, hasKeptReply: false, preRegistered: true, timing: .init(activationPatience: .seconds(10)))
        _ = machine.next(after: .started)
        #expect(machine.next(after: .failed(refused(412, FlowerAPICode.activationFailed))) == .wait(.seconds(1)))
        #expect(machine.next(after: .waited) == .activate)
        #expect(machine.next(after: .activated(nodeID: 3)) == .pull)
    }

    @Test func anActivationRefusedForAnotherReasonStops() {
        var machine = Machine(registered: true, keptMessage: nil, hasKeptReply: false)
        _ = machine.next(after: .started)
        let error = refused(400, 2003)
        #expect(machine.next(after: .failed(error)) == .stop(error))
    }
}

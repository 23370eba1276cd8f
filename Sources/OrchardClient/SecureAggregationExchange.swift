import Foundation
public import OrchardFormats
public import OrchardPrivacy
public import OrchardProtocol
import OrchardSupport

/// How long a device keeps waiting for the other devices of a secure-aggregation cycle before it gives up (outcome
/// ``CycleOutcome/rejected(retryAfter:reason:)`` with reason `secure_aggregation_timeout`).
///
/// The limit is the assignment's `report_within` (the first stage, advertise_keys, closes at the cycle's deadline at
/// the latest) plus ``margin`` (room for the three later stages, each open at most the process's `stage_timeout`),
/// and at most ``maximum`` when set. It counts the time spent waiting between polls and in backoffs, not the time
/// spent in calls.
public struct SecureAggregationWaitLimit: Sendable, Hashable {
    /// Seconds added to the assignment's `report_within`.
    public var margin: Double
    /// The longest wait in seconds whatever the assignment says, or nil for no cap.
    public var maximum: Double?

    /// The default ``margin``: the coordinator's default `stage_timeout` for each of the three stages after
    /// advertise_keys, plus a minute.
    public static let defaultMargin: Double = 3 * SecureAggregationConfig.defaultStageTimeout + 60

    /// Creates a limit.
    public init(margin: Double = Self.defaultMargin, maximum: Double? = nil) {
        self.margin = margin
        self.maximum = maximum
    }

    /// The limit in seconds for an assignment that gave `reportWithin` seconds, in a process whose stages stay open
    /// `stageTimeout` seconds at most (when its plan says so): the margin is then at least `laterStages` (three, four
    /// with consistency_check) stage timeouts plus a minute, so a process with long stages is not given up on early.
    public func seconds(reportWithin: Double, stageTimeout: Double? = nil, laterStages: Int = 3) -> Double {
        var margin = self.margin.isFinite ? self.margin : 0
        if let stageTimeout, stageTimeout.isFinite, stageTimeout > 0 { margin = max(margin, Double(max(laterStages, 0)) * stageTimeout + 60) }
        let derived = max(reportWithin.isFinite ? reportWithin : 0, 0) + max(margin, 0)
        guard let maximum else { return derived }
        return max(min(derived, maximum), 0)
    }
}

/// The device's side of a cycle's secure aggregation as a pure state machine: it performs no I/O, reads no clock and
/// draws randomness only from the generators passed in. The driver (``FederatedJob``, or an app's own) sends each
/// ``Action/send(_:)`` request through ``ClientTransport/secureAggregation(_:session:)`` and feeds the reply to
/// ``replied(_:using:)`` or the failure to ``requestFailed(_:random:)``, and sleeps through each
/// ``Action/wait(seconds:)`` and ``Action/backoff(retry:seconds:error:)`` before calling ``waitElapsed()``.
///
/// The exchange: advertise the two public keys (the coordinator answers with the device's index), then follow each
/// reply's `next`: poll after `retry_after` seconds, send share_keys for the roster, the masked update for the
/// delivery, the revealed shares for the unmask request, until `done`.
///
/// - `done` → reported once the masked input went out; otherwise rejected, reason `secure_aggregation_abandoned`
///   (the reply's stage is `abandoned`) or `secure_aggregation_excluded` (the device's part ended before it).
/// - `duplicate_message` (a repeated message whose first answer was lost) → poll instead.
/// - `dropped_device`, `stage_closed` → the device is out of this cycle: outcome rejected, the code as the reason
///   (except `stage_closed` for a message sent again after a transient failure: the first attempt may have arrived in
///   time, so the device polls to learn where it stands).
/// - Transient failures (network, 5xx, 429) → the same request again after a backoff, per the retry policy.
/// - A coordinator message the device refuses (a roster without the device's own keys, a bundle that does not
///   authenticate, an unmask request that would reveal both shares of a peer, …) → failed; nothing more is sent.
/// - Waiting longer than the limit in all → outcome rejected, reason `secure_aggregation_timeout`.
///
/// The device's secrets (two private keys, the self-mask seed, the shares it holds) live only in this value; it is
/// not `Codable`, so they are never written anywhere.
public struct SecureAggregationExchange: Sendable {
    /// What the driver does next.
    public enum Action: Sendable, Hashable {
        /// Send the request and answer with ``replied(_:using:)`` or ``requestFailed(_:random:)``.
        case send(SecureAggregationRequest)
        /// Sleep `seconds` (the coordinator's `retry_after`), then call ``waitElapsed()``.
        case wait(seconds: Double)
        /// The last call failed transiently: sleep `seconds`, then call ``waitElapsed()`` to repeat it.
        case backoff(retry: Int, seconds: Double, error: OrchardClientError)
        /// The device's part in the cycle is over.
        case finished(CycleOutcome)
        /// The exchange failed; nothing more is sent.
        case failed(OrchardClientError)
    }

    /// The wait before a poll when a `wait` reply carries no `retry_after`.
    public static let defaultPollInterval: Double = 1
    /// The shortest wait before a poll (a `retry_after` of 0 does not make the device spin).
    public static let minimumPollInterval: Double = 0.1
    /// The `retry_after` of a rejected outcome when the coordinator gave none: about one stage.
    public static let defaultRejectionRetryAfter: Double = SecureAggregationConfig.defaultStageTimeout

    /// Where the exchange is.
    private enum Phase: Sendable, Hashable {
        case ready, calling, waiting, done
    }

    /// The process's secure-aggregation parameters.
    public let plan: SecureAggregationPlan
    /// The process's id (part of the context string).
    public let processID: String
    /// The cycle.
    public let cycle: Int
    /// The worker.
    public let workerID: String
    /// The request key of the worker's assignment in the cycle.
    public let requestKey: String
    /// The retry policy for transient failures.
    public let retry: RequestRetryPolicy
    /// The most seconds the exchange waits in all (polls and backoffs).
    public let waitLimit: Double
    /// Seconds waited so far (polls and backoffs).
    public private(set) var waited: Double = 0

    private let update: [Float]
    private let sampleCount: Int
    private let publicKeys: SecureAggregationPublicKeys
    private let identity: SecureAggregationIdentity?
    private let trust: SecureAggregationTrust?
    /// The secrets until the coordinator assigns the index; then the device holds them.
    private var secrets: SecureAggregationSecrets?
    private var device: SecureAggregationDevice?
    private var phase: Phase = .ready
    /// The request of the current call (sent again after a backoff) or the one to send after a wait.
    private var pending: SecureAggregationRequest
    /// The attempt number of the current call, from 1.
    private var attempt = 1
    /// Whether the request after the current wait starts a fresh call (a poll) or repeats one (a backoff).
    private var freshAfterWait = true
    /// The last `retry_after` the coordinator gave.
    private var lastRetryAfter: Double?
    /// The terminal action, once reached.
    private var terminal: Action?

    /// Prepares the exchange for an update: draws the device's secrets from `generator` (cryptographically secure
    /// outside tests and simulations).
    /// - Parameters:
    ///   - plan: The plan's `TrainingPlan.secureAggregation`.
    ///   - processID: The assignment's process id.
    ///   - cycle: The assignment's cycle.
    ///   - workerID: The worker.
    ///   - requestKey: The assignment's request key.
    ///   - update: The update flattened by ``flatten(_:)``.
    ///   - sampleCount: The update's weight, 1…`plan.maximumSampleCount`.
    ///   - retry: Retries of transient failures.
    ///   - waitLimit: The most seconds to wait in all (``SecureAggregationWaitLimit/seconds(reportWithin:stageTimeout:laterStages:)``).
    ///   - identity: The device's certified identity; required by a plan with `consistency_check`, which signs the
    ///     advertised keys and the survivors with it.
    ///   - trust: The authorities the device accepts; with it, the device requires `consistency_check` and checks every
    ///     peer's certificate.
    ///   - generator: The source of the device's secrets (cryptographically secure outside tests and simulations).
    /// - Throws: ``OrchardClientError/Code/training`` for an empty or non-finite update or a sample count outside
    ///   1…`plan.maximumSampleCount`; ``OrchardClientError/Code/incompatibleModel`` for a plan whose maximum sample
    ///   count is below 1; ``OrchardClientError/Code/invalidConfiguration`` for a plan with `consistency_check` and no
    ///   identity, or a device with `trust` offered a plan without it (a coordinator that turned the check off).
    ///   Nothing is sent then.
    public init(
        plan: SecureAggregationPlan, processID: String, cycle: Int, workerID: String, requestKey: String, update: [Float], sampleCount: Int,
        retry: RequestRetryPolicy = RequestRetryPolicy(), waitLimit: Double, identity: SecureAggregationIdentity? = nil, trust: SecureAggregationTrust? = nil,
        using generator: inout some RandomNumberGenerator
    ) throws(OrchardClientError) {
        if let failure = Self.validationFailure(plan: plan, update: update, sampleCount: sampleCount) { throw failure }
        if plan.parameters.consistencyCheck && identity == nil {
            throw OrchardClientError(
                .invalidConfiguration, "this process's secure aggregation signs every step (consistency_check); give the client a secureAggregationIdentity")
        }
        if trust != nil && !plan.parameters.consistencyCheck {
            throw OrchardClientError(
                .invalidConfiguration,
                "this device takes part only in signed secure aggregation (it holds secureAggregationAuthorities), and the plan has no consistency_check")
        }
        let secrets = SecureAggregationSecrets(using: &generator)
        let keys: (channel: Data, mask: Data)
        var signed: SecureAggregationAdvertisementSignature?
        do {
            keys = try secrets.publicKeys()
            signed = try identity?.advertisementSignature(
                context: SecureAggregationPlan.context(processID: processID, cycle: cycle), channelPublicKey: keys.channel, maskPublicKey: keys.mask)
        } catch {
            throw OrchardClientError(.invalidConfiguration, "cannot derive or sign the secure-aggregation public keys: \(error.message)")
        }
        self.identity = identity
        self.trust = trust
        self.plan = plan
        self.processID = processID
        self.cycle = cycle
        self.workerID = workerID
        self.requestKey = requestKey
        self.retry = retry
        self.waitLimit = waitLimit.isNaN ? 0 : max(waitLimit, 0)
        self.update = update
        self.sampleCount = sampleCount
        self.secrets = secrets
        publicKeys = SecureAggregationPublicKeys(channelPublicKey: keys.channel, maskPublicKey: keys.mask, signed: signed)
        pending = SecureAggregationRequest(workerID: workerID, requestKey: requestKey, advertiseKeys: publicKeys)
    }

    /// The device's index in the cycle, once the coordinator assigned it.
    public var deviceIndex: Int? { device?.index }

    /// Whether the exchange reached ``Action/finished(_:)`` or ``Action/failed(_:)``.
    public var isOver: Bool { terminal != nil }

    // MARK: Events

    /// The first action: advertise the device's public keys.
    /// The device's masks summed while it waited, if the driver computed them (``maskPlan``).
    private var precomputedMask: SecureAggregationPrecomputedMask?

    /// Once share_keys is sent, the seeds of the device's masks, for the driver to expand while it waits (the masked
    /// input then only adds them); nil before, and after the masked input.
    public var maskPlan: SecureAggregationMaskPlan? {
        guard let device, device.stage == .maskedInput else { return nil }
        return try? device.maskPlan()
    }

    /// Hands over the masks computed from ``maskPlan``; they are used for the masked input if they still fit.
    public mutating func provide(_ mask: SecureAggregationPrecomputedMask) {
        precomputedMask = mask
    }

    public mutating func start() -> Action {
        if let terminal { return terminal }
        precondition(phase == .ready, "secure aggregation exchange: start() called twice")
        return send(SecureAggregationRequest(workerID: workerID, requestKey: requestKey, advertiseKeys: publicKeys), fresh: true)
    }

    /// The coordinator answered the last request; `generator` draws the shares' polynomials, the AEAD nonces and the
    /// stochastic rounding of the update (cryptographically secure outside tests and simulations).
    public mutating func replied(_ reply: SecureAggregationReply, using generator: inout some RandomNumberGenerator) -> Action {
        if let terminal { return terminal }
        precondition(phase == .calling, "secure aggregation exchange: a reply arrived with no request out")
        guard reply.cycle == cycle else {
            return fail(Self.invalidReply("is for cycle \(reply.cycle), not the assignment's cycle \(cycle)"))
        }
        if let device {
            guard reply.device == device.index else {
                return fail(Self.invalidReply("names device \(reply.device), but the coordinator assigned this device index \(device.index)"))
            }
        } else if let secrets {
            guard reply.device >= 1 else { return fail(Self.invalidReply("assigns device index \(reply.device); indices start at 1")) }
            do throws(SecureAggregationError) {
                var created = try SecureAggregationDevice(
                    index: reply.device, configuration: plan.parameters, context: SecureAggregationPlan.context(processID: processID, cycle: cycle),
                    maximumSampleCount: plan.maximumSampleCount, modelLength: update.count, secrets: secrets, identity: identity, trust: trust
                )
                _ = try created.advertiseKeys()
                device = created
                self.secrets = nil
            } catch {
                return fail(Self.refused(error, at: "advertise_keys"))
            }
        }
        guard var device else { preconditionFailure("secure aggregation exchange: no device after a reply") }
        defer { self.device = device }
        switch reply.next {
        case .wait:
            lastRetryAfter = reply.retryAfter
            let seconds = reply.retryAfter.flatMap { $0.isFinite ? $0 : nil } ?? Self.defaultPollInterval
            return wait(max(seconds, Self.minimumPollInterval), then: poll, fresh: true, retry: nil)
        case .shareKeys:
            guard let roster = reply.roster else { return fail(Self.invalidReply("asks for share_keys but carries no roster")) }
            do throws(SecureAggregationError) {
                let message = try device.shareKeys(roster, using: &generator)
                return send(SecureAggregationRequest(workerID: workerID, requestKey: requestKey, shareKeys: message), fresh: true)
            } catch {
                return fail(Self.refused(error, at: "share_keys"))
            }
        case .maskedInput:
            guard let delivery = reply.delivery else { return fail(Self.invalidReply("asks for masked_input but carries no delivery")) }
            do throws(SecureAggregationError) {
                let message = try device.maskedInput(delivery, update: update, sampleCount: sampleCount, precomputed: precomputedMask, using: &generator)
                precomputedMask = nil
                var request = SecureAggregationRequest(workerID: workerID, requestKey: requestKey, maskedInput: message)
                // Binary when the coordinator offers it (2.4 on), base64 JSON to an older one.
                request.maskedInputFormat = reply.maskedInputFormat ?? .json
                return send(request, fresh: true)
            } catch {
                return fail(Self.refused(error, at: "masked_input"))
            }
        case .consistencyCheck:
            guard let request = reply.consistencyRequest else {
                return fail(Self.invalidReply("asks for consistency_check but carries no consistency request"))
            }
            do throws(SecureAggregationError) {
                let message = try device.consistencyCheck(request)
                return send(SecureAggregationRequest(workerID: workerID, requestKey: requestKey, consistencyCheck: message), fresh: true)
            } catch {
                return fail(Self.refused(error, at: "consistency_check"))
            }
        case .unmask:
            guard let request = reply.unmaskRequest else { return fail(Self.invalidReply("asks for unmask but carries no unmask request")) }
            do throws(SecureAggregationError) {
                let message = try device.unmask(request)
                return send(SecureAggregationRequest(workerID: workerID, requestKey: requestKey, unmask: message), fresh: true)
            } catch {
                return fail(Self.refused(error, at: "unmask"))
            }
        case .done:
            if reply.stage == .abandoned {
                return finish(.rejected(retryAfter: lastRetryAfter ?? Self.defaultRejectionRetryAfter, reason: "secure_aggregation_abandoned"))
            }
            guard device.stage == .unmask || device.stage == .consistencyCheck else {
                // The device's part ended before its masked input went out: its update is not in the sum.
                return finish(.rejected(retryAfter: lastRetryAfter ?? Self.defaultRejectionRetryAfter, reason: "secure_aggregation_excluded"))
            }
            return finish(.reported(ReportReceipt(cycle: cycle, reportsReceived: nil, retryAfter: nil, fromEarlierWindow: false)))
        }
    }

    /// The last request failed with `error`; `random` is a uniform number in 0..<1 for the backoff's jitter.
    public mutating func requestFailed(_ error: OrchardClientError, random: Double) -> Action {
        if let terminal { return terminal }
        precondition(phase == .calling, "secure aggregation exchange: a failure arrived with no request out")
        if error.code == .cancelled { return fail(error) }
        switch error.serverCode {
        case .duplicateMessage?:
            // The message arrived before (its answer was lost): ask where the device stands instead.
            return send(poll, fresh: true)
        case .stageClosed? where attempt > 1 && pending.messageCount > 0:
            // A repeated message (its first attempt may have arrived before its stage closed): ask whether the device
            // is still in rather than assume it is out.
            return send(poll, fresh: true)
        case .droppedDevice?, .stageClosed?:
            let code = error.serverCode?.rawValue ?? "stage_closed"
            return finish(.rejected(retryAfter: error.retryAfter ?? lastRetryAfter ?? Self.defaultRejectionRetryAfter, reason: code))
        default:
            break
        }
        if error.isTransient && attempt < retry.maximumAttempts {
            let number = attempt
            attempt += 1
            let seconds = error.retryAfter.flatMap { $0.isFinite ? max($0, 0) : nil } ?? retry.delay(beforeRetry: number, random: random).inSeconds
            return wait(seconds, then: pending, fresh: false, retry: (number, error))
        }
        return fail(error)
    }

    /// The last ``Action/wait(seconds:)`` or ``Action/backoff(retry:seconds:error:)`` elapsed.
    public mutating func waitElapsed() -> Action {
        if let terminal { return terminal }
        precondition(phase == .waiting, "secure aggregation exchange: a wait ended with none begun")
        return send(pending, fresh: freshAfterWait)
    }

    // MARK: Steps

    /// A request with no message: what should the device do next?
    private var poll: SecureAggregationRequest { SecureAggregationRequest(workerID: workerID, requestKey: requestKey) }

    private mutating func send(_ request: SecureAggregationRequest, fresh: Bool) -> Action {
        if fresh { attempt = 1 }
        pending = request
        phase = .calling
        return .send(request)
    }

    /// Waits `seconds` (cut to what the limit has left) before `request`; gives up once the limit is spent.
    private mutating func wait(_ seconds: Double, then request: SecureAggregationRequest, fresh: Bool, retry: (number: Int, error: OrchardClientError)?)
        -> Action
    {
        let remaining = waitLimit - waited
        guard remaining > 0 else {
            return finish(.rejected(retryAfter: lastRetryAfter ?? Self.defaultRejectionRetryAfter, reason: "secure_aggregation_timeout"))
        }
        let wait = min(seconds, remaining)
        waited += wait
        pending = request
        freshAfterWait = fresh
        phase = .waiting
        if let retry { return .backoff(retry: retry.number, seconds: wait, error: retry.error) }
        return .wait(seconds: wait)
    }

    private mutating func finish(_ outcome: CycleOutcome) -> Action {
        phase = .done
        terminal = .finished(outcome)
        return .finished(outcome)
    }

    private mutating func fail(_ error: OrchardClientError) -> Action {
        phase = .done
        terminal = .failed(error)
        return .failed(error)
    }

    // MARK: Pure helpers

    /// The update in the flat order device and coordinator share (`FlatOrder`): every tensor, frozen layers'
    /// included, by name, end to end.
    public static func flatten(_ tensors: [TensorRecord]) -> [Float] {
        FlatOrder.flatten(tensors)
    }

    /// Why an update cannot go through secure aggregation under `plan`, or nil.
    static func validationFailure(plan: SecureAggregationPlan, update: [Float], sampleCount: Int) -> OrchardClientError? {
        guard plan.maximumSampleCount >= 1 else {
            return OrchardClientError(
                .incompatibleModel, "the plan's secure aggregation admits a maximum sample count of \(plan.maximumSampleCount); it must be at least 1")
        }
        guard sampleCount >= 1, sampleCount <= plan.maximumSampleCount else {
            return OrchardClientError(
                .training,
                "the update's sample count \(sampleCount) is outside 1...\(plan.maximumSampleCount), the range the process's secure aggregation admits; nothing was sent"
            )
        }
        guard !update.isEmpty else { return OrchardClientError(.training, "the update is empty; secure aggregation needs at least one value") }
        guard FloatScan.allFinite(update) else { return OrchardClientError(.training, "the update holds NaN or infinity; it cannot be masked") }
        return nil
    }

    /// The error for a reply that does not fit the protocol.
    static func invalidReply(_ problem: String) -> OrchardClientError {
        OrchardClientError(.serverError, "the coordinator's secure-aggregation reply \(problem); nothing more is sent in this cycle")
    }

    /// The error for a coordinator message the device's protocol core refused at `step`.
    static func refused(_ error: SecureAggregationError, at step: String) -> OrchardClientError {
        if error.code == .invalidInput {
            return OrchardClientError(.training, "the update cannot take part in secure aggregation (\(step)): \(error.message)")
        }
        return OrchardClientError(
            .serverError,
            "secure aggregation stopped at \(step): the device refused the coordinator's message (\(error.code): \(error.message)); nothing more is sent in this cycle"
        )
    }
}

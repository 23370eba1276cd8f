public import OrchardFormats
public import OrchardProtocol
import OrchardScheduler
import Synchronization

/// The handlers registered through the SwiftSyft-style API.
struct Callbacks: Sendable {
    var onReady: (@Sendable (CycleModel, TrainingPlan, ClientConfig, ReportHandle) -> Void)?
    var onError: (@Sendable (OrchardClientError) -> Void)?
    var onRejected: (@Sendable (Double) -> Void)?
    var onReported: (@Sendable (ReportReceipt) -> Void)?
}

/// Sends the update of a cycle started with ``FederatedJob/start(requiresCharging:requiresUnmeteredNetwork:)``;
/// call it once from the `onReady` handler.
public struct ReportHandle: Sendable {
    let slot: OneShot<LocalUpdate>

    /// Reports the diff (`trained − received`) trained on `sampleCount` samples. Returns false (and sends
    /// nothing) when the cycle already has its update or was cancelled.
    @discardableResult
    public func callAsFunction(_ diff: [TensorRecord], sampleCount: Int, metrics: [String: Double] = [:]) -> Bool {
        slot.fulfill(LocalUpdate(diff: diff, sampleCount: sampleCount, metrics: metrics))
    }
}

extension FederatedJob {
    /// Called once per started cycle when the model and plan are ready: train, then call `report` once.
    public func onReady(
        _ handler: @escaping @Sendable (_ model: CycleModel, _ plan: TrainingPlan, _ clientConfig: ClientConfig, _ report: ReportHandle) -> Void
    ) {
        callbacks.withLock { $0.onReady = handler }
    }

    /// Called once when a started cycle fails (including unmet conditions, code ``OrchardClientError/Code/conditionsNotMet``).
    public func onError(_ handler: @escaping @Sendable (OrchardClientError) -> Void) {
        callbacks.withLock { $0.onError = handler }
    }

    /// Called once when the coordinator turns the device away, with the seconds to wait before trying again.
    public func onRejected(_ handler: @escaping @Sendable (_ retryAfter: Double) -> Void) {
        callbacks.withLock { $0.onRejected = handler }
    }

    /// Called once when the cycle's report was accepted.
    public func onReported(_ handler: @escaping @Sendable (ReportReceipt) -> Void) {
        callbacks.withLock { $0.onReported = handler }
    }

    /// Starts one cycle in a new task and reports through the registered handlers: exactly one of `onReported`,
    /// `onRejected` or `onError` fires, after `onReady` when the cycle got that far.
    /// - Parameters:
    ///   - requiresCharging: Run only on external power (a full battery on the charger counts).
    ///   - requiresUnmeteredNetwork: Run only on an unmetered network (Wi-Fi or Ethernet).
    /// - Returns: The task; cancelling it stops the cycle (and reports `cancelled` through `onError`).
    @discardableResult
    public func start(requiresCharging: Bool = true, requiresUnmeteredNetwork: Bool = true) -> Task<Void, Never> {
        let constraints = TaskConstraints(
            requiresExternalPower: requiresCharging, requiresNetworkConnectivity: true, requiresUnmeteredNetwork: requiresUnmeteredNetwork
        )
        let handlers = callbacks.withLock { $0 }
        return Task {
            do throws(OrchardClientError) {
                let outcome = try await run(constraints: constraints) { context in
                    let slot = OneShot<LocalUpdate>()
                    guard let onReady = handlers.onReady else {
                        throw OrchardClientError(.invalidConfiguration, "register an onReady handler before start()")
                    }
                    onReady(context.model, context.plan, context.clientConfig, ReportHandle(slot: slot))
                    return try await slot.value()
                }
                switch outcome {
                case .reported(let receipt): handlers.onReported?(receipt)
                case .rejected(let retryAfter, _): handlers.onRejected?(retryAfter)
                case .conditionsNotMet(let unmet):
                    handlers.onError?(OrchardClientError(.conditionsNotMet, "device conditions not met: \(unmet.joined(separator: ", "))"))
                case .evaluated:
                    // `run` takes training only.
                    break
                }
            } catch {
                handlers.onError?(error)
            }
        }
    }
}

/// A value delivered once, awaited once; cancellation of the waiting task ends the wait.
final class OneShot<Value: Sendable>: Sendable {
    private enum State {
        case empty
        case waiting(CheckedContinuation<Value, any Error>)
        case filled(Value)
        case closed
    }
    private let state = Mutex(State.empty)

    /// Delivers the value; false when one was already delivered or the wait was cancelled.
    func fulfill(_ value: Value) -> Bool {
        let (accepted, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Value, any Error>?) in
            switch state {
            case .empty:
                state = .filled(value)
                return (true, nil)
            case .waiting(let continuation):
                state = .closed
                return (true, continuation)
            case .filled, .closed:
                return (false, nil)
            }
        }
        waiter?.resume(returning: value)
        return accepted
    }

    /// Waits for the value.
    func value() async throws -> Value {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
                let ready = state.withLock { state -> Result<Value, any Error>? in
                    switch state {
                    case .filled(let value):
                        state = .closed
                        return .success(value)
                    case .empty:
                        if Task.isCancelled {
                            state = .closed
                            return .failure(cancelledError())
                        }
                        state = .waiting(continuation)
                        return nil
                    case .waiting, .closed:
                        return .failure(cancelledError())
                    }
                }
                if let ready { continuation.resume(with: ready) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Value, any Error>? in
                if case .waiting(let continuation) = state {
                    state = .closed
                    return continuation
                }
                if case .empty = state { state = .closed }
                return nil
            }
            waiter?.resume(throwing: cancelledError())
        }
    }
}

public import Dispatch

/// Runs a long synchronous computation (training, evaluation, expanding secure-aggregation masks) on a Dispatch worker
/// thread of `qos` and waits for it, so that it does not hold one of the Swift cooperative pool's threads (there are
/// only as many as cores) while other tasks' short steps — network answers, timers, a device's next call — wait
/// behind it. The computation runs to its end once started; cancelling the waiting task does not stop it.
public func offCooperativePool<T: Sendable, E: Error>(
    qos: DispatchQoS.QoSClass = .userInitiated, _ body: @escaping @Sendable () throws(E) -> T
) async throws(E) -> T {
    let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, E>, Never>) in
        DispatchQueue.global(qos: qos).async {
            continuation.resume(returning: Result { () throws(E) -> T in try body() })
        }
    }
    return try result.get()
}

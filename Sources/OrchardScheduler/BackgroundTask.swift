import Synchronization
import Foundation

/// The work run when a registered task launches; it may throw, which counts as a failed run.
public typealias BackgroundTaskHandler = @Sendable (BackgroundTask) async throws -> Void

/// Why a run was told to stop before it finished.
public struct ExpirationReason: Sendable, Hashable, Codable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable, Codable { case timeLimit, conditionsLost, shutdown, system }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// The task's time limit (its own timeout, its kind's budget, or the window's end) was reached.
    public static let timeLimit = ExpirationReason(.timeLimit)
    /// A condition the task required (power, network, idleness, …) was lost mid-run.
    public static let conditionsLost = ExpirationReason(.conditionsLost)
    /// The scheduler is shutting down.
    public static let shutdown = ExpirationReason(.shutdown)
    /// The operating system expired the task (Apple adapter).
    public static let system = ExpirationReason(.system)

    /// The reason's name, e.g. `timeLimit`.
    public var description: String { kind.rawValue }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.singleValueContainer().decode(String.self)
        guard let kind = Kind(rawValue: name) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "unknown expiration reason '\(name)'"))
        }
        self.kind = kind
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(kind.rawValue)
    }
}

/// How a run ended from the task's side: its `setTaskCompleted(success:)`, its return, or its thrown error.
public struct TaskCompletion: Sendable, Hashable {
    /// The success the task reported (a handler that returns normally reports success; one that throws, failure).
    public var success: Bool
    /// Set when the task had already been expired when it completed.
    public var expiredBy: ExpirationReason?
    /// A description of the error the handler threw, if it threw.
    public var error: String?

    /// Creates a completion.
    public init(success: Bool, expiredBy: ExpirationReason? = nil, error: String? = nil) {
        self.success = success
        self.expiredBy = expiredBy
        self.error = error
    }
}

/// The object a handler receives, as `BGTask`: an expiration handler to set and `setTaskCompleted(success:)` to call.
///
/// Completion rules (BGTask's, with SwiftUI's `.backgroundTask` convenience):
/// - The first `setTaskCompleted(success:)` wins; later calls are ignored.
/// - A handler that returns without calling it completes with success; one that throws completes with failure.
/// - At expiry the `expirationHandler` runs once and the handler's Swift task is cancelled, so the handler
///   stops at its next suspension point. Completing after expiry is recorded as expired, whatever `success` says.
public final class BackgroundTask: Sendable {
    /// The registered identifier this run was launched for.
    public let identifier: String
    /// App refresh or processing.
    public let kind: TaskKind
    /// How long this run may take before it is expired.
    public let timeLimit: Duration
    /// The number of consecutive failed runs before this one (0 on a first try).
    public let previousFailures: Int

    private struct State {
        var expirationHandler: (@Sendable () -> Void)?
        var expiredBy: ExpirationReason?
        var completion: TaskCompletion?
        var waiters: [UInt64: CheckedContinuation<TaskCompletion?, Never>] = [:]
        var nextWaiter: UInt64 = 0
        var observers: [@Sendable (TaskCompletion) -> Void] = []
    }
    private let state = Mutex(State())

    /// Creates a task object; schedulers and adapters create these, handlers only receive them.
    public init(identifier: String, kind: TaskKind, timeLimit: Duration, previousFailures: Int = 0) {
        self.identifier = identifier
        self.kind = kind
        self.timeLimit = timeLimit
        self.previousFailures = previousFailures
    }

    /// Called once when the task is expired; set it early (setting it after expiry calls it at once).
    public var expirationHandler: (@Sendable () -> Void)? {
        get { state.withLock { $0.expirationHandler } }
        set {
            let callNow = state.withLock { s -> Bool in
                s.expirationHandler = newValue
                return s.expiredBy != nil && s.completion == nil
            }
            if callNow, let newValue { newValue() }
        }
    }

    /// Whether the task has been expired.
    public var isExpired: Bool { state.withLock { $0.expiredBy != nil } }

    /// Why the task was expired, if it was.
    public var expirationReason: ExpirationReason? { state.withLock { $0.expiredBy } }

    /// The task's completion, once it completed.
    public var completion: TaskCompletion? { state.withLock { $0.completion } }

    /// Reports that the task's work is done; the first call wins.
    public func setTaskCompleted(success: Bool) {
        complete(TaskCompletion(success: success))
    }

    /// Registers a callback run once at completion (at once if already completed); adapters forward it to the OS.
    public func onCompletion(_ observer: @escaping @Sendable (TaskCompletion) -> Void) {
        let done = state.withLock { s -> TaskCompletion? in
            if let completion = s.completion { return completion }
            s.observers.append(observer)
            return nil
        }
        if let done { observer(done) }
    }

    /// Marks the task expired and runs its expiration handler once; returns `false` if it had already completed or expired.
    @discardableResult
    public func expire(_ reason: ExpirationReason) -> Bool {
        let handler = state.withLock { s -> (@Sendable () -> Void)?? in
            guard s.expiredBy == nil, s.completion == nil else { return .none }
            s.expiredBy = reason
            return .some(s.expirationHandler)
        }
        guard let handler else { return false }
        handler?()
        return true
    }

    /// Records the handler's return or thrown error; ignored if the task already completed.
    func handlerFinished(error: (any Error)?) {
        if let error {
            complete(TaskCompletion(success: false, error: String(describing: error)))
        } else {
            complete(TaskCompletion(success: true))
        }
    }

    private func complete(_ reported: TaskCompletion) {
        let (waiters, observers, completion) = state.withLock {
            s -> ([CheckedContinuation<TaskCompletion?, Never>], [@Sendable (TaskCompletion) -> Void], TaskCompletion?) in
            guard s.completion == nil else { return ([], [], nil) }
            var completion = reported
            if let reason = s.expiredBy {
                completion.expiredBy = reason
                completion.success = false
            }
            s.completion = completion
            let waiters = Array(s.waiters.values)
            s.waiters = [:]
            let observers = s.observers
            s.observers = []
            return (waiters, observers, completion)
        }
        guard let completion else { return }
        for waiter in waiters { waiter.resume(returning: completion) }
        for observer in observers { observer(completion) }
    }

    /// Waits for completion; returns `nil` if the waiting task is cancelled first.
    public func waitForCompletion() async -> TaskCompletion? {
        let id = state.withLock { s -> UInt64 in
            s.nextWaiter += 1
            return s.nextWaiter
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<TaskCompletion?, Never>) in
                let resumeNow = state.withLock { s -> TaskCompletion?? in
                    if let completion = s.completion { return .some(completion) }
                    if Task.isCancelled { return .some(nil) }
                    s.waiters[id] = continuation
                    return .none
                }
                if let resumeNow { continuation.resume(returning: resumeNow) }
            }
        } onCancel: {
            let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.resume(returning: nil)
        }
    }
}

/// One launch of a handler: the task object plus the Swift task running the handler.
///
/// Expiring the run expires the task object and cancels the Swift task (the SwiftUI contract). Used by the
/// scheduler and by the Apple adapter, so both platforms share the same completion rules.
public final class TaskRun: Sendable {
    /// The task object handed to the handler.
    public let task: BackgroundTask
    private let work: Task<Void, Never>

    /// Launches `handler` with `task` in a new Swift task.
    public init(task: BackgroundTask, handler: @escaping BackgroundTaskHandler) {
        self.task = task
        self.work = Task {
            do {
                try await handler(task)
                task.handlerFinished(error: nil)
            } catch {
                task.handlerFinished(error: error)
            }
        }
    }

    /// Expires the task (its expiration handler runs) and cancels the handler's Swift task.
    public func expire(_ reason: ExpirationReason) {
        task.expire(reason)
        work.cancel()
    }

    /// Waits until the task completes; `nil` if the waiting task is cancelled first.
    public func waitForCompletion() async -> TaskCompletion? {
        await task.waitForCompletion()
    }
}

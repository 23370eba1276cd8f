// A small mirror of the part of Apple's BackgroundTasks framework that OrchardSchedulerApple uses, so the adapter
// compiles and is tested on Linux. Names and shapes follow Apple's API; the `simulate…` members are test hooks
// standing in for the system (Apple's counterpart is the debugger-only `_simulateLaunchForTaskWithIdentifier:`).
public import Foundation
public import Dispatch

/// Mirror of `BGTaskRequest`: an identifier and an earliest begin date.
open class BGTaskRequest: CustomStringConvertible {
    /// The identifier of the task to launch.
    public let identifier: String
    /// The earliest date the task may launch.
    open var earliestBeginDate: Date?

    init(identifier: String) { self.identifier = identifier }

    open var description: String { "\(type(of: self))(\(identifier), earliestBeginDate: \(earliestBeginDate.map { "\($0)" } ?? "nil"))" }
}

/// Mirror of `BGAppRefreshTaskRequest`.
public final class BGAppRefreshTaskRequest: BGTaskRequest {
    /// Creates a refresh request.
    public override init(identifier: String) { super.init(identifier: identifier) }
}

/// Mirror of `BGProcessingTaskRequest`.
public final class BGProcessingTaskRequest: BGTaskRequest {
    /// Launch only with network connectivity.
    public var requiresNetworkConnectivity = false
    /// Launch only on external power.
    public var requiresExternalPower = false
    /// Creates a processing request.
    public override init(identifier: String) { super.init(identifier: identifier) }
}

/// Mirror of `BGTask`: the object a launch handler receives.
open class BGTask {
    /// The task's identifier.
    public let identifier: String
    /// Called by the system when the task's time is up.
    open var expirationHandler: (() -> Void)?
    private let lock = NSLock()
    private var completed: Bool?

    init(identifier: String) { self.identifier = identifier }

    /// Reports the task's result to the system.
    open func setTaskCompleted(success: Bool) {
        lock.lock()
        defer { lock.unlock() }
        if completed == nil { completed = success }
    }

    /// Test hook: the success the task reported, `nil` until it did.
    public var simulatedCompletion: Bool? {
        lock.lock()
        defer { lock.unlock() }
        return completed
    }

    /// Test hook: what the system does when the task's time is up.
    public func simulateExpiration() { expirationHandler?() }
}

/// Mirror of `BGAppRefreshTask`.
public final class BGAppRefreshTask: BGTask {}

/// Mirror of `BGProcessingTask`.
public final class BGProcessingTask: BGTask {}

/// Mirror of `BGTaskScheduler`.
public final class BGTaskScheduler: @unchecked Sendable {
    /// Mirror of `BGTaskScheduler.Error`.
    public struct Error: Swift.Error, Hashable {
        /// Mirror of `BGTaskScheduler.Error.Code`.
        public enum Code: Int, Sendable {
            /// Background work is unavailable (refresh disabled, or a simulator).
            case unavailable = 1
            /// Too many pending requests of this type.
            case tooManyPendingTaskRequests = 2
            /// The identifier is not in `BGTaskSchedulerPermittedIdentifiers`.
            case notPermitted = 3
        }
        /// The error's code.
        public let code: Code
        /// Creates an error.
        public init(_ code: Code) { self.code = code }
    }

    /// The shared scheduler (this mirror permits every identifier).
    public static let shared = BGTaskScheduler(permittedIdentifiers: nil)

    private let lock = NSLock()
    private let permitted: Set<String>?
    private var handlers: [String: (BGTask) -> Void] = [:]
    private var pending: [String: BGTaskRequest] = [:]

    /// Test hook: a scheduler whose permitted identifiers stand in for the Info.plist list (`nil`: any).
    public init(permittedIdentifiers: Set<String>?) {
        self.permitted = permittedIdentifiers
    }

    /// Registers a launch handler; `false` if the identifier is not permitted or already registered.
    public func register(forTaskWithIdentifier identifier: String, using queue: DispatchQueue?, launchHandler: @escaping (BGTask) -> Void) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        guard permitted?.contains(identifier) ?? true, handlers[identifier] == nil else { return false }
        handlers[identifier] = launchHandler
        return true
    }

    /// Submits a request, replacing a pending one with the same identifier (1 refresh, 10 processing at most).
    public func submit(_ taskRequest: BGTaskRequest) throws {
        lock.lock()
        defer { lock.unlock() }
        guard permitted?.contains(taskRequest.identifier) ?? true else { throw Error(.notPermitted) }
        let others = pending.values.filter { type(of: $0) == type(of: taskRequest) && $0.identifier != taskRequest.identifier }
        let limit = taskRequest is BGAppRefreshTaskRequest ? 1 : 10
        guard others.count < limit else { throw Error(.tooManyPendingTaskRequests) }
        pending[taskRequest.identifier] = taskRequest
    }

    /// Cancels a pending request.
    public func cancel(taskRequestWithIdentifier identifier: String) {
        lock.lock()
        defer { lock.unlock() }
        pending.removeValue(forKey: identifier)
    }

    /// Cancels every pending request.
    public func cancelAllTaskRequests() {
        lock.lock()
        defer { lock.unlock() }
        pending.removeAll()
    }

    /// The pending requests.
    public func pendingTaskRequests() async -> [BGTaskRequest] {
        lock.withLock { pending.values.sorted { $0.identifier < $1.identifier } }
    }

    /// Test hook: launches the pending request's task as the system would; `nil` if none is pending or registered.
    @discardableResult
    public func simulateLaunch(forTaskWithIdentifier identifier: String) -> BGTask? {
        lock.lock()
        guard let request = pending.removeValue(forKey: identifier), let handler = handlers[identifier] else {
            lock.unlock()
            return nil
        }
        lock.unlock()
        let task: BGTask = request is BGProcessingTaskRequest ? BGProcessingTask(identifier: identifier) : BGAppRefreshTask(identifier: identifier)
        handler(task)
        return task
    }
}

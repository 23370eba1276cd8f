// The part of Apple's BackgroundTasks framework that Orchard uses, for Linux. Orchard's Apple-facing targets import it
// as `BackgroundTasks` (Package.swift aliases the module on Linux), so the code an iPhone compiles is the code CI
// compiles. Declarations are transcribed from the iOS SDK's `BackgroundTasks.framework/Headers` (BGTaskScheduler.h,
// BGTask.h, BGTaskRequest.h) as Swift imports them; see docs/apple-shims.md for the sources.
//
// Behaviour follows Apple's documentation, failures included, so Linux tests catch what an iPhone would:
// - registering a launch handler after the app finished launching, or the same identifier twice, raises an
//   Objective-C exception on iOS (the app ends): here it is a programming error that traps, or is recorded when a test
//   asks for that (AppleShimTesting);
// - an expiration handler runs once and is cleared; a task not completed when its expiration handler returns gets the
//   app terminated;
// - once the app's last running task completes, the system may suspend the app at once: work the app does after
//   that (a late `submit`) does not happen until some later launch, so it is dropped and recorded.
// The simulation's controls (a launch, the end of app launch, permitted identifiers) live in AppleShimTesting, not
// here: the real framework has none of them.
#if os(Linux)  // Apple platforms have the real framework
@_exported public import Foundation
public import Dispatch

/// How a simulated app meets a programming error that ends a real app.
@_spi(AppleShimTesting) public enum SimulatedViolationPolicy: Sendable {
    /// End the process, as an uncaught Objective-C exception does on iOS.
    case trap
    /// Record the violation and go on (the call fails), so a test can assert it.
    case record
}

/// The simulated app's life as BackgroundTasks sees it.
@_spi(AppleShimTesting) public enum SimulatedAppState: Sendable, Equatable {
    /// `application(_:didFinishLaunchingWithOptions:)` has not returned: registration is allowed.
    case launching
    /// Launched and running (in the foreground, or in the background with a task running).
    case running
    /// Suspended after its last background task completed: nothing the app does happens.
    case suspended
    /// Terminated by the system (a task not completed at expiry).
    case terminated
}

/// `BGTaskRequest`: an identifier and an earliest begin date (abstract: use a subclass).
open class BGTaskRequest: NSObject {
    /// The identifier of the task associated with the request.
    public let identifier: String
    /// The earliest date and time at which to run the task.
    open var earliestBeginDate: Date?

    @_spi(AppleShimTesting) public init(requestIdentifier identifier: String) { self.identifier = identifier }

    open override var description: String {
        "<\(type(of: self)): \(identifier), earliestBeginDate: \(earliestBeginDate.map { "\($0)" } ?? "(null)")>"
    }
}

/// `BGAppRefreshTaskRequest`: a request to launch the app in the background for a short refresh.
open class BGAppRefreshTaskRequest: BGTaskRequest {
    /// Returns a request with the identifier of a registered task.
    public init(identifier: String) { super.init(requestIdentifier: identifier) }
}

/// `BGProcessingTaskRequest`: a request to launch the app in the background for a time-consuming task.
open class BGProcessingTaskRequest: BGTaskRequest {
    /// Whether the task needs network connectivity.
    open var requiresNetworkConnectivity = false
    /// Whether the task runs only while the device is connected to external power.
    open var requiresExternalPower = false
    /// Returns a request with the identifier of a registered task.
    public init(identifier: String) { super.init(requestIdentifier: identifier) }
}

/// `BGTask`: the object a launch handler receives (abstract: the system passes a subclass).
open class BGTask: NSObject {
    /// The identifier of the task.
    public let identifier: String
    /// Called by the system shortly before the task's background time expires.
    open var expirationHandler: (() -> Void)? {
        get { state.withLock { $0.expirationHandler } }
        set { state.withLock { $0.expirationHandler = newValue } }
    }

    @_spi(AppleShimTesting) public struct State {
        @_spi(AppleShimTesting) public var expirationHandler: (() -> Void)?
        @_spi(AppleShimTesting) public var completion: Bool?
        @_spi(AppleShimTesting) public var expired = false
        @_spi(AppleShimTesting) public var completionWaiters: [CheckedContinuation<Bool, Never>] = []
    }
    @_spi(AppleShimTesting) public let state = NSLockedState(State())
    @_spi(AppleShimTesting) public weak var scheduler: BGTaskScheduler?

    @_spi(AppleShimTesting) public init(taskIdentifier identifier: String, scheduler: BGTaskScheduler) {
        self.identifier = identifier
        self.scheduler = scheduler
    }

    /// Informs the system that the task is complete; the first call counts. The system may suspend the app as soon as
    /// its last running task completes, so submit follow-up requests before calling this.
    open func setTaskCompleted(success: Bool) {
        let waiters = state.withLock { s -> [CheckedContinuation<Bool, Never>]? in
            guard s.completion == nil else { return nil }
            s.completion = success
            // A completed task's expiration handler is released.
            s.expirationHandler = nil
            defer { s.completionWaiters = [] }
            return s.completionWaiters
        }
        guard let waiters else { return }
        scheduler?.taskCompleted(self)
        for waiter in waiters { waiter.resume(returning: success) }
    }
}

/// `BGAppRefreshTask`: a task for a short refresh (about 30 seconds).
open class BGAppRefreshTask: BGTask {}

/// `BGProcessingTask`: a time-consuming task (minutes) that runs while the device is idle.
open class BGProcessingTask: BGTask {}

/// `BGTaskScheduler`: registers launch handlers and submits requests to run them. Not `Sendable`, and its closures are
/// not `@Sendable`, as in the SDK's headers.
open class BGTaskScheduler: NSObject {
    /// `BGTaskScheduler.Error` (`BGTaskSchedulerErrorDomain`).
    public struct Error: Swift.Error, Hashable, Sendable {
        /// `BGTaskSchedulerErrorCode`.
        public enum Code: Int, Sendable {
            /// Background work is unavailable (Background App Refresh off, or the Simulator).
            case unavailable = 1
            /// Too many pending requests of this type.
            case tooManyPendingTaskRequests = 2
            /// The identifier is not in `BGTaskSchedulerPermittedIdentifiers`, or the background mode is missing.
            case notPermitted = 3
        }
        /// The error's code.
        public let code: Code
        @_spi(AppleShimTesting) public init(_ code: Code) { self.code = code }
    }

    /// The shared background task scheduler.
    open class var shared: BGTaskScheduler { sharedScheduler }
    nonisolated(unsafe) private static let sharedScheduler = BGTaskScheduler(permittedIdentifiers: nil, policy: .trap)

    @_spi(AppleShimTesting) public struct State {
        @_spi(AppleShimTesting) public var appState: SimulatedAppState = .launching
        @_spi(AppleShimTesting) public var handlers: [String: (queue: DispatchQueue?, handler: (BGTask) -> Void)] = [:]
        @_spi(AppleShimTesting) public var pending: [String: BGTaskRequest] = [:]
        @_spi(AppleShimTesting) public var running: [ObjectIdentifier: BGTask] = [:]
        @_spi(AppleShimTesting) public var foreground = false
        @_spi(AppleShimTesting) public var violations: [String] = []
    }
    @_spi(AppleShimTesting) public let permitted: Set<String>?
    @_spi(AppleShimTesting) public let policy: SimulatedViolationPolicy
    @_spi(AppleShimTesting) public let state = NSLockedState(State())

    @_spi(AppleShimTesting) public init(permittedIdentifiers: Set<String>?, policy: SimulatedViolationPolicy) {
        self.permitted = permittedIdentifiers
        self.policy = policy
    }

    /// Registers a launch handler for the task with `identifier`. Must be called before the app finishes launching:
    /// later, or for an identifier already registered, it raises (the app ends). Returns `false` when the identifier is
    /// not in `BGTaskSchedulerPermittedIdentifiers`.
    open func register(
        forTaskWithIdentifier identifier: String, using queue: DispatchQueue?, launchHandler: @escaping (BGTask) -> Void
    ) -> Bool {
        let outcome = state.withLock { s -> Result<Bool, Violation> in
            guard s.appState == .launching else {
                return .failure(
                    Violation(
                        "'NSInternalInconsistencyException', reason: 'All launch handlers must be registered before application finishes launching' (\(identifier))"
                    ))
            }
            guard s.handlers[identifier] == nil else {
                return .failure(
                    Violation("'NSInternalInconsistencyException', reason: 'Launch handler for task with identifier \(identifier) has already been registered'")
                )
            }
            guard permitted?.contains(identifier) ?? true else { return .success(false) }
            s.handlers[identifier] = (queue, launchHandler)
            return .success(true)
        }
        switch outcome {
        case .success(let registered): return registered
        case .failure(let violation):
            programmingError(violation)
            return false
        }
    }

    /// Submits a request, replacing a pending one with the same identifier (one refresh and ten processing requests
    /// may be pending at once); a request for an identifier without a registered launch handler raises.
    open func submit(_ taskRequest: BGTaskRequest) throws {
        let dropped = state.withLock { s -> Bool in
            guard s.appState == .suspended || s.appState == .terminated else { return false }
            s.violations.append("submit(\(taskRequest.identifier)) while the app was \(s.appState): it does not reach the system")
            return true
        }
        if dropped { return }
        let violation = try state.withLock { s throws(Error) -> Violation? in
            guard permitted?.contains(taskRequest.identifier) ?? true else { throw Error(.notPermitted) }
            // iOS asserts here, not only when it would launch the task (firefox-ios PR 19054: a submit for an identifier
            // whose handler was never registered crashed the app as it went to the background).
            guard s.handlers[taskRequest.identifier] != nil else {
                return Violation(
                    "'NSInternalInconsistencyException', reason: 'No launch handler registered for task with identifier \(taskRequest.identifier)'")
            }
            let others = s.pending.values.filter { type(of: $0) == type(of: taskRequest) && $0.identifier != taskRequest.identifier }
            let limit = taskRequest is BGAppRefreshTaskRequest ? 1 : 10
            guard others.count < limit else { throw Error(.tooManyPendingTaskRequests) }
            s.pending[taskRequest.identifier] = taskRequest
            return nil
        }
        if let violation { programmingError(violation) }
    }

    /// Cancels a pending request.
    open func cancel(taskRequestWithIdentifier identifier: String) {
        state.withLock { _ = $0.pending.removeValue(forKey: identifier) }
    }

    /// Cancels every pending request.
    open func cancelAllTaskRequests() {
        state.withLock { $0.pending.removeAll() }
    }

    /// Calls `completionHandler` with the pending requests.
    open func getPendingTaskRequests(completionHandler: @escaping ([BGTaskRequest]) -> Void) {
        completionHandler(state.withLock { $0.pending.values.sorted { $0.identifier < $1.identifier } })
    }

    /// The pending requests (the async form Swift imports for `getPendingTaskRequests(completionHandler:)`).
    open func pendingTaskRequests() async -> [BGTaskRequest] {
        state.withLock { $0.pending.values.sorted { $0.identifier < $1.identifier } }
    }

    // MARK: The simulated system (driven by AppleShimTesting)

    @_spi(AppleShimTesting) public struct Violation: Swift.Error {
        @_spi(AppleShimTesting) public let message: String
        @_spi(AppleShimTesting) public init(_ message: String) { self.message = message }
    }

    @_spi(AppleShimTesting) public func programmingError(_ violation: Violation) {
        switch policy {
        case .trap: fatalError("*** Terminating app due to uncaught exception \(violation.message)")
        case .record: state.withLock { $0.violations.append(violation.message) }
        }
    }

    /// Ends the app's launch: later registrations raise.
    @_spi(AppleShimTesting) public func finishLaunching() {
        state.withLock { if $0.appState == .launching { $0.appState = .running } }
    }

    /// Launches the pending request's task as the system would: the app runs (it is relaunched if it was suspended or
    /// terminated), its launch ends, and the handler is called on its queue. `nil` if nothing is pending; a pending
    /// request without a registered handler is a programming error (iOS raises).
    @_spi(AppleShimTesting) public func launch(forTaskWithIdentifier identifier: String) -> BGTask? {
        let launched = state.withLock { s -> Result<(BGTask, DispatchQueue?, (BGTask) -> Void), Violation>? in
            guard s.pending[identifier] != nil else { return nil }
            guard let registered = s.handlers[identifier] else {
                return .failure(Violation("'NSInternalInconsistencyException', reason: 'No launch handler registered for task with identifier \(identifier)'"))
            }
            let request = s.pending.removeValue(forKey: identifier)!
            let task: BGTask =
                request is BGProcessingTaskRequest
                ? BGProcessingTask(taskIdentifier: identifier, scheduler: self) : BGAppRefreshTask(taskIdentifier: identifier, scheduler: self)
            s.appState = .running
            s.running[ObjectIdentifier(task)] = task
            return .success((task, registered.queue, registered.handler))
        }
        guard let launched else { return nil }
        let task: BGTask, queue: DispatchQueue?, handler: (BGTask) -> Void
        switch launched {
        case .success(let found): (task, queue, handler) = found
        case .failure(let violation):
            programmingError(violation)
            return nil
        }
        // On the registered queue, or (nil) on a background queue, as the system does.
        (queue ?? DispatchQueue.global()).sync { handler(task) }
        return task
    }

    /// The system's expiry of `task`: its expiration handler runs once and is cleared; a task still not completed when
    /// the handler returns gets the app terminated. A task without an expiration handler is completed unsuccessfully
    /// instead (Apple: "the system marks your task as complete and unsuccessful instead of sending a warning").
    @_spi(AppleShimTesting) public func expire(_ task: BGTask) {
        let handler = task.state.withLock { s -> (() -> Void)?? in
            guard s.completion == nil, !s.expired else { return .none }
            s.expired = true
            defer { s.expirationHandler = nil }
            return .some(s.expirationHandler)
        }
        guard let handler else { return }
        guard let handler else {
            task.setTaskCompleted(success: false)
            return
        }
        handler()
        let incomplete = task.state.withLock { $0.completion == nil }
        guard incomplete else { return }
        state.withLock { s in
            s.violations.append("task \(task.identifier) was not completed when its expiration handler returned: the app is terminated")
            s.appState = .terminated
            s.running.removeAll()
        }
        task.setTaskCompleted(success: false)
    }

    /// The app comes to the foreground (it is not suspended while it is there) or leaves it.
    @_spi(AppleShimTesting) public func setForeground(_ foreground: Bool) {
        state.withLock { s in
            s.foreground = foreground
            if foreground, s.appState != .launching { s.appState = .running }
            if !foreground, s.appState == .running, s.running.isEmpty { s.appState = .suspended }
        }
    }

    func taskCompleted(_ task: BGTask) {
        state.withLock { s in
            s.running.removeValue(forKey: ObjectIdentifier(task))
            if s.running.isEmpty, !s.foreground, s.appState == .running { s.appState = .suspended }
        }
    }
}

/// A value behind a lock (Foundation's `NSLock`, which every platform the shims run on has).
@_spi(AppleShimTesting) public final class NSLockedState<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    @_spi(AppleShimTesting) public init(_ value: Value) { self.value = value }

    @_spi(AppleShimTesting) public func withLock<T, E: Swift.Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
#endif

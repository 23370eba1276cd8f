public import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization

/// A child process for tests, started with `posix_spawn` and reaped with `waitpid`: the part of Foundation's `Process`
/// the tests use, without its Linux `run()`, which reads past the end of a `/proc/self/fd` directory entry and crashes
/// the test process now and then (swift-corelibs-foundation #5472, in Swift 6.3.1).
///
/// Standard streams are a `FileHandle` (its descriptor is duplicated into the child; `FileHandle.nullDevice` opens
/// `/dev/null`), a `Pipe` (the child gets its write end for output, its read end for input, and the parent closes that
/// end once the child runs), or nil (inherited). Every other descriptor is closed in the child, and the child leads a
/// process group of its own (as with `Process`).
public final class ChildProcess: @unchecked Sendable {
    /// Why a child ended.
    public enum TerminationReason: Sendable, Hashable {
        /// It exited with ``ChildProcess/terminationStatus``.
        case exit
        /// A signal (its number is ``ChildProcess/terminationStatus``) ended it.
        case uncaughtSignal
    }

    /// Why a child could not be started.
    public struct LaunchError: Error, CustomStringConvertible {
        /// What failed and the errno text.
        public var description: String
    }

    /// The executable.
    public var executableURL: URL?
    /// Its arguments (without the executable).
    public var arguments: [String]?
    /// Its whole environment; nil inherits this process's.
    public var environment: [String: String]?
    /// Its working directory; nil inherits this process's.
    public var currentDirectoryURL: URL?
    /// Standard input: a `FileHandle`, a `Pipe` or nil.
    public var standardInput: Any?
    /// Standard output: a `FileHandle`, a `Pipe` or nil.
    public var standardOutput: Any?
    /// Standard error: a `FileHandle`, a `Pipe` or nil.
    public var standardError: Any?
    /// Called once, on a background thread, when the child has ended.
    public var terminationHandler: (@Sendable (ChildProcess) -> Void)? {
        get { state.withLock { $0.handler } }
        set { state.withLock { $0.handler = newValue } }
    }

    private struct State {
        var pid: pid_t = 0
        var ended: (status: Int32, reason: TerminationReason)?
        var handler: (@Sendable (ChildProcess) -> Void)?
        /// Callers of ``exited()`` waiting for the child to end.
        var waiters: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Mutex(State())
    private let done = DispatchSemaphore(value: 0)

    /// Creates a child that is not started.
    public init() {}

    /// The child's process id (0 before ``run()``).
    public var processIdentifier: Int32 { state.withLock { $0.pid } }
    /// Whether it was started and has not ended.
    public var isRunning: Bool { state.withLock { $0.pid != 0 && $0.ended == nil } }
    /// Its exit status, or the signal that ended it (see ``terminationReason``); 0 before it ends.
    public var terminationStatus: Int32 { state.withLock { $0.ended?.status ?? 0 } }
    /// Why it ended (``TerminationReason/exit`` before it ends).
    public var terminationReason: TerminationReason { state.withLock { $0.ended?.reason ?? .exit } }

    /// Starts the child.
    public func run() throws {
        guard let executableURL else { throw LaunchError(description: "no executableURL") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var closeInParent: [FileHandle] = []
        for (stream, target) in [(standardInput, Int32(0)), (standardOutput, 1), (standardError, 2)] {
            switch stream {
            case let pipe as Pipe:
                let end = target == 0 ? pipe.fileHandleForReading : pipe.fileHandleForWriting
                posix_spawn_file_actions_adddup2(&actions, end.fileDescriptor, target)
                closeInParent.append(end)
            case let handle as FileHandle where handle === FileHandle.nullDevice:
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
            case let handle as FileHandle:
                posix_spawn_file_actions_adddup2(&actions, handle.fileDescriptor, target)
            default:
                break
            }
        }
        guard let closeFrom = Self.closeFrom, let changeDirectory = Self.changeDirectory else {
            throw LaunchError(description: "this C library has no posix_spawn_file_actions_addclosefrom_np or _addchdir_np (glibc 2.34 or later has both)")
        }
        _ = closeFrom(&actions, 3)
        if let currentDirectoryURL { _ = changeDirectory(&actions, currentDirectoryURL.path) }
        let path = executableURL.path
        let argv = ([path] + (arguments ?? [])).map { strdup($0) } + [nil]
        let environment = (self.environment ?? ProcessInfo.processInfo.environment).map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in environment { free(pointer) }
        }
        // As Foundation's `Process` does, the child leads a process group of its own, so that signalling the group
        // (`kill(-pid, …)`) reaches the children it starts and nothing of this process.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))
        posix_spawnattr_setpgroup(&attributes, 0)
        var pid: pid_t = 0
        let result = posix_spawn(&pid, path, &actions, &attributes, argv, environment)
        guard result == 0 else { throw LaunchError(description: "posix_spawn \(path): \(String(cString: strerror(result)))") }
        for handle in closeInParent { try? handle.close() }
        state.withLock { $0.pid = pid }
        let child = pid
        Thread.detachNewThread { [self] in reap(child) }
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np` and `_addchdir_np`, which its headers declare only for GNU
    /// sources (so Swift does not import them): looked up by name.
    private typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private typealias ChangeDirectory = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32
    private static let closeFrom: CloseFrom? = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np").map {
        unsafeBitCast($0, to: CloseFrom.self)
    }
    private static let changeDirectory: ChangeDirectory? = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addchdir_np").map {
        unsafeBitCast($0, to: ChangeDirectory.self)
    }

    private func reap(_ pid: pid_t) {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        // WIFEXITED / WTERMSIG, spelled out (the C macros are not imported).
        let signal = status & 0x7F
        let ended: (Int32, TerminationReason) = signal == 0 ? ((status >> 8) & 0xFF, .exit) : (signal, .uncaughtSignal)
        let (handler, waiters) = state.withLock { state in
            state.ended = ended
            defer { state.waiters = [] }
            return (state.handler, state.waiters)
        }
        done.signal()
        for waiter in waiters { waiter.resume() }
        handler?(self)
    }

    /// Blocks until the child has ended (from a thread of the caller's own; an async caller awaits ``exited()``).
    @available(*, noasync, message: "blocks a thread of the cooperative pool; await exited()")
    public func waitUntilExit() {
        guard state.withLock({ $0.pid != 0 }) else { return }
        done.wait()
        done.signal()
    }

    /// Returns once the child has ended (resumed by the thread that reaps it; nothing blocks meanwhile).
    public func exited() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let waiting = state.withLock { state -> Bool in
                guard state.pid != 0, state.ended == nil else { return false }
                state.waiters.append(continuation)
                return true
            }
            if !waiting { continuation.resume() }
        }
    }

    /// Sends SIGTERM.
    public func terminate() { send(SIGTERM) }
    /// Sends SIGINT.
    public func interrupt() { send(SIGINT) }

    /// Sends `signal` while the child runs.
    public func send(_ signal: Int32) {
        let pid = state.withLock { $0.ended == nil ? $0.pid : 0 }
        if pid != 0 { kill(pid, signal) }
    }
}

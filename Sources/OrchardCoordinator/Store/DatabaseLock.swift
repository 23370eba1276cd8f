import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive lock on `<database>.lock`, held while one coordinator uses the database.
///
/// One SQLite file serves one coordinator: a second one would sweep the first one's diff spool and race it on every
/// cycle. The lock is an `flock` on a file beside the database, so the kernel releases it when its holder exits or
/// crashes and a dead coordinator never blocks the next. The holder's process id is written into the file, for the
/// refusal's message only.
public final class DatabaseLock: Sendable {
    /// The lock file, `<database>.lock`.
    public let path: String
    private let descriptor: Mutex<Int32?>

    /// Takes the lock for the database at `database`, or throws ``StoreError/Code/locked`` naming its holder.
    public init(database: String) throws(StoreError) {
        let path = database + ".lock"
        self.path = path
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw StoreError(.io, "cannot open the lock file '\(path)' of database '\(database)': \(String(cString: strerror(errno)))")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let reason = errno
            let holder = Self.holder(fd)
            close(fd)
            if reason == EWOULDBLOCK {
                throw StoreError(
                    .locked,
                    "database '\(database)' is in use by another coordinator\(holder.map { " (process \($0))" } ?? "") holding '\(path)'; one SQLite file serves one coordinator, so stop that one first"
                )
            }
            throw StoreError(.io, "cannot lock '\(path)': \(String(cString: strerror(reason)))")
        }
        let pid = Array("\(getpid())\n".utf8)
        if ftruncate(fd, 0) == 0 { _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) } }
        descriptor = Mutex(fd)
    }

    /// Releases the lock (also done when the lock is deallocated, and by the kernel when the process exits).
    public func release() {
        guard
            let fd = descriptor.withLock({ held in
                let fd = held
                held = nil
                return fd
            })
        else { return }
        // Unlocked before the close: a child being spawned meanwhile by another thread holds a copy of the descriptor
        // until its exec, and the lock would last as long as that copy (an in-process restart then found it held).
        flock(fd, LOCK_UN)
        close(fd)
    }

    deinit { release() }

    private static func holder(_ fd: Int32) -> String? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        let text = String(decoding: buffer[..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return Int32(text).map(String.init)
    }
}

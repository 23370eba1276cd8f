import Foundation
import OrchardCoordinator
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The directory where a ``PostgresStore`` stages report diffs while they arrive, so memory stays bounded however
/// many uploads are in flight; each file lives until its report's transaction binds it (the diff is then in the
/// database) or the report is refused. The store owns one subdirectory and removes it when it shuts down.
final class StagingSpool: Sendable {
    /// This store's directory.
    let directory: URL

    /// Creates `<root>/orchard-postgres-<pid>-<uuid>` (root: the configured directory or the system's temporary one),
    /// first deleting the directories that processes no longer running left there.
    init(root: String?) throws(StoreError) {
        let base = root.map { URL(fileURLWithPath: $0, isDirectory: true) } ?? FileManager.default.temporaryDirectory
        Self.sweep(base)
        directory = base.appendingPathComponent("orchard-postgres-\(getpid())-\(UUID().uuidString)", isDirectory: true)
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw StoreError(.io, "cannot create the diff staging directory \(directory.path): \(error)")
        }
    }

    /// Deletes `orchard-postgres-<pid>-…` directories under `base` whose process has exited (a crash or a store
    /// never shut down).
    private static func sweep(_ base: URL) {
        let prefix = "orchard-postgres-"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: base.path)) ?? [] where name.hasPrefix(prefix) {
            guard let pid = Int32(name.dropFirst(prefix.count).prefix { $0 != "-" }), pid > 0, pid != getpid() else { continue }
            if kill(pid, 0) != 0 && errno == ESRCH {
                try? FileManager.default.removeItem(at: base.appendingPathComponent(name))
            }
        }
    }

    /// A new, empty staging file.
    func stage(requestKey: String) throws(StoreError) -> StagedFile {
        let safe = String(requestKey.unicodeScalars.prefix(40).map { scalar -> Character in
            scalar.isASCII && (scalar.properties.isAlphabetic || ("0"..."9").contains(scalar) || scalar == "-" || scalar == "_") ? Character(scalar) : "_"
        })
        let path = directory.appendingPathComponent("\(safe)-\(UUID().uuidString).f32").path
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Self.failure("create", path) }
        return StagedFile(owner: ObjectIdentifier(self), path: path, descriptor: fd)
    }

    /// Deletes the directory and whatever is still staged in it.
    func remove() {
        try? FileManager.default.removeItem(at: directory)
    }

    static func failure(_ action: String, _ path: String) -> StoreError {
        StoreError(.io, "cannot \(action) staged diff \(path): \(String(cString: strerror(errno)))")
    }
}

/// A staged diff: positioned writes and reads of a temporary file, deleted by ``discard()`` (and by the store once
/// the report's transaction ends). The descriptor closes with the object.
final class StagedFile: StagedDiff, @unchecked Sendable {
    /// The spool that created it (a store accepts only its own staged diffs).
    let owner: ObjectIdentifier
    private let path: String
    private let descriptor: Int32
    /// Whether the file is deleted; guarded by the mutex.
    private let discarded = Mutex(false)

    init(owner: ObjectIdentifier, path: String, descriptor: Int32) {
        self.owner = owner
        self.path = path
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }

    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError) {
        guard offset >= 0 else { throw StoreError(.io, "cannot write staged diff \(path) at negative offset \(offset)") }
        var done = 0
        while done < bytes.count {
            let written = pwrite(descriptor, bytes.baseAddress! + done, bytes.count - done, off_t(offset + done))
            if written < 0 {
                if errno == EINTR { continue }
                throw StagingSpool.failure("write", path)
            }
            done += written
        }
    }

    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) {
        guard offset >= 0 else { throw StoreError(.io, "cannot read staged diff \(path) at negative offset \(offset)") }
        var done = 0
        while done < buffer.count {
            let count = pread(descriptor, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
            if count < 0 {
                if errno == EINTR { continue }
                throw StagingSpool.failure("read", path)
            }
            if count == 0 { throw StoreError(.corrupt, "staged diff \(path) ends at byte \(offset + done); \(offset + buffer.count) expected") }
            done += count
        }
    }

    /// The file's size in bytes.
    func size() throws(StoreError) -> Int {
        let end = lseek(descriptor, 0, SEEK_END)
        guard end >= 0 else { throw StagingSpool.failure("measure", path) }
        return Int(end)
    }

    func discard() {
        discarded.withLock { done in
            guard !done else { return }
            done = true
            unlink(path)
        }
    }
}

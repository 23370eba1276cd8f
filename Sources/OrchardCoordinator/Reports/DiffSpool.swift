package import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The files holding committed diffs that are not yet folded into a stored running sum, one file per report
/// under `<directory>/<process>/<cycle>/`. Names are relative paths, unique per write (a refused duplicate can
/// never overwrite the file of the report it duplicates). The PostgreSQL store stages its diffs in one too.
package final class DiffSpool: Sendable {
    /// The spool's root directory.
    let directory: URL
    /// Whether every file (and its directory entry) is synced to disk before its report's row commits.
    let sync: Bool
    /// Cycle folders known to exist, so a report does not stat its folder again.
    private let folders = Mutex<Set<String>>([])

    package init(directory: URL, sync: Bool) throws {
        self.directory = directory
        self.sync = sync
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    /// Creates a new, empty file for a report whose diff is written as it arrives (``SpooledDiff``).
    package func stage(process: String, cycle: Int, key: String) throws(StoreError) -> SpooledDiff {
        guard Self.isSafe(process), Self.isSafe(key) else {
            throw StoreError(.io, "process id '\(process)' or request key '\(key)' cannot name a spool file")
        }
        let folder = "\(process)/\(cycle)"
        let name = "\(folder)/\(key)-\(UUID().uuidString).f32"
        let folderURL = directory.appendingPathComponent(folder)
        if !folders.withLock({ $0.contains(folder) }) {
            do {
                try FileManager.default.createDirectory(at: folderURL, withIntermediateDirectories: true)
            } catch {
                throw StoreError(.io, "cannot create spool folder \(folderURL.path): \(error)")
            }
            // Synced: the new folders' own entries, in the process folder and the spool root, reach the disk before
            // any file in them is relied on (each file's sync covers only its own entry).
            if sync {
                for parent in [directory.appendingPathComponent(process), directory] {
                    let descriptor = open(parent.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                    guard descriptor >= 0 else { throw Self.failure("open the spool folder", parent.path) }
                    defer { close(descriptor) }
                    guard fsync(descriptor) == 0 else { throw Self.failure("sync the spool folder", parent.path) }
                }
            }
            folders.withLock { _ = $0.insert(folder) }
        }
        let path = directory.appendingPathComponent(name).path
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Self.failure("create", path) }
        return SpooledDiff(owner: ObjectIdentifier(self), name: name, path: path, folder: folderURL.path, descriptor: fd)
    }

    /// The bytes of a spooled file, or nil when it is missing (what a power loss can leave of a file never synced);
    /// any other failure to read it throws.
    func readIfPresent(_ name: String) throws -> [UInt8]? {
        let path = directory.appendingPathComponent(name).path
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        return try read(name)
    }

    /// The bytes of a spooled file.
    func read(_ name: String) throws -> [UInt8] {
        let url = directory.appendingPathComponent(name)
        guard let data = FileManager.default.contents(atPath: url.path) else {
            throw StoreError(.corrupt, "spooled diff '\(name)' is missing from \(directory.path)")
        }
        return [UInt8](data)
    }

    /// Deletes one file (already forgotten by the database).
    func remove(_ name: String) {
        unlink(directory.appendingPathComponent(name).path)
    }

    /// Deletes a closed cycle's directory.
    func removeCycle(process: String, cycle: Int) {
        guard Self.isSafe(process) else { return }
        folders.withLock { _ = $0.remove("\(process)/\(cycle)") }
        try? FileManager.default.removeItem(at: directory.appendingPathComponent("\(process)/\(cycle)"))
    }

    /// Deletes everything of a deleted process.
    func removeProcess(_ process: String) {
        guard Self.isSafe(process) else { return }
        folders.withLock { $0 = $0.filter { !$0.hasPrefix(process + "/") } }
        try? FileManager.default.removeItem(at: directory.appendingPathComponent(process))
    }

    /// Deletes every file the database does not name (left by a crash between a write and its commit, or
    /// between a fold's commit and its deletions) and every directory left empty.
    func sweep(keeping referenced: Set<String>) throws {
        let fileManager = FileManager.default
        for process in try fileManager.contentsOfDirectory(atPath: directory.path) {
            let processURL = directory.appendingPathComponent(process)
            for cycle in (try? fileManager.contentsOfDirectory(atPath: processURL.path)) ?? [] {
                let cycleURL = processURL.appendingPathComponent(cycle)
                var kept = 0
                for file in (try? fileManager.contentsOfDirectory(atPath: cycleURL.path)) ?? [] {
                    if referenced.contains("\(process)/\(cycle)/\(file)") {
                        kept += 1
                    } else {
                        try fileManager.removeItem(at: cycleURL.appendingPathComponent(file))
                    }
                }
                if kept == 0 { try fileManager.removeItem(at: cycleURL) }
            }
            if ((try? fileManager.contentsOfDirectory(atPath: processURL.path)) ?? []).isEmpty {
                try fileManager.removeItem(at: processURL)
            }
        }
    }

    private static func isSafe(_ component: String) -> Bool {
        !component.isEmpty
            && component.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || byte == 0x5F || byte == 0x2D
            }
    }

    static func failure(_ action: String, _ path: String) -> StoreError {
        StoreError(.io, "cannot \(action) spool file \(path): \(String(cString: strerror(errno)))")
    }
}

/// A spool file written while its report arrives: positioned writes and reads of the flat diff, a sync before the
/// report's row commits, and deletion if the report is refused or abandoned. The descriptor closes with the object.
package final class SpooledDiff: StagedDiff, @unchecked Sendable {
    /// The spool that created it (a store accepts only its own staged diffs).
    package let owner: ObjectIdentifier
    /// The file's name relative to the spool directory (what the database row stores).
    let name: String
    private let path: String
    private let folder: String
    private let descriptor: Int32
    /// Set once the file is deleted; guarded by `lock`.
    private var discarded = false
    private let lock = Mutex<Void>(())

    init(owner: ObjectIdentifier, name: String, path: String, folder: String, descriptor: Int32) {
        self.owner = owner
        self.name = name
        self.path = path
        self.folder = folder
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }

    package func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreError) {
        guard offset >= 0 else { throw StoreError(.io, "cannot write spool file \(path) at negative offset \(offset)") }
        var done = 0
        while done < bytes.count {
            let written = pwrite(descriptor, bytes.baseAddress! + done, bytes.count - done, off_t(offset + done))
            if written < 0 {
                if errno == EINTR { continue }
                throw DiffSpool.failure("write", path)
            }
            done += written
        }
    }

    package func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(StoreError) {
        guard offset >= 0 else { throw StoreError(.io, "cannot read spool file \(path) at negative offset \(offset)") }
        var done = 0
        while done < buffer.count {
            let count = pread(descriptor, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
            if count < 0 {
                if errno == EINTR { continue }
                throw DiffSpool.failure("read", path)
            }
            if count == 0 { throw StoreError(.corrupt, "spool file \(path) ends at byte \(offset + done); \(offset + buffer.count) expected") }
            done += count
        }
    }

    /// Pushes the file's data and its directory entry to disk.
    func sync() throws(StoreError) {
        guard fdatasync(descriptor) == 0 else { throw DiffSpool.failure("sync", path) }
        let directory = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { throw DiffSpool.failure("open the directory of", path) }
        defer { close(directory) }
        guard fsync(directory) == 0 else { throw DiffSpool.failure("sync the directory of", path) }
    }

    /// The file's size in bytes.
    package func size() throws(StoreError) -> Int {
        let end = lseek(descriptor, 0, SEEK_END)
        guard end >= 0 else { throw DiffSpool.failure("measure", path) }
        return Int(end)
    }

    package func discard() {
        lock.withLock { _ in
            guard !discarded else { return }
            discarded = true
            unlink(path)
        }
    }
}

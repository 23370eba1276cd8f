import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The files holding committed diffs that are not yet folded into a stored running sum, one file per report
/// under `<directory>/<process>/<cycle>/`. Names are relative paths, unique per write (a refused duplicate can
/// never overwrite the file of the report it duplicates).
final class DiffSpool: Sendable {
    /// The spool's root directory.
    let directory: URL
    /// Whether every file (and its directory entry) is synced to disk before ``write(_:process:cycle:key:)``
    /// returns.
    let sync: Bool
    /// Cycle folders known to exist, so a report does not stat its folder again.
    private let folders = Mutex<Set<String>>([])

    init(directory: URL, sync: Bool) throws {
        self.directory = directory
        self.sync = sync
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    /// Writes `bytes` to a new file for a report and returns its relative name.
    func write(_ bytes: [UInt8], process: String, cycle: Int, key: String) throws -> String {
        guard Self.isSafe(process), Self.isSafe(key) else {
            throw StoreError(.io, "process id '\(process)' or request key '\(key)' cannot name a spool file")
        }
        let folder = "\(process)/\(cycle)"
        let name = "\(folder)/\(key)-\(UUID().uuidString).f32"
        let folderURL = directory.appendingPathComponent(folder)
        if !folders.withLock({ $0.contains(folder) }) {
            try FileManager.default.createDirectory(at: folderURL, withIntermediateDirectories: true)
            folders.withLock { _ = $0.insert(folder) }
        }
        let path = directory.appendingPathComponent(name).path
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Self.failure("create", path) }
        var ok = bytes.withUnsafeBytes { raw -> Bool in
            var offset = 0
            while offset < raw.count {
                let written = systemWrite(fd, raw.baseAddress! + offset, raw.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                offset += written
            }
            return true
        }
        if ok && sync { ok = fdatasync(fd) == 0 }
        let error = Self.failure("write", path)
        close(fd)
        guard ok else {
            unlink(path)
            throw error
        }
        if sync {
            let dir = open(folderURL.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if dir >= 0 {
                let synced = fsync(dir) == 0
                close(dir)
                if !synced {
                    unlink(path)
                    throw Self.failure("sync the directory of", path)
                }
            }
        }
        return name
    }

    /// The bytes of a file written by ``write(_:process:cycle:key:)``.
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
        !component.isEmpty && component.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || byte == 0x5F || byte == 0x2D
        }
    }

    private static func failure(_ action: String, _ path: String) -> StoreError {
        StoreError(.io, "cannot \(action) spool file \(path): \(String(cString: strerror(errno)))")
    }
}

#if canImport(Glibc)
private func systemWrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int { Glibc.write(fd, buffer, count) }
#elseif canImport(Darwin)
private func systemWrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int { Darwin.write(fd, buffer, count) }
#endif

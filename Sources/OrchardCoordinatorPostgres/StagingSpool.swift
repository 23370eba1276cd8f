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
    /// The staged files (a spool as the SQLite store's, not synced: the diff is durable once its transaction commits).
    private let files: DiffSpool

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
        do {
            files = try DiffSpool(directory: directory, sync: false)
        } catch {
            throw StoreError(.io, "cannot use the diff staging directory \(directory.path): \(error)")
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

    /// A new, empty staging file for a report's diff.
    func stage(processID: String, cycle: Int, requestKey: String) throws(StoreError) -> SpooledDiff {
        try files.stage(process: processID, cycle: cycle, key: requestKey)
    }

    /// Whether `diff` was staged here.
    func owns(_ diff: SpooledDiff) -> Bool { diff.owner == ObjectIdentifier(files) }

    /// Deletes the directory and whatever is still staged in it.
    func remove() {
        try? FileManager.default.removeItem(at: directory)
    }
}

import Synchronization
public import Foundation
import GRDB

/// A submitted request waiting to run, with when it was submitted.
public struct PendingTask: Sendable, Hashable, Codable {
    /// The request as submitted (a retry or a repeat carries its new earliest begin date).
    public var request: TaskRequest
    /// When it was first submitted; aging counts from the later of this and the earliest begin date.
    public var submittedAt: Date

    /// Creates a pending task.
    public init(request: TaskRequest, submittedAt: Date) {
        self.request = request
        self.submittedAt = submittedAt
    }
}

/// Everything a scheduler persists.
public struct SchedulerSnapshot: Sendable, Hashable {
    /// Pending requests by identifier.
    public var pending: [String: PendingTask]
    /// Run histories by identifier.
    public var histories: [String: TaskHistory]

    /// Creates a snapshot.
    public init(pending: [String: PendingTask] = [:], histories: [String: TaskHistory] = [:]) {
        self.pending = pending
        self.histories = histories
    }
}

/// A store that could not be read and was moved aside so the scheduler could start empty.
public struct StoreRecovery: Sendable, Hashable, CustomStringConvertible {
    /// Where the unreadable store was moved.
    public var setAsidePath: String
    /// Why it could not be read.
    public var reason: String

    /// Creates a report.
    public init(setAsidePath: String, reason: String) {
        self.setAsidePath = setAsidePath
        self.reason = reason
    }

    public var description: String { "store unreadable (\(reason)); moved to \(setAsidePath)" }
}

/// Where a scheduler keeps its pending requests and histories across restarts.
public protocol SchedulerStore: Sendable {
    /// Everything stored.
    func load() throws(SchedulerError) -> SchedulerSnapshot
    /// Inserts or replaces a pending task.
    func savePending(_ task: PendingTask) throws(SchedulerError)
    /// Removes the pending task with this identifier, if any.
    func removePending(_ identifier: String) throws(SchedulerError)
    /// Removes every pending task.
    func removeAllPending() throws(SchedulerError)
    /// Inserts or replaces a history.
    func saveHistory(_ history: TaskHistory) throws(SchedulerError)
    /// What a finished run leaves: its history and its request's follow-up, in one write, so that a crash between the
    /// two cannot leave the finished request pending to run again at once.
    func recordRun(_ history: TaskHistory, pending: PendingChange) throws(SchedulerError)
    /// Set when the store found an unreadable file at open and moved it aside.
    var recovery: StoreRecovery? { get }
}

/// What a finished run does to its identifier's pending request (``SchedulerStore/recordRun(_:pending:)``).
public enum PendingChange: Sendable, Hashable {
    /// Left as it is (a new request was submitted while the run went on, or the run was cancelled).
    case unchanged
    /// Replaced by the follow-up: the next repeat, the retry, or the stopped run again.
    case save(PendingTask)
    /// Removed: nothing follows.
    case remove
}

/// A store in memory: cheap, for the simulator's many virtual devices and for tests.
public final class InMemorySchedulerStore: SchedulerStore {
    private let state: Mutex<SchedulerSnapshot>

    /// Creates an empty store, or one holding `snapshot`.
    public init(_ snapshot: SchedulerSnapshot = SchedulerSnapshot()) {
        state = Mutex(snapshot)
    }

    public func load() throws(SchedulerError) -> SchedulerSnapshot { state.withLock { $0 } }
    public func savePending(_ task: PendingTask) throws(SchedulerError) { state.withLock { $0.pending[task.request.identifier] = task } }
    public func removePending(_ identifier: String) throws(SchedulerError) { _ = state.withLock { $0.pending.removeValue(forKey: identifier) } }
    public func removeAllPending() throws(SchedulerError) { state.withLock { $0.pending = [:] } }
    public func saveHistory(_ history: TaskHistory) throws(SchedulerError) { state.withLock { $0.histories[history.identifier] = history } }
    public func recordRun(_ history: TaskHistory, pending: PendingChange) throws(SchedulerError) {
        state.withLock { state in
            state.histories[history.identifier] = history
            switch pending {
            case .unchanged: break
            case .save(let task): state.pending[task.request.identifier] = task
            case .remove: state.pending.removeValue(forKey: history.identifier)
            }
        }
    }
    public var recovery: StoreRecovery? { nil }
}

/// A store in one SQLite file (GRDB), each change its own transaction.
///
/// At open the file is checked (`PRAGMA quick_check`, schema, every row decodes). A file that fails is renamed to
/// `<path>.corrupt` (or `.corrupt-1`, `-2`, …) with its `-wal`/`-shm` companions, a fresh store is created, and
/// ``recovery`` says what happened; nothing is silently dropped.
public final class SQLiteSchedulerStore: SchedulerStore {
    /// The database file.
    public let path: String
    /// Set when an unreadable file was moved aside at open.
    public let recovery: StoreRecovery?
    private let database: DatabaseQueue

    /// Opens (or creates) the store at `path`, moving an unreadable file aside.
    public init(path: String) throws(SchedulerError) {
        self.path = path
        do {
            let database = try Self.openChecked(path: path)
            self.database = database
            self.recovery = nil
        } catch let openError {
            let reason = String(describing: openError)
            guard FileManager.default.fileExists(atPath: path) else {
                throw SchedulerError(.storeFailure, "cannot create scheduler store at \(path): \(reason)")
            }
            let aside = try Self.setAside(path: path)
            do {
                self.database = try Self.openChecked(path: path)
            } catch {
                throw SchedulerError(.storeFailure, "cannot create a fresh scheduler store at \(path): \(error)")
            }
            self.recovery = StoreRecovery(setAsidePath: aside, reason: reason)
        }
    }

    private static func openChecked(path: String) throws -> DatabaseQueue {
        let database = try DatabaseQueue(path: path)
        try database.write { db in
            let check = try String.fetchOne(db, sql: "PRAGMA quick_check") ?? "no answer"
            guard check == "ok" else { throw SchedulerError(.storeFailure, "integrity check: \(check)") }
            try db.execute(
                sql: """
                    CREATE TABLE IF NOT EXISTS pending (identifier TEXT PRIMARY KEY NOT NULL, json TEXT NOT NULL);
                    CREATE TABLE IF NOT EXISTS history (identifier TEXT PRIMARY KEY NOT NULL, json TEXT NOT NULL);
                    """)
        }
        _ = try read(database)
        return database
    }

    private static func read(_ database: DatabaseQueue) throws -> SchedulerSnapshot {
        try database.read { db in
            var snapshot = SchedulerSnapshot()
            let decoder = JSONDecoder()
            for row in try Row.fetchAll(db, sql: "SELECT identifier, json FROM pending") {
                let identifier: String = row["identifier"]
                let json: String = row["json"]
                do {
                    snapshot.pending[identifier] = try decoder.decode(PendingTask.self, from: Data(json.utf8))
                } catch {
                    throw SchedulerError(.storeFailure, "pending request '\(identifier)' does not decode: \(error)")
                }
            }
            for row in try Row.fetchAll(db, sql: "SELECT identifier, json FROM history") {
                let identifier: String = row["identifier"]
                let json: String = row["json"]
                do {
                    snapshot.histories[identifier] = try decoder.decode(TaskHistory.self, from: Data(json.utf8))
                } catch {
                    throw SchedulerError(.storeFailure, "history of '\(identifier)' does not decode: \(error)")
                }
            }
            return snapshot
        }
    }

    private static func setAside(path: String) throws(SchedulerError) -> String {
        let files = FileManager.default
        var aside = path + ".corrupt"
        var counter = 0
        while files.fileExists(atPath: aside) {
            counter += 1
            aside = path + ".corrupt-\(counter)"
        }
        do {
            try files.moveItem(atPath: path, toPath: aside)
            for suffix in ["-wal", "-shm"] where files.fileExists(atPath: path + suffix) {
                try files.moveItem(atPath: path + suffix, toPath: aside + suffix)
            }
        } catch {
            throw SchedulerError(.storeFailure, "cannot move unreadable scheduler store \(path) aside: \(error)")
        }
        return aside
    }

    public func load() throws(SchedulerError) -> SchedulerSnapshot {
        do { return try Self.read(database) } catch { throw Self.wrap(error, "read") }
    }

    public func savePending(_ task: PendingTask) throws(SchedulerError) {
        try upsert(table: "pending", identifier: task.request.identifier, value: task)
    }

    public func removePending(_ identifier: String) throws(SchedulerError) {
        do {
            try database.write { try $0.execute(sql: "DELETE FROM pending WHERE identifier = ?", arguments: [identifier]) }
        } catch { throw Self.wrap(error, "delete pending '\(identifier)'") }
    }

    public func removeAllPending() throws(SchedulerError) {
        do { try database.write { try $0.execute(sql: "DELETE FROM pending") } } catch { throw Self.wrap(error, "delete all pending") }
    }

    public func saveHistory(_ history: TaskHistory) throws(SchedulerError) {
        try upsert(table: "history", identifier: history.identifier, value: history)
    }

    public func recordRun(_ history: TaskHistory, pending: PendingChange) throws(SchedulerError) {
        do {
            let historyJSON = try Self.json(history)
            let pendingJSON: String? = if case .save(let task) = pending { try Self.json(task) } else { nil }
            try database.write { db in
                try db.execute(sql: "INSERT OR REPLACE INTO history (identifier, json) VALUES (?, ?)", arguments: [history.identifier, historyJSON])
                switch pending {
                case .unchanged: break
                case .save(let task):
                    try db.execute(
                        sql: "INSERT OR REPLACE INTO pending (identifier, json) VALUES (?, ?)", arguments: [task.request.identifier, pendingJSON])
                case .remove:
                    try db.execute(sql: "DELETE FROM pending WHERE identifier = ?", arguments: [history.identifier])
                }
            }
        } catch { throw Self.wrap(error, "record the run of '\(history.identifier)'") }
    }

    private static func json(_ value: some Encodable) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }

    private func upsert(table: String, identifier: String, value: some Encodable) throws(SchedulerError) {
        do {
            let json = try Self.json(value)
            try database.write { db in
                try db.execute(sql: "INSERT OR REPLACE INTO \(table) (identifier, json) VALUES (?, ?)", arguments: [identifier, json])
            }
        } catch { throw Self.wrap(error, "write \(table) '\(identifier)'") }
    }

    private static func wrap(_ error: any Error, _ what: String) -> SchedulerError {
        if let error = error as? SchedulerError { return error }
        return SchedulerError(.storeFailure, "scheduler store: \(what): \(error)")
    }
}

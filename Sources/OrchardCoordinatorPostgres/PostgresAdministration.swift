public import Logging
import OrchardCoordinator
import PostgresNIO

/// Server-level chores outside a store: creating and dropping a database (set-up scripts, tests). Each call opens one
/// connection to the configuration's database (an administrative one such as `postgres`) and closes it.
public enum PostgresAdministration {
    /// Creates database `name` (letters, digits and '_' only). Throws ``OrchardCoordinator/StoreError/Code/duplicate``
    /// when it exists and ``OrchardCoordinator/StoreError/Code/io`` when the server cannot be reached.
    public static func createDatabase(_ name: String, using admin: PostgresStoreConfiguration, logger: Logger = Logger(label: "orchard.postgres")) async throws
    {
        try checkName(name)
        try await withConnection(admin, logger: logger, "create database \(name)") { connection in
            do {
                try await connection.rows(PostgresQuery(unsafeSQL: "CREATE DATABASE \"\(name)\""), logger: logger)
            } catch let error where PostgresErrors.sqlState(error) == "42P04" {
                throw StoreError(.duplicate, "database \(name) already exists")
            }
        }
    }

    /// Drops database `name` if it exists, ending its other sessions first.
    public static func dropDatabase(_ name: String, using admin: PostgresStoreConfiguration, logger: Logger = Logger(label: "orchard.postgres")) async throws {
        try checkName(name)
        try await withConnection(admin, logger: logger, "drop database \(name)") { connection in
            _ = try await connection.rows(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \"\(name)\" WITH (FORCE)"), logger: logger)
        }
    }

    /// The database names on the server that start with `prefix`.
    public static func databases(prefix: String, using admin: PostgresStoreConfiguration, logger: Logger = Logger(label: "orchard.postgres")) async throws
        -> [String]
    {
        try await withConnection(admin, logger: logger, "list databases") { connection in
            try await connection.rows("SELECT datname FROM pg_database ORDER BY datname", logger: logger)
                .map { try $0.decode(String.self) }.filter { $0.hasPrefix(prefix) }
        }
    }

    private static func checkName(_ name: String) throws {
        guard !name.isEmpty, name.utf8.count <= 63,
            name.unicodeScalars.allSatisfy({ $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_") })
        else {
            throw StoreError(.io, "'\(name)' is not a database name Orchard creates (1 to 63 ASCII letters, digits or '_')")
        }
    }

    private static func withConnection<T: Sendable>(
        _ configuration: PostgresStoreConfiguration, logger: Logger, _ what: String, _ body: (PostgresConnection) async throws -> T
    ) async throws -> T {
        let connection = try await PostgresStore.connect(configuration, logger: logger)
        do {
            let value = try await body(connection)
            try? await connection.close()
            return value
        } catch {
            try? await connection.close()
            throw PostgresErrors.map(error, what)
        }
    }
}

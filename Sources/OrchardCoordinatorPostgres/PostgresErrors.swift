import OrchardCoordinator
import PostgresNIO

/// Maps postgres-nio's errors to ``StoreError`` with a message that names the operation and the server's reason
/// (never the password, which no query or server message carries).
enum PostgresErrors {
    /// The SQLSTATE of a server error, if `error` is one.
    static func sqlState(_ error: any Error) -> String? {
        guard let error = error as? PSQLError, error.code == .server else { return nil }
        return error.serverInfo?[.sqlState]
    }

    /// Whether `error` is a unique violation (SQLSTATE 23505).
    static func isUniqueViolation(_ error: any Error) -> Bool { sqlState(error) == "23505" }

    /// Whether `error` is a foreign-key violation (SQLSTATE 23503).
    static func isForeignKeyViolation(_ error: any Error) -> Bool { sqlState(error) == "23503" }

    /// A short, safe account of `error` (postgres-nio's own `description` hides everything).
    static func detail(_ error: any Error) -> String {
        if let error = error as? PSQLError {
            var parts: [String] = []
            if let info = error.serverInfo {
                var server = info[.message] ?? "server error"
                if let state = info[.sqlState] { server = "\(server) (SQLSTATE \(state))" }
                if let detail = info[.detail] { server += "; \(detail)" }
                parts.append(server)
            } else {
                parts.append(describe(error.code))
            }
            if let underlying = error.underlying { parts.append(String(describing: underlying)) }
            return parts.joined(separator: ": ")
        }
        if let error = error as? PostgresDecodingError {
            return "column '\(error.columnName)' cannot be read as \(error.targetType) (\(error.code), PostgreSQL type \(error.postgresType))"
        }
        return String(describing: error)
    }

    private static func describe(_ code: PSQLError.Code) -> String {
        switch code {
        case .connectionError: "cannot connect"
        case .serverClosedConnection: "the server closed the connection"
        case .clientClosedConnection: "the connection was closed"
        case .poolClosed: "the store is shut down"
        case .sslUnsupported: "the server does not support TLS (sslmode asks for it)"
        case .failedToAddSSLHandler: "TLS could not be set up"
        case .uncleanShutdown: "the connection ended uncleanly"
        case .queryCancelled: "the query was cancelled"
        case .unsupportedAuthMechanism: "the server asks for an unsupported authentication method"
        case .authMechanismRequiresPassword: "the server asks for a password and none is configured"
        case .saslError: "SCRAM authentication failed"
        default: "\(code)"
        }
    }

    /// The store error for `error` raised while doing `what` (e.g. "record the report of key k").
    static func map(_ error: any Error, _ what: String) -> any Error {
        switch error {
        case let error as StoreError: return error
        case is CancellationError: return error
        case is PostgresDecodingError:
            return StoreError(.corrupt, "cannot \(what): a stored row cannot be decoded: \(detail(error))")
        case let psql as PSQLError:
            if psql.code == .server, let state = psql.serverInfo?[.sqlState] {
                if state == "23505" { return StoreError(.duplicate, "cannot \(what): \(detail(error))") }
                if state.hasPrefix("22") || state == "XX001" || state == "XX002" {
                    return StoreError(.corrupt, "cannot \(what): \(detail(error))")
                }
            }
            return StoreError(.io, "cannot \(what) in PostgreSQL: \(detail(error))")
        case let transaction as PostgresTransactionError:
            return map(transaction.closureError ?? transaction.commitError ?? transaction.beginError ?? error, what)
        default:
            // Connection failures surface as NIO errors or the pool's (e.g. its circuit breaker after repeated failures).
            return StoreError(.io, "cannot \(what) in PostgreSQL: \(detail(error))")
        }
    }
}

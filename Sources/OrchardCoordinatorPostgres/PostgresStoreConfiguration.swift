import Foundation
public import OrchardSupport

/// Where and how a ``PostgresStore`` connects, parsed from a URL
/// `postgres://user[:password]@host[:port]/database[?sslmode=…&sslrootcert=…&pool_size=…&connect_timeout=…]`.
///
/// `description` (and `debugDescription`, and the mirror `dump` uses) redacts the password, so a configuration may
/// be logged.
public struct PostgresStoreConfiguration: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// How the connection is encrypted, as libpq's `sslmode`.
    public enum TLSMode: String, Sendable, Hashable, CaseIterable {
        /// Plain TCP.
        case disable
        /// TLS when the server offers it, else plain TCP; the certificate is not verified.
        case prefer
        /// TLS or no connection; the certificate is not verified (encryption only, as libpq's `require`).
        case require
        /// TLS with the server certificate verified against `sslrootcert` (or the system's roots) and the host name.
        case verifyFull = "verify-full"
    }

    /// The server's host name or IP address.
    public var host: String
    /// The server's port.
    public var port: Int
    /// The role to log in as.
    public var user: String
    /// The role's password, if the server asks for one.
    public var password: String?
    /// The database holding the coordinator's tables.
    public var database: String
    /// How the connection is encrypted.
    public var tlsMode: TLSMode
    /// A PEM file of the certificate authorities trusted under ``TLSMode/verifyFull`` (the system's roots when nil).
    public var rootCertificatePath: String?
    /// Connections the store keeps open at most.
    public var poolSize: Int
    /// How long a connection attempt may take.
    public var connectTimeout: Duration
    /// The directory where report diffs are staged before their transaction (a temporary directory when nil).
    public var spoolDirectory: String?
    /// How long an instance's start waits for its id to be free (``PostgresStore/claimInstance(_:)``): long enough for
    /// the session of an instance killed a moment ago to end, so it can restart under its id at once.
    public var instanceClaimWait: Duration = .seconds(10)

    /// The pool size when the URL sets none.
    public static let defaultPoolSize = 8
    /// The port when the URL names none.
    public static let defaultPort = 5432
    /// The connection timeout (seconds) when the URL sets none.
    public static let defaultConnectTimeout: Duration = .seconds(10)

    /// Creates a configuration.
    public init(
        host: String, port: Int = Self.defaultPort, user: String, password: String? = nil, database: String, tlsMode: TLSMode = .prefer,
        rootCertificatePath: String? = nil, poolSize: Int = Self.defaultPoolSize, connectTimeout: Duration = Self.defaultConnectTimeout,
        spoolDirectory: String? = nil
    ) {
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.database = database
        self.tlsMode = tlsMode
        self.rootCertificatePath = rootCertificatePath
        self.poolSize = poolSize
        self.connectTimeout = connectTimeout
        self.spoolDirectory = spoolDirectory
    }

    /// Parses a `postgres://` or `postgresql://` URL; `password`, when given, replaces the URL's (so it can come from
    /// an environment variable or a file rather than the command line). Throws an error naming what is wrong.
    public init(url text: String, password: String? = nil) throws(PostgresURLError) {
        self = try Self.parse(text)
        if let password { self.password = password }
    }

    /// The URL with the password replaced by `***`.
    public var description: String {
        var userInfo = Self.percentEncoded(user)
        if password != nil { userInfo += ":***" }
        let hostPart = host.contains(":") ? "[\(host)]" : host
        var query = ["sslmode=\(tlsMode.rawValue)"]
        if let rootCertificatePath { query.append("sslrootcert=\(rootCertificatePath)") }
        if poolSize != Self.defaultPoolSize { query.append("pool_size=\(poolSize)") }
        if connectTimeout != Self.defaultConnectTimeout { query.append("connect_timeout=\(connectTimeout.secondsText)") }
        return "postgres://\(userInfo)@\(hostPart):\(port)/\(Self.percentEncoded(database))?\(query.joined(separator: "&"))"
    }

    /// The same as ``description``: the password is redacted.
    public var debugDescription: String { description }

    /// A mirror without the password.
    public var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "host": host, "port": port, "user": user, "password": password == nil ? "nil" : "***", "database": database,
                "tlsMode": tlsMode, "rootCertificatePath": rootCertificatePath as Any, "poolSize": poolSize,
                "connectTimeout": connectTimeout, "spoolDirectory": spoolDirectory as Any,
            ])
    }

    /// The same configuration for another database on the same server (e.g. a test database from an admin URL).
    public func database(_ name: String) -> PostgresStoreConfiguration {
        var copy = self
        copy.database = name
        return copy
    }

    /// Why the configuration cannot be used, or nil.
    public var problem: String? {
        if host.isEmpty { return "the host is empty" }
        if !(1...65_535).contains(port) { return "port \(port) is not between 1 and 65535" }
        if user.isEmpty { return "the user is empty" }
        if database.isEmpty { return "the database is empty" }
        if poolSize < 1 { return "pool size must be at least 1, not \(poolSize)" }
        if connectTimeout <= .zero { return "connect timeout must be a positive number of seconds, not \(connectTimeout.secondsText)" }
        if rootCertificatePath != nil && tlsMode != .verifyFull {
            // libpq would verify the chain (but not the host) here; Orchard keeps the modes distinct and says so.
            return "sslrootcert is used only with sslmode=verify-full, not sslmode=\(tlsMode.rawValue)"
        }
        return nil
    }

    private static let parameters = ["sslmode", "sslrootcert", "pool_size", "connect_timeout"]

    private static func parse(_ text: String) throws(PostgresURLError) -> PostgresStoreConfiguration {
        func fail(_ message: String) -> PostgresURLError { PostgresURLError(message) }
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard let schemeEnd = trimmed.range(of: "://") else {
            throw fail("the database URL must start with postgres:// or postgresql://")
        }
        let scheme = trimmed[..<schemeEnd.lowerBound].lowercased()
        guard scheme == "postgres" || scheme == "postgresql" else {
            throw fail("the database URL's scheme is '\(scheme)'; expected postgres:// or postgresql://")
        }
        var rest = trimmed[schemeEnd.upperBound...]
        var queryText: Substring = ""
        if let question = rest.firstIndex(of: "?") {
            queryText = rest[rest.index(after: question)...]
            rest = rest[..<question]
        }
        if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
        let authority: Substring
        let path: Substring
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            path = rest[rest.index(after: slash)...]
        } else {
            authority = rest
            path = ""
        }

        // user[:password]@host[:port]; the last '@' ends the user information.
        guard let at = authority.lastIndex(of: "@") else {
            throw fail("the database URL names no user (expected postgres://user[:password]@host[:port]/database)")
        }
        let userInfo = authority[..<at]
        let hostPort = authority[authority.index(after: at)...]
        let userText: Substring
        var password: String?
        if let colon = userInfo.firstIndex(of: ":") {
            userText = userInfo[..<colon]
            guard let decoded = String(userInfo[userInfo.index(after: colon)...]).removingPercentEncoding else {
                throw fail("the database URL's password has an invalid percent escape")
            }
            password = decoded
        } else {
            userText = userInfo
        }
        guard let user = String(userText).removingPercentEncoding else { throw fail("the database URL's user has an invalid percent escape") }
        guard !user.isEmpty else { throw fail("the database URL names no user (expected postgres://user[:password]@host[:port]/database)") }

        let host: String
        var portText: Substring?
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else { throw fail("the database URL's IPv6 host has no closing ']'") }
            host = String(hostPort[hostPort.index(after: hostPort.startIndex)..<close])
            let after = hostPort[hostPort.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw fail("the database URL has '\(after)' after its IPv6 host; expected ':port'") }
                portText = after.dropFirst()
            }
        } else if let colon = hostPort.lastIndex(of: ":") {
            host = String(hostPort[..<colon])
            portText = hostPort[hostPort.index(after: colon)...]
        } else {
            host = String(hostPort)
        }
        guard !host.isEmpty else { throw fail("the database URL names no host (expected postgres://user[:password]@host[:port]/database)") }
        guard !host.contains(",") else { throw fail("the database URL names several hosts ('\(host)'); Orchard connects to one") }
        var port = defaultPort
        if let portText {
            guard let value = Int(portText), (1...65_535).contains(value) else {
                throw fail("the database URL's port '\(portText)' is not a number between 1 and 65535")
            }
            port = value
        }

        guard let database = String(path).removingPercentEncoding else { throw fail("the database URL's database name has an invalid percent escape") }
        guard !database.isEmpty else { throw fail("the database URL names no database (expected postgres://user[:password]@host[:port]/database)") }
        guard !database.contains("/") else { throw fail("the database URL's path '\(database)' is not a single database name") }

        var configuration = PostgresStoreConfiguration(host: host, port: port, user: user, password: password, database: database)
        var seen: Set<String> = []
        for pair in queryText.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, let name = String(parts[0]).removingPercentEncoding,
                let value = String(parts[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding
            else {
                throw fail("the database URL's parameter '\(pair)' is not name=value")
            }
            guard seen.insert(name).inserted else { throw fail("the database URL sets '\(name)' twice") }
            switch name {
            case "sslmode":
                guard let mode = TLSMode(rawValue: value) else {
                    throw fail("unknown sslmode '\(value)' in the database URL; expected disable, prefer, require or verify-full")
                }
                configuration.tlsMode = mode
            case "sslrootcert":
                guard !value.isEmpty else { throw fail("the database URL's sslrootcert is empty; expected the path of a PEM file") }
                configuration.rootCertificatePath = value
            case "pool_size":
                guard let size = Int(value), (1...1_000).contains(size) else {
                    throw fail("the database URL's pool_size '\(value)' is not a number between 1 and 1000")
                }
                configuration.poolSize = size
            case "connect_timeout":
                guard let seconds = Double(value), seconds > 0, seconds.isFinite else {
                    throw fail("the database URL's connect_timeout '\(value)' is not a positive number of seconds")
                }
                configuration.connectTimeout = .seconds(seconds)
            default:
                throw fail("unknown parameter '\(name)' in the database URL; Orchard reads \(parameters.joined(separator: ", "))")
            }
        }
        if let problem = configuration.problem { throw fail("the database URL does not work: \(problem)") }
        return configuration
    }

    private static func percentEncoded(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }

}

/// A database URL that cannot be used; the message names what is wrong (never the password).
public struct PostgresURLError: OrchardError, Hashable {
    /// The kind of error (one: the URL is invalid).
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        /// The URL is malformed or asks for something unsupported.
        public static let invalidURL = Code()
        /// `invalid_url`.
        public var description: String { "invalid_url" }
    }

    /// The kind.
    public var code: Code { .invalidURL }
    /// What is wrong.
    public var message: String

    /// Creates an error.
    public init(_ message: String) { self.message = message }
}

import Crypto
import Foundation
public import OrchardSupport
import Synchronization

/// Who may see the dashboard: one-time login tokens (printed by `orchard serve` as a login URL) that are exchanged
/// for session cookies. A pure value: time is passed in, secrets come from swift-crypto (or are given, in tests).
///
/// A login token is redeemed at most once and only before it expires; a session is valid until it expires. Both
/// live only in memory (a restart signs every browser out). At most ``maximumSessions`` sessions are kept: beyond
/// that the oldest is dropped.
public struct DashboardAccess: Sendable {
    /// How long a login token may wait before it is used.
    public var loginLifetime: Duration
    /// How long a session lasts after login.
    public var sessionLifetime: Duration
    /// The most sessions kept at once.
    public var maximumSessions: Int
    private var logins: [String: WallInstant] = [:]
    private var sessions: [String: WallInstant] = [:]

    /// Creates an access table with no tokens and no sessions.
    public init(loginLifetime: Duration = .seconds(24 * 3600), sessionLifetime: Duration = .seconds(12 * 3600), maximumSessions: Int = 1000) {
        self.loginLifetime = loginLifetime
        self.sessionLifetime = sessionLifetime
        self.maximumSessions = maximumSessions
    }

    /// A fresh random secret: 32 bytes from swift-crypto, as 64 lowercase hex digits (valid in a URL and a cookie).
    public static func randomSecret() -> String {
        SymmetricKey(size: .bits256).withUnsafeBytes { bytes in bytes.map { String(format: "%02x", $0) }.joined() }
    }

    /// Issues a login token valid from `now` for ``loginLifetime``.
    public mutating func issueLoginToken(now: WallInstant, secret: String = DashboardAccess.randomSecret()) -> String {
        logins = logins.filter { $0.value > now }
        logins[secret] = now.advanced(by: loginLifetime)
        return secret
    }

    /// Redeems a login token: a new session's secret, or nil when the token is unknown, used or expired (it is
    /// forgotten either way).
    public mutating func redeem(loginToken: String, now: WallInstant, session: String = DashboardAccess.randomSecret()) -> String? {
        guard let expiry = logins.removeValue(forKey: loginToken), now < expiry else { return nil }
        return startSession(now: now, secret: session)
    }

    /// Starts a session at `now` (after a login with the admin token itself) and returns its secret.
    public mutating func startSession(now: WallInstant, secret: String = DashboardAccess.randomSecret()) -> String {
        sessions = sessions.filter { $0.value > now }
        while sessions.count >= maximumSessions, let oldest = sessions.min(by: { $0.value < $1.value })?.key {
            sessions[oldest] = nil
        }
        sessions[secret] = now.advanced(by: sessionLifetime)
        return secret
    }

    /// Whether `session` is a live session at `now`.
    public func isValid(session: String?, now: WallInstant) -> Bool {
        guard let session, let expiry = sessions[session] else { return false }
        return now < expiry
    }

    /// Ends a session (sign-out).
    public mutating func end(session: String) {
        sessions[session] = nil
    }

    /// Login tokens not yet used (expired ones included until the next issue).
    public var pendingLoginTokens: Int { logins.count }
    /// Sessions kept (expired ones included until the next login).
    public var sessionCount: Int { sessions.count }
}

/// The dashboard's shared state in a running coordinator: its ``DashboardAccess`` on the coordinator's clock (the
/// cycle history it shows is the store's: ``Coordinator/cycles(processID:)``).
public final class Dashboard: Sendable {
    /// The cookie that carries a dashboard session.
    public static let cookieName = "orchard_dashboard"
    private let access: Mutex<DashboardAccess>
    private let clock: any WallClock

    /// Creates the dashboard's state.
    public init(access: DashboardAccess = DashboardAccess(), clock: any WallClock = SystemClock()) {
        self.access = Mutex(access)
        self.clock = clock
    }

    /// Issues a one-time login token (for the login URL `orchard serve` prints).
    public func issueLoginToken() -> String {
        let now = clock.now
        return access.withLock { $0.issueLoginToken(now: now) }
    }

    /// The login URL for `token` on a server at `baseURL` (e.g. `http://127.0.0.1:8080`).
    public static func loginURL(base: String, token: String) -> String {
        "\(base)/dashboard/login?token=\(token)"
    }

    /// Redeems a login token for a new session, or nil.
    func redeem(loginToken: String) -> String? {
        let now = clock.now
        return access.withLock { $0.redeem(loginToken: loginToken, now: now) }
    }

    /// Starts a session (after a login with the admin token).
    func startSession() -> String {
        let now = clock.now
        return access.withLock { $0.startSession(now: now) }
    }

    /// Whether `session` is live now.
    func isValid(session: String?) -> Bool {
        guard let session else { return false }
        let now = clock.now
        return access.withLock { $0.isValid(session: session, now: now) }
    }

    /// Ends a session.
    func end(session: String) {
        access.withLock { $0.end(session: session) }
    }

    /// How long a session lasts, in whole seconds (the cookie's Max-Age).
    var sessionSeconds: Int { Int(access.withLock { $0.sessionLifetime }.components.seconds) }
}

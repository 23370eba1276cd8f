import Foundation
import JWTKit
public import OrchardProtocol
import Synchronization

/// Claims of a device's JWT: `sub` names the device; `exp`, `iss` and `aud` are checked when present or required.
struct DeviceClaims: JWTPayload {
    var sub: SubjectClaim
    var exp: ExpirationClaim?
    var iss: IssuerClaim?
    var aud: AudienceClaim?

    // Expiry is checked against the coordinator's injected clock, not here.
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Claims of a coordinator-issued session token: `sub` is the worker id, `process_id` the process it was issued for.
struct SessionClaims: JWTPayload {
    var sub: SubjectClaim
    var exp: ExpirationClaim
    var processID: String
    var processName: String
    var processVersion: String

    enum CodingKeys: String, CodingKey {
        case sub, exp
        case processID = "process_id"
        case processName = "process_name"
        case processVersion = "process_version"
    }

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Verifies device tokens for one process's ``AuthenticationConfig``.
struct DeviceAuthenticator: Sendable {
    let config: AuthenticationConfig
    let keys: JWTKeyCollection?

    init(_ config: AuthenticationConfig) async throws(CoordinatorError) {
        self.config = config
        switch config.mode {
        case .hs256:
            let keys = JWTKeyCollection()
            await keys.add(hmac: HMACKey(from: config.secret ?? ""), digestAlgorithm: .sha256)
            self.keys = keys
        case .rs256:
            let key: JWTKit.Insecure.RSA.PublicKey
            do {
                key = try JWTKit.Insecure.RSA.PublicKey(pem: config.publicKeyPEM ?? "")
            } catch {
                throw CoordinatorError(
                    .invalidConfiguration, "server_config.authentication.public_key_pem is not an RSA public key of at least 2048 bits: \(error)")
            }
            let keys = JWTKeyCollection()
            await keys.add(rsa: key, digestAlgorithm: .sha256)
            self.keys = keys
        default:
            self.keys = nil
        }
    }

    /// A verified device identity: the token's subject and the issuer it was verified under.
    struct Identity: Sendable, Hashable {
        var issuer: String
        var subject: String
    }

    /// The device's identity, or nil in open mode.
    func identity(of token: String?, now: Date) async throws(CoordinatorError) -> Identity? {
        guard let keys else { return nil }
        guard let token, !token.isEmpty else { throw .unauthorized("auth_token is required for \(config.mode) authentication") }
        let claims: DeviceClaims
        do {
            claims = try await keys.verify(token, as: DeviceClaims.self)
        } catch {
            throw .unauthorized("auth_token is not a valid \(config.mode) JWT for this process")
        }
        if let exp = claims.exp, exp.value <= now { throw .unauthorized("auth_token expired") }
        if let issuer = config.issuer, claims.iss?.value != issuer { throw .unauthorized("auth_token issuer is not '\(issuer)'") }
        if let audience = config.audience, !(claims.aud?.value.contains(audience) ?? false) {
            throw .unauthorized("auth_token audience does not include '\(audience)'")
        }
        guard !claims.sub.value.isEmpty else { throw .unauthorized("auth_token has an empty subject") }
        return Identity(issuer: config.issuer ?? claims.iss?.value ?? "", subject: claims.sub.value)
    }
}

/// Issues and verifies session tokens (HS256 with a secret kept in the store, so tokens survive restarts).
///
/// A device presents its token on every request, so verified tokens are remembered (up to `cacheCapacity`,
/// then the memory starts over) and a repeat costs a dictionary lookup instead of a signature check and a
/// JSON decode; the expiry is still checked against the clock every time.
final class SessionIssuer: Sendable {
    let keys: JWTKeyCollection
    private let verified: Mutex<[String: (session: DeviceSession, expires: Date)]>
    private let cacheCapacity: Int

    init(secret: [UInt8], cacheCapacity: Int = 100_000) async {
        keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        verified = Mutex([:])
        self.cacheCapacity = cacheCapacity
    }

    /// A token for `session`, valid until `expires`.
    func issue(_ session: DeviceSession, expires: Date) async throws(CoordinatorError) -> String {
        let claims = SessionClaims(
            sub: SubjectClaim(value: session.workerID), exp: ExpirationClaim(value: expires),
            processID: session.processID, processName: session.processName, processVersion: session.processVersion.description
        )
        let token: String
        do {
            token = try await keys.sign(claims)
        } catch {
            throw .internalError("cannot sign a session token: \(error)")
        }
        // This process just signed it: a device's first request after authenticating (its admission to a cycle)
        // need not verify the signature again. The token carries `expires` exactly (seconds as a JSON number).
        remember(token, session, expires: expires)
        return token
    }

    private func remember(_ token: String, _ session: DeviceSession, expires: Date) {
        let capacity = cacheCapacity
        verified.withLock { cache in
            if cache.count >= capacity { cache.removeAll(keepingCapacity: true) }
            cache[token] = (session, expires)
        }
    }

    /// The session a token proves (tokens from before sessions named their process are invalid).
    func session(from token: String, now: Date) async throws(CoordinatorError) -> DeviceSession {
        if let known = verified.withLock({ $0[token] }) {
            guard known.expires > now else { throw .unauthorized("session token expired; authenticate again") }
            return known.session
        }
        let claims: SessionClaims
        do {
            claims = try await keys.verify(token, as: SessionClaims.self)
        } catch {
            throw .unauthorized("session token is invalid; authenticate again")
        }
        guard claims.exp.value > now else { throw .unauthorized("session token expired; authenticate again") }
        guard let version = SemanticVersion(claims.processVersion) else { throw .unauthorized("session token is invalid; authenticate again") }
        let session = DeviceSession(workerID: claims.sub.value, processID: claims.processID, processName: claims.processName, processVersion: version)
        remember(token, session, expires: claims.exp.value)
        return session
    }
}

/// What a session token proves: the worker and the one process (id, name and version) it was issued for.
public struct DeviceSession: Sendable, Hashable {
    /// The worker id.
    public var workerID: String
    /// The id of the process the session was issued for.
    public var processID: String
    /// That process's name.
    public var processName: String
    /// That process's version.
    public var processVersion: SemanticVersion

    /// Creates a session.
    public init(workerID: String, processID: String, processName: String, processVersion: SemanticVersion) {
        self.workerID = workerID
        self.processID = processID
        self.processName = processName
        self.processVersion = processVersion
    }

    /// `process 'name' version v`, for messages.
    var processDescription: String { "process '\(processName)' version \(processVersion)" }
}

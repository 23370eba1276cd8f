import Crypto
import CryptoExtras
public import Foundation
import JWTKit
public import OrchardSupport

/// Why a device token cannot be issued, or its secret or key cannot be read. Messages name the offending item (an
/// option, a file, an environment variable) and never hold the secret or key itself.
public struct DeviceTokenError: OrchardError, Hashable {
    /// The kind of failure.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case conflictingSources, missingSecret, unreadableFile, invalidSecret, invalidKey, invalidSubject, invalidLifetime
            case invalidClaim, signingFailed
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        /// The secret or key is given more than one way (a file and an environment variable).
        public static let conflictingSources = Code(.conflictingSources)
        /// The environment variable that should hold the secret or key is not set.
        public static let missingSecret = Code(.missingSecret)
        /// The file holding the secret or key cannot be read, or is not UTF-8 text.
        public static let unreadableFile = Code(.unreadableFile)
        /// The HMAC secret is empty, shorter than 32 bytes, or not UTF-8 text.
        public static let invalidSecret = Code(.invalidSecret)
        /// The RSA private key is not PEM, not an RSA private key, or shorter than 2048 bits.
        public static let invalidKey = Code(.invalidKey)
        /// The subject (the device's name) is empty.
        public static let invalidSubject = Code(.invalidSubject)
        /// The lifetime does not parse, is not positive, or exceeds ``DeviceTokenIssuer/maximumLifetime``.
        public static let invalidLifetime = Code(.invalidLifetime)
        /// An issuer or audience was given empty.
        public static let invalidClaim = Code(.invalidClaim)
        /// The JWT library failed to sign.
        public static let signingFailed = Code(.signingFailed)
        /// The code in snake case, e.g. `invalid_secret`.
        public var description: String { kind.snakeCased }
    }

    /// The kind.
    public var code: Code
    /// What went wrong, naming the item to fix (never its secret content).
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
}

/// How a device token is signed: the two modes of `AuthenticationConfig` that take a JWT.
public enum DeviceTokenAlgorithm: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// HMAC-SHA256 with the secret shared with the coordinator (`server_config.authentication.secret`).
    case hs256
    /// RSASSA-PKCS1-v1_5 with SHA-256, signed with the RSA private key whose public half the coordinator holds
    /// (`server_config.authentication.public_key_pem`).
    case rs256

    public var description: String { rawValue }
}

/// Where a device token's secret (hs256) or private key (rs256) is read from: a file or an environment variable —
/// never a command-line argument, which every local user can read (`ps`, `/proc/<pid>/cmdline`).
public struct DeviceTokenKeySource: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable {
        case file(path: String, name: String)
        case environment(variable: String)
    }
    private let kind: Kind

    /// The file at `path`; `name` is what messages call it (an option such as `--secret-file`).
    public static func file(_ path: String, name: String = "file") -> DeviceTokenKeySource {
        DeviceTokenKeySource(kind: .file(path: path, name: name))
    }

    /// The environment variable `variable`.
    public static func environment(_ variable: String) -> DeviceTokenKeySource {
        DeviceTokenKeySource(kind: .environment(variable: variable))
    }

    /// `--secret-file '/path'` or the variable's name, for messages.
    public var description: String {
        switch kind {
        case .file(let path, let name): "\(name) '\(path)'"
        case .environment(let variable): variable
        }
    }

    /// The one source among a file option and an environment-variable option, or the default variable when neither
    /// is given.
    /// - Parameters:
    ///   - file: The file's path, if given, and the option that gave it (for messages).
    ///   - environment: The variable's name, if given, and the option that gave it.
    ///   - defaultVariable: The variable read when neither is given.
    ///   - material: What the source holds, for messages (`the secret`, `the private key`).
    /// - Throws: ``DeviceTokenError/Code/conflictingSources`` when both are given.
    public static func choose(
        file: (path: String, option: String)?, environment: (variable: String, option: String)?, defaultVariable: String,
        material: String = "the secret"
    ) throws(DeviceTokenError) -> DeviceTokenKeySource {
        switch (file, environment) {
        case (let file?, let environment?):
            throw DeviceTokenError(.conflictingSources, "\(file.option) and \(environment.option) are both given; give \(material) one way")
        case (let file?, nil): return .file(file.path, name: file.option)
        case (nil, let environment?): return .environment(environment.variable)
        case (nil, nil): return .environment(defaultVariable)
        }
    }

    /// The text the source holds, with trailing line breaks removed (as `$(cat file)` removes them, so a file
    /// written by `echo` holds the same secret as one written by `printf %s`). Nothing else is trimmed.
    /// - Parameter environment: The process's environment (injected for tests).
    /// - Throws: ``DeviceTokenError`` (`missing_secret`, `unreadable_file`) when the variable is not set or the
    ///   file cannot be read or is not UTF-8 text.
    public func read(environment: [String: String] = ProcessInfo.processInfo.environment) throws(DeviceTokenError) -> String {
        let text: String
        switch kind {
        case .file(let path, _):
            let data: Data
            do throws(FileAccessError) { data = try LocalFile.read(path) } catch {
                throw DeviceTokenError(.unreadableFile, "\(self): \(error.message)")
            }
            guard let decoded = String(data: data, encoding: .utf8) else {
                throw DeviceTokenError(.unreadableFile, "\(self): not UTF-8 text")
            }
            text = decoded
        case .environment(let variable):
            guard let value = environment[variable] else {
                throw DeviceTokenError(.missingSecret, "the environment variable \(variable) is not set")
            }
            text = value
        }
        var trimmed = Substring(text)
        while let last = trimmed.unicodeScalars.last, last == "\n" || last == "\r" { trimmed = trimmed.dropLast() }
        return String(trimmed)
    }
}

/// Signs device tokens: the JWTs a device presents to `/authenticate` for a process whose
/// `AuthenticationConfig` mode is hs256 or rs256.
///
/// A token carries `sub` (the device), `iat`, `exp` (`iat` + the lifetime, in whole seconds) and, when given, `iss`
/// and `aud`, which the coordinator checks against the process's `issuer` and `audience`. The key material is checked
/// here by the coordinator's own rules (an HMAC secret of at least 32 bytes; an RSA key of at least 2048 bits), so a
/// token this issuer signs is one a coordinator configured with the matching secret or public key can accept.
///
/// ```swift
/// let issuer = try DeviceTokenIssuer(hs256Secret: secret)
/// let token = try await issuer.issue(subject: "device-42", lifetime: .seconds(86_400), now: Date())
/// ```
public struct DeviceTokenIssuer: Sendable {
    /// The longest lifetime a token may have: 400 days. The coordinator cannot revoke a device token before its
    /// `exp` (it keeps no revocation list), so a leaked token works until then.
    public static let maximumLifetime: Duration = .seconds(400 * 86_400)
    /// The shortest HMAC secret, in bytes (the coordinator refuses a shorter `server_config.authentication.secret`).
    public static let minimumSecretBytes = 32
    /// The shortest RSA key, in bits (the coordinator refuses a smaller `public_key_pem`).
    public static let minimumRSABits = 2048

    private enum Key: Sendable {
        case hmac([UInt8])
        case rsa(JWTKit.Insecure.RSA.PrivateKey)
    }

    /// The algorithm tokens are signed with.
    public let algorithm: DeviceTokenAlgorithm
    private let key: Key

    /// An hs256 issuer.
    /// - Parameters:
    ///   - secret: The secret's UTF-8 text, exactly as the process's `server_config.authentication.secret` holds it.
    ///   - source: Where it came from, for messages.
    /// - Throws: ``DeviceTokenError/Code/invalidSecret`` for an empty secret or one shorter than 32 bytes.
    public init(hs256Secret secret: String, source: String = "the secret") throws(DeviceTokenError) {
        let bytes = Array(secret.utf8)
        guard !bytes.isEmpty else { throw DeviceTokenError(.invalidSecret, "\(source) holds an empty secret") }
        guard bytes.count >= Self.minimumSecretBytes else {
            throw DeviceTokenError(
                .invalidSecret,
                "\(source) holds a secret of \(bytes.count) bytes; an hs256 secret must be at least \(Self.minimumSecretBytes) bytes (the coordinator's rule for server_config.authentication.secret)"
            )
        }
        algorithm = .hs256
        key = .hmac(bytes)
    }

    /// An rs256 issuer.
    /// - Parameters:
    ///   - pem: The RSA private key, PEM (PKCS #1 `RSA PRIVATE KEY` or PKCS #8 `PRIVATE KEY`, unencrypted).
    ///   - source: Where it came from, for messages.
    /// - Throws: ``DeviceTokenError/Code/invalidKey`` for text that is not PEM, a PEM block that is not an RSA
    ///   private key (a public key, a certificate, an EC key, an encrypted key), or an RSA key under 2048 bits.
    public init(rs256PrivateKeyPEM pem: String, source: String = "the private key") throws(DeviceTokenError) {
        algorithm = .rs256
        key = .rsa(try Self.rsaKey(pem, source: source))
    }

    /// An issuer for `algorithm` with the text read from `source` (the secret for hs256, the PEM key for rs256).
    public init(algorithm: DeviceTokenAlgorithm, keyMaterial: String, source: String) throws(DeviceTokenError) {
        switch algorithm {
        case .hs256: try self.init(hs256Secret: keyMaterial, source: source)
        case .rs256: try self.init(rs256PrivateKeyPEM: keyMaterial, source: source)
        }
    }

    /// An issuer for `algorithm` with the secret or key read from `source`.
    public init(algorithm: DeviceTokenAlgorithm, source: DeviceTokenKeySource, environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(DeviceTokenError)
    {
        try self.init(algorithm: algorithm, keyMaterial: try source.read(environment: environment), source: source.description)
    }

    private static func rsaKey(_ pem: String, source: String) throws(DeviceTokenError) -> JWTKit.Insecure.RSA.PrivateKey {
        guard let label = pemLabel(pem) else {
            throw DeviceTokenError(
                .invalidKey, "\(source) is not PEM: expected an RSA private key between '-----BEGIN PRIVATE KEY-----' (or 'RSA PRIVATE KEY') and its END line")
        }
        switch label {
        case "PRIVATE KEY", "RSA PRIVATE KEY": break
        case "PUBLIC KEY", "RSA PUBLIC KEY", "CERTIFICATE":
            throw DeviceTokenError(
                .invalidKey,
                "\(source) holds a PEM '\(label)', not a private key; rs256 signs with the RSA private key whose public half is the process's public_key_pem")
        case "ENCRYPTED PRIVATE KEY":
            throw DeviceTokenError(
                .invalidKey, "\(source) holds an encrypted private key; give the RSA private key unencrypted (e.g. `openssl pkey -in key.pem -out plain.pem`)")
        case "EC PRIVATE KEY":
            throw DeviceTokenError(
                .invalidKey, "\(source) holds an EC private key, not an RSA one; rs256 needs an RSA private key of at least \(minimumRSABits) bits")
        default:
            throw DeviceTokenError(.invalidKey, "\(source) holds a PEM '\(label)', not an RSA private key ('PRIVATE KEY' or 'RSA PRIVATE KEY')")
        }
        let parsed: _RSA.Signing.PrivateKey
        do {
            // Keys down to 1024 bits parse, so a short key is refused with its size.
            parsed = try _RSA.Signing.PrivateKey(unsafePEMRepresentation: pem)
        } catch {
            if isECKey(pem) {
                throw DeviceTokenError(
                    .invalidKey, "\(source) holds an EC private key, not an RSA one; rs256 needs an RSA private key of at least \(minimumRSABits) bits")
            }
            if case CryptoKitError.incorrectParameterSize = error {
                throw DeviceTokenError(
                    .invalidKey,
                    "\(source) holds an RSA key shorter than 1024 bits; rs256 needs at least \(minimumRSABits) bits (the coordinator's rule for public_key_pem)"
                )
            }
            throw DeviceTokenError(.invalidKey, "\(source) holds no readable RSA private key: rs256 needs an unencrypted RSA key as PKCS #1 or PKCS #8 PEM")
        }
        guard parsed.keySizeInBits >= minimumRSABits else {
            throw DeviceTokenError(
                .invalidKey,
                "\(source) holds a \(parsed.keySizeInBits)-bit RSA key; rs256 needs at least \(minimumRSABits) bits (the coordinator's rule for public_key_pem)"
            )
        }
        do {
            return try JWTKit.Insecure.RSA.PrivateKey(backing: parsed)
        } catch {
            throw DeviceTokenError(.invalidKey, "\(source) holds an RSA private key the JWT library refuses")
        }
    }

    /// The label of the first PEM block (`PRIVATE KEY` of `-----BEGIN PRIVATE KEY-----`), nil when there is none
    /// with a matching END line.
    private static func pemLabel(_ text: String) -> String? {
        guard let begin = text.range(of: "-----BEGIN ") else { return nil }
        guard let close = text.range(of: "-----", range: begin.upperBound..<text.endIndex) else { return nil }
        let label = String(text[begin.upperBound..<close.lowerBound])
        guard !label.isEmpty, !label.contains("\n"), text.range(of: "-----END \(label)-----", range: close.upperBound..<text.endIndex) != nil else {
            return nil
        }
        return label
    }

    private static func isECKey(_ pem: String) -> Bool {
        (try? P256.Signing.PrivateKey(pemRepresentation: pem)) != nil || (try? P384.Signing.PrivateKey(pemRepresentation: pem)) != nil
            || (try? P521.Signing.PrivateKey(pemRepresentation: pem)) != nil
    }

    /// Parses a lifetime written as a whole number and a unit: `90s`, `30m`, `24h`, `7d`. A bare number is refused
    /// (it is unclear whether `24` means seconds or hours).
    /// - Parameters:
    ///   - text: The lifetime as written.
    ///   - name: What messages call the value (an option such as `--lifetime`).
    /// - Throws: ``DeviceTokenError/Code/invalidLifetime`` for anything else, a zero or negative lifetime, or one
    ///   over ``maximumLifetime``.
    public static func parseLifetime(_ text: String, name: String = "lifetime") throws(DeviceTokenError) -> Duration {
        let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        let form = "a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"
        guard let unit = text.last, let seconds = units[unit] else {
            if !text.isEmpty, text.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == "-" || $0 == "+") }) {
                throw DeviceTokenError(.invalidLifetime, "\(name) '\(text)' has no unit: write \(form)")
            }
            throw DeviceTokenError(.invalidLifetime, "\(name) '\(text)' is not a lifetime: write \(form)")
        }
        let digits = text.dropLast()
        let negative = digits.hasPrefix("-")
        let magnitude = negative || digits.hasPrefix("+") ? digits.dropFirst() : digits
        guard !magnitude.isEmpty, magnitude.allSatisfy({ $0.isASCII && $0.isNumber }) else {
            throw DeviceTokenError(.invalidLifetime, "\(name) '\(text)' is not a lifetime: write \(form)")
        }
        // Only digits are left: a number Int64 cannot hold is too long a lifetime, not a malformed one.
        let count = Int64(magnitude) ?? Int64.max
        guard !negative, count > 0 else { throw DeviceTokenError(.invalidLifetime, "\(name) '\(text)' must be more than zero") }
        let (total, overflow) = count.multipliedReportingOverflow(by: seconds)
        let lifetime: Duration = overflow ? .seconds(Int64.max) : .seconds(total)
        try checkLifetime(lifetime, name: "\(name) '\(text)'")
        return lifetime
    }

    /// Refuses a lifetime that is not positive or exceeds ``maximumLifetime``.
    private static func checkLifetime(_ lifetime: Duration, name: String) throws(DeviceTokenError) {
        guard lifetime > .zero else { throw DeviceTokenError(.invalidLifetime, "\(name) must be more than zero") }
        guard lifetime >= .seconds(1) else { throw DeviceTokenError(.invalidLifetime, "\(name) must be at least one second (exp is in whole seconds)") }
        guard lifetime <= maximumLifetime else {
            throw DeviceTokenError(
                .invalidLifetime,
                "\(name) is more than 400 days: the coordinator cannot revoke a device token before it expires, so a longer one would outlive any rotation of devices' credentials (hours to a day is recommended)"
            )
        }
    }

    /// A signed token.
    public struct Token: Sendable, Hashable {
        /// The compact JWT (`header.payload.signature`).
        public var token: String
        /// Its `sub`.
        public var subject: String
        /// Its `iat`.
        public var issuedAt: Date
        /// Its `exp`.
        public var expiresAt: Date
        /// Its algorithm.
        public var algorithm: DeviceTokenAlgorithm
        /// Its `iss`, if any.
        public var issuer: String?
        /// Its `aud`, if any.
        public var audience: String?
    }

    /// Signs a token for `subject`, valid from `now` for `lifetime` (`iat` and `exp` in whole seconds: `now` is
    /// rounded down).
    /// - Parameters:
    ///   - subject: The device's identity (`sub`); the coordinator maps it to a stable worker.
    ///   - lifetime: How long the token is accepted: more than zero, at most ``maximumLifetime``.
    ///   - issuer: `iss`, if the process's `issuer` requires one.
    ///   - audience: `aud`, if the process's `audience` requires one.
    ///   - now: The issue time (injected: pass the wall clock's date).
    /// - Throws: ``DeviceTokenError`` for an empty subject, issuer or audience, or a lifetime out of range.
    public func issue(subject: String, lifetime: Duration, issuer: String? = nil, audience: String? = nil, now: Date) async throws(DeviceTokenError) -> Token {
        guard !subject.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else {
            throw DeviceTokenError(.invalidSubject, "subject is empty: it names the device (the token's sub claim)")
        }
        try Self.checkLifetime(lifetime, name: "lifetime \(lifetime)")
        if let issuer, issuer.isEmpty {
            throw DeviceTokenError(.invalidClaim, "issuer is empty: leave it out, or give the process's server_config.authentication.issuer")
        }
        if let audience, audience.isEmpty {
            throw DeviceTokenError(.invalidClaim, "audience is empty: leave it out, or give the process's server_config.authentication.audience")
        }
        let issuedAt = Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down))
        let expiresAt = issuedAt.addingTimeInterval(Double(lifetime.components.seconds))
        let claims = IssuedDeviceClaims(
            sub: SubjectClaim(value: subject), iat: IssuedAtClaim(value: issuedAt), exp: ExpirationClaim(value: expiresAt),
            iss: issuer.map { IssuerClaim(value: $0) }, aud: audience.map { AudienceClaim(value: [$0]) }
        )
        let keys = JWTKeyCollection()
        switch key {
        case .hmac(let secret): await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        case .rsa(let privateKey): await keys.add(rsa: privateKey, digestAlgorithm: .sha256)
        }
        let token: String
        do {
            token = try await keys.sign(claims)
        } catch {
            throw DeviceTokenError(.signingFailed, "cannot sign the \(algorithm) token: \(type(of: error))")
        }
        return Token(token: token, subject: subject, issuedAt: issuedAt, expiresAt: expiresAt, algorithm: algorithm, issuer: issuer, audience: audience)
    }
}

// The key material never shows in `print`, `dump`, string interpolation or a debugger's summary.
extension DeviceTokenIssuer: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String { "DeviceTokenIssuer(\(algorithm), key redacted)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["algorithm": algorithm]) }
}

/// The claims ``DeviceTokenIssuer`` signs: those the coordinator's `DeviceClaims` reads, and `iat`.
private struct IssuedDeviceClaims: JWTPayload {
    var sub: SubjectClaim
    var iat: IssuedAtClaim
    var exp: ExpirationClaim
    var iss: IssuerClaim?
    var aud: AudienceClaim?

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

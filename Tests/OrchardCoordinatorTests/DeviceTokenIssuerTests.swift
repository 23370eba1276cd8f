import Crypto
import CryptoExtras
import Foundation
import OrchardClient
import OrchardCoordinator
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Synchronization
import Testing

/// Keys made for these tests only (nothing is committed): one 2048-bit RSA key shared by the suite (generating one
/// takes a moment), and throwaway secrets.
enum DeviceTokenKeys {
    static let rsa: _RSA.Signing.PrivateKey = {
        do { return try _RSA.Signing.PrivateKey(keySize: .bits2048) } catch { preconditionFailure("cannot generate an RSA key: \(error)") }
    }()
    static var rsaPEM: String { rsa.pemRepresentation }
    static var rsaPublicPEM: String { rsa.publicKey.pemRepresentation }
    static let secret = "device-token-secret-0123456789-abcdef"
    static let otherSecret = "another-device-token-secret-0123456789"
}

/// The `/authenticate` answer to `token` for the harness's process `tiny` 1.0.
private func authenticate(_ harness: Harness, _ token: String?) async throws -> HTTPResult {
    try await harness.http.json("POST", Endpoint.authenticate, AuthenticateRequest(authToken: token, processName: "tiny", processVersion: SemanticVersion(1)))
}

/// The coordinator's error message in an answer.
private func message(_ result: HTTPResult) -> String? {
    (try? result.decode(ErrorBody.self))?.error.message
}

/// Hosts `tiny` 1.0 with `authentication`.
private func host(_ harness: Harness, _ authentication: AuthenticationConfig) async throws {
    var request = Fixture.host()
    request.serverConfig.authentication = authentication
    _ = try await harness.host(request)
}

/// Tokens signed by ``DeviceTokenIssuer`` against a coordinator on loopback whose process uses the matching
/// authentication, and the issuer's refusals of bad key material, subjects and lifetimes.
@Suite struct DeviceTokenIssuerTests {
    @Test func anHS256TokenIsAcceptedWithItsIssuerAndAudience() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            try await host(harness, .hs256(secret: DeviceTokenKeys.secret, issuer: "backend.example", audience: "orchard-tests"))
            let issuer = try DeviceTokenIssuer(hs256Secret: DeviceTokenKeys.secret)
            let now = harness.clock.date
            let token = try await issuer.issue(subject: "device-42", lifetime: .seconds(3600), issuer: "backend.example", audience: "orchard-tests", now: now)
            #expect(token.algorithm == .hs256 && token.subject == "device-42")
            #expect(token.expiresAt == Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down) + 3600))

            let first = try await authenticate(harness, token.token)
            #expect(first.status == 200, "\(message(first) ?? "")")
            let again = try await issuer.issue(subject: "device-42", lifetime: .seconds(60), issuer: "backend.example", audience: "orchard-tests", now: now)
            #expect(try await authenticate(harness, again.token).decode(AuthenticateResponse.self).workerID == first.decode(AuthenticateResponse.self).workerID)

            // The process's issuer and audience are checked.
            let wrongIssuer = try await issuer.issue(
                subject: "device-42", lifetime: .seconds(3600), issuer: "someone-else", audience: "orchard-tests", now: now)
            let refusedIssuer = try await authenticate(harness, wrongIssuer.token)
            #expect(refusedIssuer.status == 401 && message(refusedIssuer) == "auth_token issuer is not 'backend.example'")
            let noAudience = try await issuer.issue(subject: "device-42", lifetime: .seconds(3600), issuer: "backend.example", now: now)
            let refusedAudience = try await authenticate(harness, noAudience.token)
            #expect(refusedAudience.status == 401 && message(refusedAudience) == "auth_token audience does not include 'orchard-tests'")
        }
    }

    @Test func anRS256TokenIsAcceptedWithItsIssuerAndAudience() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            try await host(harness, .rs256(publicKeyPEM: DeviceTokenKeys.rsaPublicPEM, issuer: "backend.example", audience: "orchard-tests"))
            let issuer = try DeviceTokenIssuer(rs256PrivateKeyPEM: DeviceTokenKeys.rsaPEM)
            #expect(issuer.algorithm == .rs256)
            let token = try await issuer.issue(
                subject: "phone-1", lifetime: .seconds(86_400), issuer: "backend.example", audience: "orchard-tests", now: harness.clock.date)
            let accepted = try await authenticate(harness, token.token)
            #expect(accepted.status == 200, "\(message(accepted) ?? "")")

            let wrongAudience = try await issuer.issue(
                subject: "phone-1", lifetime: .seconds(86_400), issuer: "backend.example", audience: "elsewhere", now: harness.clock.date)
            let refused = try await authenticate(harness, wrongAudience.token)
            #expect(refused.status == 401 && message(refused) == "auth_token audience does not include 'orchard-tests'")
            // An hs256 token is no rs256 token, whatever its secret.
            let hmac = try await DeviceTokenIssuer(hs256Secret: DeviceTokenKeys.secret).issue(
                subject: "phone-1", lifetime: .seconds(60), issuer: "backend.example", audience: "orchard-tests", now: harness.clock.date
            )
            let forged = try await authenticate(harness, hmac.token)
            #expect(forged.status == 401 && message(forged) == "auth_token is not a valid rs256 JWT for this process")
        }
    }

    @Test func anExpiredTokenIsRefusedWithTheExpiredError() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            try await host(harness, .hs256(secret: DeviceTokenKeys.secret))
            let issuer = try DeviceTokenIssuer(hs256Secret: DeviceTokenKeys.secret)
            // Issued two hours before the coordinator's clock, for one hour.
            let past = try await issuer.issue(subject: "device-7", lifetime: .seconds(3600), now: harness.clock.date.addingTimeInterval(-7200))
            let refused = try await authenticate(harness, past.token)
            #expect(refused.status == 401)
            #expect(refused.errorCode == "unauthorized" && message(refused) == "auth_token expired")

            // A token accepted now is refused once the coordinator's clock passes its exp.
            let current = try await issuer.issue(subject: "device-7", lifetime: .seconds(600), now: harness.clock.date)
            #expect(try await authenticate(harness, current.token).status == 200)
            harness.clock.advance(bySeconds: 601)
            let later = try await authenticate(harness, current.token)
            #expect(later.status == 401 && message(later) == "auth_token expired")
        }
    }

    @Test func aTokenSignedWithAnotherSecretIsRefused() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            try await host(harness, .hs256(secret: DeviceTokenKeys.secret))
            let other = try DeviceTokenIssuer(hs256Secret: DeviceTokenKeys.otherSecret)
            let forged = try await other.issue(subject: "device-42", lifetime: .seconds(3600), now: harness.clock.date)
            let refused = try await authenticate(harness, forged.token)
            #expect(refused.status == 401)
            #expect(refused.errorCode == "unauthorized" && message(refused) == "auth_token is not a valid hs256 JWT for this process")
        }
    }

    @Test func badSecretsAreRefusedByTheCoordinatorsRule() throws {
        #expect(throws: DeviceTokenError(.invalidSecret, "the secret holds an empty secret")) { try DeviceTokenIssuer(hs256Secret: "") }
        #expect(
            throws: DeviceTokenError(
                .invalidSecret,
                "S holds a secret of 31 bytes; an hs256 secret must be at least 32 bytes (the coordinator's rule for server_config.authentication.secret)"
            )
        ) { try DeviceTokenIssuer(hs256Secret: String(repeating: "x", count: 31), source: "S") }
        // 32 bytes: the coordinator's own minimum.
        _ = try DeviceTokenIssuer(hs256Secret: String(repeating: "x", count: 32))
        // Bytes, not characters: 16 two-byte characters are 32 bytes.
        _ = try DeviceTokenIssuer(hs256Secret: String(repeating: "é", count: 16))
    }

    @Test func badRSAKeysAreRefusedWithTheirReason() throws {
        func refusal(_ pem: String) -> String? {
            do {
                _ = try DeviceTokenIssuer(rs256PrivateKeyPEM: pem, source: "K")
                return nil
            } catch {
                #expect(error.code == .invalidKey)
                return error.message
            }
        }
        let short = try _RSA.Signing.PrivateKey(unsafeKeySize: .init(bitCount: 1024))
        #expect(refusal(short.pemRepresentation) == "K holds a 1024-bit RSA key; rs256 needs at least 2048 bits (the coordinator's rule for public_key_pem)")
        #expect(
            refusal(P256.Signing.PrivateKey().pemRepresentation)
                == "K holds an EC private key, not an RSA one; rs256 needs an RSA private key of at least 2048 bits")
        #expect(refusal(DeviceTokenKeys.rsaPublicPEM)?.hasPrefix("K holds a PEM 'PUBLIC KEY', not a private key") == true)
        #expect(refusal("not a key")?.hasPrefix("K is not PEM:") == true)
        #expect(
            refusal("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
                == "K holds no readable RSA private key: rs256 needs an unencrypted RSA key as PKCS #1 or PKCS #8 PEM")
        // PKCS #8 and PKCS #1 both work.
        _ = try DeviceTokenIssuer(rs256PrivateKeyPEM: DeviceTokenKeys.rsaPEM)
        let pkcs8 = DeviceTokenKeys.rsa.pkcs8DERRepresentation.base64EncodedString(options: [.lineLength64Characters, .endLineWithLineFeed])
        _ = try DeviceTokenIssuer(rs256PrivateKeyPEM: "-----BEGIN PRIVATE KEY-----\n\(pkcs8)\n-----END PRIVATE KEY-----\n")
    }

    @Test func subjectsClaimsAndLifetimesAreChecked() async throws {
        let issuer = try DeviceTokenIssuer(hs256Secret: DeviceTokenKeys.secret)
        let now = Date(timeIntervalSince1970: 1_700_000_000.75)
        await #expect(throws: DeviceTokenError(.invalidSubject, "subject is empty: it names the device (the token's sub claim)")) {
            try await issuer.issue(subject: "", lifetime: .seconds(60), now: now)
        }
        await #expect(throws: DeviceTokenError(.invalidSubject, "subject is empty: it names the device (the token's sub claim)")) {
            try await issuer.issue(subject: "  ", lifetime: .seconds(60), now: now)
        }
        for lifetime: Duration in [.zero, .seconds(-5), .milliseconds(500), .seconds(400 * 86_400 + 1)] {
            await #expect(throws: DeviceTokenError.self) { try await issuer.issue(subject: "d", lifetime: lifetime, now: now) }
        }
        await #expect(throws: DeviceTokenError.self) { try await issuer.issue(subject: "d", lifetime: .seconds(60), issuer: "", now: now) }
        await #expect(throws: DeviceTokenError.self) { try await issuer.issue(subject: "d", lifetime: .seconds(60), audience: "", now: now) }
        // iat and exp are whole seconds.
        let token = try await issuer.issue(subject: "d", lifetime: .seconds(400 * 86_400), now: now)
        #expect(token.issuedAt == Date(timeIntervalSince1970: 1_700_000_000) && token.expiresAt == Date(timeIntervalSince1970: 1_700_000_000 + 400 * 86_400))
        let payload = try #require(Self.payload(of: token.token))
        #expect(payload["sub"] as? String == "d" && (payload["iat"] as? NSNumber)?.int64Value == 1_700_000_000)
        let exp: Int64 = 1_700_000_000 + 400 * 86_400
        #expect((payload["exp"] as? NSNumber)?.int64Value == exp, "\(payload)")
        #expect(payload["iss"] == nil && payload["aud"] == nil)
    }

    /// The JSON payload of a compact JWT.
    static func payload(of token: String) -> [String: Any]? {
        let parts = token.split(separator: ".")
        guard parts.count == 3 else { return nil }
        var base64 = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        guard let data = Data(base64Encoded: base64) else { return nil }
        return try? JSONSerialization.jsonObject(with: data) as? [String: Any]
    }

    @Test(
        arguments: [
            ("30s", 30), ("30m", 1800), ("24h", 86_400), ("7d", 604_800), ("400d", 34_560_000), ("+2h", 7200),
        ] as [(String, Int64)])
    func lifetimesParse(_ text: String, _ seconds: Int64) throws {
        #expect(try DeviceTokenIssuer.parseLifetime(text) == .seconds(seconds))
    }

    @Test(arguments: [
        ("0h", "lifetime '0h' must be more than zero"),
        ("-1h", "lifetime '-1h' must be more than zero"),
        ("24", "lifetime '24' has no unit: write a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"),
        ("1.5h", "lifetime '1.5h' is not a lifetime: write a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"),
        ("soon", "lifetime 'soon' is not a lifetime: write a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"),
        ("", "lifetime '' is not a lifetime: write a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"),
        ("h", "lifetime 'h' is not a lifetime: write a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"),
        (
            "401d",
            "lifetime '401d' is more than 400 days: the coordinator cannot revoke a device token before it expires, so a longer one would outlive any rotation of devices' credentials (hours to a day is recommended)"
        ),
        (
            "99999999999999999999d",
            "lifetime '99999999999999999999d' is more than 400 days: the coordinator cannot revoke a device token before it expires, so a longer one would outlive any rotation of devices' credentials (hours to a day is recommended)"
        ),
        ("-0s", "lifetime '-0s' must be more than zero"),
        (
            "9999999999999999d",
            "lifetime '9999999999999999d' is more than 400 days: the coordinator cannot revoke a device token before it expires, so a longer one would outlive any rotation of devices' credentials (hours to a day is recommended)"
        ),
    ])
    func badLifetimesAreRefused(_ text: String, _ expected: String) {
        #expect(throws: DeviceTokenError(.invalidLifetime, expected)) { try DeviceTokenIssuer.parseLifetime(text) }
    }

    @Test func keySourcesReadFilesAndVariablesNeverArguments() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-device-token-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("secret").path
        try Data((DeviceTokenKeys.secret + "\n").utf8).write(to: URL(fileURLWithPath: file))

        // A trailing line break (echo) is not part of the secret; nothing else is trimmed.
        #expect(try DeviceTokenKeySource.file(file).read() == DeviceTokenKeySource.environment("S").read(environment: ["S": DeviceTokenKeys.secret + "\r\n"]))
        #expect(try DeviceTokenKeySource.environment("S").read(environment: ["S": " padded "]) == " padded ")
        #expect(throws: DeviceTokenError(.missingSecret, "the environment variable S is not set")) {
            try DeviceTokenKeySource.environment("S").read(environment: [:])
        }
        let missing = directory.appendingPathComponent("missing").path
        #expect(throws: DeviceTokenError(.unreadableFile, "--secret-file '\(missing)': no such file")) {
            try DeviceTokenKeySource.file(missing, name: "--secret-file").read()
        }
        let binary = directory.appendingPathComponent("binary").path
        try Data([0xFF, 0xFE, 0x00, 0x80]).write(to: URL(fileURLWithPath: binary))
        #expect(throws: DeviceTokenError(.unreadableFile, "file '\(binary)': not UTF-8 text")) { try DeviceTokenKeySource.file(binary).read() }

        #expect(throws: DeviceTokenError(.conflictingSources, "--a and --b are both given; give the secret one way")) {
            try DeviceTokenKeySource.choose(file: ("f", "--a"), environment: ("V", "--b"), defaultVariable: "D")
        }
        #expect(try DeviceTokenKeySource.choose(file: nil, environment: nil, defaultVariable: "D") == .environment("D"))
        #expect(try DeviceTokenKeySource.choose(file: ("f", "--a"), environment: nil, defaultVariable: "D").description == "--a 'f'")

        // The secret never shows when the issuer is printed or dumped.
        let issuer = try DeviceTokenIssuer(algorithm: .hs256, source: .file(file))
        var dumped = ""
        dump(issuer, to: &dumped)
        for shown in ["\(issuer)", String(reflecting: issuer), dumped] { #expect(!shown.contains("device-token-secret"), "\(shown)") }
    }
}

/// `orchard token issue` (the built executable): its tokens are accepted by a coordinator whose process uses the
/// matching authentication.
@Suite struct TokenIssueExecutableTests {
    /// Runs `orchard arguments…` with `environment` in place of the device-token variables of this process's.
    static func orchard(_ arguments: [String], environment: [String: String] = [:], in directory: URL) async throws -> (
        status: Int32, output: String, error: String
    ) {
        let unset: [String: String?] = ["ORCHARD_DEVICE_TOKEN_SECRET": nil, "ORCHARD_DEVICE_TOKEN_PRIVATE_KEY": nil]
        let run = try await OrchardExecutable.run(arguments, environment: unset.merging(environment.mapValues { $0 }) { $1 }, in: directory)
        return (run.status, run.output, run.error)
    }

    @Test func tokensFromTheCommandAreAcceptedForHS256AndRS256() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let directory = harness.directory
            let secretFile = directory.appendingPathComponent("secret").path
            try Data((DeviceTokenKeys.secret + "\n").utf8).write(to: URL(fileURLWithPath: secretFile))
            let keyFile = directory.appendingPathComponent("key.pem").path
            try Data(DeviceTokenKeys.rsaPEM.utf8).write(to: URL(fileURLWithPath: keyFile))
            let claims = ["--issuer", "backend.example", "--audience", "orchard-tests"]

            // hs256: the secret from a file; the token alone on standard output.
            try await host(harness, .hs256(secret: DeviceTokenKeys.secret, issuer: "backend.example", audience: "orchard-tests"))
            let hs = try await Self.orchard(
                ["token", "issue", "--algorithm", "hs256", "--secret-file", secretFile, "--subject", "device-1", "--lifetime", "24h"] + claims, in: directory)
            #expect(hs.status == 0 && hs.error.isEmpty, "\(hs.error)")
            let hsToken = hs.output.trimmingCharacters(in: .newlines)
            #expect(hs.output == hsToken + "\n" && hsToken.split(separator: ".").count == 3)
            #expect(try await authenticate(harness, hsToken).status == 200)
            // ... and from the default variable, which a token without the process's issuer does not pass.
            let unclaimed = try await Self.orchard(
                ["token", "issue", "--algorithm", "hs256", "--subject", "device-1", "--lifetime", "1h"],
                environment: ["ORCHARD_DEVICE_TOKEN_SECRET": DeviceTokenKeys.secret], in: directory
            )
            #expect(unclaimed.status == 0, "\(unclaimed.error)")
            let refused = try await authenticate(harness, unclaimed.output.trimmingCharacters(in: .newlines))
            #expect(refused.status == 401 && message(refused) == "auth_token issuer is not 'backend.example'")

            // rs256: the key from a variable named on the command line; --json.
            var rs256 = Fixture.host(name: "tiny-rsa")
            rs256.serverConfig.authentication = .rs256(publicKeyPEM: DeviceTokenKeys.rsaPublicPEM, issuer: "backend.example", audience: "orchard-tests")
            _ = try await harness.host(rs256)
            let rs = try await Self.orchard(
                ["token", "issue", "--algorithm", "rs256", "--private-key-env", "APP_KEY", "--subject", "phone-9", "--lifetime", "30m", "--json"] + claims,
                environment: ["APP_KEY": DeviceTokenKeys.rsaPEM], in: directory
            )
            #expect(rs.status == 0 && rs.error.isEmpty, "\(rs.error)")
            #expect(rs.output.split(separator: "\n").count == 1)
            let line = try #require(try JSONSerialization.jsonObject(with: Data(rs.output.utf8)) as? [String: Any])
            #expect(line["algorithm"] as? String == "rs256" && line["subject"] as? String == "phone-9")
            #expect(line["issuer"] as? String == "backend.example" && line["audience"] as? String == "orchard-tests")
            let expires = try #require((line["expires_at"] as? String).flatMap { ISO8601DateFormatter().date(from: $0) })
            #expect(abs(expires.timeIntervalSinceNow - 1800) < 120)
            let rsToken = try #require(line["token"] as? String)
            let accepted = try await harness.http.json(
                "POST", Endpoint.authenticate, AuthenticateRequest(authToken: rsToken, processName: "tiny-rsa", processVersion: SemanticVersion(1))
            )
            #expect(accepted.status == 200, "\(message(accepted) ?? "")")
            // The key file works too, and signs for the same device.
            let fromFile = try await Self.orchard(
                ["token", "issue", "--algorithm", "rs256", "--private-key-file", keyFile, "--subject", "phone-9", "--lifetime", "1h"] + claims, in: directory)
            let again = try await harness.http.json(
                "POST", Endpoint.authenticate,
                AuthenticateRequest(authToken: fromFile.output.trimmingCharacters(in: .newlines), processName: "tiny-rsa", processVersion: SemanticVersion(1))
            )
            #expect(try again.decode(AuthenticateResponse.self).workerID == accepted.decode(AuthenticateResponse.self).workerID)

            for run in [hs, unclaimed, rs, fromFile] {
                #expect(!run.output.contains(DeviceTokenKeys.secret) && !run.error.contains(DeviceTokenKeys.secret))
                #expect(!run.output.contains("PRIVATE KEY") && !run.error.contains("PRIVATE KEY"))
            }
        }
    }

    @Test func badRSAKeysAreOneLineErrors() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-token-keys-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let short = directory.appendingPathComponent("short.pem").path
        try Data(try _RSA.Signing.PrivateKey(unsafeKeySize: .init(bitCount: 1024)).pemRepresentation.utf8).write(to: URL(fileURLWithPath: short))
        let ec = directory.appendingPathComponent("ec.pem").path
        try Data(P256.Signing.PrivateKey().pemRepresentation.utf8).write(to: URL(fileURLWithPath: ec))
        let publicKey = directory.appendingPathComponent("public.pem").path
        try Data(DeviceTokenKeys.rsaPublicPEM.utf8).write(to: URL(fileURLWithPath: publicKey))

        let cases: [(file: String, line: String)] = [
            (
                short,
                "error: invalid_key: --private-key-file '\(short)' holds a 1024-bit RSA key; rs256 needs at least 2048 bits (the coordinator's rule for public_key_pem)"
            ),
            (
                ec,
                "error: invalid_key: --private-key-file '\(ec)' holds an EC private key, not an RSA one; rs256 needs an RSA private key of at least 2048 bits"
            ),
            (
                publicKey,
                "error: invalid_key: --private-key-file '\(publicKey)' holds a PEM 'PUBLIC KEY', not a private key; rs256 signs with the RSA private key whose public half is the process's public_key_pem"
            ),
        ]
        for (file, line) in cases {
            let run = try await Self.orchard(
                ["token", "issue", "--algorithm", "rs256", "--private-key-file", file, "--subject", "d", "--lifetime", "1h"], in: directory)
            #expect(run.status == 1)
            #expect(run.output.isEmpty)
            #expect(run.error == line + "\n", "\(run.error)")
        }
    }
}

/// Forwards the five cycle calls to HTTP and counts the authentications.
private final class CountingTransport: ClientTransport {
    let inner: HTTPTransport
    private let count = Mutex(0)

    init(_ inner: HTTPTransport) { self.inner = inner }

    var authentications: Int { count.withLock { $0 } }

    func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        count.withLock { $0 += 1 }
        return try await inner.authenticate(request)
    }

    func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await inner.requestCycle(request, session: session)
    }

    func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> TrainingPlan {
        try await inner.plan(planID, requestKey: requestKey, session: session)
    }

    func downloadModel(_ request: ModelRequest, session: String, into sink: any DownloadSink) async throws(OrchardClientError) {
        try await inner.downloadModel(request, session: session, into: sink)
    }

    func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await inner.report(body, session: session)
    }
}

/// A token provider that answers from a script, then signs fresh tokens; counts the times it is asked.
private final class ScriptedTokenProvider: DeviceTokenProvider {
    enum Answer: Sendable {
        case token(String)
        case failure(String)
    }

    private let script: Mutex<[Answer]>
    private let asked = Mutex(0)
    let fresh: @Sendable () async throws -> String

    init(_ script: [Answer], fresh: @escaping @Sendable () async throws -> String) {
        self.script = Mutex(script)
        self.fresh = fresh
    }

    var times: Int { asked.withLock { $0 } }

    struct Refusal: Error, CustomStringConvertible { var description: String }

    func deviceToken() async throws -> String {
        asked.withLock { $0 += 1 }
        let next = script.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        switch next {
        case .token(let token): return token
        case .failure(let reason): throw Refusal(description: reason)
        case nil: return try await fresh()
        }
    }
}

/// What the device SDK does with an expired device token (the behaviour `docs/device-tokens.md` describes).
@Suite struct DeviceTokenExpiryClientTests {
    @Test func anExpiredTokenFailsTheCycleOnceAndAFreshTokenInANewClientWorks() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            try await host(harness, .hs256(secret: DeviceTokenKeys.secret))
            let issuer = try DeviceTokenIssuer(hs256Secret: DeviceTokenKeys.secret)
            let expired = try await issuer.issue(subject: "phone-3", lifetime: .seconds(3600), now: harness.clock.date.addingTimeInterval(-7200))
            // The default retry policy (5 attempts for transient failures) and the system clock for its backoff.
            let configuration = DeviceConfiguration(storageDirectory: harness.directory.appendingPathComponent("device"), durability: .unsynced)
            let transport = CountingTransport(try HTTPTransport(url: harness.server.baseURL.absoluteString))
            let update: @Sendable (CycleContext) async throws -> LocalUpdate = { _ in LocalUpdate(diff: Fixture.diff(0.1), sampleCount: 4) }

            let job = try CoordinatorConnection(transport: transport, server: "coordinator", authToken: expired.token, configuration: configuration)
                .newJob(processName: "tiny", version: "1.0")
            let error = await #expect(throws: OrchardClientError.self) { try await job.run(update) }
            #expect(error?.code == .authenticationFailed && error?.httpStatus == 401 && error?.serverCode == .unauthorized)
            #expect(error?.message == "auth_token expired")
            #expect(error?.description == "authentication_failed: auth_token expired (HTTP 401 unauthorized)")
            // Not retried, and the same job asks with the same token next time.
            #expect(transport.authentications == 1)
            _ = await #expect(throws: OrchardClientError.self) { try await job.run(update) }
            #expect(transport.authentications == 2)

            // The remedy: a fresh token from the backend, in a new client and job over the same storage.
            let fresh = try await issuer.issue(subject: "phone-3", lifetime: .seconds(3600), now: harness.clock.date)
            let renewed = try CoordinatorConnection(transport: transport, server: "coordinator", authToken: fresh.token, configuration: configuration)
                .newJob(processName: "tiny", version: "1.0")
            let outcome = try await renewed.run(update)
            guard case .reported = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(transport.authentications == 3)
        }
    }

    @Test func aProviderIsAskedAtEachAuthenticationSoTheNextRunGetsAFreshToken() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            try await host(harness, .hs256(secret: DeviceTokenKeys.secret))
            let issuer = try DeviceTokenIssuer(hs256Secret: DeviceTokenKeys.secret)
            let expired = try await issuer.issue(subject: "phone-4", lifetime: .seconds(3600), now: harness.clock.date.addingTimeInterval(-7200))
            let clock = harness.clock
            let provider = ScriptedTokenProvider([.token(expired.token), .failure("the backend is unreachable")]) {
                try await issuer.issue(subject: "phone-4", lifetime: .seconds(3600), now: clock.date).token
            }
            let configuration = DeviceConfiguration(storageDirectory: harness.directory.appendingPathComponent("device"), durability: .unsynced)
            let transport = CountingTransport(try HTTPTransport(url: harness.server.baseURL.absoluteString))
            let job = try CoordinatorConnection(transport: transport, server: "coordinator", tokenProvider: provider, configuration: configuration)
                .newJob(processName: "tiny", version: "1.0")
            let update: @Sendable (CycleContext) async throws -> LocalUpdate = { _ in LocalUpdate(diff: Fixture.diff(0.1), sampleCount: 4) }

            // The provider's expired token: refused once, not retried.
            let refused = await #expect(throws: OrchardClientError.self) { try await job.run(update) }
            #expect(refused?.code == .authenticationFailed && refused?.message == "auth_token expired")
            #expect(provider.times == 1 && transport.authentications == 1)
            // The provider fails: an authentication failure naming it, and nothing is sent.
            let failed = await #expect(throws: OrchardClientError.self) { try await job.run(update) }
            #expect(failed?.code == .authenticationFailed && failed?.httpStatus == nil)
            #expect(failed?.message == "the app's provider gave no device token: the backend is unreachable")
            #expect(provider.times == 2 && transport.authentications == 1)
            // The same job's next run asks again and gets a fresh token.
            let outcome = try await job.run(update)
            guard case .reported = outcome else {
                Issue.record("expected a report, got \(outcome)")
                return
            }
            #expect(provider.times == 3 && transport.authentications == 2)
        }
    }
}

// Public imports: a public library type's conformance to ExpressibleByArgument is public.
public import ArgumentParser
import Foundation
import OrchardBenchmarks
public import OrchardCoordinator
import OrchardSupport

extension DeviceTokenAlgorithm: ExpressibleByArgument {}

/// `orchard token …`: credentials for devices.
struct TokenCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token",
        abstract: "Issue the device tokens (JWTs) that processes with hs256 or rs256 authentication accept.",
        subcommands: [TokenIssueCommand.self]
    )
}

/// `orchard token issue`: signs one device token, as an app's backend would.
struct TokenIssueCommand: AsyncParsableCommand {
    /// The variable holding the hs256 secret when neither --secret-file nor --secret-env is given.
    static let defaultSecretVariable = "ORCHARD_DEVICE_TOKEN_SECRET"
    /// The variable holding the rs256 private key when neither --private-key-file nor --private-key-env is given.
    static let defaultPrivateKeyVariable = "ORCHARD_DEVICE_TOKEN_PRIVATE_KEY"

    static let configuration = CommandConfiguration(
        commandName: "issue",
        abstract: "Sign a device token for a process's hs256 or rs256 authentication.",
        discussion: """
            The token carries sub (--subject), iat, exp (now + --lifetime) and, when given, iss and aud, which must \
            match the process's server_config.authentication issuer and audience. The hs256 secret comes from \
            --secret-file FILE or the environment variable --secret-env names (ORCHARD_DEVICE_TOKEN_SECRET by \
            default); the rs256 private key (PEM, at least 2048 bits) from --private-key-file FILE or \
            --private-key-env (ORCHARD_DEVICE_TOKEN_PRIVATE_KEY by default). Never on the command line: every local \
            user can read a process's arguments. Trailing line breaks of a file or variable are ignored. Prints the \
            token alone (TOKEN=$(orchard token issue …)), or with --json one line {"algorithm", "expires_at", \
            "subject", "token"}. A failure is one line on standard error, `error: <code>: <message>`, with exit \
            status 1.
            """
    )

    @Option(help: "How the token is signed: hs256 (a shared secret) or rs256 (an RSA private key).")
    var algorithm: DeviceTokenAlgorithm

    @Option(help: ArgumentHelp("A file holding the hs256 secret (at least 32 bytes).", valueName: "file"))
    var secretFile: String?

    @Option(help: ArgumentHelp("The environment variable holding the hs256 secret (default: \(defaultSecretVariable)).", valueName: "name"))
    var secretEnv: String?

    @Option(help: ArgumentHelp("A PEM file holding the rs256 RSA private key (at least 2048 bits).", valueName: "file"))
    var privateKeyFile: String?

    @Option(help: ArgumentHelp("The environment variable holding the rs256 private key as PEM (default: \(defaultPrivateKeyVariable)).", valueName: "name"))
    var privateKeyEnv: String?

    @Option(help: ArgumentHelp("The device's identity: the token's sub claim.", valueName: "device-id"))
    var subject: String

    // Unconditional, so `--lifetime -1h` reaches the lifetime's own check instead of reading as an option.
    @Option(
        parsing: .unconditional,
        help: ArgumentHelp("How long the token is valid: a whole number and a unit s, m, h or d (30m, 24h, 7d); at most 400d.", valueName: "lifetime"))
    var lifetime: String

    @Option(help: "The iss claim (the process's server_config.authentication.issuer, if it sets one).")
    var issuer: String?

    @Option(help: "The aud claim (the process's server_config.authentication.audience, if it sets one).")
    var audience: String?

    @Flag(help: "Print one JSON line with the token, its subject, algorithm and expiry instead of the token alone.")
    var json = false

    /// The line `--json` prints; keys in snake case, sorted.
    struct Output: Encodable {
        var token: String
        var subject: String
        var expiresAt: String
        var algorithm: String
        var issuer: String?
        var audience: String?
    }

    /// Where the secret or key is read from, refusing the other algorithm's options.
    func keySource() throws(DeviceTokenError) -> DeviceTokenKeySource {
        switch algorithm {
        case .hs256:
            if let option = [privateKeyFile.map { _ in "--private-key-file" }, privateKeyEnv.map { _ in "--private-key-env" }].compactMap({ $0 }).first {
                throw DeviceTokenError(.conflictingSources, "\(option) is for --algorithm rs256; hs256 takes --secret-file or --secret-env")
            }
            return try DeviceTokenKeySource.choose(
                file: secretFile.map { ($0, "--secret-file") }, environment: secretEnv.map { ($0, "--secret-env") },
                defaultVariable: Self.defaultSecretVariable,
                material: "the secret"
            )
        case .rs256:
            if let option = [secretFile.map { _ in "--secret-file" }, secretEnv.map { _ in "--secret-env" }].compactMap({ $0 }).first {
                throw DeviceTokenError(.conflictingSources, "\(option) is for --algorithm hs256; rs256 takes --private-key-file or --private-key-env")
            }
            return try DeviceTokenKeySource.choose(
                file: privateKeyFile.map { ($0, "--private-key-file") }, environment: privateKeyEnv.map { ($0, "--private-key-env") },
                defaultVariable: Self.defaultPrivateKeyVariable, material: "the private key"
            )
        }
    }

    /// The signed token; the options' names in place of the library's field names.
    func issue(now: Date) async throws(DeviceTokenError) -> DeviceTokenIssuer.Token {
        let lifetime = try DeviceTokenIssuer.parseLifetime(self.lifetime, name: "--lifetime")
        let source = try keySource()
        let issuer: DeviceTokenIssuer
        do throws(DeviceTokenError) {
            issuer = try DeviceTokenIssuer(algorithm: algorithm, source: source)
        } catch  where error.code == .missingSecret {
            let options = algorithm == .hs256 ? "--secret-file FILE or --secret-env NAME" : "--private-key-file FILE or --private-key-env NAME"
            throw DeviceTokenError(error.code, "\(error.message): set it, or give \(options)")
        }
        do throws(DeviceTokenError) {
            return try await issuer.issue(subject: subject, lifetime: lifetime, issuer: self.issuer, audience: audience, now: now)
        } catch {
            throw DeviceTokenError(error.code, namingOption(error.message, ["subject": "--subject", "issuer": "--issuer", "audience": "--audience"]))
        }
    }

    func run() async throws {
        let token: DeviceTokenIssuer.Token
        do throws(DeviceTokenError) {
            token = try await issue(now: SystemClock().date)
        } catch {
            FileHandle.standardError.write(Data("error: \(error)\n".utf8))
            throw ExitCode(1)
        }
        guard json else { return print(token.token) }
        try JSONLine.write(
            Output(
                token: token.token, subject: token.subject, expiresAt: ISO8601DateFormatter().string(from: token.expiresAt),
                algorithm: token.algorithm.rawValue, issuer: token.issuer, audience: token.audience
            ))
    }
}

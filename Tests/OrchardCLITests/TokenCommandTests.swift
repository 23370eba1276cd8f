import Foundation
import OrchardTesting
import Testing

extension OrchardExecutable.Run {
    /// Runs `orchard arguments…` to its end with the device-token variables removed from this process's environment
    /// and `environment` added.
    static func withoutTokenVariables(_ arguments: [String], environment: [String: String] = [:]) async throws -> Run {
        let unset: [String: String?] = ["ORCHARD_DEVICE_TOKEN_SECRET": nil, "ORCHARD_DEVICE_TOKEN_PRIVATE_KEY": nil]
        return try await OrchardExecutable.run(arguments, environment: unset.merging(environment.mapValues { $0 }) { $1 })
    }
}

/// `orchard token issue`: what it prints, and each bad input refused with one line on standard error, exit status 1,
/// nothing on standard output, and the secret nowhere.
@Suite struct TokenCommandTests {
    static let secret = "cli-test-device-secret-0123456789abcdef"

    /// Input files in a temporary directory.
    struct Files {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-token-files-\(UUID().uuidString)")

        init() throws { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }

        func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

        func write(_ name: String, _ text: String) throws -> String {
            try Data(text.utf8).write(to: directory.appendingPathComponent(name))
            return path(name)
        }

        func remove() { try? FileManager.default.removeItem(at: directory) }
    }

    /// `orchard token issue` with these options after the command.
    static func issue(_ options: [String], environment: [String: String] = [:]) async throws -> Run {
        try await Run.withoutTokenVariables(["token", "issue"] + options, environment: environment)
    }

    /// The one error line of a refused run.
    func errorLine(_ run: Run, sourceLocation: SourceLocation = #_sourceLocation) -> String {
        #expect(run.status == 1, "\(run.error)", sourceLocation: sourceLocation)
        #expect(run.output.isEmpty, "\(run.output)", sourceLocation: sourceLocation)
        #expect(!run.error.contains(Self.secret) && !run.output.contains(Self.secret), sourceLocation: sourceLocation)
        let lines = run.error.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        #expect(lines.count == 1 && run.error.hasSuffix("\n"), "\(run.error)", sourceLocation: sourceLocation)
        return String(lines.first ?? "")
    }

    @Test func theTokenAloneOrOneJSONLine() async throws {
        let files = try Files()
        defer { files.remove() }
        let secretFile = try files.write("secret", Self.secret + "\n")
        let plain = try await Self.issue(["--algorithm", "hs256", "--secret-file", secretFile, "--subject", "device-1", "--lifetime", "24h"])
        #expect(plain.status == 0 && plain.error.isEmpty, "\(plain.error)")
        let token = plain.output.trimmingCharacters(in: .newlines)
        #expect(plain.output == token + "\n")
        #expect(token.split(separator: ".").count == 3 && token.allSatisfy { $0.isLetter || $0.isNumber || "-_.".contains($0) })

        let json = try await Self.issue(
            ["--algorithm", "hs256", "--subject", "device-1", "--lifetime", "7d", "--json"], environment: ["ORCHARD_DEVICE_TOKEN_SECRET": Self.secret]
        )
        #expect(json.status == 0 && json.error.isEmpty, "\(json.error)")
        #expect(json.output.hasSuffix("\n") && json.output.split(separator: "\n").count == 1)
        let line = try #require(try JSONSerialization.jsonObject(with: Data(json.output.utf8)) as? [String: Any])
        #expect(Set(line.keys) == ["token", "subject", "expires_at", "algorithm"])
        #expect(line["subject"] as? String == "device-1" && line["algorithm"] as? String == "hs256")
        let expires = try #require((line["expires_at"] as? String).flatMap { ISO8601DateFormatter().date(from: $0) })
        #expect(abs(expires.timeIntervalSinceNow - 7 * 86_400) < 120)
        for run in [plain, json] { #expect(!run.output.contains(Self.secret) && !run.error.contains(Self.secret)) }
    }

    @Test func aSecretOnTheCommandLineIsAnUnknownOptionAndIsNotEchoed() async throws {
        for options in [["--secret", Self.secret], ["--secret=\(Self.secret)"]] {
            let run = try await Self.issue(["--algorithm", "hs256", "--subject", "d", "--lifetime", "1h"] + options)
            #expect(run.status == usageError)
            #expect(run.output.isEmpty)
            #expect(run.error.hasPrefix("Error: Unknown option '--secret'\n"), "\(run.error)")
            #expect(!run.error.contains(Self.secret), "\(run.error)")
        }
        // No option names a secret or key value: only files and environment variables.
        let help = try await Self.issue(["--help"])
        #expect(help.status == 0)
        let optionLines = help.output.split(separator: "\n").drop { $0 != "OPTIONS:" }
        let options = optionLines.flatMap { $0.split(separator: " ").filter { $0.hasPrefix("--") } }.map {
            String($0.trimmingCharacters(in: .punctuationCharacters.subtracting(["-"])))
        }
        #expect(
            Set(options) == [
                "--algorithm", "--secret-file", "--secret-env", "--private-key-file", "--private-key-env", "--subject", "--lifetime", "--issuer",
                "--audience", "--json", "--help",
            ], "\(options)")
    }

    @Test func badInputsAreOneLineErrors() async throws {
        let files = try Files()
        defer { files.remove() }
        let secretFile = try files.write("secret", Self.secret)
        let missing = files.path("missing")
        let empty = try files.write("empty", "")
        let newlineOnly = try files.write("newline", "\n")
        let short = try files.write("short", "only-31-bytes-of-secret-xxxxxxx\n")
        let notPEM = try files.write("key.txt", "this is not a key\n")
        let certificates = try TestCertificates.make()
        let ecKey = try files.write("ec.pem", certificates.serverPrivateKeyPEM)
        let certificate = try files.write("ca.pem", certificates.caCertificatePEM)
        let hs = ["--algorithm", "hs256"], rs = ["--algorithm", "rs256"], device = ["--subject", "device-1"], hour = ["--lifetime", "1h"]
        let secretEnvironment = ["ORCHARD_DEVICE_TOKEN_SECRET": Self.secret]

        let cases: [(options: [String], environment: [String: String], line: String)] = [
            (
                hs + ["--secret-file", secretFile, "--secret-env", "APP_SECRET"] + device + hour, ["APP_SECRET": Self.secret],
                "error: conflicting_sources: --secret-file and --secret-env are both given; give the secret one way"
            ),
            (
                rs + ["--private-key-file", notPEM, "--private-key-env", "APP_KEY"] + device + hour, [:],
                "error: conflicting_sources: --private-key-file and --private-key-env are both given; give the private key one way"
            ),
            (
                rs + ["--secret-file", secretFile] + device + hour, [:],
                "error: conflicting_sources: --secret-file is for --algorithm hs256; rs256 takes --private-key-file or --private-key-env"
            ),
            (
                hs + ["--private-key-env", "APP_KEY"] + device + hour, secretEnvironment,
                "error: conflicting_sources: --private-key-env is for --algorithm rs256; hs256 takes --secret-file or --secret-env"
            ),
            (hs + ["--secret-file", missing] + device + hour, [:], "error: unreadable_file: --secret-file '\(missing)': no such file"),
            (
                hs + ["--secret-file", files.directory.path] + device + hour, [:],
                "error: unreadable_file: --secret-file '\(files.directory.path)': is a directory"
            ),
            (rs + ["--private-key-file", missing] + device + hour, [:], "error: unreadable_file: --private-key-file '\(missing)': no such file"),
            (
                hs + device + hour, [:],
                "error: missing_secret: the environment variable ORCHARD_DEVICE_TOKEN_SECRET is not set: set it, or give --secret-file FILE or --secret-env NAME"
            ),
            (
                hs + ["--secret-env", "APP_SECRET"] + device + hour, secretEnvironment,
                "error: missing_secret: the environment variable APP_SECRET is not set: set it, or give --secret-file FILE or --secret-env NAME"
            ),
            (
                rs + device + hour, [:],
                "error: missing_secret: the environment variable ORCHARD_DEVICE_TOKEN_PRIVATE_KEY is not set: set it, or give --private-key-file FILE or --private-key-env NAME"
            ),
            (hs + ["--secret-file", empty] + device + hour, [:], "error: invalid_secret: --secret-file '\(empty)' holds an empty secret"),
            (hs + ["--secret-file", newlineOnly] + device + hour, [:], "error: invalid_secret: --secret-file '\(newlineOnly)' holds an empty secret"),
            (hs + device + hour, ["ORCHARD_DEVICE_TOKEN_SECRET": ""], "error: invalid_secret: ORCHARD_DEVICE_TOKEN_SECRET holds an empty secret"),
            (
                hs + ["--secret-file", short] + device + hour, [:],
                "error: invalid_secret: --secret-file '\(short)' holds a secret of 31 bytes; an hs256 secret must be at least 32 bytes (the coordinator's rule for server_config.authentication.secret)"
            ),
            (
                hs + ["--secret-env", "APP_SECRET"] + device + hour, ["APP_SECRET": "short"],
                "error: invalid_secret: APP_SECRET holds a secret of 5 bytes; an hs256 secret must be at least 32 bytes (the coordinator's rule for server_config.authentication.secret)"
            ),
            (
                rs + ["--private-key-file", notPEM] + device + hour, [:],
                "error: invalid_key: --private-key-file '\(notPEM)' is not PEM: expected an RSA private key between '-----BEGIN PRIVATE KEY-----' (or 'RSA PRIVATE KEY') and its END line"
            ),
            (
                rs + ["--private-key-file", secretFile] + device + hour, [:],
                "error: invalid_key: --private-key-file '\(secretFile)' is not PEM: expected an RSA private key between '-----BEGIN PRIVATE KEY-----' (or 'RSA PRIVATE KEY') and its END line"
            ),
            (
                rs + ["--private-key-file", ecKey] + device + hour, [:],
                "error: invalid_key: --private-key-file '\(ecKey)' holds an EC private key, not an RSA one; rs256 needs an RSA private key of at least 2048 bits"
            ),
            (
                rs + ["--private-key-file", certificate] + device + hour, [:],
                "error: invalid_key: --private-key-file '\(certificate)' holds a PEM 'CERTIFICATE', not a private key; rs256 signs with the RSA private key whose public half is the process's public_key_pem"
            ),
            (hs + ["--subject", ""] + hour, secretEnvironment, "error: invalid_subject: --subject is empty: it names the device (the token's sub claim)"),
            (hs + device + ["--lifetime", "0h"], secretEnvironment, "error: invalid_lifetime: --lifetime '0h' must be more than zero"),
            (hs + device + ["--lifetime", "-1h"], secretEnvironment, "error: invalid_lifetime: --lifetime '-1h' must be more than zero"),
            (
                hs + device + ["--lifetime", "soon"], secretEnvironment,
                "error: invalid_lifetime: --lifetime 'soon' is not a lifetime: write a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"
            ),
            (
                hs + device + ["--lifetime", "24"], secretEnvironment,
                "error: invalid_lifetime: --lifetime '24' has no unit: write a whole number and a unit s, m, h or d, such as 30m, 24h or 7d"
            ),
            (
                hs + device + ["--lifetime", "401d"], secretEnvironment,
                "error: invalid_lifetime: --lifetime '401d' is more than 400 days: the coordinator cannot revoke a device token before it expires, so a longer one would outlive any rotation of devices' credentials (hours to a day is recommended)"
            ),
            (
                hs + device + hour + ["--issuer", ""], secretEnvironment,
                "error: invalid_claim: --issuer is empty: leave it out, or give the process's server_config.authentication.issuer"
            ),
            (
                hs + device + hour + ["--audience", ""], secretEnvironment,
                "error: invalid_claim: --audience is empty: leave it out, or give the process's server_config.authentication.audience"
            ),
        ]
        for (options, environment, line) in cases {
            let run = try await Self.issue(options, environment: environment)
            #expect(errorLine(run) == line, "orchard token issue \(options.joined(separator: " "))")
        }
    }

    @Test func aWrongAlgorithmIsRefusedByTheParserWithTheValues() async throws {
        let run = try await Self.issue(["--algorithm", "hs512", "--subject", "d", "--lifetime", "1h"])
        #expect(run.status == usageError)
        #expect(
            run.error.hasPrefix("Error: The value 'hs512' is invalid for '--algorithm <algorithm>'. Please provide one of 'hs256' and 'rs256'.\n"),
            "\(run.error)")
        let help = try await Self.issue(["--help"])
        #expect(help.flatOutput.contains("(values: hs256, rs256)"), "\(help.output)")
    }
}

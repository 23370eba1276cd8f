import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OrchardTesting
import Testing

/// One finished run of the `orchard` executable.
typealias Run = OrchardExecutable.Run

extension OrchardExecutable.Run {
    /// Runs `orchard arguments…` to its end in a temporary directory; `environment` is added to this process's (a nil
    /// value removes the variable).
    static func orchard(_ arguments: [String], environment: [String: String?] = [:]) async throws -> Run {
        try await OrchardExecutable.run(arguments, environment: environment)
    }
}

/// `EX_USAGE`, ArgumentParser's exit status for a parse or validation error.
let usageError: Int32 = 64

@Suite struct EnumeratedOptionTests {
    /// A wrong value for each option with a fixed set of values, and one listed value.
    static let wrongValues: [(arguments: [String], option: String, listed: String)] = [
        (["serve", "--durability", "sometimes"], "--durability", "'normal' and 'full'"),
        (["serve", "--log-level", "loud"], "--log-level", "- critical"),
        (["agent", "--server", "http://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--log-level", "loud"], "--log-level", "- warning"),
        (["bench", "coordinator", "--durability", "fsync"], "--durability", "'normal' and 'full'"),
        (["bench", "train", "--backend", "gpu"], "--backend", "'automatic', 'avx2', 'avx512', 'blas' or 'portable'"),
        (["bench", "train", "--model", "resnet"], "--model", "'mlp2nn'"),
        (["bench", "train", "--parallelism", "threads"], "--parallelism", "'automatic', 'gemm' or 'batch'"),
        (["train", "housing", "--optimizer", "rmsprop"], "--optimizer", "'adam' and 'sgd'"),
        (["coreml", "export", "m.json", "w.safetensors", "-o", "out.mlmodel", "--array-type", "int8"], "--array-type", "'double' and 'float32'"),
        (["simulate", "--aggregator", "fedsgd"], "--aggregator", "'fedavg', 'fedavgm', 'fedadam' or 'fedyogi'"),
        (["simulate", "--transport", "udp"], "--transport", "'http' and 'memory'"),
        (["simulate", "--model", "gpt"], "--model", "'housing', 'mlp2nn', 'cnn' or 'char-lstm'"),
        (["simulate", "--availability", "weekly"], "--availability", "'always', 'diurnal', 'realistic' or 'trace:FILE'"),
        (["simulate", "--dataset", "csv"], "--dataset", "'housing', 'fashion-mnist', 'kjv' or 'idx:PATH'"),
        (["simulate", "--partition", "dirichlet:-1"], "--partition", "'iid', 'shards', 'dirichlet:α' or 'sampled:N'"),
        (["simulate", "--partition", "sampled:0"], "--partition", "'iid', 'shards', 'dirichlet:α' or 'sampled:N'"),
        (["simulate", "--turned-away", "skipped"], "--turned-away", "'modeled' and 'full-stack'"),
        (["simulate", "--dp-noise-multiplier", "1", "--dp-mode", "hybrid"], "--dp-mode", "'central', 'local' or 'distributed'"),
        (["simulate", "--robust-aggregation", "krum"], "--robust-aggregation", "'median', 'trimmed-mean:β', 'multi-krum:f' or 'multi-krum:f:m'"),
        (["simulate", "--robust-aggregation", "trimmed-mean:0.5"], "--robust-aggregation", "'median', 'trimmed-mean:β'"),
        (["simulate", "--attackers", "0.2", "--attack", "backdoor"], "--attack", "'sign-flip', 'scaled', 'gaussian' or 'label-flip'"),
    ]

    @Test(arguments: wrongValues)
    func theParserRefusesAWrongValueAndListsTheValues(_ arguments: [String], _ option: String, _ listed: String) async throws {
        let run = try await Run.orchard(arguments)
        #expect(run.status == usageError)
        let value = arguments[arguments.firstIndex(of: option)! + 1]
        #expect(run.flatError.contains("The value '\(value)' is invalid for '\(option) <"), "\(run.error)")
        #expect(run.flatError.contains(listed), "\(run.error)")
        #expect(run.output.isEmpty)
    }

    static let helpLines: [(arguments: [String], listing: String)] = [
        (["serve", "--help"], "(values: normal, full; default: normal)"),
        (["serve", "--help"], "(values: trace, debug, info, notice, warning, error, critical; default: info)"),
        (["agent", "--help"], "(values: trace, debug, info, notice, warning, error, critical; default: info)"),
        (["bench", "coordinator", "--help"], "(values: normal, full; default: normal)"),
        (["bench", "train", "--help"], "(values: automatic, avx2, avx512, blas, portable)"),
        (["bench", "train", "--help"], "(values: mlp2nn, char-lstm; default: mlp2nn)"),
        (["train", "housing", "--help"], "(values: adam, sgd; default: adam)"),
        (["coreml", "export", "--help"], "(values: double, float32; default: double)"),
        (["simulate", "--help"], "(values: housing, fashion-mnist, kjv, idx:PATH; default: housing)"),
        (["simulate", "--help"], "(values: housing, mlp2nn, cnn, char-lstm)"),
        (["simulate", "--help"], "(values: chapter, book)"),
        (["simulate", "--help"], "(values: iid, shards, dirichlet:α, sampled:N)"),
        (["simulate", "--help"], "(values: modeled, full-stack)"),
        (["simulate", "--help"], "(values: fedavg, fedavgm, fedadam, fedyogi)"),
        (["simulate", "--help"], "(values: always, diurnal, realistic, trace:FILE)"),
        (["simulate", "--help"], "(values: http, memory)"),
    ]

    @Test(arguments: helpLines)
    func helpListsTheValues(_ arguments: [String], _ listing: String) async throws {
        let run = try await Run.orchard(arguments)
        #expect(run.status == 0)
        #expect(run.flatOutput.contains(listing), "\(run.output)")
    }

    @Test func theToolsVersionIsAFlagOfTheRootCommandOnly() async throws {
        let version = try await Run.orchard(["--version"])
        #expect(version.status == 0)
        #expect(version.output == "0.1.0\n")
        // `--version` of client, agent and process create is the process's version, listed once in their help.
        for command in [["client"], ["agent"], ["process", "create"]] {
            let help = try await Run.orchard(command + ["--help"])
            #expect(help.status == 0)
            let lines = help.output.split(separator: "\n").filter { $0.trimmingCharacters(in: .whitespaces).hasPrefix("--version") }
            #expect(lines.count == 1 && !lines[0].contains("Show the version"), "\(command): \(lines)")
        }
        let bare = try await Run.orchard([])
        #expect(bare.status == 0)
        #expect(bare.output.contains("SUBCOMMANDS:"))
    }

    @Test func trainHousingNamesABadOutputDirectoryBeforeTraining() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-output-file-\(UUID().uuidString)")
        try Data("x".utf8).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let run = try await Run.orchard(["train", "housing", "--output", file.path])
        #expect(run.status != 0)
        #expect(run.error.contains("--output '\(file.path)': is a file, not a directory"), "\(run.error)")
        #expect(!run.error.contains("epochs"), "refused before any training (no progress line)")
        #expect(!run.error.contains("NSCocoaErrorDomain"))
    }

    @Test func aListedValueIsAccepted() async throws {
        // A valid enumerated value gets past the parser: the missing trace file is reported with its reason.
        let run = try await Run.orchard(["simulate", "--availability", "trace:/nonexistent/trace.csv", "--transport", "memory", "--rounds", "1"])
        #expect(run.status == usageError)
        #expect(run.error.contains("/nonexistent/trace.csv: no such file"), "\(run.error)")
        #expect(!run.error.contains("is invalid for") && !run.error.contains("could not be completed"))
    }
}

@Suite struct ConfigurationErrorTests {
    @Test(arguments: [
        (["bench", "coordinator", "--devices", "0"], "--devices must be at least 1"),
        (["bench", "coordinator", "--params", "5"], "--params must be at least 10"),
        (["bench", "coordinator", "--report-concurrency", "0"], "--report-concurrency must be at least 1"),
        (["simulate", "--devices", "0"], "--devices must be in 1...100000000"),
        (["simulate", "--devices", "-5"], "--devices must be in 1...100000000, not -5"),
        (["simulate", "--clients", "-5"], "--devices must be in 1...100000000, not -5"),  // the old name, kept hidden
        (["simulate", "--devices", "9223372036854775807", "--fraction", "1"], "--devices must be in 1...100000000"),
        // Values that trapped while the goal or capacity was derived, before these checks ran.
        (["simulate", "--fraction", "nan"], "--fraction must be in (0, 1], not nan"),
        (["simulate", "--fraction", "1e300"], "--fraction must be in (0, 1]"),
        (["simulate", "--dp-noise-multiplier", "1", "--over-selection", "1e300"], "--over-selection must be in 1...100.0"),
        (["simulate", "--window-seconds", "1e19"], "--window-seconds must be a positive number of seconds up to 31536000"),
        (["simulate", "--aggregation", "buffered", "--buffer-size", "2305843009213693952"], "--buffer-size must be in 1...1000000"),
        (["simulate", "--coordinator", "http://127.0.0.1:1", "--host-timeout", "1e30"], "--host-timeout must be at most 31536000 seconds"),
        (["simulate", "--clients", "5", "--devices", "5"], "--clients is the old name of --devices: give one of them"),
        (["simulate", "--rounds", "-1"], "--rounds"),
        (["serve", "--instance-id", "bad:id"], "--instance-id must be 1 to 64 ASCII letters"),
        (["serve", "--seal-lease", "0"], "--seal-lease must be a positive number of seconds"),
        (["serve", "--database", "postgres://orchard@127.0.0.1/db?sslmode=maybe"], "unknown sslmode 'maybe'"),
        (["serve", "--database", "mysql://x/y"], "use a SQLite path, a sqlite:// or file:// URL, or a postgres:// URL"),
        (["bench", "coordinator", "--instances", "2"], "--instances must be 1 without a PostgreSQL database"),
        (["simulate", "--lr", "0"], "--lr must be a positive number"),
        (["simulate", "--server-lr", "0"], "--server-lr must be a positive number, not 0.0"),
        (["simulate", "--server-lr", "-2"], "--server-lr must be a positive number, not -2.0"),
        (["simulate", "--server-lr", "inf"], "--server-lr must be a positive number, not inf"),
        (["simulate", "--server-lr", "nan"], "--server-lr must be a positive number"),
        (["simulate", "--over-selection", "0.5"], "--over-selection must be in 1...100.0"),
        (["simulate", "--dp-clip", "1"], "--dp-clip needs --dp-noise-multiplier"),
        (["simulate", "--population", "1000"], "--population needs --dp-noise-multiplier"),
        (["simulate", "--dp-noise-multiplier", "0"], "--dp-noise-multiplier must be in (0, 1000]"),
        (["simulate", "--dp-noise-multiplier", "1", "--dp-clip=-2"], "--dp-clip must be a positive finite number"),
        (["simulate", "--dp-noise-multiplier", "1", "--dp-delta", "2"], "--dp-delta must be in (0, 1)"),
        (["simulate", "--dp-noise-multiplier", "1", "--dp-adaptive-quantile", "1.5"], "--dp-adaptive-quantile must be in (0, 1)"),
        (["simulate", "--dp-noise-multiplier", "1", "--population", "3"], "--population (3) must be at least the devices a cycle admits"),
        (["simulate", "--shard", "1/2"], "--shard needs --coordinator"),
        (["simulate", "--attack", "gaussian"], "--attack needs --attackers"),
        (["simulate", "--attack-scale", "3"], "--attack-scale needs --attackers"),
        (["simulate", "--attackers", "1.5"], "--attackers must be in (0, 1), not 1.5"),
        (["simulate", "--attackers", "0.01"], "--attackers 0.01 of 20 devices rounds to no attacker"),
        (["simulate", "--attackers", "0.2", "--attack-scale", "0"], "--attack-scale must be a positive number"),
        (["simulate", "--attackers", "0.2", "--attack", "label-flip"], "--attack label-flip needs a classifier"),
        (["simulate", "--attackers", "0.2", "--attack", "label-flip", "--attack-scale", "2"], "--attack-scale does not apply to --attack label-flip"),
        (["simulate", "--robust-aggregation", "median", "--secure-aggregation"], "--robust-aggregation cannot be used with --secure-aggregation"),
        (["simulate", "--robust-aggregation", "median", "--dp-noise-multiplier", "1"], "--robust-aggregation cannot be used with privacy"),
        (["simulate", "--robust-aggregation", "multi-krum:8"], "--robust-aggregation multi_krum(f=8) needs at least 11 reports a round; the goal"),
        (["simulate", "--coordinator", "localhost:8080"], "--coordinator must be an http or https URL"),
        (["simulate", "--coordinator", "http://127.0.0.1:1,localhost:2"], "not 'localhost:2'"),
        (["simulate", "--coordinator", "http://127.0.0.1:1,http://127.0.0.1:1"], "--coordinator names 'http://127.0.0.1:1' twice"),
        (["simulate", "--coordinator", "http://127.0.0.1:1", "--shard", "3/2"], "--shard 3/2: the shard number must be in 1…2"),
        (["simulate", "--coordinator", "http://127.0.0.1:1", "--shard", "a/b"], "--shard must be i/n"),
        (["simulate", "--coordinator", "http://127.0.0.1:1", "--transport", "memory"], "--transport cannot be used with --coordinator"),
        (["simulate", "--coordinator", "http://127.0.0.1:1", "--window-seconds", "5"], "--window-seconds cannot be used with --coordinator"),
        (["simulate", "--coordinator", "http://127.0.0.1:1", "--availability", "diurnal"], "--availability diurnal cannot be used with --coordinator"),
        (["simulate", "--coordinator", "http://127.0.0.1:1", "--device-speeds", "speeds.json"], "--device-speeds cannot be used with --coordinator"),
        (["simulate", "--device-speeds", "/nonexistent/speeds.json"], "cannot read the device speed trace /nonexistent/speeds.json"),
        (["simulate", "--coordinator", "https://127.0.0.1:1", "--ca-cert", "/nonexistent/ca.pem"], "'/nonexistent/ca.pem': no such file"),
        (["serve", "--open-auth-burst", "0"], "--open-auth-burst must be at least 1"),
        (["serve", "--connection-idle-timeout", "1e10"], "--connection-idle-timeout must be a positive number of seconds up to 86400"),
        (
            ["agent", "--server", "http://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--poll-interval", "0.0001"],
            "--poll-interval must be in 0.01...86400"
        ),
        (
            ["agent", "--server", "http://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--poll-interval", "1e16"],
            "--poll-interval must be in 0.01...86400"
        ),
        (
            ["agent", "--server", "http://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--shutdown-grace", "1e16"],
            "--shutdown-grace must be in 0...3600"
        ),
        (["serve", "--open-auth-per-second=-1"], "--open-auth-per-second must be a non-negative number"),
        (["serve", "--max-open-workers=-1"], "--max-open-workers must be non-negative"),
        (["serve", "--speed-test-interval", "nan"], "--speed-test-interval must be a non-negative number of seconds"),
        (["serve", "--tls-cert", "/nonexistent/server.pem"], "--tls-cert needs --tls-key"),
        (
            ["client", "--server", "https://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--ca-cert", "/nonexistent/ca.pem"],
            "'/nonexistent/ca.pem': no such file"
        ),
        // Training settings a model's training section cannot hold (`process create` would refuse the files), and values
        // that overflowed while the progress total or the batch buffers were sized.
        (["train", "housing", "--epochs", "4611686018427387904"], "--epochs must be in 1...10000"),
        (["train", "housing", "--batch-size", "1000000000000000000"], "--batch-size must be in 1...65536"),
        // A Flower-only option without --flower-superlink is refused, not ignored.
        (
            ["agent", "--server", "http://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--heartbeat-interval", "60"],
            "--heartbeat-interval are for --flower-superlink"
        ),
        // The device's JWT comes from a file or ORCHARD_DEVICE_TOKEN, one way only.
        (
            ["client", "--server", "http://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--token-file", "/nonexistent/device.jwt"],
            "--token-file '/nonexistent/device.jwt'"
        ),
        (
            ["client", "--server", "http://127.0.0.1:1", "--process", "m", "--version", "1", "--data", "d", "--token-file", "/x", "--token", "y"],
            "the device token is given 2 ways (--token-file, --token)"
        ),
    ])
    func libraryErrorsAreShownWithTheOptionThatSetsTheField(_ arguments: [String], _ message: String) async throws {
        let run = try await Run.orchard(arguments)
        #expect(run.status == usageError)
        #expect(run.error.contains(message), "\(run.error)")
        // The usage shown is the subcommand's, not the root's (`client` checks its CA file when it runs: a `validate()`
        // there would let the tool's own `--version` flag take the client's `--version` option).
        if arguments[0] != "client" { #expect(run.error.contains("Usage: orchard \(arguments[0])"), "\(run.error)") }
    }

    @Test func aPortInUseIsNamedBeforeTheDatabaseIsCreated() async throws {
        // Hold a port with a listening socket.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        try #require(bound == 0 && listen(fd, 1) == 0)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        let port = Int(UInt16(bigEndian: address.sin_port))
        let database = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-port-\(UUID().uuidString).sqlite").path
        let run = try await Run.orchard(["serve", "--port", "\(port)", "--database", database, "--admin-token-file", "/nonexistent-not-read"])
        // A runtime failure, not a usage error: one line, no usage block.
        #expect(run.status == 1)
        #expect(run.error.contains("--port \(port): 127.0.0.1:\(port) is already in use"), "\(run.error)")
        #expect(run.error.split(separator: "\n").count == 1 && !run.error.contains("Usage:"), "\(run.error)")
        #expect(!FileManager.default.fileExists(atPath: database), "nothing is created for a server that cannot listen")
    }
}

@Suite struct BenchmarkLineTests {
    /// The one line a benchmark printed, as a JSON object.
    func object(_ run: Run) throws -> [String: Any] {
        #expect(run.status == 0, "\(run.error)")
        let lines = run.output.split(separator: "\n")
        try #require(lines.count == 1, "\(run.output)")
        return try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
    }

    @Test func benchCoordinatorPrintsPeakRSSInMiB() async throws {
        let run = try await Run.orchard([
            "bench", "coordinator", "--devices", "2", "--params", "20", "--checkins", "4", "--rate", "0", "--rounds", "1", "--durability", "full",
        ])
        // Progress goes to standard error (how many lines depends on how long the run takes); stdout is one JSON line.
        let line = try object(run)
        #expect(line["benchmark"] as? String == "coordinator")
        #expect((line["reports"] as? NSNumber)?.intValue == 2)
        #expect((line["checkins"] as? NSNumber)?.intValue == 4)
        #expect(((line["peak_rss_mib"] as? NSNumber)?.doubleValue ?? 0) > 1)
        #expect(line["peak_rss_mb"] == nil)
    }

    @Test func benchTrainPrintsPeakRSSInMiB() async throws {
        let line = try object(try await Run.orchard(["bench", "train", "--samples", "40", "--batch", "10", "--repeats", "1", "--backend", "portable"]))
        #expect(line["model"] as? String == "mlp2nn")
        #expect(line["backend"] as? String == "portable")
        #expect((line["steps_per_epoch"] as? NSNumber)?.intValue == 4)
        let peak = try #require((line["peak_rss_mib"] as? NSNumber)?.doubleValue)
        let dataset = try #require((line["dataset_mib"] as? NSNumber)?.doubleValue)
        let rest = try #require((line["peak_rss_minus_dataset_mib"] as? NSNumber)?.doubleValue)
        #expect(peak > 1)
        #expect(dataset == 0.1)  // 40 × (784 + 1) Float32 = 0.12 MiB, to 0.1 MiB
        #expect(abs(peak - dataset - rest) <= 0.11)
        #expect(!line.keys.contains { $0.hasSuffix("_mb") })
    }

    /// `--server-lr` reaches the process's `server_config.aggregator` and the summary's settings.
    @Test func serverLearningRateIsASetting() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-cli-server-lr-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let run = try await Run.orchard(["simulate", "--rounds", "1", "--dropout", "0", "--server-lr", "2.5", "--output", directory.path])
        #expect(run.status == 0, "\(run.error)")
        let summary = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: directory.appendingPathComponent("summary.json"))) as? [String: Any])
        #expect((summary["settings"] as? [String: Any])?["server_lr"] as? Double == 2.5)
        #expect((summary["aggregated_rounds"] as? NSNumber)?.intValue == 1)
    }

    /// The housing scenario's 10 s windows hold its 7.5 s of training but not secure aggregation's exchanges after it:
    /// `--secure-aggregation` gives its devices 60 s unless `--window-seconds` says otherwise, and a window too short
    /// for the protocol is named before the run (whose cycles are then all abandoned).
    @Test func secureAggregationGetsAWindowThatHoldsItsExchangesOrAWarning() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-cli-sa-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        func summary(_ run: Run) throws -> [String: Any] {
            #expect(run.status == 0, "\(run.error)")
            let data = try Data(contentsOf: directory.appendingPathComponent("summary.json"))
            return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        }
        let fitting = try await Run.orchard(["simulate", "--secure-aggregation", "--rounds", "1", "--dropout", "0", "--output", directory.path])
        let fitted = try summary(fitting)
        #expect((fitted["settings"] as? [String: Any])?["window_seconds"] as? Double == 60, "settings are numbers in summary.json")
        #expect((fitted["aggregated_rounds"] as? NSNumber)?.intValue == 1)
        #expect(!(fitting.output + fitting.error).contains("warning:"))

        let short = try await Run.orchard([
            "simulate", "--secure-aggregation", "--window-seconds", "10", "--rounds", "1", "--dropout", "0", "--output", directory.path,
        ])
        let shorted = try summary(short)
        #expect((shorted["settings"] as? [String: Any])?["window_seconds"] as? Double == 10)
        #expect((shorted["aggregated_rounds"] as? NSNumber)?.intValue == 0)
        let flat = (short.output + " " + short.error).split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(flat.contains("warning: a 10.0 s background window leaves 2.5 s after the median device's 7.5 s of training"), "\(flat)")
    }

    @Test func benchGEMMPrintsEveryBackend() async throws {
        let line = try object(try await Run.orchard(["bench", "gemm", "--m", "4", "--n", "4", "--k", "4", "--repeats", "1", "--seconds", "0.0001"]))
        let gflops = try #require(line["gflops"] as? [String: Any])
        #expect(gflops["automatic"] != nil && gflops["portable"] != nil)
        #expect(line["automatic_runs_on"] is String)
        #expect(line["transpose_a"] as? Bool == false)
    }
}

/// `orchard privacy`: the accountant's answers as JSON lines, and bad values refused naming the value.
@Suite struct PrivacyCommandTests {
    @Test func epsilonAndNoiseAnswerAsJSONLines() async throws {
        let epsilon = try await Run.orchard([
            "privacy", "epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.1", "--steps", "10000", "--delta", "1e-5", "--json",
        ])
        #expect(epsilon.status == 0, "\(epsilon.error)")
        let line = try #require(try JSONSerialization.jsonObject(with: Data(epsilon.output.utf8)) as? [String: Any])
        // dp-accounting 0.6.0 gives 5.6320 at order 4.7 with its default orders (see RDPAccountantTests).
        #expect(abs((line["epsilon"] as? Double ?? 0) - 5.6320) < 0.001)
        #expect((line["optimal_order"] as? NSNumber)?.doubleValue == 4.7)

        let noise = try await Run.orchard([
            "privacy", "noise", "--sampling-rate", "0.01", "--steps", "10000", "--delta", "1e-5", "--target-epsilon", "2", "--json",
        ])
        #expect(noise.status == 0, "\(noise.error)")
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(noise.output.utf8)) as? [String: Any])
        let z = try #require(answer["noise_multiplier"] as? Double)
        #expect(z > 1.1 && z < 4)
        #expect((answer["epsilon"] as? Double ?? 99) <= 2)
    }

    @Test(arguments: [
        (["epsilon", "--sampling-rate", "1.5", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "sampling rate must be in 0...1"),
        (["epsilon", "--sampling-rate", "0.1", "--noise-multiplier=-1", "--steps", "10", "--delta", "1e-5"], "noise multiplier must be"),
        (["epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "0"], "delta must be in (0, 1)"),
        (["noise", "--sampling-rate", "1", "--steps", "1000", "--delta", "1e-5", "--target-epsilon", "1e-9"], "no noise multiplier up to 10^4"),
    ])
    func badValuesAreRefusedNamingThem(arguments: [String], message: String) async throws {
        let run = try await Run.orchard(["privacy"] + arguments)
        #expect(run.status != 0)
        #expect(run.flatError.contains(message), "\(run.error)")
    }
}

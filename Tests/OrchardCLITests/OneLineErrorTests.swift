import OrchardTesting
import Testing

/// What the first run used to print badly, now: a negative number is a value (and is refused for what it is, not as a
/// missing value), and library checks speak of the options the user typed, not the library's field names.
@Suite struct OneLineErrorTests {
    @Test(arguments: [
        (["bench", "gemm", "--m", "-4"], "--m, --n, --k, --threads, --repeats and --seconds must be positive"),
        (["train", "housing", "--epochs", "-1"], "--epochs must be in 1...10000"),
        (["serve", "--seal-lease", "-1"], "--seal-lease must be a positive number of seconds"),
        (["simulate", "--secure-aggregation", "--sa-threshold", "50", "--rounds", "1"], "--sa-threshold 50 is more than the 9 neighbours a device has"),
        (["simulate", "--secure-aggregation", "--sa-threshold", "1", "--rounds", "1"], "--sa-threshold must be at least 2, not 1"),
        (["simulate", "--dp-mode", "distributed", "--dp-noise-multiplier", "1", "--rounds", "1"], "--dp-mode distributed needs --secure-aggregation"),
    ])
    func refusedForWhatIsWrong(arguments: [String], message: String) async throws {
        let run = try await Run.orchard(arguments)
        #expect(run.status != 0)
        #expect(run.flatError.contains(message), "\(run.error)")
        #expect(!run.error.contains("Missing value") && !run.error.contains("goal_count") && !run.error.contains("secureAggregation"), "\(run.error)")
    }
}

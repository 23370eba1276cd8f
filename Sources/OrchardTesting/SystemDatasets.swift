public import Foundation
public import Testing

/// Datasets that tests read from Debian's packages (e.g. `dataset-fashion-mnist` in
/// `/usr/share/datasets/fashion-mnist`): a test that needs one is skipped, with the install command as its reason,
/// when it is missing, unless `ORCHARD_REQUIRE_DATASETS=1` is set (CI), in which case it runs and fails.
public enum SystemDatasets {
    /// The environment variable that turns a missing dataset from a skip into a failure.
    public static let requireVariable = "ORCHARD_REQUIRE_DATASETS"

    /// Whether `ORCHARD_REQUIRE_DATASETS=1` is set in `environment` (the process's by default).
    public static func isRequired(in environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        environment[requireVariable] == "1"
    }

    /// A condition trait: runs the test when `file` exists (or the variable is set); otherwise skips it, saying
    /// which Debian package to install.
    /// - Parameters:
    ///   - file: A file the dataset's package installs.
    ///   - package: The Debian package.
    public static func requirement(
        file: String, package: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> ConditionTrait {
        let present = FileManager.default.fileExists(atPath: file)
        let comment =
            present
            ? "needs \(file) (Debian's \(package)), which is present"
            : "\(file) is missing; install it with `apt-get install \(package)`, or set \(requireVariable)=1 to make this a failure"
        return .enabled(if: present || isRequired(in: environment), Comment(rawValue: comment))
    }
}

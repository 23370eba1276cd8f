public import Foundation
import OrchardSupport
import OrchardClient
public import OrchardHTTPClient
import OrchardOperator
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import Logging
import Synchronization

/// How a shard of the fleet reaches a coordinator that runs elsewhere (`orchard simulate --coordinator URL`).
public struct ExternalCoordinator: Sendable {
    /// The coordinator's base URL, `http` or `https`: the shard hosts and watches the process there.
    public var url: String
    /// Further instances of the same coordinator (sharing its store) the devices are spread over with ``url``: device
    /// d talks to instance d mod n of `[url] + additionalURLs`, as behind a round-robin balancer.
    public var additionalURLs: [String] = []
    /// The slice of the fleet this process runs.
    public var shard: FleetShard
    /// The certificate authorities trusted for `https` (a private CA's with `TrustRoots.certificateFile(_:)`).
    public var trustRoots: TrustRoots
    /// Most local trainings at the same time (devices wait for a slot after their download).
    public var concurrency: Int
    /// How long to wait for shard 1 to host the process, and the longest gap in the coordinator's answers tolerated
    /// while the shard runs.
    public var hostTimeout: Duration
    /// The time between two reads of the process's status.
    public var pollInterval: Duration
    /// The hosted process's name (default `simulation-<model>`); its version is 1.0.0.
    public var processName: String?
    /// How long a device's HTTP request, or a call of the shard's to the admin API, may wait to connect and for each piece of data.
    public var requestTimeout: Duration

    /// Creates settings; every field but the URL has a default.
    public init(
        url: String, shard: FleetShard = .whole, trustRoots: TrustRoots = .system,
        concurrency: Int = 2 * ProcessInfo.processInfo.activeProcessorCount, hostTimeout: Duration = .seconds(300), pollInterval: Duration = .seconds(1),
        processName: String? = nil, requestTimeout: Duration = .seconds(30)
    ) {
        self.url = url
        self.shard = shard
        self.trustRoots = trustRoots
        self.concurrency = concurrency
        self.hostTimeout = hostTimeout
        self.pollInterval = pollInterval
        self.processName = processName
        self.requestTimeout = requestTimeout
    }

    /// Every instance's URL, the hosting one first.
    public var urls: [String] { [url] + additionalURLs }

    /// The instance device `device` talks to.
    public func url(forDevice device: Int) -> String { urls[device % urls.count] }

    /// Throws an error whose message starts with the first invalid field's name.
    public func validate() throws(SimulationError) {
        for candidate in urls {
            guard let parsed = URL(string: candidate), let scheme = parsed.scheme?.lowercased(), scheme == "http" || scheme == "https",
                let host = parsed.host, !host.isEmpty
            else {
                throw SimulationError(
                    .invalidOption,
                    "coordinator must be an http or https URL with a host (several separated by commas), such as http://127.0.0.1:8080 or https://fl.example.com, not '\(candidate)'"
                )
            }
        }
        if let repeated = urls.enumerated().first(where: { urls[..<$0.offset].contains($0.element) })?.element {
            throw SimulationError(.invalidOption, "coordinator names '\(repeated)' twice: give each instance once")
        }
        if concurrency < 1 { throw SimulationError(.invalidOption, "concurrency must be at least 1, not \(concurrency)") }
        if hostTimeout <= .zero { throw SimulationError(.invalidOption, "hostTimeout must be a positive number of seconds, not \(hostTimeout.secondsText)") }
        if pollInterval <= .zero { throw SimulationError(.invalidOption, "pollInterval must be a positive number of seconds, not \(pollInterval.secondsText)") }
        if requestTimeout <= .zero {
            throw SimulationError(.invalidOption, "requestTimeout must be a positive number of seconds, not \(requestTimeout.secondsText)")
        }
    }
}

public import Foundation
public import Logging
public import OrchardPrivacy
import OrchardProtocol
public import OrchardScheduler

/// Settings of a device client. Every field has a default.
public struct ClientConfiguration: Sendable {
    /// The directory holding every job's durable state (one subdirectory per job).
    public var storageDirectory: URL
    /// Seconds an HTTP request may wait for data.
    public var requestTimeout: Double
    /// Retries of calls that fail transiently.
    public var retry: RequestRetryPolicy
    /// Clock, sleep and randomness.
    public var environment: ClientEnvironment
    /// The seed of local training; each cycle trains with a seed derived from it and the cycle number.
    public var trainingSeed: UInt64
    /// The local trainer used by ``FederatedJob/train(on:constraints:)``.
    public var trainer: any LocalTrainer
    /// Where the device's power and network state comes from; nil reads every condition as unknown, so a
    /// cycle with constraints reports them unmet.
    public var conditions: (any DeviceConditionsProvider)?
    /// Thresholds and the unknown-reading rule for constraints (the scheduler's rules).
    public var conditionRules: ConditionRules
    /// Logs.
    public var logger: Logger
    /// Whether the job's files are forced to disk when written (``StorageDurability/synced``, the default).
    public var durability: StorageDurability
    /// How link speed is measured when a process asks for it before a cycle request.
    public var linkSpeedTest: LinkSpeedTest
    /// The certificate authorities the HTTP transport trusts for `https` (the system's by default; a private CA's
    /// with ``TrustRoots/certificateFile(_:)``).
    public var trustRoots: TrustRoots
    /// How long a device waits for the other devices of a secure-aggregation cycle before it gives up.
    public var secureAggregationWait: SecureAggregationWaitLimit
    /// The device's long-term identity (its signing key and the certificate an authority issued for it), for
    /// processes whose secure aggregation has `consistency_check`; such a process is refused without one. Keep it
    /// where the device's secrets live (the Keychain on Apple platforms).
    public var secureAggregationIdentity: SecureAggregationIdentity?
    /// The authorities whose certificates this device accepts (raw P-256 public keys, shipped with the app, never
    /// learnt from the coordinator). When set, the device takes part only in secure aggregation with
    /// `consistency_check`, and only with peers certified by one of them: a coordinator that invents devices or tells
    /// devices different survivor sets cannot unmask anyone.
    public var secureAggregationAuthorities: [Data]

    /// Creates a configuration.
    public init(
        storageDirectory: URL = ClientConfiguration.defaultStorageDirectory, requestTimeout: Double = 30,
        retry: RequestRetryPolicy = RequestRetryPolicy(), environment: ClientEnvironment = .system, trainingSeed: UInt64 = 0,
        trainer: any LocalTrainer = EngineLocalTrainer(), conditions: (any DeviceConditionsProvider)? = nil,
        conditionRules: ConditionRules = ConditionRules(), logger: Logger = Logger(label: "orchard.client"),
        durability: StorageDurability = .synced, linkSpeedTest: LinkSpeedTest = LinkSpeedTest(), trustRoots: TrustRoots = .system,
        secureAggregationWait: SecureAggregationWaitLimit = SecureAggregationWaitLimit(), secureAggregationIdentity: SecureAggregationIdentity? = nil,
        secureAggregationAuthorities: [Data] = []
    ) {
        self.secureAggregationWait = secureAggregationWait
        self.secureAggregationIdentity = secureAggregationIdentity
        self.secureAggregationAuthorities = secureAggregationAuthorities
        self.trustRoots = trustRoots
        self.durability = durability
        self.linkSpeedTest = linkSpeedTest
        self.conditions = conditions
        self.conditionRules = conditionRules
        self.storageDirectory = storageDirectory
        self.requestTimeout = requestTimeout
        self.retry = retry
        self.environment = environment
        self.trainingSeed = trainingSeed
        self.trainer = trainer
        self.logger = logger
    }

    /// The platform's application-support directory (`~/.local/share` style on Linux), subdirectory `Orchard`.
    public static var defaultStorageDirectory: URL {
        let base = FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
            ?? URL(fileURLWithPath: NSTemporaryDirectory())
        return base.appendingPathComponent("Orchard", isDirectory: true)
    }
}

/// How the job's state files are written. Every write is atomic (a reader sees the old file or the new one);
/// `synced` also forces it to disk before returning, so a report or checkpoint survives power loss.
public struct StorageDurability: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable { case synced, unsynced }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Atomic and forced to disk (fsync): for devices.
    public static let synced = StorageDurability(.synced)
    /// Atomic, left to the operating system to write back: for simulated fleets and tests, where thousands of
    /// virtual devices share one disk and none of them loses power.
    public static let unsynced = StorageDurability(.unsynced)

    public var description: String { kind.rawValue }
}

/// Where a device's token comes from, asked each time the device authenticates: a process with `hs256` or `rs256`
/// authentication accepts a JWT that the app's backend signs (`sub` names the device, `exp` a few hours away), so a
/// token that expires between background windows is replaced by the next authentication's, not fatal.
public protocol DeviceTokenProvider: Sendable {
    /// A token valid now.
    func deviceToken() async throws -> String
}

/// A device's connection to one coordinator: creates jobs for the FL processes it takes part in.
///
/// ```swift
/// let client = try OrchardClient(url: "https://fl.example.com", authToken: jwt)
/// let job = try client.newJob(processName: "mnist", version: "1.0")
/// let outcome = try await job.train(on: localData)
/// ```
public struct OrchardClient: Sendable {
    /// The settings.
    public let configuration: ClientConfiguration
    /// The device's credential (a JWT), or nil for coordinators in open mode (or when ``tokenProvider`` gives it).
    public let authToken: String?
    /// Gives the device's token each time the device authenticates; when set, ``authToken`` is not used.
    public let tokenProvider: (any DeviceTokenProvider)?
    let transport: any ClientTransport
    let server: String

    /// Creates a client for a coordinator reached over HTTP.
    /// - Parameters:
    ///   - url: The coordinator's base URL, e.g. `https://fl.example.com`.
    ///   - authToken: The device's JWT, or nil in open mode.
    ///   - configuration: Settings.
    /// - Throws: ``OrchardClientError/Code/invalidConfiguration`` for a URL that is not absolute HTTP(S), or trust roots
    ///   that are not PEM certificates.
    public init(url: String, authToken: String? = nil, configuration: ClientConfiguration = ClientConfiguration()) throws(OrchardClientError) {
        let transport = try HTTPTransport(
            url: url, timeout: configuration.requestTimeout, trustRoots: configuration.trustRoots, clock: configuration.environment.clock
        )
        self.init(transport: transport, server: transport.baseURL.absoluteString, authToken: authToken, configuration: configuration)
    }

    /// Creates a client for a coordinator reached over HTTP, whose device token comes from `tokenProvider` each time
    /// the device authenticates (a fresh one after the last expired).
    /// - Throws: as ``init(url:authToken:configuration:)``.
    public init(url: String, tokenProvider: any DeviceTokenProvider, configuration: ClientConfiguration = ClientConfiguration()) throws(OrchardClientError) {
        let transport = try HTTPTransport(
            url: url, timeout: configuration.requestTimeout, trustRoots: configuration.trustRoots, clock: configuration.environment.clock
        )
        self.init(transport: transport, server: transport.baseURL.absoluteString, tokenProvider: tokenProvider, configuration: configuration)
    }

    /// Creates a client over any transport whose device token comes from `tokenProvider` each time the device
    /// authenticates.
    public init(transport: any ClientTransport, server: String, tokenProvider: any DeviceTokenProvider, configuration: ClientConfiguration = ClientConfiguration()) {
        self.transport = transport
        self.server = server
        self.authToken = nil
        self.tokenProvider = tokenProvider
        self.configuration = configuration
    }

    /// The token to authenticate with now: the provider's, or the fixed one.
    func currentAuthToken() async throws(OrchardClientError) -> String? {
        guard let tokenProvider else { return authToken }
        do {
            return try await tokenProvider.deviceToken()
        } catch let error as OrchardClientError {
            throw error
        } catch is CancellationError {
            throw OrchardClientError(.cancelled, "cancelled while getting a device token")
        } catch let error as URLError {
            // The app's backend could not be reached: transient, like any network failure.
            throw OrchardClientError(.network, "cannot reach the app's backend for a device token: \(error.localizedDescription)")
        } catch {
            throw OrchardClientError(.authenticationFailed, "the app's provider gave no device token: \(error)")
        }
    }

    /// Creates a client over any transport (e.g. `OrchardInProcess`'s in-process transport).
    /// - Parameters:
    ///   - transport: How to reach the coordinator.
    ///   - server: A name for the coordinator; a saved session is reused only with the same name.
    ///   - authToken: The device's JWT, or nil in open mode.
    ///   - configuration: Settings.
    public init(transport: any ClientTransport, server: String, authToken: String? = nil, configuration: ClientConfiguration = ClientConfiguration()) {
        self.transport = transport
        self.server = server
        self.authToken = authToken
        self.tokenProvider = nil
        self.configuration = configuration
    }

    /// A job for one FL process, with its state in its own subdirectory of the storage directory.
    /// - Parameters:
    ///   - processName: The process's name.
    ///   - version: Its version, such as "1.0" (the same as "1.0.0").
    /// - Throws: ``OrchardClientError/Code/invalidConfiguration`` for an empty name or a malformed version.
    public func newJob(processName: String, version: String) throws(OrchardClientError) -> FederatedJob {
        guard !processName.isEmpty else { throw OrchardClientError(.invalidConfiguration, "the process name is empty") }
        guard let parsed = SemanticVersion(version) else {
            throw OrchardClientError(.invalidConfiguration, "'\(version)' is not a version such as 1.0 or 1.0.0")
        }
        let safeName = String(processName.map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." ? $0 : "_" })
        let directory = configuration.storageDirectory.appendingPathComponent("\(safeName)@\(parsed)", isDirectory: true)
        return FederatedJob(client: self, processName: processName, version: parsed, directory: directory)
    }
}

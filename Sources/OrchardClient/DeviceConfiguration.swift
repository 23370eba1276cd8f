public import Foundation
public import Logging
public import OrchardHTTPClient
public import OrchardPrivacy
import OrchardProtocol
public import OrchardScheduler

/// Settings of a device client. Every field has a default.
public struct DeviceConfiguration: Sendable {
    /// The directory holding every job's durable state (one subdirectory per job).
    public var storageDirectory: URL
    /// How long an HTTP request may wait to connect and for each piece of data.
    public var requestTimeout: Duration
    /// Retries of calls that fail transiently.
    public var retry: RequestRetryPolicy
    /// Clock, sleep and randomness.
    public var environment: ClientEnvironment
    /// The seed of local training (each cycle trains with a seed derived from it and the cycle number) and of the
    /// held-out split of federated evaluation: keep it fixed for a device, since another seed holds out other rows (and
    /// trains on the ones held out before).
    public var trainingSeed: UInt64
    /// The local trainer used by ``FederatedJob/train(on:constraints:tasks:)``.
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
    /// with `TrustRoots.certificateFile(_:)`).
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

    /// The default ``requestTimeout``.
    public static let defaultRequestTimeout: Duration = .seconds(30)

    /// Creates a configuration.
    public init(
        storageDirectory: URL = DeviceConfiguration.defaultStorageDirectory, requestTimeout: Duration = defaultRequestTimeout,
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
        let base =
            FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
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

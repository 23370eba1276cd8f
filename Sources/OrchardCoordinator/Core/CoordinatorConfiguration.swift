public import Foundation
import OrchardSupport

/// Settings of a coordinator instance (per-process settings live in `ServerConfig`).
public struct CoordinatorConfiguration: Sendable {
    /// The bearer token for the admin API; nil disables the admin API.
    public var adminToken: String?
    /// The largest report body accepted, in bytes.
    public var maximumReportBytes: Int
    /// The largest admin request body accepted (a hosted model), in bytes.
    public var maximumAdminBodyBytes: Int
    /// The largest JSON control message accepted, in bytes.
    public var maximumMessageBytes: Int
    /// Reports folded in memory before the running sum is written back and their diffs dropped.
    public var foldInterval: Int
    /// How long a session token stays valid.
    public var sessionLifetime: Duration
    /// How often one client address may authenticate to processes in open mode (where every call registers a
    /// worker); nil for no limit. Calls from the in-process transport carry no address and are not limited.
    public var openAuthenticationRate: RateLimit?
    /// The most workers one process in open mode may register; nil for no limit.
    public var maximumOpenWorkers: Int?
    /// The least time between two speed tests in the same direction by the same worker (zero: no limit).
    public var speedTestInterval: Duration
    /// Report uploads received at once; one more is refused with `too_many_uploads` (503) and ``uploadRetryAfter``.
    public var maximumUploadsInFlight: Int
    /// Uploads one worker may have in flight at once (its report, and a stale connection the server has not yet
    /// noticed); one more is refused with `too_many_uploads`, so one session cannot take every place.
    public var maximumUploadsPerWorker: Int = 2
    /// How long a device refused for ``maximumUploadsInFlight`` is told to wait (`Retry-After`, whole seconds in 1…3600).
    public var uploadRetryAfter: Duration
    /// The largest safetensors header a report may announce (its tensors' names, shapes and offsets and the report
    /// metadata: about 100 bytes a tensor); more is refused with `payload_too_large` before it is read.
    public var maximumReportHeaderBytes: Int
    /// How long a connection may send nothing before it is closed: an idle keep-alive connection, or an upload that
    /// stalled mid-body (which is then abandoned, so it cannot hold its cycle open or its upload place); nil never.
    public var connectionIdleTimeout: Duration?
    /// How long past its cycle's deadline (a buffered report: past its assignment's `cycle_length`) an admitted report
    /// may still be arriving; after that its next bytes are refused with `deadline_passed`, so an upload trickling in
    /// a byte at a time cannot hold its cycle's closing (or its buffer's release) for longer.
    public var reportUploadGrace: Duration = .seconds(300)
    /// This instance's name among the coordinator instances sharing a store (each folds the reports it accepts into
    /// its own partial sum under this name); unique per instance, stable across its restarts.
    public var instanceID: String
    /// How long a cycle may stay sealed by another instance before this one takes its closing over (that instance
    /// is presumed dead); only with a store shared by several instances.
    public var sealLease: Duration
    /// The largest held-out data file a process may have attached for server-side evaluation (64 MiB by default); it is
    /// kept in the store and evaluated in memory.
    public var maximumEvaluationDataBytes: Int = 64 << 20
    /// Where a robust rule's scratch file of a cycle's reports goes (reports × model × 4 bytes, unlinked when created):
    /// the system's temporary directory by default; name a disk-backed directory where that is a RAM file system.
    public var scratchDirectory: URL = FileManager.default.temporaryDirectory

    /// Open-mode authentication by default: 30 calls at once per client address, then one every 2 seconds.
    public static let defaultOpenAuthenticationRate = RateLimit(burst: 30, perSecond: 0.5)
    /// Workers one open-mode process may register by default.
    public static let defaultMaximumOpenWorkers = 10_000
    /// The instance name of a coordinator that does not set one.
    public static let defaultInstanceID = "main"

    /// Creates a configuration.
    public init(
        adminToken: String? = nil, maximumReportBytes: Int = 256 << 20, maximumAdminBodyBytes: Int = 1 << 30, maximumMessageBytes: Int = 64 << 10,
        foldInterval: Int = 32, sessionLifetime: Duration = .seconds(86_400), openAuthenticationRate: RateLimit? = Self.defaultOpenAuthenticationRate,
        maximumOpenWorkers: Int? = Self.defaultMaximumOpenWorkers, speedTestInterval: Duration = .seconds(30),
        maximumUploadsInFlight: Int = 64, uploadRetryAfter: Duration = .seconds(2), maximumReportHeaderBytes: Int = 1 << 20,
        connectionIdleTimeout: Duration? = .seconds(30), instanceID: String = Self.defaultInstanceID, sealLease: Duration = .seconds(60)
    ) {
        self.instanceID = instanceID
        self.sealLease = sealLease
        self.adminToken = adminToken
        self.maximumReportBytes = maximumReportBytes
        self.maximumAdminBodyBytes = maximumAdminBodyBytes
        self.maximumMessageBytes = maximumMessageBytes
        self.foldInterval = foldInterval
        self.sessionLifetime = sessionLifetime
        self.openAuthenticationRate = openAuthenticationRate
        self.maximumOpenWorkers = maximumOpenWorkers
        self.speedTestInterval = speedTestInterval
        self.maximumUploadsInFlight = maximumUploadsInFlight
        self.uploadRetryAfter = uploadRetryAfter
        self.maximumReportHeaderBytes = maximumReportHeaderBytes
        self.connectionIdleTimeout = connectionIdleTimeout
    }

    /// Describes the first unusable setting among the abuse limits, or nil when they are usable.
    public func validationFailure() -> String? {
        if let failure = openAuthenticationRate?.validationFailure() { return "openAuthenticationRate: \(failure)" }
        if let cap = maximumOpenWorkers, cap < 1 { return "maximumOpenWorkers must be at least 1, not \(cap)" }
        if speedTestInterval < .zero { return "speedTestInterval must not be negative, not \(speedTestInterval)" }
        if maximumUploadsInFlight < 1 { return "maximumUploadsInFlight must be at least 1, not \(maximumUploadsInFlight)" }
        if maximumUploadsPerWorker < 1 { return "maximumUploadsPerWorker must be at least 1, not \(maximumUploadsPerWorker)" }
        if uploadRetryAfter < .seconds(1) || uploadRetryAfter > .seconds(3600) || uploadRetryAfter.components.attoseconds != 0 {
            return "uploadRetryAfter must be a whole number of seconds in 1...3600, not \(uploadRetryAfter)"
        }
        if maximumReportHeaderBytes < 64 { return "maximumReportHeaderBytes must be at least 64, not \(maximumReportHeaderBytes)" }
        if instanceID.isEmpty || instanceID.utf8.count > 64
            || !instanceID.unicodeScalars.allSatisfy({
                $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || "-_.".unicodeScalars.contains($0))
            })
        {
            return "instanceID must be 1 to 64 ASCII letters, digits, '-', '_' or '.', not '\(instanceID)'"
        }
        if sealLease <= .zero { return "sealLease must be positive, not \(sealLease)" }
        if maximumEvaluationDataBytes < 1 { return "maximumEvaluationDataBytes must be at least 1, not \(maximumEvaluationDataBytes)" }
        if reportUploadGrace < .zero { return "reportUploadGrace must not be negative, not \(reportUploadGrace)" }
        if let idle = connectionIdleTimeout, idle <= .zero { return "connectionIdleTimeout must be positive, not \(idle)" }
        return nil
    }
}

extension CoordinatorConfiguration {
    /// `<hostname>-<port>`, the host name's characters an instance name cannot hold replaced by `-`. A host name over
    /// 50 characters keeps its first 40 and a hash of the whole: replicas whose names differ only in a long tail (a
    /// Kubernetes pod's random suffix) still get distinct ids, which instances sharing a store must have.
    public static func defaultInstanceID(hostName: String, port: Int) -> String {
        let host = String(
            hostName.unicodeScalars.map { scalar -> Character in
                scalar.isASCII && (scalar.properties.isAlphabetic || ("0"..."9").contains(scalar) || "-_.".unicodeScalars.contains(scalar))
                    ? Character(scalar) : "-"
            })
        guard host.count > 50 else { return host + "-\(port)" }
        // FNV-1a (64 bits) of the whole name: stable across runs and builds, unlike Swift's seeded hashing.
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in hostName.utf8 { hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01B3 }
        let hex = String(hash, radix: 16)
        return String(host.prefix(40)) + "-" + String(repeating: "0", count: 16 - hex.count) + hex + "-\(port)"
    }
}

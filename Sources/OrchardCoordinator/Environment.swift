public import Foundation

/// Settings of a coordinator instance (per-process settings live in ``OrchardProtocol/ServerConfig``).
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
    /// Seconds a session token stays valid.
    public var sessionLifetime: Double
    /// Report uploads received at once; one more is refused with `too_many_uploads` (503) and ``uploadRetryAfter``.
    public var maximumUploadsInFlight: Int
    /// Seconds a device refused for ``maximumUploadsInFlight`` is told to wait (`Retry-After`).
    public var uploadRetryAfter: Int

    /// Creates a configuration.
    public init(adminToken: String? = nil, maximumReportBytes: Int = 256 << 20, maximumAdminBodyBytes: Int = 1 << 30, maximumMessageBytes: Int = 64 << 10, foldInterval: Int = 32, sessionLifetime: Double = 86_400,
        maximumUploadsInFlight: Int = 64, uploadRetryAfter: Int = 2
    ) {
        self.adminToken = adminToken
        self.maximumReportBytes = maximumReportBytes
        self.maximumAdminBodyBytes = maximumAdminBodyBytes
        self.maximumMessageBytes = maximumMessageBytes
        self.foldInterval = foldInterval
        self.sessionLifetime = sessionLifetime
        self.maximumUploadsInFlight = maximumUploadsInFlight
        self.uploadRetryAfter = uploadRetryAfter
    }
}

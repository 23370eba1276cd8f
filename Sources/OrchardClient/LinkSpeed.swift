public import OrchardProtocol
public import OrchardSupport

/// A device's link speed, measured against the coordinator's speed-test endpoint, in Mbit/s.
public struct LinkSpeed: Sendable, Hashable, CustomStringConvertible {
    /// Coordinator to device.
    public var downloadMbps: Double
    /// Device to coordinator.
    public var uploadMbps: Double

    /// Creates a measurement.
    public init(downloadMbps: Double, uploadMbps: Double) {
        self.downloadMbps = downloadMbps
        self.uploadMbps = uploadMbps
    }

    public var description: String { "\(downloadMbps) Mbit/s down, \(uploadMbps) Mbit/s up" }
}

/// Which way a speed-test transfer goes.
public struct SpeedTestDirection: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: String, Sendable, Hashable { case download, upload }
    private let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// `GET` bytes from the coordinator.
    public static let download = SpeedTestDirection(.download)
    /// `POST` bytes to the coordinator.
    public static let upload = SpeedTestDirection(.upload)

    public var description: String { kind.rawValue }
}

/// How the client measures its link when a process asks for link speeds (`AuthenticateResponse.requiresSpeedTest`):
/// one timed download and one timed upload through the client's transport, of the sizes the coordinator announced
/// when it authenticated the device (these settings' sizes serve coordinators before protocol 2.1, which announce none).
public struct LinkSpeedTest: Sendable {
    /// Bytes downloaded, 1 to `SpeedTest.maximumBytes`, unless the coordinator announces a size.
    public var downloadBytes: Int
    /// Bytes uploaded, 1 to `SpeedTest.maximumBytes`, unless the coordinator announces a size.
    public var uploadBytes: Int
    /// The clock the transfers are timed on.
    public var clock: any WallClock

    /// Creates a test; 256 KiB each way on the system clock by default.
    public init(downloadBytes: Int = SpeedTest.defaultBytes, uploadBytes: Int = SpeedTest.defaultBytes, clock: any WallClock = SystemClock()) {
        self.downloadBytes = downloadBytes
        self.uploadBytes = uploadBytes
        self.clock = clock
    }

    /// Times a download and an upload of the configured sizes through `transport`, with the device's `session`.
    /// - Throws: ``OrchardClientError/Code/invalidConfiguration`` for sizes outside 1…`SpeedTest.maximumBytes`;
    ///   ``OrchardClientError/Code/network`` when a transfer moved fewer bytes than asked; the transport's errors.
    public func measure(over transport: any ClientTransport, session: String) async throws(OrchardClientError) -> LinkSpeed {
        for (name, bytes) in [("downloadBytes", downloadBytes), ("uploadBytes", uploadBytes)] where !(1...SpeedTest.maximumBytes).contains(bytes) {
            throw OrchardClientError(.invalidConfiguration, "link speed test: \(name) must be in 1...\(SpeedTest.maximumBytes), not \(bytes)")
        }
        let download = try await Self.timed(clock, .download, downloadBytes, session, transport)
        let upload = try await Self.timed(clock, .upload, uploadBytes, session, transport)
        return LinkSpeed(downloadMbps: download, uploadMbps: upload)
    }

    /// Moves `bytes` one way and returns the rate in Mbit/s.
    private static func timed(
        _ clock: any WallClock, _ direction: SpeedTestDirection, _ bytes: Int, _ session: String, _ transport: any ClientTransport
    ) async throws(OrchardClientError) -> Double {
        let start = clock.now
        let moved = try await transport.speedTest(direction, bytes: bytes, session: session)
        let elapsed = start.duration(to: clock.now)
        guard moved == bytes else {
            throw OrchardClientError(.network, "link speed test: the \(direction) moved \(moved) of \(bytes) bytes")
        }
        // A clock too coarse to see the transfer counts it as one nanosecond: a finite, very high rate.
        let seconds = max(elapsed / .seconds(1), 1e-9)
        return Double(bytes) * 8 / 1e6 / seconds
    }
}

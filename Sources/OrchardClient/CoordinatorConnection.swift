import Foundation
import Logging
import OrchardPrivacy
import OrchardProtocol
import OrchardScheduler

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
/// let client = try CoordinatorConnection(url: "https://fl.example.com", authToken: jwt)
/// let job = try client.newJob(processName: "mnist", version: "1.0")
/// let outcome = try await job.train(on: localData)
/// ```
public struct CoordinatorConnection: Sendable {
    /// The settings.
    public let configuration: DeviceConfiguration
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
    public init(url: String, authToken: String? = nil, configuration: DeviceConfiguration = DeviceConfiguration()) throws(OrchardClientError) {
        let transport = try HTTPTransport(
            url: url, timeout: configuration.requestTimeout, trustRoots: configuration.trustRoots, clock: configuration.environment.clock
        )
        self.init(transport: transport, server: transport.baseURL.absoluteString, authToken: authToken, configuration: configuration)
    }

    /// Creates a client for a coordinator reached over HTTP, whose device token comes from `tokenProvider` each time
    /// the device authenticates (a fresh one after the last expired).
    /// - Throws: as ``init(url:authToken:configuration:)``.
    public init(url: String, tokenProvider: any DeviceTokenProvider, configuration: DeviceConfiguration = DeviceConfiguration()) throws(OrchardClientError) {
        let transport = try HTTPTransport(
            url: url, timeout: configuration.requestTimeout, trustRoots: configuration.trustRoots, clock: configuration.environment.clock
        )
        self.init(transport: transport, server: transport.baseURL.absoluteString, tokenProvider: tokenProvider, configuration: configuration)
    }

    /// Creates a client over any transport whose device token comes from `tokenProvider` each time the device
    /// authenticates.
    public init(
        transport: any ClientTransport, server: String, tokenProvider: any DeviceTokenProvider, configuration: DeviceConfiguration = DeviceConfiguration()
    ) {
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
    public init(transport: any ClientTransport, server: String, authToken: String? = nil, configuration: DeviceConfiguration = DeviceConfiguration()) {
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

/// The former name of ``CoordinatorConnection`` (a type named like its module hides the module's other names).
@available(*, deprecated, renamed: "CoordinatorConnection")
public typealias OrchardClient = CoordinatorConnection

/// The former name of ``DeviceConfiguration``.
@available(*, deprecated, renamed: "DeviceConfiguration")
public typealias ClientConfiguration = DeviceConfiguration

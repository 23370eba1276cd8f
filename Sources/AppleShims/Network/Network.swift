// The part of Apple's Network framework that Orchard uses, for Linux: `NWPathMonitor` and `NWPath`. Orchard's
// Apple-facing targets import it as `Network` (Package.swift aliases the module on Linux; the alias reaches no other
// package, so SwiftNIO, AsyncHTTPClient and the rest keep their Linux paths). Declarations are transcribed from the SDK's
// `Network.swiftmodule` interface (NWPathMonitor, NWPath, NWInterface); see docs/apple-shims.md.
//
// The simulated path is set through AppleShimTesting.
#if os(Linux)  // Apple platforms have the real framework
import Foundation
public import Dispatch

/// The path every monitor reports; AppleShimTesting sets it.
@_spi(AppleShimTesting) public let simulatedNetwork = SimulatedNetwork()

/// The simulated path and the started monitors.
@_spi(AppleShimTesting) public final class SimulatedNetwork: @unchecked Sendable {
    private let lock = NSLock()
    private var path = NWPath(status: .unsatisfied)
    private var monitors: [ObjectIdentifier: Weak] = [:]

    private final class Weak {
        weak var monitor: NWPathMonitor?
        init(_ monitor: NWPathMonitor) { self.monitor = monitor }
    }

    @_spi(AppleShimTesting) public var currentPath: NWPath { lock.withLock { path } }

    func started(_ monitor: NWPathMonitor) { lock.withLock { monitors[ObjectIdentifier(monitor)] = Weak(monitor) } }
    func stopped(_ monitor: NWPathMonitor) { lock.withLock { _ = monitors.removeValue(forKey: ObjectIdentifier(monitor)) } }

    /// The path the system reports from now on, delivered to every started monitor.
    @_spi(AppleShimTesting) public func set(_ newPath: NWPath) {
        let targets = lock.withLock { () -> [NWPathMonitor] in
            path = newPath
            return monitors.values.compactMap(\.monitor)
        }
        for monitor in targets { monitor.deliver(newPath) }
    }
}

/// `NWInterface`: a network interface (its type and name).
public struct NWInterface: Sendable, Hashable {
    /// `NWInterface.InterfaceType`.
    public enum InterfaceType: Sendable, Hashable {
        case other, wifi, cellular, wiredEthernet, loopback
    }

    /// The interface's type.
    public let type: InterfaceType
    /// The interface's name (`en0`).
    public let name: String

    @_spi(AppleShimTesting) public init(type: InterfaceType, name: String) {
        self.type = type
        self.name = name
    }
}

/// `NWPath`: the status and interfaces of the network path.
public struct NWPath: Sendable, Equatable {
    /// `NWPath.Status`.
    public enum Status: Sendable, Hashable {
        case satisfied, unsatisfied, requiresConnection
    }

    /// Whether the path can be used.
    public let status: Status
    /// Whether the path uses an interface the system considers expensive (cellular, a personal hotspot).
    public let isExpensive: Bool
    /// Whether the path uses an interface in Low Data Mode.
    public let isConstrained: Bool
    /// The interfaces the path can use, preferred first.
    public let availableInterfaces: [NWInterface]

    @_spi(AppleShimTesting) public init(status: Status, isExpensive: Bool = false, isConstrained: Bool = false, availableInterfaces: [NWInterface] = []) {
        self.status = status
        self.isExpensive = isExpensive
        self.isConstrained = isConstrained
        self.availableInterfaces = availableInterfaces
    }

    /// Whether the path uses an interface of `type`.
    public func usesInterfaceType(_ type: NWInterface.InterfaceType) -> Bool {
        availableInterfaces.first?.type == type
    }
}

/// `NWPathMonitor`: reports the current path, and each change to `pathUpdateHandler` on the queue it was started on.
public final class NWPathMonitor: @unchecked Sendable {
    private let lock = NSLock()
    private var queue: DispatchQueue?
    private var cancelled = false
    private var handler: (@Sendable (NWPath) -> Void)?

    /// Called with every new path on the monitor's queue.
    public var pathUpdateHandler: (@Sendable (_ newPath: NWPath) -> Void)? {
        get { lock.withLock { handler } }
        set { lock.withLock { handler = newValue } }
    }

    /// A monitor of every interface.
    public init() {}

    /// The path now.
    public var currentPath: NWPath { simulatedNetwork.currentPath }

    /// Starts delivering paths on `queue` (the current one first).
    public func start(queue: DispatchQueue) {
        lock.withLock { self.queue = queue }
        simulatedNetwork.started(self)
        deliver(currentPath)
    }

    deinit { simulatedNetwork.stopped(self) }

    /// Stops delivering paths.
    public func cancel() {
        lock.withLock { cancelled = true }
        simulatedNetwork.stopped(self)
    }

    func deliver(_ path: NWPath) {
        let (queue, cancelled, handler) = lock.withLock { (self.queue, self.cancelled, self.handler) }
        guard let queue, !cancelled, let handler else { return }
        queue.async { handler(path) }
    }
}
#endif

import Foundation
public import OrchardCoordinator
public import OrchardProtocol

/// The device side of the wire protocol, over some transport: what a simulated device needs from a coordinator.
public protocol CoordinatorLink: Sendable {
    /// `POST /authenticate`.
    func authenticate(_ request: AuthenticateRequest) async throws -> AuthenticateResponse
    /// `POST /cycle-request`.
    func requestCycle(_ request: CycleRequest, session: AuthenticateResponse) async throws -> CycleResponse
    /// `GET /model/{id}`: the assigned checkpoint's safetensors bytes.
    func model(_ modelID: String, requestKey: String, session: AuthenticateResponse) async throws -> [UInt8]
    /// `POST /report`.
    func report(_ body: [UInt8], session: AuthenticateResponse) async throws -> ReportResponse
}

/// Direct calls into the coordinator's core, without HTTP (`--transport memory`).
public struct InProcessLink: CoordinatorLink {
    /// The coordinator.
    public let coordinator: Coordinator

    /// Creates a link.
    public init(coordinator: Coordinator) { self.coordinator = coordinator }

    public func authenticate(_ request: AuthenticateRequest) async throws -> AuthenticateResponse {
        try await coordinator.authenticate(request)
    }

    public func requestCycle(_ request: CycleRequest, session: AuthenticateResponse) async throws -> CycleResponse {
        try await coordinator.requestCycle(request, sessionWorker: session.workerID)
    }

    public func model(_ modelID: String, requestKey: String, session: AuthenticateResponse) async throws -> [UInt8] {
        try await coordinator.model(modelID, requestKey: requestKey, sessionWorker: session.workerID).bytes
    }

    public func report(_ body: [UInt8], session: AuthenticateResponse) async throws -> ReportResponse {
        try await coordinator.report(body, sessionWorker: session.workerID)
    }
}

/// A real ``OrchardCoordinator/Coordinator`` as the fleet's server: devices authenticate, request cycles,
/// download the assigned checkpoint and upload reports through a ``CoordinatorLink``; the coordinator's
/// manual clock follows the simulation's virtual clock, and the round's cycle is the coordinator's own (goal,
/// over-selection, deadline, aggregation and its SQLite store).
public actor CoordinatorFleetServer: FleetServer {
    /// Reports that close a cycle.
    public nonisolated let goal: Int
    private let coordinator: Coordinator
    private let clock: ManualWallClock
    private let epoch: Date
    private let processID: String
    private let processName: String
    private let processVersion: SemanticVersion
    private let link: any CoordinatorLink
    private var sessions: [Int: AuthenticateResponse] = [:]

    /// Hosts the process on the coordinator and prepares the fleet's access to it.
    /// - Parameters:
    ///   - coordinator: A started coordinator whose clock is `clock`.
    ///   - clock: The coordinator's clock; virtual time 0 is its time when this server is created.
    ///   - process: The process to host (model, initial weights, client and server configuration).
    ///   - link: How devices reach the coordinator.
    public init(coordinator: Coordinator, clock: ManualWallClock, process: HostProcessRequest, link: any CoordinatorLink) async throws(SimulationError) {
        self.coordinator = coordinator
        self.clock = clock
        epoch = clock.now
        goal = process.serverConfig.goalCount
        processName = process.name
        processVersion = process.version
        self.link = link
        do { processID = try await coordinator.host(process).processID } catch {
            throw SimulationError(.coordinator, "the coordinator refused the process: \(error)")
        }
    }

    private func move(to time: Double) {
        let target = epoch.addingTimeInterval(time)
        if target > clock.now { clock.set(target) }
    }

    private func status() async throws(SimulationError) -> ProcessStatus {
        do { return try await coordinator.status(processID: processID) } catch {
            throw SimulationError(.coordinator, "cannot read the process status: \(error)")
        }
    }

    public func openRound(at time: Double) async throws(SimulationError) -> Double {
        move(to: time)
        await coordinator.tick()
        guard let cycle = try await status().currentCycle else {
            throw SimulationError(.coordinator, "the coordinator has no open cycle for the process")
        }
        return cycle.deadline - epoch.timeIntervalSince1970
    }

    public func currentModel() async throws(SimulationError) -> [UInt8] {
        do { return try await coordinator.checkpoint(processID: processID, number: nil).bytes } catch {
            throw SimulationError(.coordinator, "cannot read the latest checkpoint: \(error)")
        }
    }

    public func checkIn(device: Int, at time: Double) async throws(SimulationError) -> FleetAssignment? {
        move(to: time)
        do {
            let session: AuthenticateResponse
            if let known = sessions[device] {
                session = known
            } else {
                session = try await link.authenticate(AuthenticateRequest(processName: processName, processVersion: processVersion))
                sessions[device] = session
            }
            let response = try await link.requestCycle(
                CycleRequest(workerID: session.workerID, processName: processName, processVersion: processVersion), session: session
            )
            guard case .accepted(let assignment) = response else { return nil }
            let model = try await link.model(assignment.modelID, requestKey: assignment.requestKey, session: session)
            return FleetAssignment(device: device, worker: session.workerID, cycle: assignment.cycle, model: model, handle: assignment.requestKey)
        } catch {
            throw SimulationError(.coordinator, "device \(device) could not check in: \(error)")
        }
    }

    public func report(_ update: DeviceUpdate, for assignment: FleetAssignment, at time: Double) async throws(SimulationError) -> ReportReceipt {
        move(to: time)
        guard let session = sessions[update.device] else {
            throw SimulationError(.coordinator, "device \(update.device) reports without a session")
        }
        var accepted = true
        do {
            _ = try await link.report(update.diff, session: session)
        } catch let error as CoordinatorError where error.status == 409 {
            // The cycle closed or the deadline passed first: the coordinator refuses the report, as on a real fleet.
            accepted = false
        } catch {
            throw SimulationError(.coordinator, "device \(update.device)'s report failed: \(error)")
        }
        let closed = try await status().currentCycle?.number != assignment.cycle
        return ReportReceipt(accepted: accepted, closedCycle: closed)
    }

    public func expireCycle(at time: Double) async throws(SimulationError) -> Bool {
        let before = try await status()
        move(to: time)
        await coordinator.tick()
        let after = try await status()
        return after.cyclesCompleted > before.cyclesCompleted
    }
}

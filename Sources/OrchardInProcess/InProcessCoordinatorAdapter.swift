public import OrchardClient
public import OrchardCoordinator
public import OrchardProtocol

/// The coordinator's core as an ``OrchardClient/InProcessCoordinator``, for ``OrchardClient/InMemoryTransport``:
/// session tokens are resolved by the core, and its errors are mapped to client errors exactly as the HTTP layer
/// sends them (status and JSON body), so a device behaves the same in-process as over loopback HTTP.
public struct InProcessCoordinatorAdapter: InProcessCoordinator {
    /// The coordinator called.
    public let coordinator: Coordinator

    /// Wraps a coordinator.
    public init(coordinator: Coordinator) { self.coordinator = coordinator }

    private func mapped<T>(_ body: () async throws(CoordinatorError) -> T) async throws(OrchardClientError) -> T {
        do {
            return try await body()
        } catch {
            throw OrchardClientError.server(status: error.status, body: error.body)
        }
    }

    /// Authenticates a device.
    public func authenticate(_ request: AuthenticateRequest) async throws(OrchardClientError) -> AuthenticateResponse {
        try await mapped { () async throws(CoordinatorError) in try await coordinator.authenticate(request) }
    }

    /// Handles a cycle request from the worker holding `session`.
    public func requestCycle(_ request: CycleRequest, session: String) async throws(OrchardClientError) -> CycleResponse {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            return try await coordinator.requestCycle(request, sessionWorker: worker)
        }
    }

    /// The training plan of an assignment.
    public func plan(_ planID: String, requestKey: String, session: String) async throws(OrchardClientError) -> OrchardProtocol.TrainingPlan {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            return try await coordinator.plan(planID, requestKey: requestKey, sessionWorker: worker)
        }
    }

    /// The whole model of an assignment and its entity tag.
    public func model(_ modelID: String, requestKey: String, session: String) async throws(OrchardClientError) -> (bytes: [UInt8], etag: String) {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            let download = try await coordinator.model(modelID, requestKey: requestKey, sessionWorker: worker)
            return (download.bytes, download.etag)
        }
    }

    /// Accepts a report.
    public func report(_ body: [UInt8], session: String) async throws(OrchardClientError) -> ReportResponse {
        try await mapped { () async throws(CoordinatorError) in
            let worker = try await coordinator.worker(forSessionToken: session)
            return try await coordinator.report(body, sessionWorker: worker)
        }
    }
}

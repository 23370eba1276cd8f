public import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import OrchardCoordinator
public import OrchardProtocol

/// The device protocol over real HTTP (`--transport http`): JSON control messages and safetensors bodies, the
/// session token as a bearer token, error bodies turned back into ``OrchardCoordinator/CoordinatorError``.
public struct HTTPLink: CoordinatorLink {
    /// The coordinator's base URL, e.g. `http://127.0.0.1:52110`.
    public let baseURL: URL
    private let session: URLSession

    /// Creates a link with its own URL session.
    public init(baseURL: URL) {
        self.baseURL = baseURL
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 8
        session = URLSession(configuration: configuration)
    }

    public func authenticate(_ request: AuthenticateRequest) async throws -> AuthenticateResponse {
        try await json(AuthenticateResponse.self, method: "POST", path: Endpoint.authenticate, body: request, token: nil)
    }

    public func requestCycle(_ request: CycleRequest, session: AuthenticateResponse) async throws -> CycleResponse {
        try await json(CycleResponse.self, method: "POST", path: Endpoint.cycleRequest, body: request, token: session.sessionToken)
    }

    public func model(_ modelID: String, requestKey: String, session: AuthenticateResponse) async throws -> [UInt8] {
        var components = URLComponents(url: baseURL.appendingPathComponent(Endpoint.model(modelID)), resolvingAgainstBaseURL: false)!
        components.queryItems = [URLQueryItem(name: Endpoint.requestKeyQuery, value: requestKey)]
        var request = URLRequest(url: components.url!)
        request.setValue("Bearer \(session.sessionToken)", forHTTPHeaderField: "Authorization")
        return try await send(request)
    }

    public func report(_ body: [UInt8], session: AuthenticateResponse) async throws -> ReportResponse {
        var request = URLRequest(url: baseURL.appendingPathComponent(Endpoint.report))
        request.httpMethod = "POST"
        request.setValue(MediaType.safetensors, forHTTPHeaderField: "Content-Type")
        request.setValue("Bearer \(session.sessionToken)", forHTTPHeaderField: "Authorization")
        request.httpBody = Data(body)
        return try WireCoding.decoder().decode(ReportResponse.self, from: Data(try await send(request)))
    }

    private func json<Response: Decodable>(_ type: Response.Type, method: String, path: String, body: some Encodable, token: String?) async throws -> Response {
        var request = URLRequest(url: baseURL.appendingPathComponent(path))
        request.httpMethod = method
        request.setValue(MediaType.json, forHTTPHeaderField: "Content-Type")
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        request.httpBody = try WireCoding.encoder().encode(body)
        return try WireCoding.decoder().decode(Response.self, from: Data(try await send(request)))
    }

    private func send(_ request: URLRequest) async throws -> [UInt8] {
        let (data, response) = try await session.data(for: request)
        guard let http = response as? HTTPURLResponse else {
            throw SimulationError(.coordinator, "\(request.url?.path ?? "?"): not an HTTP response")
        }
        guard (200..<300).contains(http.statusCode) else {
            if let body = try? WireCoding.decoder().decode(ErrorBody.self, from: data) {
                throw CoordinatorError(body.error.code, status: http.statusCode, body.error.message)
            }
            throw SimulationError(.coordinator, "\(request.url?.path ?? "?") answered HTTP \(http.statusCode)")
        }
        return [UInt8](data)
    }
}

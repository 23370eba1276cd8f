import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import OrchardClient

// Where the device's token comes from: Orchard's `DeviceTokenProvider`, asked each time the device authenticates. A
// process with `hs256` or `rs256` authentication accepts a JWT whose `sub` names the device and whose `exp` is a few
// hours away, signed by the app's backend (docs/device-tokens.md); a token that expired since the last background
// window is simply replaced by the next authentication's.

/// The app's backend signs device tokens: `POST endpoint` with the app's own user session (a cookie or bearer token
/// the backend already knows) answers `{"token": "<JWT>"}`.
struct BackendTokenProvider: DeviceTokenProvider {
    /// The backend's endpoint, e.g. `https://api.example.com/orchard/device-token`.
    let endpoint: URL
    /// The app's session with its backend, sent as a bearer token.
    let appSession: String

    func deviceToken() async throws -> String {
        var request = URLRequest(url: endpoint)
        request.httpMethod = "POST"
        request.setValue("Bearer \(appSession)", forHTTPHeaderField: "Authorization")
        let (data, response) = try await URLSession.shared.data(for: request)
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard status == 200 else { throw ExampleError("the backend refused a device token (HTTP \(status))") }
        struct Answer: Decodable { let token: String }
        do {
            return try JSONDecoder().decode(Answer.self, from: data).token
        } catch {
            throw ExampleError("the backend's answer holds no token: \(error)")
        }
    }
}

/// A token the app was given (for development against an `orchard token issue` token, or an `open` process: `nil`).
struct FixedTokenProvider: DeviceTokenProvider {
    let token: String
    func deviceToken() async throws -> String { token }
}

/// An error of the example's own, with what went wrong.
struct ExampleError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

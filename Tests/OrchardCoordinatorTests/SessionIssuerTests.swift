import Foundation
@testable import OrchardCoordinator
import OrchardProtocol
import Testing

/// Session tokens: the issuing process remembers what it signed, with the same expiry and binding a verification
/// would give; anything it did not sign is still verified.
@Suite struct SessionIssuerTests {
    let session = DeviceSession(workerID: "w_1", processID: "p_1", processName: "tiny", processVersion: SemanticVersion(1))

    @Test func aTokenJustIssuedExpiresWhenAVerifiedOneWould() async throws {
        let issuer = await SessionIssuer(secret: Array(repeating: 7, count: 32))
        let elsewhere = await SessionIssuer(secret: Array(repeating: 7, count: 32))
        let expires = Date(timeIntervalSince1970: 2_000_000_000.75)
        let token = try await issuer.issue(session, expires: expires)
        // The issuer answers from memory; another instance with the same secret verifies; both agree at every time.
        for (seconds, valid) in [(1_999_999_999.0, true), (2_000_000_000.5, true), (2_000_000_000.75, false), (2_000_000_001, false)] {
            let now = Date(timeIntervalSince1970: seconds)
            for instance in [issuer, elsewhere] {
                if valid {
                    #expect(try await instance.session(from: token, now: now) == session)
                } else {
                    await #expect(throws: CoordinatorError.self, "at \(seconds)") { try await instance.session(from: token, now: now) }
                }
            }
        }
    }

    @Test func aTamperedOrForeignTokenIsNotTakenFromMemory() async throws {
        let issuer = await SessionIssuer(secret: Array(repeating: 7, count: 32))
        let now = Date(timeIntervalSince1970: 1_000)
        let token = try await issuer.issue(session, expires: now.addingTimeInterval(3600))
        var tampered = Array(token)
        tampered[tampered.count - 2] = tampered[tampered.count - 2] == "A" ? "B" : "A"
        await #expect(throws: CoordinatorError.self) { try await issuer.session(from: String(tampered), now: now) }
        let other = await SessionIssuer(secret: Array(repeating: 8, count: 32))
        let foreign = try await other.issue(session, expires: now.addingTimeInterval(3600))
        await #expect(throws: CoordinatorError.self) { try await issuer.session(from: foreign, now: now) }
    }
}

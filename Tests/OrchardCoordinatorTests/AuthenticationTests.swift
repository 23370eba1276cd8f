import _CryptoExtras
import Crypto
import Foundation
import JWTKit
import OrchardCoordinator
import OrchardProtocol
import Testing

private struct DeviceToken: JWTPayload {
    var sub: SubjectClaim
    var exp: ExpirationClaim
    var iss: IssuerClaim?
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

@Suite(.serialized) struct AuthenticationTests {
    private func token(_ keys: JWTKeyCollection, subject: String, expires: Date, issuer: String? = nil) async throws -> String {
        try await keys.sign(DeviceToken(sub: SubjectClaim(value: subject), exp: ExpirationClaim(value: expires), iss: issuer.map { IssuerClaim(value: $0) }))
    }

    private func authenticate(_ harness: Harness, token: String?) async throws -> HTTPResult {
        try await harness.http.json("POST", Endpoint.authenticate, AuthenticateRequest(authToken: token, processName: "tiny", processVersion: SemanticVersion(1)))
    }

    @Test func hs256TokensMapTheSubjectToAStableWorker() async throws {
        let harness = try await Harness.start()
        defer { Task { await harness.stop() } }
        var request = Fixture.host()
        request.serverConfig.authentication = .hs256(secret: "device-secret", issuer: "orchard-tests")
        _ = try await harness.host(request)
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: "device-secret"), digestAlgorithm: .sha256)
        let later = harness.clock.now.addingTimeInterval(3600)

        let first = try await authenticate(harness, token: try await token(keys, subject: "device-42", expires: later, issuer: "orchard-tests")).decode(AuthenticateResponse.self)
        let second = try await authenticate(harness, token: try await token(keys, subject: "device-42", expires: later, issuer: "orchard-tests")).decode(AuthenticateResponse.self)
        let other = try await authenticate(harness, token: try await token(keys, subject: "device-43", expires: later, issuer: "orchard-tests")).decode(AuthenticateResponse.self)
        #expect(first.workerID == second.workerID)
        #expect(first.workerID != other.workerID)
        // The session token is tied to its worker: using it for another worker id is refused.
        let crossed = try await harness.http.json("POST", Endpoint.cycleRequest, CycleRequest(workerID: other.workerID, processName: "tiny", processVersion: SemanticVersion(1)), token: first.sessionToken)
        #expect(crossed.status == 403)

        #expect(try await authenticate(harness, token: nil).status == 401)
        #expect(try await authenticate(harness, token: try await token(keys, subject: "device-42", expires: harness.clock.now.addingTimeInterval(-1), issuer: "orchard-tests")).status == 401)
        #expect(try await authenticate(harness, token: try await token(keys, subject: "device-42", expires: later, issuer: "someone-else")).status == 401)
        let wrongKeys = JWTKeyCollection()
        await wrongKeys.add(hmac: HMACKey(from: "other-secret"), digestAlgorithm: .sha256)
        let forged = try await authenticate(harness, token: try await token(wrongKeys, subject: "device-42", expires: later, issuer: "orchard-tests"))
        #expect(forged.status == 401)
        #expect(forged.errorCode == "unauthorized")
    }

    @Test func rs256TokensAreVerifiedWithThePublicKey() async throws {
        let harness = try await Harness.start()
        defer { Task { await harness.stop() } }
        let privateKey = try Insecure.RSA.PrivateKey(backing: _RSA.Signing.PrivateKey(keySize: .bits2048))
        var request = Fixture.host()
        request.serverConfig.authentication = .rs256(publicKeyPEM: privateKey.publicKey.pemRepresentation)
        _ = try await harness.host(request)
        let keys = JWTKeyCollection()
        await keys.add(rsa: privateKey, digestAlgorithm: .sha256)
        let response = try await authenticate(harness, token: try await token(keys, subject: "phone-1", expires: harness.clock.now.addingTimeInterval(60)))
        #expect(response.status == 200)
        let hmacKeys = JWTKeyCollection()
        await hmacKeys.add(hmac: HMACKey(from: "guess"), digestAlgorithm: .sha256)
        #expect(try await authenticate(harness, token: try await token(hmacKeys, subject: "phone-1", expires: harness.clock.now.addingTimeInterval(60))).status == 401)
    }

    @Test func badRSAKeyIsAConfigurationError() async throws {
        let harness = try await Harness.start()
        defer { Task { await harness.stop() } }
        var request = Fixture.host()
        request.serverConfig.authentication = .rs256(publicKeyPEM: "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")
        let result = try await harness.http.json("POST", Endpoint.processes, request, token: Harness.adminToken)
        #expect(result.status == 400)
        #expect(result.errorCode == "invalid_configuration")
    }
}

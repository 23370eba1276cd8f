import OrchardSupport
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
    /// A throwaway 2048-bit key generated for these tests only.
    static let testRSAKeyPEM = """
        -----BEGIN PRIVATE KEY-----
        MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDqYkdQRxO5qCSz
        5Xpc2v98qJtH2S3/Au1UMycFKcOEtiGPpEatzM9fxR13NcP9uZcIjez+ibo2RUIL
        Oc0t3AgkjBCfTe8LjJaVqC9U/Rh28lS6ccwdlzIBl/A2hc+jqaV09g1KT0TgOf3o
        xar5/h55Ermp+r5cVa3uutkEUSGRvHcUm2pmtCVKW5II/581Qt/wNqDPzXEcXGGc
        /DuM5Qyf2rsqrx5tCRm2kFq7Rlj+WnS7/Dx2fZ1sH039xYIB4lweiyFpa3ag+S5c
        rWtB8UYr5ERWbyM8439hrW+gjkmSSDz/WS0QhKZTDV+yLNlRNwr0CJJ6woK+B8c/
        aLwkfOTZAgMBAAECggEAKj0U0fRFKz+QgbT4tLQot6vg8/VBE0RRRcvEG+uXVxrF
        eI/nxtlyg7VPppSTYe2ouLtu+r4SR0Z67O/5OGr/MqrlMfhG/INU/dpl0UCdQI5S
        U5k/ahO9yMi7WvAJZ9qiPS48XehkJq58wg6hTdUMY9BKkkXkOVqdcjjM9Di0voDq
        dNvxf6XyqeBBQ6cb7KN/eiOlwHUTurSwySlV80hfFXz8r2lkUPPOh/x4uBue9Y1x
        vZ3VYQs4fSZhQVAR2Oju19woK/GhSGSRrdE+zmFlQ7GB4oTPMG4xwCgK0kfcXnT5
        Pau0CgtayhkY2DAAL600ZLLZQy2DNjoNIog9fUHRiQKBgQD9JFirr71/NnpctKA1
        S7QI2x6H2Qsyyult4nn9A6QJY6w4xbKc/zqzh61A9uGGJjxt0zcOdUNukW0u0iMV
        zS4w9Um/H1xzpF3fR+jp01jNspkSiahtx5SIOhfGPLJXOTWxnB7O+iCCaN+ck0gh
        TPA/WNsxyORE1oIAI/O0KnUlPQKBgQDtB7dGt2iy+n0NlBdJUVIlWaE4SzMrXhZw
        z5t7rjb6zmotuIiL/8n3gwrs17tiPxQgLoVSyn6A/zNMunsLoWwzNRGRG0Ehs1tr
        Hvp8bty2kpKMi1reOZKtGmN+cZNteC4tNvezGApzPNznCrd+z5XgmeHfG0KJjteF
        AXAycHWPzQKBgQDSkJM5bJuh37z0tEK3UltVKn9A3OeVvndhMgvqzEZ8kO5G4xvp
        v9wiTe9tpG5/2fpWGGUpn50RseIyGhWZIu0TSFWppvqOLuDuw7AYH/c0UyVE6ECz
        4FnK3xe7i+2E5E+nh4eQ/zpff8DRSymqmYcWCmF6DfLi19OXLlCfQtniuQKBgG9A
        N92RKCsZNqiw4V0gNhYhw3HQmeu49X9tceTTGCsPxvY+rphHLlxlvTL87o5mXOPd
        8eWx9T5GiaVxwV7sHQTL27rnt+JBdJ8KozbUMfPfR7l/jt7O1vE4eYpXdILk7Yd7
        TTdaCU2dO3GVrhpvBEGu+DznZot5594dlrOV5RfhAoGAPEoH/CQRZ1UI15t+6qLi
        pp/aoxe0NjYBAr2PlaxkE0oVFaJ35+u1TaREDn8/MWofrkBc1y7dnFmBLNnKEzhL
        utlqJVgP3XLIRFBme2WML0TiRPwr+GCV1EkN/w7/V/dnQIT+cTLNVoRxKVYuJZuh
        lXCU08V70LP/H6m7LPJf3RM=
        -----END PRIVATE KEY-----
        """

    private func token(_ keys: JWTKeyCollection, subject: String, expires: Date, issuer: String? = nil) async throws -> String {
        try await keys.sign(DeviceToken(sub: SubjectClaim(value: subject), exp: ExpirationClaim(value: expires), iss: issuer.map { IssuerClaim(value: $0) }))
    }

    private func authenticate(_ harness: Harness, token: String?) async throws -> HTTPResult {
        try await harness.http.json(
            "POST", Endpoint.authenticate, AuthenticateRequest(authToken: token, processName: "tiny", processVersion: SemanticVersion(1)))
    }

    @Test func hs256TokensMapTheSubjectToAStableWorker() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Fixture.host()
            request.serverConfig.authentication = .hs256(secret: "device-secret-of-at-least-32-bytes!!", issuer: "orchard-tests")
            _ = try await harness.host(request)
            let keys = JWTKeyCollection()
            await keys.add(hmac: HMACKey(from: "device-secret-of-at-least-32-bytes!!"), digestAlgorithm: .sha256)
            let later = harness.clock.date.addingTimeInterval(3600)

            let first = try await authenticate(harness, token: try await token(keys, subject: "device-42", expires: later, issuer: "orchard-tests")).decode(
                AuthenticateResponse.self)
            let second = try await authenticate(harness, token: try await token(keys, subject: "device-42", expires: later, issuer: "orchard-tests")).decode(
                AuthenticateResponse.self)
            let other = try await authenticate(harness, token: try await token(keys, subject: "device-43", expires: later, issuer: "orchard-tests")).decode(
                AuthenticateResponse.self)
            #expect(first.workerID == second.workerID)
            #expect(first.workerID != other.workerID)
            // The session token is tied to its worker: using it for another worker id is refused.
            let crossed = try await harness.http.json(
                "POST", Endpoint.cycleRequest, CycleRequest(workerID: other.workerID, processName: "tiny", processVersion: SemanticVersion(1)),
                token: first.sessionToken)
            #expect(crossed.status == 403)

            #expect(try await authenticate(harness, token: nil).status == 401)
            #expect(
                try await authenticate(
                    harness, token: try await token(keys, subject: "device-42", expires: harness.clock.date.addingTimeInterval(-1), issuer: "orchard-tests")
                ).status == 401)
            #expect(try await authenticate(harness, token: try await token(keys, subject: "device-42", expires: later, issuer: "someone-else")).status == 401)
            let wrongKeys = JWTKeyCollection()
            await wrongKeys.add(hmac: HMACKey(from: "other-secret-of-at-least-32-bytes!!!"), digestAlgorithm: .sha256)
            let forged = try await authenticate(harness, token: try await token(wrongKeys, subject: "device-42", expires: later, issuer: "orchard-tests"))
            #expect(forged.status == 401)
            #expect(forged.errorCode == "unauthorized")
        }
    }

    @Test func aSessionTokenStopsWorkingWhenItExpiresEvenAfterItWasAccepted() async throws {
        let harness = try await Harness.start(configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, sessionLifetime: .seconds(600)))
        try await harness.stopping {
            _ = try await harness.host(Fixture.host())
            let device = try await harness.device()
            let request = CycleRequest(workerID: device.workerID, processName: "tiny", processVersion: SemanticVersion(1))
            // Accepted twice (the second time from the coordinator's memory of verified tokens) ...
            #expect(try await harness.http.json("POST", Endpoint.cycleRequest, request, token: device.sessionToken).status == 200)
            #expect(try await harness.http.json("POST", Endpoint.cycleRequest, request, token: device.sessionToken).status == 200)
            // The scheme is case-insensitive and spaces around the token do not matter.
            let body = Array(try WireCoding.encoder().encode(request))
            let spelled = try await harness.http.send(
                "POST", Endpoint.cycleRequest, body: body, headers: ["Authorization": "bearer   \(device.sessionToken) ", "Content-Type": MediaType.json])
            #expect(spelled.status == 200)
            // A token altered by one character is refused, not served from that memory.
            var forged = Array(device.sessionToken.utf8)
            forged[forged.count - 2] = forged[forged.count - 2] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            #expect(try await harness.http.json("POST", Endpoint.cycleRequest, request, token: String(decoding: forged, as: UTF8.self)).status == 401)
            // ... and refused once the clock passes its expiry.
            harness.clock.advance(bySeconds: 601)
            let expired = try await harness.http.json("POST", Endpoint.cycleRequest, request, token: device.sessionToken)
            #expect(expired.status == 401)
            #expect(String(decoding: expired.body, as: UTF8.self).contains("expired"))
        }
    }

    @Test func rs256TokensAreVerifiedWithThePublicKey() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let privateKey = try JWTKit.Insecure.RSA.PrivateKey(pem: Self.testRSAKeyPEM)
            var request = Fixture.host()
            request.serverConfig.authentication = .rs256(publicKeyPEM: privateKey.publicKey.pemRepresentation)
            _ = try await harness.host(request)
            let keys = JWTKeyCollection()
            await keys.add(rsa: privateKey, digestAlgorithm: .sha256)
            let response = try await authenticate(harness, token: try await token(keys, subject: "phone-1", expires: harness.clock.date.addingTimeInterval(60)))
            #expect(response.status == 200)
            let hmacKeys = JWTKeyCollection()
            await hmacKeys.add(hmac: HMACKey(from: "a-guessed-secret-of-at-least-32-bytes"), digestAlgorithm: .sha256)
            #expect(
                try await authenticate(harness, token: try await token(hmacKeys, subject: "phone-1", expires: harness.clock.date.addingTimeInterval(60))).status
                    == 401)
        }
    }

    @Test func badRSAKeyIsAConfigurationError() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            var request = Fixture.host()
            request.serverConfig.authentication = .rs256(publicKeyPEM: "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")
            let result = try await harness.http.json("POST", Endpoint.processes, request, token: Harness.adminToken)
            #expect(result.status == 400)
            #expect(result.errorCode == "invalid_configuration")
        }
    }
}

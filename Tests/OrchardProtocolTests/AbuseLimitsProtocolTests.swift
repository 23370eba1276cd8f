import Foundation
import OrchardProtocol
import Testing

@Suite("Wire 2.1: speed-test sizes, rate limits and worker caps")
struct AbuseLimitsProtocolTests {
    @Test func theAuthenticateAnswerCarriesSpeedTestSizesOnlyWhenSetAndDecodesWithout() throws {
        let gated = AuthenticateResponse(
            workerID: "w", sessionToken: "t", expiresIn: 60, requiresSpeedTest: true, speedTestDownloadBytes: 1000, speedTestUploadBytes: 500)
        let object = try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(gated)) as? [String: Any]
        #expect(object?["speed_test_download_bytes"] as? Int == 1000 && object?["speed_test_upload_bytes"] as? Int == 500)
        let plain = AuthenticateResponse(workerID: "w", sessionToken: "t", expiresIn: 60, requiresSpeedTest: false)
        let keys = try JSONSerialization.jsonObject(with: WireCoding.encoder().encode(plain)) as? [String: Any]
        #expect(keys?["speed_test_download_bytes"] == nil && keys?["speed_test_upload_bytes"] == nil)
        // A 2.0 coordinator's answer has no sizes.
        let old = try WireCoding.decoder().decode(
            AuthenticateResponse.self,
            from: Data(#"{"worker_id":"w","session_token":"t","expires_in":60,"requires_speed_test":true,"protocol_version":"2.0.0"}"#.utf8))
        #expect(old.speedTestDownloadBytes == nil && old.speedTestUploadBytes == nil)
        #expect(WireProtocol.isCompatible(old.protocolVersion))
    }

    @Test func serverConfigSpeedTestSizesDefaultAndAreValidated() {
        #expect(ServerConfig().validationFailure() == nil)
        #expect(ServerConfig(speedTestDownloadBytes: 0).validationFailure()?.contains("speed_test_download_bytes") == true)
        #expect(ServerConfig(speedTestUploadBytes: SpeedTest.maximumBytes + 1).validationFailure()?.contains("speed_test_upload_bytes") == true)
        #expect(ServerConfig(speedTestDownloadBytes: SpeedTest.maximumBytes, speedTestUploadBytes: 1).validationFailure() == nil)
    }

    @Test func theOpenAPIDocumentStatesTheVersionCodesFieldsAndRetryAfter() throws {
        let object = try #require(try JSONSerialization.jsonObject(with: Data(OpenAPI.document)) as? [String: Any])
        #expect((object["info"] as? [String: Any])?["version"] as? String == WireProtocol.version.description)
        let components = try #require(object["components"] as? [String: Any])
        let schemas = try #require(components["schemas"] as? [String: Any])
        // The error body's code is the ErrorCode enum (by reference).
        let codes = try #require((schemas["ErrorCode"] as? [String: Any])?["enum"] as? [String])
        #expect(codes.contains(WireErrorCode.rateLimited.rawValue) && codes.contains(WireErrorCode.workerLimitReached.rawValue))
        #expect(codes.contains(WireErrorCode.tooManyUploads.rawValue))
        for schema in ["AuthenticateResponse", "ServerConfig"] {
            let properties = try #require((schemas[schema] as? [String: Any])?["properties"] as? [String: Any])
            #expect(properties["speed_test_download_bytes"] != nil && properties["speed_test_upload_bytes"] != nil, "\(schema)")
        }
        let paths = try #require(object["paths"] as? [String: Any])
        let speedTest = try #require(paths[Endpoint.speedTest] as? [String: Any])
        for method in ["get", "post"] {
            let operation = try #require(speedTest[method] as? [String: Any])
            #expect((operation["security"] as? [[String: Any]])?.first?["session"] != nil, "\(method)")
            let responses = try #require(operation["responses"] as? [String: Any])
            let limited = try #require(responses["429"] as? [String: Any])
            #expect((limited["headers"] as? [String: Any])?["Retry-After"] != nil)
            #expect(responses["401"] != nil && responses["403"] != nil)
        }
        let authenticate = try #require((paths[Endpoint.authenticate] as? [String: Any])?["post"] as? [String: Any])
        let responses = try #require(authenticate["responses"] as? [String: Any])
        #expect(responses["429"] != nil && responses["403"] != nil)
    }
}

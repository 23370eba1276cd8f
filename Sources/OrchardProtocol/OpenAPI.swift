import Foundation

/// The OpenAPI 3 document of the coordinator's HTTP API, shipped as a resource of this module.
public enum OpenAPI {
    /// The document's bytes (JSON).
    public static let document: [UInt8] = {
        guard let url = Bundle.module.url(forResource: "openapi", withExtension: "json"),
            let data = try? Data(contentsOf: url)
        else {
            preconditionFailure("OrchardProtocol's openapi.json resource is missing from the bundle")
        }
        return [UInt8](data)
    }()
}

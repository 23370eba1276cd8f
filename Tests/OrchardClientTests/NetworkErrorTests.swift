@testable import OrchardClient
import Testing

/// A connection failure reads as a sentence: NIO's description of a refused connection
/// (`connection reset (error set): Connection refused) (errno: 111)`) is not shown as it is.
@Suite struct NetworkErrorTests {
    struct Described: Error, CustomStringConvertible {
        let description: String
    }

    @Test(arguments: [
        ("connection reset (error set): Connection refused) (errno: 111)", "connection refused"),
        ("NIOConnectionError(host: x, port: 1, dnsAAAAError: Optional(unknownHost), dnsAError: Optional(unknownHost))", "the host name cannot be resolved"),
        ("connection reset by peer (errno: 104)", "the connection was reset"),
        ("something\nelse", "something else"),
    ])
    func failuresReadAsOneLine(described: String, reason: String) {
        let error = HTTPTransport.networkError(Described(description: described), url: "http://127.0.0.1:1/v1/device/authenticate")
        #expect(error.code == .network)
        #expect(error.message == "request to http://127.0.0.1:1/v1/device/authenticate failed: \(reason)")
        #expect(error.message.filter { $0 == "(" }.count == error.message.filter { $0 == ")" }.count)
    }
}

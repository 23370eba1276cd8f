import NIOCore
import Testing

@testable import OrchardBenchmarks

/// The load generator's response reader, fed bytes as a socket would deliver them.
@Suite struct ResponseParserTests {
    /// Feeds `text` in pieces of `step` bytes; returns the response and how many pieces it took.
    func read(_ text: String, step: Int, keepBody: Bool = true) throws -> (BenchConnection.Response?, Int) {
        var parser = ResponseParser()
        parser.reset(keepBody: keepBody)
        let bytes = Array(text.utf8)
        var pieces = 0
        var offset = 0
        while offset < bytes.count {
            var buffer = ByteBuffer(bytes: bytes[offset..<min(bytes.count, offset + step)])
            offset += step
            pieces += 1
            if let response = try parser.feed(&buffer) {
                #expect(offset >= bytes.count, "answered before the last byte")
                return (response, pieces)
            }
        }
        return (nil, pieces)
    }

    @Test(arguments: [1, 3, 7, 1000])
    func contentLengthAndChunkedBodiesAreFramedWhateverTheSplit(_ step: Int) throws {
        let plain = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"
        let (first, _) = try read(plain, step: step)
        let response = try #require(first)
        #expect(response.status == 200 && response.bodyBytes == 11)
        #expect(response.body.map { String(buffer: $0) } == "{\"ok\":true}")

        let chunked = "HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n3;ext=1\r\n!!!\r\n0\r\nX-Trailer: 1\r\n\r\n"
        let (second, _) = try read(chunked, step: step)
        let refused = try #require(second)
        #expect(refused.status == 503 && refused.bodyBytes == 7)
        #expect(refused.body.map { String(buffer: $0) } == "busy!!!")

        let empty = "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
        #expect(try read(empty, step: step).0?.bodyBytes == 0)
    }

    @Test func anIncompleteResponseIsNotAnswered() throws {
        #expect(try read("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", step: 4).0 == nil)
        #expect(try read("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n", step: 4).0 == nil)
    }

    @Test(arguments: [
        "HTTP/2 200\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabEXTRA",
    ])
    func malformedResponsesAreErrors(_ text: String) {
        #expect(throws: BenchmarkError.self) { _ = try read(text, step: 1000) }
    }

    @Test func aHeadWithoutEndIsRefusedPast64KiB() {
        let endless = "HTTP/1.1 200 OK\r\nX: " + String(repeating: "a", count: 70_000)
        #expect(throws: BenchmarkError.self) { _ = try read(endless, step: 4096) }
    }

    @Test func theParserIsReusableForTheNextResponse() throws {
        var parser = ResponseParser()
        for status in [200, 404] {
            parser.reset(keepBody: false)
            var buffer = ByteBuffer(string: "HTTP/1.1 \(status) X\r\nContent-Length: 3\r\n\r\nabc")
            let response = try #require(try parser.feed(&buffer))
            #expect(response.status == status && response.bodyBytes == 3 && response.body == nil)
        }
    }
}

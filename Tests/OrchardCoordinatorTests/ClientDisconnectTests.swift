import Hummingbird
import NIOCore
import NIOHTTP1
@testable import OrchardCoordinator
import Testing

/// A device that goes away mid-upload is what happened, logged as information, not an unhandled error.
@Suite struct ClientDisconnectTests {
    @Test func aRequestCutShortIsTheClientGoingAway() {
        #expect(ErrorMiddleware<BasicRequestContext>.isClientDisconnect(HTTPParserError.invalidEOFState))
        #expect(ErrorMiddleware<BasicRequestContext>.isClientDisconnect(ChannelError.ioOnClosedChannel))
        #expect(!ErrorMiddleware<BasicRequestContext>.isClientDisconnect(HTTPParserError.invalidHeaderToken))
        #expect(!ErrorMiddleware<BasicRequestContext>.isClientDisconnect(CancellationError()))
    }
}

import HummingbirdCore
import Logging
import NIOCore
import NIOPosix
@testable import OrchardCoordinator
import Testing

/// A connection's task runs on its channel's event loop.
@Suite(.timeLimit(.minutes(1))) struct EventLoopConnectionTests {
    /// An actor elsewhere: awaiting it leaves the loop, and the task must come back to it.
    actor Elsewhere {
        func value() -> Int { 7 }
    }

    @Test func aTaskPreferringALoopRunsOnItAcrossAwaits() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let loop = group.next()
        #expect(!loop.inEventLoop)
        let seen = await withTaskExecutorPreference(EventLoopTaskExecutor(loop)) { () async -> [Bool] in
            var seen = [loop.inEventLoop]
            _ = await Elsewhere().value()
            seen.append(loop.inEventLoop)
            _ = await Task.detached { 1 }.value
            seen.append(loop.inEventLoop)
            await withTaskGroup(of: Bool.self) { children in
                children.addTask { loop.inEventLoop }
                for await child in children { seen.append(child) }
            }
            return seen
        }
        #expect(seen == [true, true, true, true])
    }

    /// A connection's value: its channel.
    struct Connection: ServerChildChannelValue {
        let channel: any Channel
    }

    /// Reports whether `handle` ran on the connection's loop.
    struct Recording: ServerChildChannel {
        let ranOnLoop: @Sendable (Bool) -> Void

        func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Connection> {
            channel.eventLoop.makeSucceededFuture(Connection(channel: channel))
        }

        func handle(value: Connection, logger: Logger) async {
            ranOnLoop(value.channel.eventLoop.inEventLoop)
        }
    }

    @Test func aConnectionIsHandledOnItsChannelsLoop() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let channel = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
        defer { channel.close(promise: nil) }
        let (stream, continuation) = AsyncStream.makeStream(of: Bool.self)
        let bound = EventLoopBoundChannel(base: Recording { continuation.yield($0) })
        let connection = try await bound.setup(channel: channel, logger: Logger(label: "test")).get()
        #expect(connection.channel === channel)
        await bound.handle(value: connection, logger: Logger(label: "test"))
        // The unbound handler, for contrast: it runs on the global pool, not on the loop.
        await Recording { continuation.yield($0) }.handle(value: connection, logger: Logger(label: "test"))
        continuation.finish()
        var results: [Bool] = []
        for await result in stream { results.append(result) }
        #expect(results == [true, false])
    }
}

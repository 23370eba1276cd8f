import HummingbirdCore
import Logging
import NIOCore

/// Runs each connection's task on its channel's event loop (a task executor preference) instead of the global
/// concurrent pool.
///
/// Hummingbird answers a connection in a Swift task; by default every request then crosses threads twice: the
/// event loop hands the request to a pool thread, which hands the response back. With the preference, the task's
/// jobs run on the loop that reads and writes the connection, so a request is read, answered and written on one
/// thread. Actor-isolated calls still run on the actor's terms (a default actor runs on the caller's preferred
/// executor while it holds the actor). A route whose work is long (checking and spooling a report) moves it to the
/// global pool itself (`CoordinatorServer.offTheEventLoop`), so that the loop goes on serving its other connections;
/// nothing on a loop may block waiting for that loop (no `EventLoopFuture.wait()` in a route).
struct EventLoopBoundChannel<Base: ServerChildChannel>: ServerChildChannel {
    typealias Value = Base.Value

    /// The channel setup and handling that run on the loop.
    let base: Base

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        base.setup(channel: channel, logger: logger)
    }

    func handle(value: Value, logger: Logger) async {
        await withTaskExecutorPreference(EventLoopTaskExecutor(value.channel.eventLoop)) {
            await base.handle(value: value, logger: logger)
        }
    }
}

/// An event loop as a task executor: a job is run by the loop's `execute`.
final class EventLoopTaskExecutor: TaskExecutor {
    /// The loop the jobs run on.
    let eventLoop: any EventLoop

    init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        eventLoop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

public import Foundation

/// Runs `body`, a call that blocks its thread (reading a child's pipe to its end, waiting for a child to exit), on a
/// thread of its own and awaits its result.
///
/// A test awaits; it must not block. The Swift cooperative pool has as many threads as cores and adds none while one
/// is blocked, so on a two-core machine two blocked tests stop every task of the test process, the in-process
/// coordinators' request handlers among them, until the waits end. Their clients then time out while the CPU idles.
public func awaitBlocking<T: Sendable, E: Error>(_ body: @escaping @Sendable () throws(E) -> T) async throws(E) -> T {
    let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, E>, Never>) in
        Thread.detachNewThread { continuation.resume(returning: Result { () throws(E) -> T in try body() }) }
    }
    return try result.get()
}

extension FileHandle {
    /// Everything left to read until end of file (a child's output, until the child closes it), read on a thread of
    /// its own (``awaitBlocking(_:)``).
    public func readToEndOfFile() async -> Data {
        await awaitBlocking { self.readDataToEndOfFile() }
    }

    /// The bytes available now, or the next ones once some arrive (empty at end of file), read on a thread of its own.
    public func nextAvailableData() async -> Data {
        await awaitBlocking { self.availableData }
    }
}

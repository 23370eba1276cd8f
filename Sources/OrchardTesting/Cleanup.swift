/// Runs `body` with `resource`, then awaits `stop(resource)` whether `body` returns or throws: a test's server or
/// coordinator is gone before the test returns, never left to an unawaited task.
public func withCleanup<Resource>(
    _ resource: Resource, stop: (Resource) async -> Void, _ body: (Resource) async throws -> Void
) async throws {
    do {
        try await body(resource)
    } catch {
        await stop(resource)
        throw error
    }
    await stop(resource)
}

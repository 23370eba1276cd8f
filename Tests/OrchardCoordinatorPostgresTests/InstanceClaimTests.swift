import Foundation
import Synchronization
import OrchardCoordinator
import OrchardCoordinatorPostgres
import Testing

/// Instances sharing PostgreSQL each claim their id for as long as they run: a second running instance with the same
/// id (two replicas given one `--instance-id`, or a default that came out alike) is refused at start, since the two
/// would fold into one partial sum and lose each other's reports.
@Suite(TestDatabase.requirement) struct InstanceClaimTests {
    @Test func anIDHeldByARunningInstanceIsRefusedAndFreedByItsShutdown() async throws {
        try await TestDatabase.withDatabase { configuration in
            let first = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            let second = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            try await first.claimInstance("a")
            let refused = await #expect(throws: StoreError.self) { try await second.claimInstance("a", waiting: .zero) }
            #expect(refused?.code == .locked && refused?.message.contains("instance id 'a' is held by another running instance") == true)
            try await second.claimInstance("b", waiting: .zero)
            // Shut down (or killed: its connection closes), the first frees its id within the wait.
            await first.shutdown()
            try await second.claimInstance("a", waiting: .seconds(10))
            await second.shutdown()
        }
    }

    @Test func aSecondCoordinatorWithTheSameIDDoesNotStart() async throws {
        try await TestDatabase.withDatabase { configuration in
            let store = try await PostgresStore.open(configuration: configuration, logger: TestDatabase.logger)
            let instance = try await CoordinatorInstance.open(
                store: store, configuration: CoordinatorConfiguration(instanceID: "twin"), logger: TestDatabase.logger
            ) { await store.shutdown() }
            var impatient = configuration
            impatient.instanceClaimWait = .zero
            let other = try await PostgresStore.open(configuration: impatient, logger: TestDatabase.logger)
            let released = Mutex(false)
            let error = await #expect(throws: StoreError.self) {
                _ = try await CoordinatorInstance.open(
                    store: other, configuration: CoordinatorConfiguration(instanceID: "twin"), logger: TestDatabase.logger
                ) {
                    released.withLock { $0 = true }
                    await other.shutdown()
                }
            }
            #expect(error?.code == .locked && released.withLock { $0 }, "a refused start frees its store")
            // Another id starts beside it.
            let store3 = try await PostgresStore.open(configuration: impatient, logger: TestDatabase.logger)
            let third = try await CoordinatorInstance.open(
                store: store3, configuration: CoordinatorConfiguration(instanceID: "other"), logger: TestDatabase.logger
            ) { await store3.shutdown() }
            await third.shutdown()
            await instance.shutdown()
        }
    }
}

import Foundation
import OrchardSupport
import OrchardClient
import OrchardHTTPClient
import OrchardOperator
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import Logging
import Synchronization

/// The coordinator's admin API as a shard uses it (list, host, status, checkpoint), over the operator's admin client,
/// with its failures in the simulator's words.
struct CoordinatorAdmin: Sendable {
    let client: AdminClient
    let clock: any WallClock

    var url: String { client.baseURL.absoluteString }

    init(url: String, token: String, trustRoots: TrustRoots, timeout: Duration, clock: any WallClock) throws(SimulationError) {
        do { client = try AdminClient(server: url, adminToken: token, trustRoots: trustRoots, timeout: timeout) } catch {
            throw SimulationError(.invalidOption, error.message.replacingOccurrences(of: "--server ", with: ""))
        }
        self.clock = clock
    }

    /// The simulator's error for a failed call `what`.
    func failure(_ error: OperatorError, _ what: String) -> SimulationError {
        switch error.code {
        case .unauthorized:
            return SimulationError(
                .coordinator, "the coordinator at \(url) refused the admin token from \(ExternalFleet.adminTokenVariable) (\(error.message))")
        case .unreachable, .tls:
            return SimulationError(.coordinator, error.message)
        default:
            let status = error.httpStatus.map { "HTTP \($0) " } ?? ""
            return SimulationError(.coordinator, "the coordinator at \(url) refused to \(what): \(status)\(error.code): \(error.message)")
        }
    }

    func processes() async throws(SimulationError) -> [ProcessStatus] {
        do { return try await client.processes().value.processes } catch { throw failure(error, "list the processes") }
    }

    func find(name: String, version: SemanticVersion) async throws(SimulationError) -> ProcessStatus? {
        try await processes().first { $0.name == name && $0.version == version }
    }

    func status(_ processID: String) async throws(SimulationError) -> ProcessStatus {
        do { return try await client.status(processID).value } catch { throw failure(error, "read the status of process \(processID)") }
    }

    /// Checkpoint `number`'s safetensors bytes; the latest when `number` was pruned meanwhile.
    func checkpoint(_ processID: String, _ number: Int) async throws(SimulationError) -> [UInt8] {
        do {
            do {
                return try await client.checkpoint(processID, .number(number)).bytes
            } catch  where error.httpStatus == 404 {
                return try await client.checkpoint(processID, .latest).bytes
            }
        } catch {
            throw failure(error, "send checkpoint \(number) of process \(processID)")
        }
    }

    /// Hosts `request` unless a process of its name and version exists; true when this call hosted it.
    func hostOnce(_ request: HostProcessRequest) async throws(SimulationError) -> (ProcessStatus, Bool) {
        if let existing = try await find(name: request.name, version: request.version) { return (existing, false) }
        do {
            return (try await client.host(request).value, true)
        } catch  where error.httpStatus == 409 {
            // Hosted by someone else between the list and the call.
            if let existing = try await find(name: request.name, version: request.version) { return (existing, false) }
            throw failure(error, "host process '\(request.name)' \(request.version)")
        } catch {
            throw failure(error, "host process '\(request.name)' \(request.version)")
        }
    }

    /// Polls, with backoff, until a process of `name` and `version` exists, for at most `timeout`.
    func waitForProcess(name: String, version: SemanticVersion, timeout: Duration) async throws(SimulationError) -> ProcessStatus {
        let start = clock.now
        var delay = Duration.milliseconds(250)
        while true {
            if let found = try await find(name: name, version: version) { return found }
            let waited = start.duration(to: clock.now)
            if waited >= timeout {
                throw SimulationError(
                    .coordinator,
                    "process '\(name)' \(version) did not appear on \(url) within \(timeout.secondsText) s: shard 1 hosts it, so start shard 1 against the same coordinator with the same options, or wait longer (--host-timeout)"
                )
            }
            do { try await clock.sleep(for: min(delay, timeout - waited)) } catch { throw SimulationError(.coordinator, "stopped") }
            delay = min(delay * 2, .seconds(5))
        }
    }
}

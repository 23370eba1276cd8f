import OrchardSupport
import CoreMetrics
import Crypto
import Foundation
import OrchardPrivacy
import Logging
import OrchardFormats
public import OrchardProtocol
import Synchronization

// The admin API: hosting, listing, inspecting and deleting processes, and their checkpoints.
extension Coordinator {
    // MARK: Admin API

    /// Hosts a new FL process: validates the model, weights and configurations, stores checkpoint 0, opens cycle 1.
    public func host(_ request: HostProcessRequest) async throws(CoordinatorError) -> ProcessStatus {
        if let failure = WireLimits.nameFailure(request.name, field: "name") {
            throw CoordinatorError(.invalidConfiguration, failure)
        }
        do throws(FormatError) {
            try request.model.validate()
            try request.model.validateLimits()
        } catch {
            throw CoordinatorError(.invalidConfiguration, error.message)
        }
        if let failure = request.clientConfig.validationFailure() ?? request.serverConfig.validationFailure()
            ?? Self.evaluationFailure(client: request.clientConfig, server: request.serverConfig, model: request.model)
        {
            throw CoordinatorError(.invalidConfiguration, failure)
        }
        if let privacy = request.serverConfig.privacy {
            if let caution = privacy.deltaCaution { logger.warning("\(caution)", metadata: ["process": "\(request.name)"]) }
            // A budget that one release already exceeds would host a process that can never aggregate.
            let mechanism = PrivacyMechanism(config: privacy, server: request.serverConfig)
            let allowed: Bool
            do throws(PrivacyError) {
                allowed = try mechanism.allowsRelease(after: mechanism.initialLedger)
            } catch {
                throw CoordinatorError(.invalidConfiguration, "server_config.privacy: \(error.message)")
            }
            if !allowed {
                let first = (try? mechanism.epsilon(releases: 1)) ?? .infinity
                throw CoordinatorError(
                    .invalidConfiguration,
                    "server_config.privacy.target_epsilon \(privacy.targetEpsilon ?? 0) is below the ε of a single aggregate (\(first)); raise it or the noise_multiplier"
                )
            }
        }
        let archive: SafetensorsArchive
        do throws(FormatError) {
            archive = try Safetensors.decode(request.initialWeights)
        } catch {
            throw CoordinatorError(.malformedSafetensors, "initial_weights: \(error.message)")
        }
        // The weights must build against the architecture here, not fail later on every device.
        do throws(FormatError) {
            try request.model.checkWeights(Dictionary(archive.tensors.map { ($0.name, $0.shape) }, uniquingKeysWith: { first, _ in first }))
        } catch {
            throw CoordinatorError(.invalidConfiguration, "\(error.code == .invalidSpec ? "model" : "initial_weights"): \(error.message)")
        }
        let layout = try ModelLayout(weights: archive.tensors, model: request.model)
        let flat = try layout.flatten(archive.tensors)
        if flat.contains(where: { !$0.isFinite }) {
            throw CoordinatorError(.invalidConfiguration, "initial_weights hold NaN or infinity")
        }
        _ = try await DeviceAuthenticator(request.serverConfig.authentication)
        let now = clock.date
        let process = StoredProcess(
            id: "p_" + randomHex(8), name: request.name, version: request.version, model: request.model,
            clientConfig: request.clientConfig, serverConfig: request.serverConfig, createdAt: now
        )
        // The initial weights' metadata (the model's preprocessing, its format) stays with every checkpoint.
        var metadata = ModelLayout.carriedMetadata(archive.metadata)
        metadata["orchard.process"] = process.id
        metadata["orchard.checkpoint"] = "0"
        let weights = Safetensors.encode(layout.records(flat), metadata: metadata)
        do {
            try await store.createProcess(process, initialWeights: weights, firstCycle: StoredCycle(number: 1, checkpoint: 0, openedAt: now))
        } catch let error as StoreError where error.code == .duplicate {
            throw CoordinatorError(.processExists, error.message)
        } catch {
            throw storeFailure(error, "store the process")
        }
        do {
            try await load(process)
        } catch {
            throw storeFailure(error, "load the new process")
        }
        logger.info("process hosted", metadata: ["process": "\(process.id)", "name": "\(process.name)", "version": "\(process.version)"])
        if process.serverConfig.authentication.mode == .open { warnOpenAuthentication(process) }
        return try await status(processID: process.id)
    }

    /// Every hosted process.
    public func processList() async throws(CoordinatorError) -> ProcessList {
        if store.isShared { await refreshProcesses() }
        var statuses: [ProcessStatus] = []
        for id in runtimes.keys.sorted() {
            statuses.append(try await status(processID: id))
        }
        return ProcessList(processes: statuses)
    }

    /// What makes a process's federated evaluation unusable, or nil: it needs devices that hold data out, and a loss to
    /// evaluate.
    static func evaluationFailure(client: ClientConfig, server: ServerConfig, model: ModelSpec) -> String? {
        guard server.evaluation != nil else { return nil }
        guard let fraction = client.holdoutFraction, fraction > 0 else {
            return
                "server_config.evaluation needs client_config.holdout_fraction above 0: devices evaluate on the samples they hold out and never train on"
        }
        guard model.training?.loss != nil else {
            return "server_config.evaluation needs the model's training section, whose loss devices evaluate with"
        }
        return nil
    }

    /// Closed cycles listed by ``cycles(processID:)``.
    public static let cycleHistoryLimit = 200

    /// A process's closed cycles (the newest ``cycleHistoryLimit``), oldest first, as the store recorded them.
    public func cycles(processID: String) async throws(CoordinatorError) -> ProcessCycles {
        await catchUpShared(processID: processID)
        guard runtimes[processID] != nil else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        do {
            var records = try await store.cycleRecords(processID: processID, limit: Self.cycleHistoryLimit)
            // Each published checkpoint's evaluations, server-side and federated, beside the cycle that published it.
            let limit = Self.cycleHistoryLimit + 1
            let server = Dictionary(try await store.evaluations(processID: processID, limit: limit).map { ($0.checkpoint, $0) }) { _, new in new }
            let federated = Dictionary(
                try await store.federatedEvaluations(processID: processID, limit: limit).map { ($0.checkpoint, $0) }
            ) { _, new in new }
            for index in records.indices {
                guard let checkpoint = records[index].checkpoint else { continue }
                records[index].evaluation = server[checkpoint]
                records[index].federatedEvaluation = federated[checkpoint]
            }
            return ProcessCycles(processID: processID, cycles: records)
        } catch {
            throw storeFailure(error, "read the cycle history")
        }
    }

    /// The number of the process's current cycle and the counts of cycles it aggregated and abandoned (nil for an
    /// unknown process): what a driver polls to learn that a cycle closed, without the store reads of
    /// ``status(processID:)``.
    public func cycleCounts(processID: String) -> (current: Int, completed: Int, abandoned: Int)? {
        runtimes[processID].map { ($0.machine.cycle, $0.machine.completedCycles, $0.machine.abandonedCycles) }
    }

    /// The status of one process and its open cycle.
    public func status(processID: String) async throws(CoordinatorError) -> ProcessStatus {
        if store.isShared, runtimes[processID]?.secure != nil {
            // The protocol's stage as the instances together have it.
            // A store that cannot be read leaves the status as this instance has it (as for other processes).
            _ = try? await withSecureLock(processID: processID) { _ in }
        } else {
            await catchUpShared(processID: processID)
        }
        guard let runtime = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        let numbers: [Int]
        let evaluation: CheckpointEvaluation?
        let federated: CheckpointEvaluation?
        do {
            numbers = try await store.checkpointNumbers(processID: processID)
            evaluation = try await store.evaluations(processID: processID, limit: 1).last
            federated = try await store.federatedEvaluations(processID: processID, limit: 1).last
        } catch {
            throw storeFailure(error, "list checkpoints")
        }
        guard let current = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        let machine = current.machine
        let buffered = machine.configuration.buffered
        let staleness = current.bufferStaleness
        let cycle: CycleStatus? =
            machine.phase == .completed
            ? nil
            : CycleStatus(
                number: machine.cycle, checkpoint: machine.checkpoint, openedAt: machine.openedAt.timeIntervalSince1970,
                deadline: buffered ? clock.date.timeIntervalSince1970 + machine.configuration.cycleLength : machine.deadline.timeIntervalSince1970,
                assigned: machine.assignments.count, reported: machine.reported,
                goal: machine.configuration.goalCount, capacity: machine.configuration.capacity,
                secureAggregation: current.secure?.status(cycleDeadline: machine.deadline),
                buffered: buffered
                    ? BufferedStatus(
                        bufferSize: machine.configuration.goalCount, bufferFill: machine.reported, inFlight: machine.inFlight,
                        maxConcurrency: machine.configuration.capacity, releases: machine.completedCycles,
                        meanStaleness: staleness.count > 0 ? Double(staleness.sum) / Double(staleness.count) : nil,
                        maxStaleness: staleness.count > 0 ? staleness.max : nil
                    ) : nil
            )
        var server = runtime.process.serverConfig
        server.authentication.secret = server.authentication.secret == nil ? nil : "<redacted>"
        return ProcessStatus(
            processID: processID, name: current.process.name, version: current.process.version,
            state: machine.phase == .completed ? .completed : .running, latestCheckpoint: current.process.latestCheckpoint,
            checkpoints: numbers, cyclesCompleted: machine.completedCycles, cyclesAbandoned: machine.abandonedCycles,
            currentCycle: cycle, clientConfig: current.process.clientConfig, serverConfig: server,
            privacy: current.privacy.map { mechanism, ledger in
                PrivacyStatus(
                    epsilon: ledger.epsilon, delta: mechanism.config.delta, releases: ledger.releases, samplingRate: mechanism.samplingRate,
                    noiseMultiplier: mechanism.accountedNoiseMultiplier, clippingNorm: ledger.clippingNorm, targetEpsilon: mechanism.config.targetEpsilon
                )
            },
            evaluation: evaluation, federatedEvaluation: federated
        )
    }

    /// A stored checkpoint's safetensors bytes; `number` nil means the latest.
    public func checkpoint(processID: String, number: Int?) async throws(CoordinatorError) -> (number: Int, bytes: [UInt8]) {
        await catchUpShared(processID: processID)
        guard let runtime = runtimes[processID] else { throw CoordinatorError(.unknownProcess, "no process '\(processID)'") }
        let wanted = number ?? runtime.process.latestCheckpoint
        if wanted == runtime.process.latestCheckpoint { return (wanted, runtime.checkpointBytes) }
        let bytes: [UInt8]?
        do {
            bytes = try await store.checkpoint(processID: processID, number: wanted)
        } catch {
            throw storeFailure(error, "read the checkpoint")
        }
        guard let bytes else { throw CoordinatorError(.unknownCheckpoint, "process '\(processID)' has no checkpoint \(wanted) (pruned or not yet written)") }
        return (wanted, bytes)
    }

    /// Deletes a process and everything stored for it.
    public func delete(processID: String) async throws(CoordinatorError) {
        guard try await knownRuntime(processID: processID) != nil, await confirmShared(processID: processID) else {
            throw CoordinatorError(.unknownProcess, "no process '\(processID)'")
        }
        do {
            try await store.deleteProcess(id: processID)
        } catch {
            throw storeFailure(error, "delete the process")
        }
        forget(processID: processID)
        logger.info("process deleted", metadata: ["process": "\(processID)"])
    }

    /// Whether `token` is the admin token, given by a client at `address`. Wrong tokens are counted per address
    /// (``adminGuessLimit``): once an address has spent its allowance, its attempts are refused without being checked
    /// until it refills, so an admin token cannot be guessed online at the speed of the connection.
    /// - Throws: `rate_limited` with the seconds to wait, for an address out of attempts.
    public nonisolated func checkAdmin(token: String?, from address: ClientAddress?) throws(CoordinatorError) -> Bool {
        guard let token, configuration.adminToken != nil else { return false }
        let key = address ?? ClientAddress("unknown")
        let now = clock.date
        if let wait = adminGuesses.withLock({ $0.wait(key, at: now) }) {
            throw .rateLimited("too many wrong admin tokens from \(key); try again shortly", retryAfter: max(1, wait.rounded(.up)))
        }
        if isAdmin(token: token) { return true }
        _ = adminGuesses.withLock { $0.take(key, at: now) }
        logger.warning("wrong admin token", metadata: ["address": "\(key)"])
        return false
    }

    /// Whether an admin bearer token is valid: the SHA-256 digests of both are compared in constant time, so neither
    /// the token's bytes nor its length show in the time an answer takes.
    public nonisolated func isAdmin(token: String?) -> Bool {
        guard let expected = configuration.adminToken, let token else { return false }
        let a = Array(SHA256.hash(data: Array(expected.utf8))), b = Array(SHA256.hash(data: Array(token.utf8)))
        var difference: UInt8 = 0
        for i in 0..<a.count { difference |= a[i] ^ b[i] }
        return difference == 0
    }
}

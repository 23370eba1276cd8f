public import Foundation
public import OrchardSupport
import Synchronization
import OrchardData
import OrchardExamples
import OrchardFormats
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import OrchardCoordinator
import OrchardClient
import OrchardInProcess
import Logging

/// What a finished run produced.
public struct SimulationResult: Sendable {
    /// The directory holding `metrics.jsonl`, `summary.json` and `report.html`.
    public var directory: URL
    /// The summary.
    public var summary: SimulationSummary
    /// One record per round.
    public var rounds: [RoundMetrics]
}

/// Runs a whole scenario: loads the data, prepares the model (for housing, central pretraining of the
/// embeddings first), hosts the process on a real coordinator, runs the fleet of virtual devices against it, and writes the report.
/// The data, the model and the hosted process are shared with ``ExternalFleet``, which runs a shard of the same fleet
/// against a coordinator running elsewhere, in real time.
public enum SimulationRunner {
    /// Runs `configuration`.
    /// - Parameters:
    ///   - configuration: The scenario.
    ///   - progress: Where progress goes.
    ///   - clock: Real time, for the wall-seconds figures (injected; the CLI passes the system clock).
    ///   - stop: Asked before each round: once requested, the run ends after the round in progress, and the report covers
    ///     the rounds run (`planned_rounds` in `summary.json` says how many were asked for).
    public static func run(
        _ configuration: SimulationConfiguration, progress: ProgressDisplay, clock: any WallClock, stop: SimulationStop? = nil
    ) async throws(SimulationError) -> SimulationResult {
        try configuration.validate()
        let setupStart = clock.now
        let directory =
            configuration.output
            ?? FileManager.default.temporaryDirectory
            .appendingPathComponent("orchard-simulation-\(configuration.seed)-\(UUID().uuidString.prefix(8))")
        // The directory is checked first (a bad --output fails at once), its files left alone until the run begins.
        let writer = try ReportWriter(directory: directory, truncating: false)
        let prepared: (model: Model, workload: any FleetWorkload, centralRMSE: Double?)
        do throws(SimulationError) {
            prepared = try prepare(configuration, progress: progress)
            try writer.begin()
        } catch {
            writer.discardIfCreated()
            throw error
        }
        return try await runFleet(
            configuration, model: prepared.model, workload: prepared.workload, centralRMSE: prepared.centralRMSE, writer: writer, progress: progress,
            clock: clock, setupStart: setupStart, stop: stop
        )
    }

    /// The scenario's data and model, the same on every run and every machine for a seed: for images, the zoo's
    /// model with PyTorch's initialisation; for housing, central pretraining of the embeddings, then the device
    /// model with them imported frozen. The workload deals the training set to `configuration.clients` devices
    /// (the seed's partition) and evaluates on the test set.
    static func prepare(
        _ configuration: SimulationConfiguration, progress: ProgressDisplay
    ) throws(SimulationError) -> (model: Model, workload: any FleetWorkload, centralRMSE: Double?) {
        if configuration.dataset.isText { return try prepareText(configuration, progress: progress) }
        if let imageDirectory = configuration.dataset.imageDirectory {
            let (train, test) = try loadImages(imageDirectory, cache: configuration.datasetCache)
            let spec =
                configuration.model == .cnn
                ? ModelZoo.cnn(imageShape: train.inputSpecs[0].shape, learningRate: configuration.learningRate)
                : ModelZoo.mlp2nn(imageShape: train.inputSpecs[0].shape, learningRate: configuration.learningRate)
            // Same initial distribution as the PyTorch frameworks FedAvg baselines come from (see ModelZoo).
            let model = try engine { () throws(EngineError) in
                var model = try Model(spec: spec, seed: configuration.seed)
                try ModelZoo.initializeAsPyTorch(&model, seed: configuration.seed)
                return model
            }
            let slices = try partition(train, configuration: configuration)
            progress.note(
                "\(configuration.dataset): \(train.count) training and \(test.count) test images over \(configuration.clients) devices; \(configuration.model) with \(model.parameterCount) parameters"
            )
            var workload = EngineWorkload(model: model, slices: slices, testSet: test)
            if let attack = configuration.attack {
                let attackers = attack.attackers(clients: configuration.clients, seed: configuration.seed)
                workload.attack = (attack, attackers, model.outputShape.reduce(1, *))
                progress.note("attack: \(attack.summary) (\(attackers.count) devices)")
            }
            return (model, workload, nil)
        }
        // Housing: central pretraining, then the device model with the embeddings imported frozen.
        let housing = HousingConfiguration(seed: configuration.seed)
        let data: HousingData
        do { data = try HousingExample.prepare(housing) } catch {
            throw SimulationError(.unreadable, "cannot prepare the housing data: \(error)")
        }
        let central: TrainedHousingModel
        let device: Model
        do {
            central = try HousingExample.trainCentral(data, configuration: housing)
            device = try HousingExample.deviceModel(from: central.model, preprocessor: data.preprocessor, configuration: housing)
        } catch {
            throw SimulationError(.training, "central pretraining failed: \(error)")
        }
        progress.note(
            String(
                format: "central pretraining: test RMSE %.3f after %d epochs (%.2f s); embeddings frozen for the fleet", central.metrics.testRMSE,
                central.metrics.epochs, central.metrics.seconds))
        let slices = try partition(data.train, configuration: configuration)
        var workload = EngineWorkload(model: device, slices: slices, testSet: data.test)
        if let attack = configuration.attack {
            let attackers = attack.attackers(clients: configuration.clients, seed: configuration.seed)
            workload.attack = (attack, attackers, 0)
            progress.note("attack: \(attack.summary) (\(attackers.count) devices)")
        }
        return (device, workload, central.metrics.testRMSE)
    }

    /// The process the simulator hosts for `configuration` — in process, and on an external coordinator
    /// (`--coordinator`, where shard 1 hosts it through the admin API): the model and its initial weights, the
    /// client config, and a server config with the scenario's goal, over-selection, minimum reports, cycle length,
    /// aggregator, privacy and secure aggregation.
    /// - Parameters:
    ///   - name: The process's name (default `simulation-<model>`); its version is 1.0.0.
    ///   - cycles: `server_config.cycles` (0, unbounded, in process, where the simulation decides when to stop).
    static func hostedProcess(
        _ configuration: SimulationConfiguration, model: Model, workload: any FleetWorkload, name: String? = nil, cycles: Int = 0
    ) throws(SimulationError) -> HostProcessRequest {
        var server = ServerConfig(
            cycleLength: configuration.cycleSeconds, cycles: cycles, goalCount: configuration.goal,
            overSelection: configuration.overSelection, minimumReports: configuration.minimumReports,
            paceSteeringWindow: 60, checkpointRetention: 3, aggregator: configuration.aggregator, privacy: configuration.privacy,
            secureAggregation: configuration.secureAggregation, robustAggregation: configuration.robustAggregation,
            evaluation: configuration.federatedEvaluation
        )
        if let buffered = configuration.buffered {
            server.aggregationMode = .buffered
            server.buffered = buffered
        }
        if configuration.secureAggregation != nil {
            // The bound the masked sum is sized for: the largest slice a device trains on.
            server.maximumSampleCount = (0..<configuration.clients).map { workload.sampleCount(device: $0) }.max() ?? 1
        }
        if let failure = server.validationFailure() {
            throw SimulationError(.invalidOption, failure.replacingOccurrences(of: "server_config.", with: ""))
        }
        var metadata = ["format": "pt", "orchard.model": model.name]
        metadata.merge(workload.weightsMetadata) { _, new in new }
        return HostProcessRequest(
            name: name ?? defaultProcessName(configuration), version: processVersion, model: model.spec,
            initialWeights: Safetensors.encode(model.weightRecords, metadata: metadata), clientConfig: configuration.clientConfig, serverConfig: server
        )
    }

    /// Why secure aggregation will mostly fail in `configuration`, or nil: a background window must hold a device's
    /// training and then the protocol's three later stages, each up to a stage timeout; when the median device's
    /// training leaves less than that, most devices run out of window between stages and drop out of their cycles.
    static func secureWindowWarning(_ configuration: SimulationConfiguration, process: HostProcessRequest, workload: any FleetWorkload) -> String? {
        guard let secure = configuration.secureAggregation, configuration.clients > 0,
            let training = try? TrainingConfiguration.resolved(architecture: process.model, clientConfig: process.clientConfig, seed: 0)
        else { return nil }
        let samples = (0..<configuration.clients).map { workload.sampleCount(device: $0) }.sorted()
        let trainingSeconds = Double(training.plannedUpdates(samples: samples[samples.count / 2])) * configuration.secondsPerUpdate
        let stages = secure.parameters.consistencyCheck ? 4.0 : 3.0
        guard configuration.windowSeconds - trainingSeconds < stages * secure.stageTimeout else { return nil }
        func seconds(_ value: Double) -> String { String(format: "%.1f s", value) }
        return "a \(seconds(configuration.windowSeconds)) background window leaves \(seconds(max(0, configuration.windowSeconds - trainingSeconds))) after the "
            + "median device's \(seconds(trainingSeconds)) of training, less than secure aggregation's \(Int(stages)) later stages of up to "
            + "\(seconds(secure.stageTimeout)) each: most devices will run out of their window between stages and drop out of their cycles "
            + "(give a longer --window-seconds)"
    }

    /// The version of every process the simulator hosts.
    static let processVersion = SemanticVersion(1, 0, 0)

    /// `simulation-<model>`: the name of the process the simulator hosts unless told otherwise.
    static func defaultProcessName(_ configuration: SimulationConfiguration) -> String { "simulation-\(configuration.model)" }

    private static func runFleet(
        _ configuration: SimulationConfiguration, model: Model, workload: any FleetWorkload, centralRMSE: Double?, writer: ReportWriter,
        progress: ProgressDisplay, clock: any WallClock, setupStart: WallInstant, stop: SimulationStop?
    ) async throws(SimulationError) -> SimulationResult {
        let process = try hostedProcess(configuration, model: model, workload: workload)
        if let warning = secureWindowWarning(configuration, process: process, workload: workload) { progress.note("warning: \(warning)") }
        var fleet = FleetSimulation(
            devices: configuration.clients, conditions: configuration.conditions, seed: configuration.seed, rounds: configuration.rounds,
            evaluateEvery: configuration.evaluateEvery, turnedAway: configuration.turnedAway)
        fleet.virtualSecondsLimit = configuration.virtualHours.map { $0 * 3600 }
        let setupSeconds = setupStart.duration(to: clock.now).inSeconds
        let outcome: (initial: Evaluation, rounds: [RoundMetrics])
        var appendFailure: SimulationError?
        func record(_ metrics: RoundMetrics) {
            do throws(SimulationError) { try writer.append(metrics) } catch { appendFailure = appendFailure ?? error }
            progress.update(metrics, total: configuration.rounds)
        }
        outcome = try await runAgainstCoordinator(
            process, fleet: fleet, transport: configuration.transport, workload: workload, seed: configuration.seed, clock: clock, stop: stop, onRound: record
        )
        if let appendFailure { throw appendFailure }
        var summary = SimulationSummary(settings: configuration.settings, initial: outcome.initial, rounds: outcome.rounds, setupSeconds: setupSeconds)
        summary.centralRMSE = centralRMSE
        // "housing, housing" says the same thing twice: the housing scenario has one model.
        let scenario =
            configuration.dataset.description == configuration.model.description
            ? configuration.dataset.description : "\(configuration.dataset), \(configuration.model)"
        var title = "Orchard fleet simulation — \(scenario)"
        // Stopped by the user (Ctrl-C); a run that reached `virtual_hours` first ended as it was asked to.
        if outcome.rounds.count < configuration.rounds, stop?.isRequested == true {
            summary.plannedRounds = configuration.rounds
            title += " (stopped after \(outcome.rounds.count) of \(configuration.rounds) rounds)"
        }
        try writer.finish(summary: summary, rounds: outcome.rounds, title: title)
        return SimulationResult(directory: writer.directory, summary: summary, rounds: outcome.rounds)
    }

    /// Runs the fleet against a real coordinator with its SQLite store in a temporary directory (removed
    /// afterwards) and its wall clock driven by the simulation's virtual time: devices reach it over HTTP on a
    /// loopback port (`http`) or through in-process calls (`memory`). The devices' job directories live beside it.
    private static func runAgainstCoordinator(
        _ process: HostProcessRequest, fleet: FleetSimulation, transport choice: TransportChoice, workload: some FleetWorkload,
        seed: UInt64, clock: any WallClock, stop: SimulationStop?, onRound: (RoundMetrics) -> Void
    ) async throws(SimulationError) -> (initial: Evaluation, rounds: [RoundMetrics]) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-simulate-\(UUID().uuidString)", isDirectory: true)
        stop?.register(scratch: directory)
        defer {
            removeScratch(directory)
            stop?.unregister(scratch: directory)
        }
        // The coordinator's wall clock follows the simulation's virtual time (the `clock` parameter is real time).
        let coordinatorClock = ManualClock()
        let instance: CoordinatorInstance
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            // The coordinator's report spool and the devices' directory are made and emptied within seconds, run after
            // run: spread them over the file system's groups (see `LocalFile.spreadSubdirectories`).
            LocalFile.spreadSubdirectories(of: directory.path)
            // A simulated fleet reaches the coordinator from one address, in far more workers than an open-mode
            // process may register by default: those abuse limits are for exposed coordinators, not this one.
            let configuration = CoordinatorConfiguration(openAuthenticationRate: nil, maximumOpenWorkers: nil)
            instance = try await CoordinatorInstance.open(
                database: directory.appendingPathComponent("coordinator.sqlite").path, configuration: configuration, clock: coordinatorClock,
                random: SplitMix64(seed: seed), logger: Logger(label: "orchard.simulation.coordinator") { _ in SwiftLogNoOpLogHandler() }
            )
        } catch {
            throw SimulationError(.coordinator, "cannot open the coordinator's store in \(directory.path): \(error)")
        }
        var server: RunningServer?
        do throws(SimulationError) {
            let coordinator = try await FleetCoordinator(coordinator: instance.coordinator, clock: coordinatorClock, process: process)
            let transport: any ClientTransport
            if choice == .memory {
                transport = InProcessTransport(coordinator: instance.coordinator)
            } else {
                let running: RunningServer
                do { running = try await instance.serve(port: 0) } catch {
                    throw SimulationError(.coordinator, "cannot start the coordinator on a loopback port: \(error)")
                }
                server = running
                do { transport = try HTTPTransport(url: running.baseURL.absoluteString) } catch {
                    throw SimulationError(.coordinator, "cannot reach the coordinator at \(running.baseURL): \(error)")
                }
            }
            let outcome = try await fleet.run(
                coordinator: coordinator, transport: transport, workload: workload,
                directory: directory.appendingPathComponent("devices", isDirectory: true), wallClock: clock, stop: stop, onRound: onRound
            )
            await server?.stop()
            return outcome
        } catch {
            await server?.stop()
            throw error
        }
    }

    private static func loadImages(_ path: String, cache: IDXCache?) throws(SimulationError) -> (IDXImageDataset, IDXImageDataset) {
        let url = URL(fileURLWithPath: path)
        // The two splits decompress side by side (zlib is single-threaded; the training set is ~85 % of the bytes).
        let loaded = Mutex<[Result<IDXImageDataset, DataError>?]>([nil, nil])
        DispatchQueue.concurrentPerform(iterations: 2) { index in
            let result = Result { () throws(DataError) in try IDXImageDataset(directory: url, split: index == 0 ? .train : .test, cache: cache) }
            loaded.withLock { $0[index] = result }
        }
        let (train, test) = loaded.withLock { ($0[0]!, $0[1]!) }
        do {
            return (try train.get(), try test.get())
        } catch {
            throw SimulationError(.unreadable, "cannot read the IDX dataset in \(path) (for Fashion-MNIST: apt-get install dataset-fashion-mnist): \(error)")
        }
    }

    /// Removes the run's scratch directory. The devices' trees go in stripes side by side, one per core (at most
    /// two): each holds the model it downloaded, and freeing those files' pages is most of the time.
    private static func removeScratch(_ directory: URL) {
        let devices = directory.appendingPathComponent("devices", isDirectory: true)
        if let names = try? FileManager.default.contentsOfDirectory(atPath: devices.path), names.count > 1 {
            let stripes = min(2, ProcessInfo.processInfo.activeProcessorCount)
            DispatchQueue.concurrentPerform(iterations: stripes) { stripe in
                for index in stride(from: stripe, to: names.count, by: stripes) {
                    try? FileManager.default.removeItem(at: devices.appendingPathComponent(names[index]))
                }
            }
        }
        try? FileManager.default.removeItem(at: directory)
    }

    /// The text scenario: the corpus from the installed package, cut into sequences and dealt by its own partition;
    /// the char-lstm model over its vocabulary, which the initial weights carry.
    static func prepareText(
        _ configuration: SimulationConfiguration, progress: ProgressDisplay
    ) throws(SimulationError) -> (model: Model, workload: any FleetWorkload, centralRMSE: Double?) {
        let task: TextTask
        let all: TensorDataset
        do throws(DataError) {
            let corpus = try KingJamesBible.corpus()
            task = try TextTask(corpus: corpus, length: configuration.sequenceLength, partition: configuration.textPartition, devices: configuration.clients)
            all = try task.sequences.dataset(Array(0..<task.sequences.count))
        } catch {
            throw SimulationError(error.code == .invalidArgument ? .invalidOption : .unreadable, "kjv: \(error.message)")
        }
        let vocabulary = task.sequences.vocabulary
        let spec = ModelZoo.charLSTM(vocabularySize: vocabulary.size, length: configuration.sequenceLength, learningRate: configuration.learningRate)
        let model = try engine { () throws(EngineError) in
            var model = try Model(spec: spec, seed: configuration.seed)
            try ModelZoo.initializeAsPyTorch(&model, seed: configuration.seed)
            return model
        }
        let slices = task.devices.map { DatasetSlice(all, indices: $0) }
        let trained = task.devices.reduce(0) { $0 + $1.count }
        progress.note(
            "kjv: \(trained) training and \(task.test.count) test sequences of \(configuration.sequenceLength) characters over \(slices.count) devices (one per \(configuration.textPartition)); \(vocabulary.size) symbols; \(configuration.model) with \(model.parameterCount) parameters"
        )
        // The test sequences are a slice of the same dataset, not a second copy of them.
        var workload = EngineWorkload(model: model, slices: slices, testSet: DatasetSlice(all, indices: task.test))
        workload.weightsMetadata = task.weightsMetadata
        return (model, workload, nil)
    }

    private static func partition<D: Dataset>(_ data: D, configuration: SimulationConfiguration) throws(SimulationError) -> [DatasetSlice<D>] {
        var random = OrchardRandom.derived(seed: configuration.seed, stream: 0x9A27)
        do { return try data.partitioned(into: configuration.clients, strategy: configuration.partition, using: &random) } catch {
            throw SimulationError(
                .invalidOption,
                "cannot partition \(data.count) samples over \(configuration.clients) devices with partition \(configuration.partition): \(error)")
        }
    }

    private static func engine<T>(_ body: () throws(EngineError) -> T) throws(SimulationError) -> T {
        do { return try body() } catch { throw SimulationError(.training, "\(error)") }
    }
}

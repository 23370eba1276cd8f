public import Foundation
public import OrchardData
public import OrchardFormats
public import OrchardML
public import OrchardSupport
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How a text corpus is dealt to devices: its own partition.
public enum TextPartition: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// One device per chapter (1,189 for the King James Bible).
    case chapter
    /// One device per book (66).
    case book

    public var description: String { rawValue }
}

/// The King James Bible as a next-character task, read through Debian's `bible` program (packages `bible-kjv` and
/// `bible-kjv-text`; the 1611 translation is in the public domain, the packages' own code GPL-2+): nothing is
/// downloaded, the text comes from the installed package.
public enum KingJamesBible {
    /// Where Debian installs the program.
    public static let program = "/usr/bin/bible"
    /// The verse range of the whole text.
    public static let wholeText = "gen1:1-rev22:21"
    /// Its chapters: the devices of the chapter partition.
    public static let chapters = 1189
    /// Its books: the devices of the book partition.
    public static let books = 66

    /// The installed text as `bible` prints it, one line per verse (`-l` wide enough that nothing wraps).
    /// - Throws: `DataError` `unreadable` when the program is missing or fails, saying which package to install.
    public static func installedText(program: String = program) throws(DataError) -> String {
        guard FileManager.default.isExecutableFile(atPath: program) else {
            throw DataError(.unreadable, "\(program) is not installed: apt-get install bible-kjv (the text is in bible-kjv-text)")
        }
        let output: (status: Int32, bytes: [UInt8])
        do {
            output = try ProgramOutput.run(program, ["-l100000", wholeText])
        } catch {
            throw DataError(.unreadable, "cannot run \(program): \(error)")
        }
        guard output.status == 0, !output.bytes.isEmpty else {
            throw DataError(.unreadable, "\(program) \(wholeText) ended with status \(output.status) and \(output.bytes.count) bytes of output")
        }
        return String(decoding: output.bytes, as: UTF8.self)
    }

    /// The installed corpus: its 1,189 chapters grouped in 66 books.
    public static func corpus(program: String = program) throws(DataError) -> TextCorpus {
        try TextCorpus.kingJamesBible(parsing: try installedText(program: program))
    }
}

/// A text corpus prepared for the simulator: next-character sequences, each device's (its chapter's or book's,
/// less the held-out part) and the pooled held-out test sequences.
public struct TextTask: Sendable {
    /// The sequences.
    public let sequences: NextCharacterSequences
    /// Each device's sequence indices.
    public let devices: [[Int]]
    /// Each device's name (the chapter or the book).
    public let deviceNames: [String]
    /// The held-out sequences: the last tenth of each chapter's, of the devices kept.
    public let test: [Int]

    /// The share of each chapter's sequences held out for the test set.
    public static let testFraction = 0.1

    /// Cuts `corpus` into sequences of `length` and deals them by `partition`; `devices` keeps that many of the
    /// partition's owners (all of them when nil).
    /// - Throws: `DataError` `invalid_argument` for more devices than the partition has owners, a bad length, or devices
    ///   that together hold out no test sequence.
    public init(corpus: TextCorpus, length: Int, partition: TextPartition, devices count: Int?) throws(DataError) {
        let vocabulary = CharacterVocabulary(corpus: corpus)
        sequences = try NextCharacterSequences(corpus: corpus, vocabulary: vocabulary, length: length)
        let split = sequences.naturalSplit(corpus: corpus, byGroup: partition == .book, testFraction: Self.testFraction)
        let owners = split.owners.count
        if let count, !(1...owners).contains(count) {
            throw DataError(.invalidArgument, "the \(partition) partition has \(owners) devices; --devices must be between 1 and \(owners), not \(count)")
        }
        let kept = count ?? owners
        devices = Array(split.owners.prefix(kept))
        deviceNames = Array(split.ownerNames.prefix(kept))
        test = split.tests.prefix(kept).flatMap { $0 }
        // Each owner holds out a tenth of its sequences, rounded down: few long sequences can leave none, and a test
        // set of nothing would report a loss and accuracy of 0 every round.
        guard !test.isEmpty else {
            throw DataError(
                .invalidArgument,
                "\(kept) device\(kept == 1 ? "" : "s") of the \(partition) partition hold out no test sequence at length \(length) (each holds out \(Int(Self.testFraction * 100)) % of its sequences, rounded down): use more devices or a shorter --sequence-length"
            )
        }
    }

    /// The metadata the model's weights carry: the vocabulary, so that a device can read text the model was trained on.
    public var weightsMetadata: [String: String] { [CharacterVocabulary.metadataKey: sequences.vocabulary.json()] }
}

/// Runs a program to its end with `posix_spawn` and returns its exit status and standard output (standard error is
/// discarded). Foundation's `Process` is avoided: on Linux it can crash reading `/proc/self/fd` (swift-corelibs-foundation #5472).
enum ProgramOutput {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    static func run(_ path: String, _ arguments: [String]) throws(Failure) -> (status: Int32, bytes: [UInt8]) {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else { throw Failure(description: "pipe: \(String(cString: strerror(errno)))") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addclose(&actions, pipeEnds[0])
        posix_spawn_file_actions_addclose(&actions, pipeEnds[1])
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, path, &actions, nil, argv, environ)
        close(pipeEnds[1])
        guard spawned == 0 else {
            close(pipeEnds[0])
            throw Failure(description: String(cString: strerror(spawned)))
        }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(pipeEnds[0], $0.baseAddress, $0.count) }
            if count > 0 {
                bytes += buffer[0..<count]
            } else if count == 0 || errno != EINTR {
                break
            }
        }
        close(pipeEnds[0])
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // WIFEXITED / WEXITSTATUS, spelled out (the macros are not imported).
        let exited = status & 0x7f == 0
        return (exited ? (status >> 8) & 0xff : -1, bytes)
    }
}

/// The central baseline of a federated text run: the same model trained on every device's training sequences pooled
/// in one place, evaluated on the same held-out sequences.
public struct CentralTextTraining: Sendable {
    /// What a central run reports (snake_case in JSON).
    public struct Result: Sendable, Codable {
        /// Training and test sequences.
        public var trainSequences: Int
        public var testSequences: Int
        /// The model's parameters.
        public var parameters: Int
        /// Updates applied.
        public var updates: Int
        /// Test accuracy per character, perplexity and mean loss, before training and after.
        public var initialAccuracy: Double
        public var initialPerplexity: Double
        public var accuracy: Double
        public var perplexity: Double
        public var loss: Double
        /// Seconds of training.
        public var seconds: Double

        enum CodingKeys: String, CodingKey {
            case trainSequences = "train_sequences", testSequences = "test_sequences", parameters, updates
            case initialAccuracy = "initial_accuracy", initialPerplexity = "initial_perplexity", accuracy, perplexity, loss, seconds
        }
    }

    /// Trains `configuration`'s char-lstm (its sequence length, partition, learning rate, batch size and seed; its
    /// devices' training sequences pooled) for `epochs` passes with plain SGD. `progress` is called after every batch.
    public static func run(
        _ configuration: SimulationConfiguration, epochs: Int, corpus: TextCorpus, clock: any WallClock,
        progress: ((TrainingProgress) -> Void)? = nil
    ) throws(SimulationError) -> Result {
        let task: TextTask
        let train: TensorDataset, test: TensorDataset
        do throws(DataError) {
            task = try TextTask(corpus: corpus, length: configuration.sequenceLength, partition: configuration.textPartition, devices: configuration.clients)
            train = try task.sequences.dataset(task.devices.flatMap { $0 })
            test = try task.sequences.dataset(task.test)
        } catch {
            throw SimulationError(.invalidOption, "kjv: \(error.message)")
        }
        let spec = ModelZoo.charLSTM(
            vocabularySize: task.sequences.vocabulary.size, length: configuration.sequenceLength, learningRate: configuration.learningRate)
        do throws(EngineError) {
            var model = try Model(spec: spec, seed: configuration.seed)
            try ModelZoo.initializeAsPyTorch(&model, seed: configuration.seed)
            let before = try model.evaluationMetrics(on: test, loss: .crossEntropy)
            let start = clock.now
            let trainer = try Trainer(
                model: model,
                configuration: TrainingConfiguration(
                    loss: .crossEntropy, optimizer: .sgd(learningRate: configuration.learningRate), epochs: epochs, batchSize: configuration.batchSize,
                    seed: configuration.seed))
            guard case .completed(let report) = try trainer.train(on: train, progress: progress) else {
                throw EngineError(.invalidArgument, "central training was interrupted")
            }
            let seconds = start.duration(to: clock.now).inSeconds
            let after = try report.model.evaluationMetrics(on: test, loss: .crossEntropy)
            return Result(
                trainSequences: train.count, testSequences: test.count, parameters: model.parameterCount, updates: report.updates,
                initialAccuracy: before.values["accuracy"] ?? 0, initialPerplexity: before.values["perplexity"] ?? 0,
                accuracy: after.values["accuracy"] ?? 0, perplexity: after.values["perplexity"] ?? 0, loss: after.loss, seconds: seconds)
        } catch {
            throw SimulationError(.training, "central training failed: \(error)")
        }
    }
}

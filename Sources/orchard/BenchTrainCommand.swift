import ArgumentParser
import OrchardSupport
import Foundation
import OrchardBenchmarks
import OrchardFormats
import OrchardML

/// `orchard bench train`: trains the FedAvg paper's 2NN on synthetic data and reports throughput and memory.
struct BenchTrain: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "train",
        abstract: "Train a reference model on synthetic data; print samples/s, peak RSS (MiB) and settings as one JSON line.",
        discussion: """
            The model 'mlp2nn' is McMahan et al.'s 2NN: 784-200-200-10 with ReLU, softmax cross-entropy and plain SGD. \
            'char-lstm' is a next-character model on --sequence-length characters of a 64-symbol vocabulary: embedding \
            (width 8), an LSTM of 128 units over the whole sequence, a per-step dense layer and softmax, per-step \
            cross-entropy and plain SGD (a standard LSTM, as PyTorch's nn.LSTM in benchmarks/pytorch_char_lstm.py; the \
            simulator's model couples its input and forget gates, which PyTorch has no layer for). Samples are sequences. \
            The first epoch warms up; the reported figure is the median over the following --repeats epochs.
            """
    )

    /// `--model`: the reference models.
    enum ReferenceModel: String, CaseIterable, ExpressibleByArgument {
        case mlp2nn
        case charLSTM = "char-lstm"
    }

    /// The char-lstm's vocabulary, embedding width and hidden units.
    static let characterModel = (vocabulary: 64, embedding: 8, units: 128)

    @Option(help: "The model to train.")
    var model: ReferenceModel = .mlp2nn

    @Option(parsing: .unconditional, help: "Samples per update.")
    var batch: Int = 10

    @Option(parsing: .unconditional, help: "Synthetic samples per epoch (default 6000; 600 sequences for char-lstm).")
    var samples: Int?

    @Option(name: .customLong("sequence-length"), parsing: .unconditional, help: "Characters per sequence (char-lstm).")
    var sequenceLength: Int = 80

    /// `--samples`, or the model's default.
    var sampleCount: Int { samples ?? (model == .charLSTM ? 600 : 6000) }

    /// `--parallelism`: how the threads share a step.
    enum Parallelism: String, CaseIterable, ExpressibleByArgument {
        /// Batch parts when each gets at least ``minimumShard`` samples, matrix products otherwise; for a recurrent model
        /// batch parts whenever each thread gets a sample (its steps run one after another, and threads that share each
        /// step's small products spend more on meeting than they save).
        case automatic
        /// Each matrix product runs on all the threads, one after another.
        case gemm
        /// The batch is cut into one part per thread, run forward and backward side by side (one thread per product).
        case batch

        /// The fewest samples a batch part gets under `automatic`.
        static let minimumShard = 16

        /// The batch parts a step is cut into for `batch` samples on `threads` threads (`recurrent`: the model has an
        /// LSTM or GRU).
        func shards(batch: Int, threads: Int, recurrent: Bool = false) -> Int {
            switch self {
            case .gemm: 1
            case .batch: threads
            case .automatic: batch >= (recurrent ? 1 : Self.minimumShard) * threads ? threads : 1
            }
        }
    }

    @Option(parsing: .unconditional, help: "Threads the training step may use (default: the machine's cores, as PyTorch uses them).")
    var threads: Int = ProcessInfo.processInfo.activeProcessorCount

    @Option(
        help:
            "How the threads share a step: batch parts side by side, or each matrix product on all of them (automatic: batch parts when each gets at least 16 samples, or 1 for a recurrent model)."
    )
    var parallelism: Parallelism = .automatic

    @Option(parsing: .unconditional, help: "Timed epochs after the warm-up epoch; the median is reported.")
    var repeats: Int = 3

    @Option(help: "Matrix-multiply backend (default: automatic, the fastest per shape).")
    var backend: MatrixBackend?

    @Option(parsing: .unconditional, help: "Seed for data, initialisation and shuffling.")
    var seed: UInt64 = 1

    func validate() throws {
        guard batch > 0, sampleCount > 0, threads > 0, repeats > 0, sequenceLength > 1 else {
            throw ValidationError("--batch, --samples, --threads and --repeats must be positive, and --sequence-length at least 2")
        }
    }

    func run() async throws {
        let shards = parallelism.shards(batch: batch, threads: threads, recurrent: model == .charLSTM)
        GEMM.setThreads(shards > 1 ? 1 : threads)
        if let backend { try GEMM.setBackend(backend) }

        let samples = sampleCount
        let dataset: any Dataset
        let datasetBytes: Int
        let network: Model
        switch model {
        case .mlp2nn:
            let data = try SyntheticClassification(count: samples, features: 784, classes: 10, seed: seed)
            (dataset, datasetBytes) = (data, data.byteCount)
            network = try Model(name: "mlp2nn", inputShape: [784], seed: seed) {
                Dense(units: 200)
                ReLU()
                Dense(units: 200)
                ReLU()
                Dense(units: 10)
                Softmax()
            }
        case .charLSTM:
            let (vocabulary, width, units) = Self.characterModel
            var random = OrchardRandom(seed: seed ^ 0x5EED)
            let count = samples * sequenceLength
            let x = Tensor(shape: [samples, sequenceLength], scalars: (0..<count).map { _ in Float(random.nextInt(below: vocabulary)) })
            let y = Tensor(shape: [samples, sequenceLength], scalars: (0..<count).map { _ in Float(random.nextInt(below: vocabulary)) })
            (dataset, datasetBytes) = (try TensorDataset(inputs: ["chars": x], targets: y), 2 * count * MemoryLayout<Float>.stride)
            network = try Model(
                name: "char-lstm", inputs: [InputSpec(name: "chars", shape: [sequenceLength], categorical: true)],
                layers: [
                    Embedding(vocabularySize: vocabulary, embeddingSize: width), Reshape([sequenceLength, width]),
                    LSTM(units: units, returnSequences: true), Dense(units: vocabulary), Softmax(),
                ], seed: seed)
        }
        let trainer = try Trainer(
            model: network,
            configuration: TrainingConfiguration(
                loss: .crossEntropy, optimizer: .sgd(learningRate: 0.05), epochs: repeats + 1, batchSize: batch, seed: seed, batchShards: shards
            ))
        let clock = ContinuousClock()
        var epochStart = clock.now
        var seconds: [Double] = []
        var lastLoss: Float = 0
        // Progress on standard error (outside the timed epochs' arithmetic); standard output is the one JSON line.
        let reporter = ProgressReporter("bench train", total: repeats + 1, unit: "epochs")
        _ = try trainer.train(on: dataset) { progress in
            lastLoss = progress.loss
            guard progress.batch == progress.batchesPerEpoch - 1 else { return }
            let now = clock.now
            let elapsed = now - epochStart
            if progress.epoch > 0 { seconds.append(elapsed.inSeconds) }
            reporter.update(progress.epoch + 1, detail: progress.epoch == 0 ? "warm-up" : "\(Int(Double(samples) / max(elapsed.inSeconds, 1e-6))) samples/s")
            epochStart = clock.now
        }
        seconds.sort()
        let median = seconds[seconds.count / 2]
        let datasetMiB = Double(datasetBytes) / PeakMemory.bytesPerMiB
        let peak = PeakMemory.residentMiB()
        try JSONLine.write(
            Result(
                model: model.rawValue,
                samplesPerSecond: (Double(samples) / median).rounded(),
                batch: batch,
                threads: threads,
                batchShards: shards,
                samples: samples,
                epochs: repeats,
                stepsPerEpoch: (samples + batch - 1) / batch,
                backend: GEMM.backend.description,
                blasCore: GEMM.blasCore,
                peakRSSMiB: peak.map { ($0 * 10).rounded() / 10 },
                datasetMiB: (datasetMiB * 10).rounded() / 10,
                peakRSSMinusDatasetMiB: peak.map { (($0 - datasetMiB) * 10).rounded() / 10 },
                epochSeconds: seconds.map { ($0 * 1e4).rounded() / 1e4 },
                finalLoss: Double(lastLoss),
                engine: "orchard"
            ))
    }

    /// The JSON line `orchard bench train` prints; `benchmarks/pytorch_2nn.py` prints the same keys.
    struct Result: Encodable {
        var model: String
        var samplesPerSecond: Double
        var batch: Int
        var threads: Int
        /// Parts each batch was cut into (1: the threads shared each matrix product).
        var batchShards: Int
        var samples: Int
        var epochs: Int
        var stepsPerEpoch: Int
        var backend: String
        /// The kernels the loaded OpenBLAS runs (its core name); nil (left out) without OpenBLAS.
        var blasCore: String?
        /// Peak resident set size in MiB; nil (left out) when unreadable.
        var peakRSSMiB: Double?
        /// The synthetic dataset's size in MiB.
        var datasetMiB: Double
        var peakRSSMinusDatasetMiB: Double?
        var epochSeconds: [Double]
        var finalLoss: Double
        var engine: String

        private enum CodingKeys: String, CodingKey {
            case model, samplesPerSecond = "samples_per_second", batch, threads, batchShards = "batch_shards", samples, epochs, stepsPerEpoch =
                "steps_per_epoch"
            case backend, blasCore = "blas_core", peakRSSMiB = "peak_rss_mib", datasetMiB = "dataset_mib", peakRSSMinusDatasetMiB = "peak_rss_minus_dataset_mib"
            case epochSeconds = "epoch_seconds", finalLoss = "final_loss", engine
        }
    }
}

/// Seeded synthetic classification data: uniform features in `[0, 1)` and uniform class labels, stored once.
struct SyntheticClassification: Dataset {
    let features: [Float]
    let labels: [Float]
    let width: Int

    init(count: Int, features width: Int, classes: Int, seed: UInt64) throws {
        var random = OrchardRandom(seed: seed ^ 0x5EED)
        var features = [Float](repeating: 0, count: count * width)
        for i in features.indices { features[i] = random.nextFloat() }
        self.features = features
        self.labels = (0..<count).map { _ in Float(random.nextInt(below: classes)) }
        self.width = width
    }

    var count: Int { labels.count }
    var inputSpecs: [FeatureSpec] { [FeatureSpec(name: "input", shape: [width])] }
    var targetSpec: FeatureSpec { FeatureSpec(name: "label", shape: [1]) }
    var byteCount: Int { (features.count + labels.count) * MemoryLayout<Float>.stride }

    func copyInput(_ input: Int, of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        features.withUnsafeBufferPointer { src in
            destination.baseAddress!.update(from: src.baseAddress! + index * width, count: width)
        }
    }

    func copyTarget(of index: Int, into destination: UnsafeMutableBufferPointer<Float>) {
        destination[0] = labels[index]
    }
}

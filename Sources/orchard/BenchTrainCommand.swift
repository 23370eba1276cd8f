import ArgumentParser
import OrchardSupport
import Foundation
import OrchardFormats
import OrchardML

/// `orchard bench train`: trains the FedAvg paper's 2NN on synthetic data and reports throughput and memory.
struct BenchTrain: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "train",
        abstract: "Train a reference model on synthetic data; print samples/s, peak RSS and settings as one JSON line.",
        discussion: """
        The model 'mlp2nn' is McMahan et al.'s 2NN: 784-200-200-10 with ReLU, softmax cross-entropy and plain SGD. \
        The first epoch warms up; the reported figure is the median over the following --repeats epochs.
        """
    )

    @Option(help: "The model to train (mlp2nn).")
    var model: String = "mlp2nn"

    @Option(help: "Samples per update.")
    var batch: Int = 10

    @Option(help: "Synthetic samples per epoch.")
    var samples: Int = 6000

    @Option(help: "Threads the matrix multiply may use.")
    var threads: Int = 1

    @Option(help: "Timed epochs after the warm-up epoch; the median is reported.")
    var repeats: Int = 3

    @Option(help: "Matrix-multiply backend: automatic, avx2, blas or portable (default: automatic, the fastest per shape).")
    var backend: String?

    @Option(help: "Seed for data, initialisation and shuffling.")
    var seed: UInt64 = 1

    func validate() throws {
        guard model == "mlp2nn" else { throw ValidationError("unknown model '\(model)' (available: mlp2nn)") }
        guard batch > 0, samples > 0, threads > 0, repeats > 0 else {
            throw ValidationError("--batch, --samples, --threads and --repeats must be positive")
        }
        if let backend, Self.backends[backend] == nil {
            throw ValidationError("--backend must be automatic, avx2, blas or portable")
        }
    }

    /// The backends by name.
    static let backends: [String: MatrixBackend] = ["automatic": .automatic, "avx2": .avx2, "blas": .blas, "portable": .portable]

    func run() async throws {
        GEMM.setThreads(threads)
        if let backend, let chosen = Self.backends[backend] { try GEMM.setBackend(chosen) }

        let dataset = try SyntheticClassification(count: samples, features: 784, classes: 10, seed: seed)
        let network = try Model(name: "mlp2nn", inputShape: [784], seed: seed) {
            Dense(units: 200)
            ReLU()
            Dense(units: 200)
            ReLU()
            Dense(units: 10)
            Softmax()
        }
        let trainer = try Trainer(model: network, configuration: TrainingConfiguration(
            loss: .crossEntropy, optimizer: .sgd(learningRate: 0.05), epochs: repeats + 1, batchSize: batch, seed: seed
        ))
        let clock = ContinuousClock()
        var epochStart = clock.now
        var seconds: [Double] = []
        var lastLoss: Float = 0
        _ = try trainer.train(on: dataset) { progress in
            lastLoss = progress.loss
            guard progress.batch == progress.batchesPerEpoch - 1 else { return }
            let now = clock.now
            let elapsed = now - epochStart
            if progress.epoch > 0 { seconds.append(elapsed.inSeconds) }
            epochStart = now
        }
        seconds.sort()
        let median = seconds[seconds.count / 2]
        let datasetMB = Double(dataset.byteCount) / 1_048_576
        let peak = peakResidentMegabytes()
        let report: [String: Any] = [
            "model": model,
            "samples_per_second": (Double(samples) / median).rounded(),
            "batch": batch,
            "threads": threads,
            "samples": samples,
            "epochs": repeats,
            "steps_per_epoch": (samples + batch - 1) / batch,
            "backend": GEMM.backend.description,
            "peak_rss_mb": peak.map { ($0 * 10).rounded() / 10 } ?? -1,
            "dataset_mb": (datasetMB * 10).rounded() / 10,
            "peak_rss_minus_dataset_mb": peak.map { (($0 - datasetMB) * 10).rounded() / 10 } ?? -1,
            "epoch_seconds": seconds.map { ($0 * 1e4).rounded() / 1e4 },
            "final_loss": Double(lastLoss),
            "engine": "orchard",
        ]
        let json = try JSONSerialization.data(withJSONObject: report, options: [.sortedKeys])
        print(String(decoding: json, as: UTF8.self))
    }

    /// Peak resident set size in MiB: `VmHWM` from `/proc/self/status` on Linux, `ru_maxrss` elsewhere.
    private func peakResidentMegabytes() -> Double? {
        #if os(Linux)
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            let kb = line.split(separator: " ").compactMap { Double($0) }.first
            return kb.map { $0 / 1024 }
        }
        return nil
        #else
        var usage = rusage()
        guard getrusage(RUSAGE_SELF, &usage) == 0 else { return nil }
        return Double(usage.ru_maxrss) / 1_048_576
        #endif
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

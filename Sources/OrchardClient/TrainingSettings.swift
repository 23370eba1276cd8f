public import OrchardFormats
public import OrchardML
public import OrchardProtocol

extension TrainingConfiguration {
    /// How a device trains in a cycle, resolved in the one place the SDK does it, with one precedence:
    ///
    ///     Orchard's built-in defaults  <  the architecture's `training` section  <  the process's client config
    ///
    /// The built-in defaults are `TrainingConfiguration.init(loss:optimizer:epochs:batchSize:maxUpdates:seed:shuffle:batchShards:)`'s
    /// (mean squared error, SGD at 0.01, one epoch, batches of 32, no update cap). An architecture with a training
    /// section replaces them all (loss, optimizer and its hyper-parameters, epochs, batch size, cap). The process's
    /// client config then replaces each field it sets: `batch_size`, `learning_rate` (the architecture's optimizer
    /// keeps its type and other hyper-parameters), `local_epochs`, `max_updates`, `proximal_mu` (FedProx).
    /// - Parameters:
    ///   - spec: The architecture, from the cycle's plan.
    ///   - clientConfig: The process's client config, from the same plan.
    ///   - seed: The cycle's training seed (shuffle order and dropout).
    /// - Throws: ``OrchardClientError/Code/incompatibleModel`` when the client config sets an unusable value.
    public static func resolved(architecture spec: ModelSpec, clientConfig: ClientConfig, seed: UInt64) throws(OrchardClientError) -> TrainingConfiguration {
        if let failure = clientConfig.validationFailure() {
            throw OrchardClientError(.incompatibleModel, "the coordinator's client configuration is invalid: \(failure)")
        }
        var resolved = spec.training.map { TrainingConfiguration($0, seed: seed) } ?? TrainingConfiguration(seed: seed)
        if let batchSize = clientConfig.batchSize { resolved.batchSize = batchSize }
        if let learningRate = clientConfig.learningRate { resolved.optimizer.learningRate = learningRate }
        if let localEpochs = clientConfig.localEpochs { resolved.epochs = localEpochs }
        if let maxUpdates = clientConfig.maxUpdates { resolved.maxUpdates = maxUpdates }
        if let proximalMu = clientConfig.proximalMu { resolved.proximalMu = proximalMu }
        return resolved
    }
}

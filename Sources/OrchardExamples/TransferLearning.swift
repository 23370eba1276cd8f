public import OrchardML

extension Model {
    /// Imports the parameters of `layers` from `source` and freezes those layers: the transfer-learning step
    /// that lets a device reuse a centrally trained representation and train only the rest of its model.
    ///
    /// Each named layer must exist in both models with the same parameter names and shapes; the values are
    /// copied bit for bit. Other layers are untouched.
    /// - Parameters:
    ///   - layers: Names of the layers to import and freeze.
    ///   - source: The model to copy them from (e.g. the central model).
    public mutating func importFrozenLayers(_ layers: [String], from source: Model) throws(EngineError) {
        for name in layers {
            guard let from = source.layer(named: name) else {
                throw EngineError(.invalidArgument, "source model '\(source.name)' has no layer '\(name)'")
            }
            guard let to = layer(named: name), Set(to.parameters.keys) == Set(from.parameters.keys), !from.parameters.isEmpty else {
                throw EngineError(.invalidArgument, "layer '\(name)' of model '\(self.name)' does not have the parameters of the source's layer")
            }
            for (suffix, value) in from.parameters.sorted(by: { $0.key < $1.key }) {
                try setParameter("\(name).\(suffix)", to: value)
            }
            try setFrozen(true, layer: name)
        }
    }
}

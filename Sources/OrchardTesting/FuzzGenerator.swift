public import OrchardSupport
public import PropertyBased

/// A property-based generator over a ``Fuzz`` function (or any function of a seeded generator), seeded from the
/// property checker's generator so that its reported seed reproduces the input.
public func fuzzed<T>(_ make: @escaping @Sendable (inout SplitMix64) -> T) -> Generator<T, Shrink.None<T>> {
    Generator { rng in
        var random = SplitMix64(state: rng.next())
        return make(&random)
    }
}

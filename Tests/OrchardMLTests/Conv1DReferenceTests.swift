import Foundation
import OrchardFormats
@testable import OrchardML
import Testing

/// The 1-D layers against PyTorch: the same `Conv1d` and `MaxPool1d`, weights, inputs and MSE loss give the same
/// output and the same weight and bias gradients. The reference values were written by `Reference/conv1d_reference.py`
/// (PyTorch 2.13, float64) when this test was written; the inputs are the script's closed forms.
@Suite struct Conv1DReferenceTests {
    static let output: [Double] = [
        1.41160029, 2.16353074, 1.5043205, 2.26928605, 1.59660126, 2.37438562, 1.68844476, 2.47882803, 2.09354373, -0.115961666, 2.21056227, 0.00330039866,
        2.32694169, 0.122547394, 2.44267736, 0.241773877,
    ]
    static let weightGradient: [Double] = [
        0.639545606, 0.687283989, 0.67362934, -0.516100878, -0.62825645, -0.684291745, 0.333017948, 0.496630537, 0.615880599, 0.642065238, 0.68868706,
        0.673790519, -0.519613048, -0.630915172, -0.685859524, 0.337116806, 0.500237681, 0.618673813, 0.644399739, 0.689897396, 0.673768574, -0.522968776,
        -0.633391157, -0.687234593, 0.341105989, 0.503693201, 0.621286999, 0.646548448, 0.690914655, 0.673563513, -0.526167113, -0.635683704, -0.688416563,
        0.344984369, 0.506996121, 0.623719419,
    ]
    static let biasGradient: [Double] = [0.731589136, 0.735933652, 0.740059497, 0.743965505]
    static let loss = 3.22142513441

    static func input() -> Tensor {
        var values: [Float] = []
        for b in 0..<2 { for c in 0..<3 { for t in 0..<9 { values.append(Float(sin(0.3 * Double(b * 27 + c * 9 + t) + 0.1 * Double(c)))) } } }
        return Tensor(shape: [2, 3, 9], scalars: values)
    }

    static func weight() -> Tensor {
        var values: [Float] = []
        for f in 0..<4 { for c in 0..<3 { for k in 0..<3 { values.append(Float(cos(0.7 * Double(f * 9 + c * 3 + k)) * 0.5)) } } }
        return Tensor(shape: [4, 3, 3], scalars: values)
    }

    static func target() -> Tensor {
        var values: [Float] = []
        for b in 0..<2 { for f in 0..<4 { for t in 0..<2 { values.append(Float(0.05 * Double(b * 8 + f * 2 + t) - 0.3)) } } }
        return Tensor(shape: [2, 4, 2], scalars: values)
    }

    static func model() throws -> Model {
        var model = try Model(
            name: "sequence", inputs: [InputSpec(name: "x", shape: [3, 9])],
            layers: [Conv1D(filters: 4, kernelSize: 3, stride: 2, name: "conv"), MaxPool1D(poolSize: 2, name: "pool")], seed: 1)
        try model.setParameter("conv.weight", to: weight())
        try model.setParameter("conv.bias", to: Tensor(shape: [4], scalars: (0..<4).map { Float(0.1 * Double($0) - 0.15) }))
        return model
    }

    static func expectClose(_ actual: [Float], _ expected: [Double], _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(actual.count == expected.count, "\(what): \(actual.count) values, PyTorch has \(expected.count)", sourceLocation: sourceLocation)
        for (a, e) in zip(actual, expected) {
            #expect(abs(Double(a) - e) <= 1e-5 + 1e-5 * abs(e), "\(what): \(a) against PyTorch's \(e)", sourceLocation: sourceLocation)
        }
    }

    @Test func theForwardPassIsPyTorchs() throws {
        let model = try Self.model()
        #expect(model.outputShape == [4, 2])
        Self.expectClose(try model(Self.input()).scalars, Self.output, "output")
    }

    @Test func theGradientsArePyTorchs() throws {
        let model = try Self.model()
        let plan = try CompiledModel(model: model, batchCapacity: 2, loss: .meanSquaredError)
        let loss = try plan.computeGradients(inputs: ["x": Self.input()], targets: Self.target())
        #expect(abs(Double(loss) - Self.loss) <= 1e-5 * Self.loss)
        let gradients = plan.flatGradients()
        let weight = try #require(plan.parameterOffsets["conv.weight"]), bias = try #require(plan.parameterOffsets["conv.bias"])
        Self.expectClose(Array(gradients[weight..<(weight + 36)]), Self.weightGradient, "weight gradient")
        Self.expectClose(Array(gradients[bias..<(bias + 4)]), Self.biasGradient, "bias gradient")
    }

    @Test func theArchitectureJSONRoundTripsAndIsChecked() throws {
        let spec = try Self.model().spec
        let json = try spec.jsonData()
        let decoded = try ModelSpec.decode(json: json)
        #expect(decoded == spec)
        #expect(decoded.layers[0].kernelSize == [3] && decoded.layers[0].strides == [2] && decoded.layers[0].type == LayerType.conv1d)
        var rebuilt = try Model(spec: decoded)
        try rebuilt.loadWeights(safetensors: try Self.model().weightsSafetensors())
        #expect(try rebuilt(Self.input()).scalars == (try Self.model()(Self.input())).scalars)
        #expect(try decoded.parameters().first { $0.name == "conv.weight" }?.shape == [4, 3, 3])
        // Windows given as pairs, explicit padding and a 3-D input are refused with the field named.
        for (mutate, fragment) in [
            ({ (s: inout ModelSpec) in s.layers[0].kernelSize = [3, 3] }, "one integer"),
            ({ (s: inout ModelSpec) in s.layers[0].padding = .explicit(height: 0, width: 1) }, "valid or same"),
            ({ (s: inout ModelSpec) in s.inputs[0].shape = [3, 9, 1] }, "[C, L]"),
        ] {
            var broken = spec
            mutate(&broken)
            #expect(throws: FormatError.self) { _ = try broken.parameters() }
            do {
                _ = try Model(spec: broken)
                Issue.record("a broken 1-D layer was built")
            } catch {
                #expect("\(error)".contains(fragment), "\(error)")
            }
        }
    }
}

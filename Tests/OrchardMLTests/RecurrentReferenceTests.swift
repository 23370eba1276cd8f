import Foundation
import OrchardFormats
@testable import OrchardML
import Testing

/// The recurrent layers against PyTorch: `nn.LSTM`, `nn.GRU` and a CIFG LSTM written out in torch, with the same
/// weights, inputs and MSE loss, give the same output, loss and parameter gradients. The reference values were written
/// by `Reference/recurrent_reference.py` (PyTorch 2.13, float64) when this test was written; the inputs, weights and
/// targets are the script's closed forms.
@Suite struct RecurrentReferenceTests {
    static let lstmOutput: [Double] = [
        0.0612782356, -0.0123238522, -0.229177143, 0.0281840893, 0.0795175313, 0.0212347276, -0.427329811, 0.0732024493, -0.057421294, 0.0545992868,
        -0.465319784, -0.0266095475, -0.159930152, 0.0720732906, -0.344248998, -0.141455762, -0.140946051, -0.207362815, -0.0607838108, -0.147050975,
        -0.0189469647, -0.402689492, 0.130170261, -0.0451795656, -0.0221132004, -0.391928342, 0.112435321, -0.0737577372, 0.0335243547, -0.183994168,
        -0.161875178, -0.0460210712, 0.0489749504, -0.0668033753, -0.390220219, 0.0294682643, -0.0810816727, -0.0121973372, -0.443111227, -0.0551733756,
    ]
    static let lstmLoss = 0.98269730968
    static let lstmWeightIhGradient: [Double] = [
        0.000406997996, -0.00235267084, -0.00474090467, -0.031529106, -0.0288428068, -0.0216028626, 0.0447996835, 0.0546185322, 0.0558143157, -0.00660796935,
        -0.00766312444, -0.00750844067, -0.00253768226, -0.00234202003, -0.00177660433, -0.00171927263, 0.00524365954, 0.0113787332, 0.0168851044, 0.0101502581,
        0.00181290918, -0.00144834491, 0.000352166713, 0.00209707895, -0.0718201536, -0.0812842477, -0.0779153463, 0.0223412013, 0.0163975104, 0.00786501319,
        0.0355517494, 0.0114038859, -0.0145444004, -0.0774329362, -0.0938071041, -0.0953711929, -0.000196441053, -0.00237450708, -0.00417769065, -0.0110537347,
        -0.00336150996, 0.00486142329, 0.0404157135, 0.0384672722, 0.0304456943, -0.00383853428, -0.00428261139, -0.00405055833,
    ]
    static let lstmWeightHhGradient: [Double] = [
        -0.000169260441, 0.00106566853, -0.00287704102, 9.80322541e-05, -0.0011586089, -0.00383876716, 0.00277517838, -0.00110146847, 0.00148452246,
        -0.00973837923, -0.00755969051, -0.00115842271, -0.000408578898, -0.000973662505, -0.00181192996, -0.000306157085, -0.000260626289, -0.000283405413,
        0.00044405594, -0.000204462167, 4.94018208e-05, -0.00765221764, 0.00153659819, -0.00101588821, 0.000220210806, 0.00408750994, -0.00831637271,
        0.000380133217, -0.00023434681, -0.00197893239, 0.000516176715, -0.000500416032, -0.0027660675, 0.0255398835, 0.0270038938, 0.00326156078,
        0.00224837995, 0.0137202835, 0.00622380956, 0.00361913893, 0.00193667177, 0.0304746893, -0.000788349866, 0.00504252673, -0.00295913758, 0.0349718113,
        0.0317954884, 0.0045101519, -0.000474617482, 0.000525845862, -0.00258687104, -0.000277512026, -0.000594127819, -0.0093917564, 0.00126381122,
        -0.00177667607, 0.00143831912, -0.0037351577, -0.0140774744, -4.07144656e-05, -0.000678931034, -0.0014550629, -0.00173501125, -0.000705617849,
    ]
    static let lstmBiasIhGradient: [Double] = [
        0.00602639733, 0.0217682886, 0.0448396674, 0.0131127834, 0.000182161405, 0.0206190589, 0.00834037944, 0.00548634292, -0.149513044, -0.0820555895,
        -0.120126066, -0.200740625, 0.00654569096, 0.0335723351, 0.0437145187, 0.0117110708,
    ]
    static let lstmBiasHhGradient: [Double] = [
        0.00602639733, 0.0217682886, 0.0448396674, 0.0131127834, 0.000182161405, 0.0206190589, 0.00834037944, 0.00548634292, -0.149513044, -0.0820555895,
        -0.120126066, -0.200740625, 0.00654569096, 0.0335723351, 0.0437145187, 0.0117110708,
    ]
    static let gruOutput: [Double] = [-0.180119779, -0.141471833, 0.152825968, -0.22525212, 0.0327896683, 0.228126094, -0.412331537, -0.0352654312]
    static let gruLoss = 0.0535716731845
    static let gruWeightIhGradient: [Double] = [
        -0.00148119201, -0.00112171548, -0.000585144733, -7.63326575e-05, -0.00031537919, -0.000504634283, 0.00102973369, 0.00235356343, 0.00330581725,
        -0.000236610562, -0.000108140902, 3.74018285e-05, 0.0014563763, 0.00012057606, -0.00123426049, -0.022668185, -0.0252659942, -0.0238748584,
        -0.0105727963, -0.0082096189, -0.00455032317, -0.000102514748, 0.00086698594, 0.00169960861, 0.0261357161, 0.0211153333, 0.0127613036, 0.0165770341,
        0.0172863858, 0.0152665974, 0.00123607157, -0.023330175, -0.0442130999, -0.013106709, -0.00863527082, -0.00280051327,
    ]
    static let gruWeightHhGradient: [Double] = [
        -0.000296816518, -3.53792351e-05, 0.000690504215, -2.17842943e-05, -6.85033046e-05, 0.000359947816, -0.000194391099, 6.32612143e-05, 0.00037637863,
        -0.00139011652, 0.00177627628, 0.000376151233, -2.49334626e-05, -0.000128672904, 0.000178946609, -2.04943231e-05, 0.000240611681, 0.000900036093,
        -0.00183234942, -3.99383041e-05, -0.00445214732, 0.00580965318, 0.000135508142, -0.00117110463, -0.00172558398, 0.00544017183, 0.00680122462,
        0.00439898961, -0.000115300023, -0.000750275858, 0.00134430093, 7.37802101e-05, 0.00381734213, -0.000861680369, -0.00607607916, 0.000774508822,
        0.000452428419, -0.00137725157, -0.00153091805, -0.00104374459, -0.00192291587, 0.0121874635, -0.0134974615, -0.000654834388, -0.00219498519,
        -0.000373612705, 0.00416502944, -0.00058975187,
    ]
    static let gruBiasIhGradient: [Double] = [
        -0.00259256544, -0.00119857633, -0.00234093072, -0.0001026581, 0.00423450525, -0.0144928107, -0.0501751833, -0.00407427919, 0.0451891628, 0.0512124901,
        0.000180944864, -0.029901111,
    ]
    static let gruBiasHhGradient: [Double] = [
        -0.00259256544, -0.00119857633, -0.00234093072, -0.0001026581, 0.00423450525, -0.0144928107, -0.0501751833, -0.00407427919, 0.0261504297, 0.0169274211,
        -0.00263434264, -0.0168046345,
    ]
    static let cifgOutput: [Double] = [0.0417766775, 0.000164393403, 0.210178299, 0.0452709705, -0.230974109, 0.218878196, 0.127263154, -0.249306904]
    static let cifgLoss = 0.0726250930253
    static let cifgWeightIhGradient: [Double] = [
        -0.000474987501, -0.00459541735, -0.00799033184, 5.73130352e-05, 0.00193346746, 0.00350436988, 0.00744535138, 0.0116934287, 0.0140953707,
        0.000986764555, -0.000846101449, -0.00254538664, 0.00447883246, -0.000594912312, -0.00557473351, -0.000877406788, -0.00176142144, -0.00236734638,
        0.00275554376, -0.00730967669, -0.0162208599, -0.00696062495, -0.00983639972, -0.0111592233, 0.00219816046, 0.000736619801, -0.000841216932,
        0.00587134339, 0.00483872245, 0.00304217363, 0.00012502308, -0.00303014829, -0.00570692587, 0.00914768845, 0.00712447877, 0.00397647056,
    ]
    static let cifgWeightHhGradient: [Double] = [
        -0.00160719028, 0.00157095341, 0.0021621259, -0.00158153921, 0.00044304992, 7.91213915e-05, -0.000579822073, 0.00042327742, 0.000496019195,
        -0.000614567625, -0.00211192701, 0.000367095041, -0.000913407713, 0.00107093698, 0.00115662566, -0.000950985205, -0.00362463939, 0.00152695056,
        0.00240825592, -0.00339509378, -0.00232612395, 0.0045676907, 0.00243520004, -0.00265534003, -0.00580009664, 0.00486697478, 0.00671858748,
        -0.00575284341, -0.000502370333, -0.000861736425, 0.000869124034, -3.25681306e-05, -0.000890991936, 0.000925516974, 0.000765757627, -0.00100615889,
        -0.00136862743, 0.00123750808, 0.000559439749, -0.0015714715, -0.00151695142, 0.00154125312, 0.00207013451, -0.00159296877, -0.00236495555,
        0.00230466059, 0.00117308381, -0.00271885992,
    ]
    static let cifgBiasIhGradient: [Double] = [
        0.0112456214, 0.0030038224, -0.00584835872, 0.00787602323, 0.0139382999, 0.0449356612, 0.0423633459, -0.00106088446, 0.00453683943, 0.00562689638,
        0.0118936283, 0.0115029886,
    ]
    static let cifgBiasHhGradient: [Double] = [
        0.0112456214, 0.0030038224, -0.00584835872, 0.00787602323, 0.0139382999, 0.0449356612, 0.0423633459, -0.00106088446, 0.00453683943, 0.00562689638,
        0.0118936283, 0.0115029886,
    ]

    static let charProbabilities: [Double] = [
        0.167066179, 0.199849526, 0.162246464, 0.170766032, 0.151324407, 0.148747393, 0.160742878, 0.207295285, 0.161656828, 0.170252584, 0.156874901,
        0.143177523, 0.152969578, 0.219070761, 0.150425002, 0.181321555, 0.147127444, 0.149085659, 0.151885619, 0.220325044, 0.151391219, 0.179926286,
        0.149830293, 0.146641539, 0.153947679, 0.21653254, 0.15715637, 0.173750511, 0.156974946, 0.141637954, 0.167313308, 0.198677287, 0.166165379,
        0.166577457, 0.157058187, 0.144208382, 0.157383063, 0.213040242, 0.153190848, 0.179094401, 0.14699973, 0.150291716, 0.154273818, 0.217033005,
        0.152781198, 0.17888629, 0.149554246, 0.147471443, 0.155104043, 0.214963303, 0.157799816, 0.173305676, 0.156756517, 0.142070645, 0.148982825,
        0.224663687, 0.147952707, 0.183243815, 0.147307903, 0.147849064,
    ]
    static let charLoss = 1.82878998678
    static let charEmbeddingGradient: [Double] = [
        -0.000395861228, -0.00232718147, -0.00316399191, 0.0023391581, 0.00127907725, -0.000382573622, 0.0102297477, 0.0100560907, 0.00515289719, 0.00705189795,
        0.00937226801, 0.00728471397, 0.00200514716, 0.000762956586, -0.000838064393, -0.00856487859, -0.00647928936, -0.00134638911,
    ]
    static let charWeightIhGradient: [Double] = [
        4.06215429e-05, 0.000266650253, 0.000367269183, -0.00111374265, -0.00121320463, -0.000742077521, 0.00291458524, 0.00435429579, 0.00374611299,
        0.00160011549, 0.00126713589, 0.000338202479, 0.000139706293, 2.54510623e-05, -0.0001007742, 0.000953380828, 0.000932195586, 0.000472584194,
        -0.00198809096, -0.00150730672, -0.000317612574, -0.000110938226, 0.000773180003, 0.0012936596, -0.00294392116, 0.000656959865, 0.0039488624,
        -0.00284344785, -0.00246764461, -0.000931269545, 0.000520114327, -0.00223421363, -0.00393775601, -0.00634416381, -0.0129916211, -0.013528916,
        0.000336097454, 0.000454031743, 0.000358427809, 0.000462257315, 0.00101896249, 0.00109643369, -0.000497430967, 0.00025297456, 0.000884402198,
        -8.17476276e-05, 0.000774777332, 0.00126691241,
    ]
    static let charDenseWeightGradient: [Double] = [
        0.00191410127, -0.0154703404, 0.00119085176, 0.0019556861, -0.0117809763, -0.0191012254, -0.0132596425, -0.0175651584, 0.0116773878, 0.0223330987,
        0.0463506769, 0.0174614694, 0.00267630674, 0.0211178004, -0.0273456879, 0.0073594787, -0.00247865272, 0.000152829886, -0.0141351985, -0.00399736412,
        -0.00200816677, -0.00903216321, 0.00719900026, -0.00521411165,
    ]
    static let charDenseBiasGradient: [Double] = [0.0590579747, 0.110234889, -0.191975768, -0.0760323666, 0.0528663074, 0.0458489632]

    static let (batch, steps, features, units) = (2, 5, 3, 4)

    /// `cos(0.7 k + phase) × scale` over a tensor's flat index, as the script fills its parameters.
    static func closedForm(_ shape: [Int], phase: Double, scale: Double = 0.5) -> Tensor {
        Tensor(shape: shape, scalars: (0..<shape.reduce(1, *)).map { Float(cos(0.7 * Double($0) + phase) * scale) })
    }

    static func input() -> Tensor {
        var values: [Float] = []
        for b in 0..<batch { for t in 0..<steps { for i in 0..<features { values.append(Float(sin(0.3 * Double(b * 15 + t * 3 + i) + 0.1 * Double(i)))) } } }
        return Tensor(shape: [batch, steps, features], scalars: values)
    }

    static func target(_ shape: [Int]) -> Tensor {
        Tensor(shape: shape, scalars: (0..<shape.reduce(1, *)).map { Float(0.05 * Double($0) - 0.3) })
    }

    /// A one-layer model with the script's parameters.
    static func model(_ layer: some RecurrentLayer) throws -> Model {
        var model = try Model(name: "recurrent", inputs: [InputSpec(name: "x", shape: [steps, features])], layers: [layer.named("rnn")], seed: 1)
        let rows = (layer.cell == .lstm ? 4 : 3) * units
        try model.setParameter("rnn.weight_ih", to: closedForm([rows, features], phase: 0))
        try model.setParameter("rnn.weight_hh", to: closedForm([rows, units], phase: 1))
        try model.setParameter("rnn.bias_ih", to: closedForm([rows], phase: 2, scale: 0.2))
        try model.setParameter("rnn.bias_hh", to: closedForm([rows], phase: 3, scale: 0.2))
        return model
    }

    static func expectClose(_ actual: [Float], _ expected: [Double], _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(actual.count == expected.count, "\(what): \(actual.count) values, PyTorch has \(expected.count)", sourceLocation: sourceLocation)
        for (index, (a, e)) in zip(actual, expected).enumerated() where abs(Double(a) - e) > 2e-6 + 1e-4 * abs(e) {
            Issue.record("\(what)[\(index)]: \(a) against PyTorch's \(e)", sourceLocation: sourceLocation)
            return
        }
    }

    struct Expected: Sendable, CustomTestStringConvertible {
        var label: String
        var layer: @Sendable () -> any RecurrentLayer
        var output: [Double]
        var loss: Double
        var gradients: [String: [Double]]
        var testDescription: String { label }
    }

    static let cases: [Expected] = [
        Expected(
            label: "lstm, whole sequence", layer: { LSTM(units: units, returnSequences: true) }, output: lstmOutput, loss: lstmLoss,
            gradients: [
                "weight_ih": lstmWeightIhGradient, "weight_hh": lstmWeightHhGradient, "bias_ih": lstmBiasIhGradient, "bias_hh": lstmBiasHhGradient,
            ]),
        Expected(
            label: "gru, last step", layer: { GRU(units: units) }, output: gruOutput, loss: gruLoss,
            gradients: ["weight_ih": gruWeightIhGradient, "weight_hh": gruWeightHhGradient, "bias_ih": gruBiasIhGradient, "bias_hh": gruBiasHhGradient]),
        Expected(
            label: "cifg lstm, last step", layer: { LSTM(units: units, cifg: true) }, output: cifgOutput, loss: cifgLoss,
            gradients: [
                "weight_ih": cifgWeightIhGradient, "weight_hh": cifgWeightHhGradient, "bias_ih": cifgBiasIhGradient, "bias_hh": cifgBiasHhGradient,
            ]),
    ]

    @Test(arguments: cases) func theForwardPassAndTheGradientsArePyTorchs(_ expected: Expected) throws {
        let model = try Self.model(expected.layer())
        // Inference (the layer value) and training (the compiled plan) run the same kernels.
        Self.expectClose(try model(Self.input()).scalars, expected.output, "output")
        let plan = try CompiledModel(model: model, batchCapacity: Self.batch, loss: .meanSquaredError)
        let loss = try plan.computeGradients(inputs: ["x": Self.input()], targets: Self.target([Self.batch] + model.outputShape))
        #expect(abs(Double(loss) - expected.loss) <= 1e-5 * expected.loss)
        let gradients = plan.flatGradients()
        for (suffix, values) in expected.gradients.sorted(by: { $0.key < $1.key }) {
            let offset = try #require(plan.parameterOffsets["rnn.\(suffix)"])
            Self.expectClose(Array(gradients[offset..<(offset + values.count)]), values, "\(suffix) gradient")
        }
    }

    /// Embedding → reshape → LSTM over the whole sequence → dense over the last axis → softmax, with per-step
    /// cross-entropy and padding (−1) masked: the probabilities, the loss and the gradients are PyTorch's.
    @Test func aNextCharacterModelWithPaddingIsPyTorchs() throws {
        let (vocabulary, width) = (6, 3)
        var model = try Model(
            name: "chars", inputs: [InputSpec(name: "x", shape: [Self.steps], categorical: true)],
            layers: [
                Embedding(vocabularySize: vocabulary, embeddingSize: width, name: "embed"), Reshape([Self.steps, width], name: "steps"),
                LSTM(units: Self.units, returnSequences: true, name: "rnn"), Dense(units: vocabulary, name: "out"), Softmax(name: "probabilities"),
            ], seed: 2)
        #expect(model.shapes["out"] == [Self.steps, vocabulary])
        try model.setParameter("embed.weight", to: Self.closedForm([vocabulary, width], phase: 4))
        try model.setParameter("rnn.weight_ih", to: Self.closedForm([4 * Self.units, width], phase: 0))
        try model.setParameter("rnn.weight_hh", to: Self.closedForm([4 * Self.units, Self.units], phase: 1))
        try model.setParameter("rnn.bias_ih", to: Self.closedForm([4 * Self.units], phase: 2, scale: 0.2))
        try model.setParameter("rnn.bias_hh", to: Self.closedForm([4 * Self.units], phase: 3, scale: 0.2))
        try model.setParameter("out.weight", to: Self.closedForm([vocabulary, Self.units], phase: 5))
        try model.setParameter("out.bias", to: Self.closedForm([vocabulary], phase: 6, scale: 0.1))
        var indices: [Float] = []
        for b in 0..<Self.batch { for t in 0..<Self.steps { indices.append(Float((b * 5 + t * 2) % vocabulary)) } }
        let input = Tensor(shape: [Self.batch, Self.steps], scalars: indices)
        let labels = Tensor(shape: [Self.batch, Self.steps], scalars: [1, 4, 0, 5, 2, 3, -1, 2, -1, -1])
        Self.expectClose(try model(input).scalars, Self.charProbabilities, "probabilities")
        let plan = try CompiledModel(model: model, batchCapacity: Self.batch, loss: .crossEntropy)
        let loss = try plan.computeGradients(inputs: ["x": input], targets: labels)
        #expect(abs(Double(loss) - Self.charLoss) <= 1e-5 * Self.charLoss)
        let gradients = plan.flatGradients()
        for (name, values) in [
            ("embed.weight", Self.charEmbeddingGradient), ("rnn.weight_ih", Self.charWeightIhGradient), ("out.weight", Self.charDenseWeightGradient),
            ("out.bias", Self.charDenseBiasGradient),
        ] {
            let offset = try #require(plan.parameterOffsets[name])
            Self.expectClose(Array(gradients[offset..<(offset + values.count)]), values, "\(name) gradient")
        }
        // The metrics count the seven steps that are not padding: accuracy per step, perplexity exp(mean step loss).
        let data = try TensorDataset(inputs: ["x": input], targets: labels)
        let metrics = try model.evaluationMetrics(on: data, loss: .crossEntropy)
        #expect(abs(metrics.loss - Self.charLoss) <= 1e-5 * Self.charLoss)
        var stepLoss = 0.0, hits = 0
        for (row, label) in zip(0..<10, labels.scalars) where label >= 0 {
            let probabilities = Self.charProbabilities[(row * vocabulary)..<((row + 1) * vocabulary)]
            stepLoss -= log(probabilities[probabilities.startIndex + Int(label)])
            if probabilities.firstIndex(of: probabilities.max()!)! - probabilities.startIndex == Int(label) { hits += 1 }
        }
        #expect(abs((metrics.values["perplexity"] ?? 0) - exp(stepLoss / 7)) <= 1e-4)
        #expect(metrics.values["accuracy"] == Double(hits) / 7)
        // In parts of one sample (an output budget of one sample's outputs): the same sums as one pass.
        let onePass = try model.lossSums(on: data, targets: labels.scalars, loss: .crossEntropy, batchSize: 1)
        let inParts = try model.lossSums(on: data, targets: labels.scalars, loss: .crossEntropy, batchSize: 1, outputBudget: 1)
        #expect(inParts == onePass && inParts.positions == 7)
        let single = try model.evaluationMetrics(on: data, loss: .crossEntropy, batchSize: 1)
        #expect(single.samples == metrics.samples && abs(single.loss - metrics.loss) <= 1e-6 * metrics.loss)
        #expect(single.values["accuracy"] == metrics.values["accuracy"])
        #expect(abs((single.values["perplexity"] ?? 0) - (metrics.values["perplexity"] ?? 0)) <= 1e-5)
        // A label outside the classes (other than the padding marker) is refused, naming both.
        let bad = Tensor(shape: [Self.batch, Self.steps], scalars: [1, 4, 0, 5, 2, 3, -2, 2, -1, -1])
        #expect(throws: EngineError.self) { _ = try plan.computeGradients(inputs: ["x": input], targets: bad) }
    }

    @Test func thePyTorchStateDictMapsOntoTheParameterNamesAndTheJSONRoundTrips() throws {
        let model = try Model(
            name: "stack", inputs: [InputSpec(name: "x", shape: [7, 3])],
            layers: [
                LSTM(units: 5, returnSequences: true, cifg: true, name: "l0"), Dropout(rate: 0.2), GRU(units: 4, useBias: false, name: "l1"),
                Dense(units: 2),
            ], seed: 3)
        #expect(model.shapes["l0"] == [7, 5] && model.shapes["l1"] == [4])
        #expect(model.parameterShapes["l0.weight_ih"] == [15, 3] && model.parameterShapes["l0.weight_hh"] == [15, 5])
        #expect(model.parameterShapes["l0.bias_ih"] == [15] && model.parameterShapes["l1.weight_ih"] == [12, 5])
        #expect(model.parameterShapes["l1.bias_ih"] == nil, "use_bias false: no biases")
        let spec = model.spec
        let decoded = try ModelSpec.decode(json: try spec.jsonData())
        #expect(decoded == spec)
        #expect(decoded.layers[0].cifg == true && decoded.layers[0].returnSequences == true && decoded.layers[2].returnSequences == false)
        // The architecture implies the same parameter shapes the engine builds.
        let implied = Dictionary(uniqueKeysWithValues: try decoded.parameters().map { ($0.name, $0.shape) })
        #expect(implied == model.parameterShapes)
        var rebuilt = try Model(spec: decoded, seed: 99)
        for (name, value) in model.namedParameters { try rebuilt.setParameter(name, to: value) }
        let probe = Tensor(shape: [1, 7, 3], scalars: (0..<21).map { Float($0) / 21 })
        #expect(try rebuilt(probe).scalars == model(probe).scalars)
    }

    @Test func badRecurrentSpecsAreRefusedNamingTheField() throws {
        func failure(_ layer: LayerSpec, shape: [Int] = [5, 3]) -> String {
            let spec = ModelSpec(name: "bad", inputs: [InputSpec(name: "x", shape: shape)], layers: [layer])
            do {
                _ = try spec.parameters()
                return "accepted"
            } catch {
                return error.message
            }
        }
        #expect(failure(LayerSpec(name: "r", type: .lstm, inputs: ["x"])).contains("'units' is required"))
        #expect(failure(LayerSpec(name: "r", type: .lstm, inputs: ["x"], units: 4), shape: [15]).contains("[T, features]"))
        #expect(failure(LayerSpec(name: "r", type: .gru, inputs: ["x"], units: 4, cifg: true)).contains("'cifg' is an LSTM option"))
        #expect(failure(LayerSpec(name: "r", type: .lstm, inputs: ["x"], units: 4, inputSize: 7)).contains("'input_size' is 7"))
        #expect(throws: (any Error).self) {
            try ModelSpec.decode(
                json: Data(
                    #"{"format_version":2,"name":"m","inputs":[{"name":"x","shape":[5,3],"categorical":false}],"layers":[{"name":"r","type":"gru","inputs":["x"],"units":2,"retrun_sequences":true}],"output":"r"}"#
                        .utf8))
        }
    }
}

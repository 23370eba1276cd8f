import Foundation
@testable import OrchardFormats
import Testing

@Suite struct ModelSpecTests {
    static let housing = ModelSpec(
        name: "housing",
        inputs: [
            InputSpec(name: "numeric", shape: [11]),
            InputSpec(name: "chas", shape: [1], categorical: true),
            InputSpec(name: "rad", shape: [1], categorical: true),
        ],
        layers: [
            LayerSpec(name: "chasEmbedding", type: .embedding, inputs: ["chas"], frozen: true, vocabularySize: 2, embeddingSize: 2),
            LayerSpec(name: "radEmbedding", type: .embedding, inputs: ["rad"], frozen: true, vocabularySize: 9, embeddingSize: 5),
            LayerSpec(name: "joined", type: .concat, inputs: ["numeric", "chasEmbedding", "radEmbedding"]),
            LayerSpec(name: "dense1", type: .dense, inputs: ["joined"], units: 64),
            LayerSpec(name: "relu1", type: .relu, inputs: ["dense1"]),
            LayerSpec(name: "out", type: .dense, inputs: ["relu1"], units: 1),
        ],
        training: TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.01, momentum: 0.9), epochs: 5, batchSize: 16)
    )

    @Test func jsonRoundTripIsLosslessAndStable() throws {
        let json = try Self.housing.jsonData()
        let decoded = try ModelSpec.decode(json: json)
        #expect(decoded == Self.housing)
        #expect(try decoded.jsonData() == json)
    }

    @Test func jsonKeysAreSnakeCaseInFormatVersion2() throws {
        let text = String(decoding: try Self.housing.jsonData(), as: UTF8.self)
        #expect(ModelSpec.currentFormatVersion == 2)
        for key in ["\"format_version\" : 2", "\"vocabulary_size\"", "\"embedding_size\"", "\"learning_rate\"", "\"weight_decay\"", "\"batch_size\""] {
            #expect(text.contains(key), "\(key) missing from \(text)")
        }
        // No key of the written JSON has an upper-case letter (values such as layer names may).
        let object = try JSONSerialization.jsonObject(with: try Self.housing.jsonData())
        func keys(_ any: Any) -> [String] {
            if let dictionary = any as? [String: Any] { return dictionary.keys.map { $0 } + dictionary.values.flatMap(keys) }
            if let array = any as? [Any] { return array.flatMap(keys) }
            return []
        }
        let camel = keys(object).filter { $0.contains { $0.isUppercase } }
        #expect(camel.isEmpty, "camelCase keys: \(camel)")
    }

    @Test func formatVersion1WithCamelCaseKeysIsStillRead() throws {
        let json = String(decoding: try Self.housing.jsonData(), as: UTF8.self)
        var version1 = json.replacingOccurrences(of: "\"format_version\" : 2", with: "\"formatVersion\" : 1")
        for (snake, camel) in [
            ("vocabulary_size", "vocabularySize"), ("embedding_size", "embeddingSize"), ("learning_rate", "learningRate"),
            ("weight_decay", "weightDecay"), ("batch_size", "batchSize"),
        ] {
            version1 = version1.replacingOccurrences(of: "\"\(snake)\"", with: "\"\(camel)\"")
        }
        #expect(version1 != json)
        let decoded = try ModelSpec.decode(json: Data(version1.utf8))
        #expect(decoded == Self.housing)
        #expect(decoded.formatVersion == 2)
        #expect(try decoded.jsonData() == Self.housing.jsonData())
    }

    @Test(arguments: [
        (#"{"format_version":3,"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format version 3 is not supported"),
        (#"{"format_version":1,"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format version 1 is not supported"),
        (#"{"formatVersion":2,"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format version 2 is not supported"),
        (#"{"name":"x","inputs":[],"layers":[],"output":"a"}"#, "format_version"),
        (
            #"{"format_version":2,"name":"x","inputs":[{"name":"i","shape":[1],"categorical":false}],"layers":[{"name":"d","type":"dense","inputs":["i"],"units":1}],"output":"d","training":{"loss":"mse","optimizer":{"type":"sgd"},"epochs":1,"batch_size":1}}"#,
            "learning_rate"
        ),
    ])
    func unreadableVersionsAndMissingKeysAreNamed(json: String, expected: String) {
        let error = #expect(throws: FormatError.self) { try ModelSpec.decode(json: Data(json.utf8)) }
        #expect(error?.code == .invalidSpec)
        #expect(error?.message.contains(expected) == true, "\(error?.message ?? "no error")")
    }

    @Test func paddingCodesAsStringOrPair() throws {
        let values: [Padding] = [.valid, .same, .explicit(height: 1, width: 2)]
        let data = try JSONEncoder().encode(values)
        #expect(String(decoding: data, as: UTF8.self) == #"["valid","same",[1,2]]"#)
        #expect(try JSONDecoder().decode([Padding].self, from: data) == values)
        #expect(throws: (any Error).self) { try JSONDecoder().decode([Padding].self, from: Data(#"["full"]"#.utf8)) }
    }

    @Test(arguments: [
        (28, 3, 1, 28, 1), (28, 3, 2, 14, 0), (5, 2, 2, 3, 0), (7, 4, 1, 7, 1),
    ])
    func samePaddingFollowsTensorFlowsRule(input: Int, kernel: Int, stride: Int, output: Int, before: Int) {
        let r = Padding.same.resolve(input: input, kernel: kernel, stride: stride, axis: 0)
        #expect(r.output == output)
        #expect(r.padBefore == before)
    }

    @Test func invalidSpecsNameTheProblem() {
        var spec = Self.housing
        spec.layers[3].inputs = ["nowhere"]
        #expect(throws: FormatError.self) { try spec.validate() }

        spec = Self.housing
        spec.layers[4].name = "dense1"
        #expect(throws: FormatError.self) { try spec.validate() }

        spec = Self.housing
        spec.output = "missing"
        #expect(throws: FormatError.self) { try spec.validate() }

        spec = Self.housing
        spec.layers[3].inputs = ["numeric", "chas"]
        #expect(throws: FormatError.self) { try spec.validate() }

        do {
            _ = try ModelSpec.decode(json: Data(#"{"formatVersion":1,"name":"x","inputs":[],"layers":[{"name":"a"}],"output":"a"}"#.utf8))
            Issue.record("expected an error")
        } catch {
            #expect(error.code == .invalidSpec)
            #expect(error.message.contains("type"))
        }
    }

    /// A model file with sizes past the limits is refused when it is read, not when a layer multiplies them (a flatten
    /// of [2³², 2³²] trapped in the engine before); so is one whose shapes are too large though each size is in range.
    @Test func sizesPastTheLimitsAreRefusedWhenTheFileIsRead() throws {
        let huge =
            #"{"format_version":2,"name":"m","inputs":[{"name":"x","shape":[4294967296,4294967296],"categorical":false}],"layers":[{"name":"f","type":"flatten","inputs":["x"]}],"output":"f"}"#
        #expect(throws: FormatError.self) { try ModelSpec.decode(json: Data(huge.utf8)) }
        let wide =
            #"{"format_version":2,"name":"m","inputs":[{"name":"x","shape":[16777216,16777216,16777216],"categorical":false}],"layers":[{"name":"f","type":"flatten","inputs":["x"]}],"output":"f"}"#
        do {
            _ = try ModelSpec.decode(json: Data(wide.utf8))
            Issue.record("a model of 2^72 elements a sample was read")
        } catch {
            #expect(error.code == .invalidSpec && error.message.contains("elements"), "\(error)")
        }
    }

    @Test func unknownKeysAreRefusedNamingTheKeyAndTheLayer() throws {
        let json =
            #"{"format_version":2,"name":"x","inputs":[{"name":"in","shape":[3],"categorical":false}],"layers":[{"name":"d","type":"dense","inputs":["in"],"unit":64}],"output":"d"}"#
        #expect { try ModelSpec.decode(json: Data(json.utf8)) } throws: { error in
            let message = (error as? FormatError)?.message ?? ""
            return message.contains("layer 'd'") && message.contains("'unit'") && message.contains("units") && message.contains("input_size")
        }
        let topLevel = json.replacingOccurrences(of: #""output":"d""#, with: #""output":"d","outputs":"d""#)
        #expect { try ModelSpec.decode(json: Data(topLevel.utf8)) } throws: { ($0 as? FormatError)?.message.contains("'outputs'") == true }
        let training = json.replacingOccurrences(of: #","unit":64"#, with: #","units":64"#)
            .replacingOccurrences(
                of: #""output":"d""#,
                with: #""output":"d","training":{"loss":"mse","optimizer":{"type":"sgd","learning_rate":0.1,"lr":1},"epochs":1,"batch_size":4}"#)
        #expect { try ModelSpec.decode(json: Data(training.utf8)) } throws: { error in
            let message = (error as? FormatError)?.message ?? ""
            return message.contains("'lr'") && message.contains("learning_rate") && !message.contains("learningRate")
        }
        // Without the stray keys, the same JSON decodes.
        #expect(try ModelSpec.decode(json: Data(json.replacingOccurrences(of: #""unit""#, with: #""units""#).utf8)).layers[0].units == 64)
        #expect(try ModelSpec.decode(json: Data(training.replacingOccurrences(of: #","lr":1"#, with: "").utf8)).training?.batchSize == 4)
    }

    @Test func unknownKeysAreRefusedInFormatVersion1ButItsCamelCaseKeysAreKnown() throws {
        let json =
            #"{"formatVersion":1,"name":"x","inputs":[{"name":"in","shape":[3],"categorical":false}],"layers":[{"name":"d","type":"dense","inputs":["in"],"units":64,"inputSize":3,"useBias":true,"unit":64}],"output":"d","training":{"loss":"mse","optimizer":{"type":"sgd","learningRate":0.1,"weightDecay":0},"epochs":1,"batchSize":4,"maxUpdates":2}}"#
        #expect { try ModelSpec.decode(json: Data(json.utf8)) } throws: { error in
            let message = (error as? FormatError)?.message ?? ""
            return message.contains("layer 'd'") && message.contains("'unit'") && message.contains("input_size")
        }
        let spec = try ModelSpec.decode(json: Data(json.replacingOccurrences(of: #","unit":64"#, with: "").utf8))
        #expect(spec.layers[0].inputSize == 3)
        #expect(spec.training?.optimizer.learningRate == 0.1)
        #expect(spec.training?.maxUpdates == 2)
    }

    @Test func unknownLayerTypesFailValidation() throws {
        var spec = Self.housing
        spec.layers[4].type = LayerType(rawValue: "gelu")
        #expect { try spec.validate() } throws: { ($0 as? FormatError)?.message.contains("layer 'relu1' has unknown type 'gelu'") == true }
    }

    @Test func parametersAreDerivedFromTheArchitecture() throws {
        let parameters = try Self.housing.parameters()
        #expect(parameters.map(\.name) == ["chasEmbedding.weight", "dense1.bias", "dense1.weight", "out.bias", "out.weight", "radEmbedding.weight"])
        #expect(
            Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.shape) }) == [
                "chasEmbedding.weight": [2, 2], "radEmbedding.weight": [9, 5], "dense1.weight": [64, 18], "dense1.bias": [64],
                "out.weight": [1, 64], "out.bias": [1],
            ])
        var shapes = Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.shape) })
        try Self.housing.checkWeights(shapes)
        shapes["dense1.weight"] = [65, 18]
        #expect { try Self.housing.checkWeights(shapes) } throws: { error in
            let error = error as? FormatError
            return error?.code == .shapeMismatch && error?.message.contains("dimension 0 is the layer's 'units', 64, not 65") == true
        }
        var wide = Self.housing
        wide.layers[3].inputSize = 20
        #expect { try wide.parameters() } throws: { ($0 as? FormatError)?.message.contains("'input_size' is 20, but its input 'joined' has width 18") == true }
    }
}

/// JSON syntax errors by line and column, in model files and elsewhere.
@Suite struct JSONSyntaxTests {
    @Test(arguments: [
        ("{\n  \"format_version\": 2,\n  \"name\": small\n}\n", 3, 11, "expected a value (strings take double quotes), found 'small'"),
        ("{\n  \"format_version\": 2\n  \"name\": \"x\"\n}", 3, 3, "expected ',' or '}', found '\"'"),
        ("{\"a\": [1, 2,]}", 1, 13, "expected a value (no ',' before ']'), found ']'"),
        ("{\"a\": 1,}", 1, 9, "expected a key in double quotes (no ',' before '}'), found '}'"),
        ("{'a': 1}", 1, 2, "expected a key in double quotes, found \"'\""),
        ("{\"a\" 1}", 1, 6, "expected ':' after the key, found '1'"),
        ("{\"a\": [1, 2", 1, 12, "expected ',' or ']', found the end of the text"),
        ("", 1, 1, "expected a value, found the end of the text"),
        ("{\"é\": \"ü\n\"}", 1, 9, "the string has no closing '\"' on its line"),
        ("{\"a\": \"b", 1, 7, "the string has no closing '\"'"),
        ("{\"a\": \"\\x\"}", 1, 8, "invalid escape in a string, found '\\'"),
        ("[01]", 1, 3, "expected ',' or ']', found '1'"),
        ("[1.]", 1, 4, "expected a digit after '.', found ']'"),
        ("[-]", 1, 3, "expected a digit, found ']'"),
        ("[tru]", 1, 2, "expected a value (strings take double quotes), found 'tru'"),
        ("{} {}", 1, 4, "expected the end of the text after the JSON value, found '{'"),
        ("[\"a\tb\"]", 1, 4, "a control character in a string must be escaped, found a tab"),
    ])
    func aSyntaxErrorIsFoundAtItsLineAndColumn(text: String, line: Int, column: Int, reason: String) {
        let error = JSONSyntaxError.find(in: Data(text.utf8))
        #expect(error?.description == "line \(line), column \(column): \(reason)")
        #expect(error?.line == line && error?.column == column && error?.reason == reason)
    }

    @Test(arguments: [
        "{}", "[]", "0", "-0.5e+10", "\"\\u00e9\\n\"", " { \"a\" : [ true , false , null , 1E3 , {\"b\": []} ] } \n", "\u{FEFF}{\"a\": 1}",
    ])
    func validJSONHasNoSyntaxError(text: String) {
        #expect(JSONSyntaxError.find(in: Data(text.utf8)) == nil)
    }

    @Test func aModelFileSyntaxErrorNamesTheLineAndColumn() {
        let json = "{\n  \"format_version\": 2,\n  \"name\": small\n}\n"
        let error = #expect(throws: FormatError.self) { try ModelSpec.decode(json: Data(json.utf8)) }
        #expect(error?.message == "model JSON: line 3, column 11: expected a value (strings take double quotes), found 'small'")
    }
}

@Suite struct SpecKeyCamelCaseTests {
    /// The byte-wise conversion gives what splitting on `_` and capitalising each later part gives, for the names the
    /// formats use and for every name of up to four characters over `a`, `Z`, `9`, `é` and `_` (leading, repeated and
    /// trailing underscores, digits and upper case after one, non-ASCII).
    @Test func byteWiseConversionMatchesTheReference() {
        var names = [
            "input_size", "use_bias", "format_version", "learning_rate", "weight_decay", "batch_size", "max_updates",
            "vocabulary_size", "embedding_size", "kernel_size", "units", "", "_", "__a", "a__b", "a_", "a_9b", "a_B",
        ]
        let alphabet: [String] = ["a", "Z", "9", "é", "_"]
        var level = [""]
        for _ in 0..<4 {
            level = level.flatMap { prefix in alphabet.map { prefix + $0 } }
            names += level
        }
        for name in names {
            #expect(SpecKey.camelCase(name) == SpecKey.unicodeCamelCase(name), "\(name)")
        }
        #expect(SpecKey.camelCase("input_size") == "inputSize")
        #expect(SpecKey.camelCase("_é_é") == "éÉ")
    }

    /// Keys a hostile model JSON might carry are refused as unknown, naming them: a non-ASCII spelling of a known key,
    /// the camelCase of a known key in a format-2 file's layer (accepted: both spellings are read), and a key of
    /// 100 000 underscores and letters.
    @Test func unusualKeysAreRefusedOrReadAsBefore() throws {
        func layer(_ extra: String) -> Data {
            Data(
                #"{"format_version":2,"name":"x","inputs":[{"name":"in","shape":[3],"categorical":false}],"layers":[{"name":"d","type":"dense","inputs":["in"],"units":4\#(extra)}],"output":"d"}"#
                    .utf8)
        }
        #expect { try ModelSpec.decode(json: layer(#","ünits":4"#)) } throws: { ($0 as? FormatError)?.message.contains("'ünits'") == true }
        #expect(try ModelSpec.decode(json: layer(#","inputSize":3"#)).layers[0].inputSize == 3)
        let long = String(repeating: "_a", count: 50_000)
        #expect { try ModelSpec.decode(json: layer(",\"\(long)\":1")) } throws: { ($0 as? FormatError)?.message.contains("has unknown key") == true }
    }
}

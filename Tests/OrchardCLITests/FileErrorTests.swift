import Foundation
import OrchardTesting
import Testing

/// A bad file given to `orchard coreml …` is one `Error:` line naming the argument or option and the path, never
/// Foundation's `Error Domain=NSCocoaErrorDomain …` record.
@Suite struct CoreMLFileErrorTests {
    /// A dense layer 2 → 1, with its training settings (an updatable export needs them).
    static let model = #"""
        {
          "format_version": 2,
          "name": "tiny",
          "inputs": [{"name": "x", "shape": [2], "categorical": false}],
          "layers": [{"name": "d", "type": "dense", "inputs": ["x"], "units": 1}],
          "output": "d",
          "training": {"loss": "mse", "optimizer": {"type": "sgd", "learning_rate": 0.1}, "epochs": 1, "batch_size": 1}
        }
        """#

    /// Safetensors bytes of F32 tensors (all zero) with these names and shapes.
    static func safetensors(_ tensors: [(name: String, shape: [Int])]) -> Data {
        var offset = 0
        var entries: [String] = []
        for tensor in tensors {
            let bytes = tensor.shape.reduce(4, *)
            entries.append(#""\#(tensor.name)":{"dtype":"F32","shape":\#(tensor.shape),"data_offsets":[\#(offset),\#(offset + bytes)]}"#)
            offset += bytes
        }
        let header = Data("{\(entries.joined(separator: ","))}".utf8)
        var data = Data()
        withUnsafeBytes(of: UInt64(header.count).littleEndian) { data.append(contentsOf: $0) }
        return data + header + Data(count: offset)
    }

    /// A directory of input files that the test removes.
    struct Files {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-coreml-files-\(UUID().uuidString)")

        init() throws { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }

        func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

        func write(_ name: String, _ data: Data) throws -> String {
            try data.write(to: directory.appendingPathComponent(name))
            return path(name)
        }

        func remove() { try? FileManager.default.removeItem(at: directory) }
    }

    /// Runs `orchard arguments…` and returns its one `Error:` line, expecting a failure and nothing else on standard
    /// error (no usage, no Foundation record).
    func errorLine(_ arguments: [String]) async throws -> String {
        let run = try await Run.orchard(arguments)
        #expect(run.status != 0)
        #expect(!run.error.contains("NSCocoaErrorDomain") && !run.error.contains("Error Domain="), "\(run.error)")
        let lines = run.error.split(separator: "\n")
        #expect(lines.count == 1, "\(run.error)")
        #expect(run.output.isEmpty, "\(run.output)")
        return String(lines.first ?? "")
    }

    @Test func aMissingFileOrADirectoryIsNamedWithItsArgument() async throws {
        let files = try Files()
        defer { files.remove() }
        let model = try files.write("model.json", Data(Self.model.utf8))
        let weights = try files.write("w.safetensors", Self.safetensors([("d.weight", [1, 2]), ("d.bias", [1])]))
        let missing = files.path("missing.json")
        let out = files.path("out.mlmodel")

        #expect(try await errorLine(["coreml", "export", missing, weights, "-o", out]) == "Error: <model> '\(missing)': no such file")
        #expect(
            try await errorLine(["coreml", "export", files.directory.path, weights, "-o", out])
                == "Error: <model> '\(files.directory.path)': is a directory")
        #expect(try await errorLine(["coreml", "export", model, missing, "-o", out]) == "Error: <weights> '\(missing)': no such file")
        #expect(try await errorLine(["coreml", "inspect", missing]) == "Error: <input> '\(missing)': no such file")
        #expect(try await errorLine(["coreml", "inspect", files.directory.path]) == "Error: <input> '\(files.directory.path)': is a directory")
        #expect(try await errorLine(["coreml", "import", missing, "-o", files.path("imported")]) == "Error: <input> '\(missing)': no such file")
        let nowhere = files.path("no/such/dir/out.mlmodel")
        #expect(try await errorLine(["coreml", "export", model, weights, "-o", nowhere]) == "Error: --output '\(nowhere)': no such directory")

        // The same files convert.
        let run = try await Run.orchard(["coreml", "export", model, weights, "-o", out])
        #expect(run.status == 0, "\(run.error)")
        #expect(run.output == "wrote \(out) (\(try Data(contentsOf: URL(fileURLWithPath: out)).count) bytes)\n")
        #expect(try await errorLine(["coreml", "import", out, "-o", model]) == "Error: --output '\(model)': is a file, not a directory")
        // An output that is an input would replace it: refused before anything is written.
        let before = try Data(contentsOf: URL(fileURLWithPath: weights))
        #expect(
            try await errorLine(["coreml", "export", model, weights, "-o", weights])
                == "Error: --output '\(weights)': is the input <weights> '\(weights)'; writing it would replace that file: choose another path")
        #expect(try Data(contentsOf: URL(fileURLWithPath: weights)) == before)
    }

    @Test func safetensorsErrorsNameTheWeightsFile() async throws {
        let files = try Files()
        defer { files.remove() }
        let model = try files.write("model.json", Data(Self.model.utf8))
        let out = files.path("out.mlmodel")
        let garbage = try files.write("garbage.safetensors", Data("abc".utf8))
        #expect(
            try await errorLine(["coreml", "export", model, garbage, "-o", out])
                == "Error: <weights> '\(garbage)': safetensors data is 3 bytes; the 8-byte header length is missing")
        let wide = try files.write("wide.safetensors", Self.safetensors([("d.weight", [1, 3]), ("d.bias", [1])]))
        let line = try await errorLine(["coreml", "export", model, wide, "-o", out])
        #expect(
            line
                == "Error: <weights> '\(wide)': does not match the model 'tiny': weight 'd.weight' has shape [1, 3]; layer 'd' (dense) implies [1, 2]: dimension 1 is the layer's 'input_size', 2, not 3"
        )
        #expect(!FileManager.default.fileExists(atPath: out))
    }

    @Test func aModelJSONSyntaxErrorHasItsLineAndColumn() async throws {
        let files = try Files()
        defer { files.remove() }
        let weights = try files.write("w.safetensors", Self.safetensors([("d.weight", [1, 2]), ("d.bias", [1])]))
        let bad = try files.write("bad.json", Data("{\n  \"format_version\": 2,\n  \"name\": tiny\n}\n".utf8))
        #expect(
            try await errorLine(["coreml", "export", bad, weights, "-o", files.path("out.mlmodel")])
                == "Error: <model> '\(bad)': line 3, column 11: expected a value (strings take double quotes), found 'tiny'")
        let comma = try files.write("comma.json", Data(Self.model.replacingOccurrences(of: "\"tiny\",", with: "\"tiny\"").utf8))
        #expect(
            try await errorLine(["coreml", "export", comma, weights, "-o", files.path("out.mlmodel")])
                == "Error: <model> '\(comma)': line 4, column 3: expected ',' or '}', found '\"'")
        // A semantic error keeps its own message.
        let unknown = try files.write("unknown.json", Data(Self.model.replacingOccurrences(of: "\"dense\"", with: "\"dence\"").utf8))
        let line = try await errorLine(["coreml", "export", unknown, weights, "-o", files.path("out.mlmodel")])
        #expect(line.hasPrefix("Error: <model> '\(unknown)': layer 'd' has unknown type 'dence' (known: "), "\(line)")
    }

    @Test func aFileThatIsNotACoreMLModelIsNamed() async throws {
        let files = try Files()
        defer { files.remove() }
        let garbage = try files.write("garbage.mlmodel", Data("abc".utf8))
        let line = try await errorLine(["coreml", "inspect", garbage])
        #expect(line.hasPrefix("Error: <input> '\(garbage)': "), "\(line)")
    }
}

/// Long jobs show progress on standard error — plain lines when it is not a terminal, as here — and keep standard
/// output to their results.
@Suite struct ProgressOutputTests {
    @Test func benchGEMMPrintsOneJSONLineAndPlainProgressOnStandardError() async throws {
        let run = try await Run.orchard(["bench", "gemm", "--m", "4", "--n", "4", "--k", "4", "--repeats", "2", "--seconds", "0.0001"])
        #expect(run.status == 0, "\(run.error)")
        let lines = run.output.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count == 2 && lines[1].isEmpty, "exactly one line: \(run.output)")
        #expect((try? JSONSerialization.jsonObject(with: Data(lines[0].utf8))) is [String: Any])
        // A job this short writes no progress at all; a longer one plain `bench gemm: …` lines, never a redrawn bar.
        #expect(!run.error.contains("\r") && !run.error.contains("\u{1B}"), "\(run.error)")
        #expect(run.error.split(separator: "\n").allSatisfy { $0.hasPrefix("bench gemm: ") }, "\(run.error)")
    }
}

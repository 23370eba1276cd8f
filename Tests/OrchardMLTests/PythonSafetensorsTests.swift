import Foundation
import OrchardFormats
import OrchardML
import OrchardTesting
import Testing

/// The Python packages ``PythonSafetensorsTests`` import.
let pythonSafetensorsModules = ["numpy", "safetensors"]

/// Checkpoints checked against Python's reference `safetensors` package. Skipped, with the install command as the
/// reason, when `numpy` or `safetensors` is missing; CI sets `ORCHARD_REQUIRE_PYTHON=1`, under which they run and
/// a missing package fails them.
@Suite(PythonModules.requirement(pythonSafetensorsModules))
struct PythonSafetensorsTests {
    /// Runs a Python script with arguments; fails the test with a clear message when Python or a package is missing.
    static func python(_ script: String, _ arguments: [String]) async throws -> String {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script] + arguments
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        do { try process.run() } catch {
            Issue.record("python3 could not be started (\(error)); install Python 3 with `pip install safetensors numpy`")
            throw error
        }
        async let outRead = output.fileHandleForReading.readToEndOfFile()
        async let errRead = errors.fileHandleForReading.readToEndOfFile()
        let (out, err) = await (outRead, errRead)
        await process.exited()
        let stderr = String(decoding: err, as: UTF8.self)
        if process.terminationStatus != 0 {
            let hint = stderr.contains("No module named") ? " — install the packages with `pip install safetensors numpy`" : ""
            Issue.record("python3 failed (status \(process.terminationStatus))\(hint): \(stderr)")
            throw EngineError(.unavailable, "python3 failed")
        }
        return String(decoding: out, as: UTF8.self)
    }

    @Test func pythonReadsOrchardWeightsAndTrainingState() async throws {
        try PythonModules.require(pythonSafetensorsModules)
        let model = try Fixtures.housingModel(seed: 31)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-py-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let weights = directory.appendingPathComponent("weights.safetensors")
        try model.writeWeights(to: weights)
        let trainer = try Trainer(model: model, configuration: TrainingConfiguration(optimizer: .adam(), epochs: 1, batchSize: 32))
        let state = try trainer.train(on: try Fixtures.housingData()).state
        let stateURL = directory.appendingPathComponent("state.safetensors")
        try state.write(to: stateURL)

        let script = """
            import json, sys
            from safetensors.numpy import load_file
            from safetensors import safe_open
            out = {}
            for path in sys.argv[1:]:
                tensors = load_file(path)
                with safe_open(path, framework="numpy") as f:
                    meta = f.metadata()
                out[path] = {"tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape), "sum": float(v.astype("float64").sum()), "first": float(v.flat[0])} for k, v in tensors.items()}, "meta": meta}
            print(json.dumps(out))
            """
        let text = try await Self.python(script, [weights.path, stateURL.path])
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: [String: Any]])
        let weightInfo = try #require(parsed[weights.path]?["tensors"] as? [String: [String: Any]])
        #expect(Set(weightInfo.keys) == Set(model.parameterNames))
        for (name, tensor) in model.namedParameters {
            let info = try #require(weightInfo[name])
            #expect(info["dtype"] as? String == "float32")
            #expect(info["shape"] as? [Int] == tensor.shape)
            // JSON carries the value as a decimal; it must round to the same Float32.
            #expect((info["first"] as? Double).map(Float.init) == tensor.scalars[0])
            let sum = tensor.scalars.reduce(0.0) { $0 + Double($1) }
            #expect(abs((info["sum"] as? Double ?? .nan) - sum) < 1e-9 * max(1, abs(sum)))
        }
        let stateInfo = try #require(parsed[stateURL.path]?["tensors"] as? [String: [String: Any]])
        #expect(stateInfo["optimizer.dense1.weight.m"]?["shape"] as? [Int] == [64, 17])
        #expect(stateInfo["optimizer.chasEmbedding.weight.m"] == nil)
        let meta = try #require(parsed[stateURL.path]?["meta"] as? [String: String])
        #expect(meta["optimizer.kind"] == "adam")
        #expect(meta["position.epoch"] == "1")
    }

    @Test func orchardReadsWeightsWrittenByPython() async throws {
        try PythonModules.require(pythonSafetensorsModules)
        var model = try Fixtures.housingModel()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-py-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let url = directory.appendingPathComponent("from-python.safetensors")
        let shapes = try JSONSerialization.data(withJSONObject: model.parameterShapes)
        // Each tensor holds 0.5 · (its flat index) + (its position in name order).
        let script = """
            import json, sys
            import numpy as np
            from safetensors.numpy import save_file
            shapes = json.loads(sys.argv[2])
            tensors = {}
            for i, name in enumerate(sorted(shapes)):
                n = int(np.prod(shapes[name]))
                tensors[name] = (np.arange(n, dtype=np.float32) * 0.5 + i).reshape(shapes[name])
            save_file(tensors, sys.argv[1], metadata={"format": "np"})
            """
        _ = try await Self.python(script, [url.path, String(decoding: shapes, as: UTF8.self)])
        try model.readWeights(from: url)
        for (i, name) in model.parameterNames.enumerated() {
            let t = try #require(model.parameter(name))
            #expect(t.scalars == (0..<t.count).map { Float($0) * 0.5 + Float(i) })
        }
        // A float64 file is refused with a clear error.
        let wrong = directory.appendingPathComponent("f64.safetensors")
        _ = try await Self.python(
            """
            import sys, numpy as np
            from safetensors.numpy import save_file
            save_file({"dense3.bias": np.zeros([1], dtype=np.float64)}, sys.argv[1])
            """, [wrong.path])
        let error = #expect(throws: EngineError.self) { try model.readWeights(from: wrong) }
        #expect(error?.code == .incompatibleCheckpoint)
    }
}

import Foundation
import OrchardCoordinatorTesting
import OrchardData
import OrchardFormats
import OrchardML
import OrchardOperator
import OrchardProtocol
import OrchardTesting
import Testing

/// The built `orchard` executable: `orchard process …` against a coordinator on loopback, and `orchard data prepare`.
@Suite struct ExecutableTests {
    @Test func createListStatusWatchCheckpointDelete() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let model = try files.write("model.json", SmallModel.json())
        let weights = try files.write("weights.safetensors", bytes: SmallModel.weights())
        let token: [String: String?] = ["ORCHARD_ADMIN_TOKEN": LoopbackCoordinator.adminToken]
        let server = ["--server", coordinator.url, "--timeout", "120"]

        let created = try await Run.orchard(
            ["process", "create"] + server + [
                "--name", "small", "--version", "1.0", "--model", model, "--weights", weights, "--goal", "3", "--batch-size", "16", "--json",
            ],
            environment: token, in: files.url
        )
        #expect(created.status == 0, "\(created.error)")
        let status = try JSONDecoder().decode(ProcessStatus.self, from: Data(created.output.utf8))
        #expect(status.serverConfig.goalCount == 3 && status.clientConfig.batchSize == 16)
        let id = status.processID

        let list = try await Run.orchard(["process", "list"] + server, environment: token, in: files.url)
        #expect(list.status == 0 && list.output.contains(id) && list.output.contains("0/3"), "\(list.output)\(list.error)")

        let shown = try await Run.orchard(["process", "status", id] + server, environment: token, in: files.url)
        #expect(shown.status == 0 && shown.output.contains("reported    0 of 3 (goal)"), "\(shown.output)\(shown.error)")

        // Not a terminal: one plain line.
        let watched = try await Run.orchard(["process", "watch", id, "--once"] + server, environment: token, in: files.url)
        #expect(watched.status == 0, "\(watched.error)")
        #expect(watched.output.split(separator: "\n").count == 1)
        #expect(watched.output.contains("\(id) running cycle 1: assigned 0/4, reported 0/3, deadline in "), "\(watched.output)")

        let out = files.path("checkpoint.safetensors")
        let fetched = try await Run.orchard(["process", "checkpoint", id, "latest", "-o", out] + server, environment: token, in: files.url)
        #expect(fetched.status == 0, "\(fetched.error)")
        #expect(fetched.output.hasPrefix("wrote checkpoint 0 of \(id) to \(out) ("))
        #expect(
            try Safetensors.decode([UInt8](try Data(contentsOf: URL(fileURLWithPath: out)))).tensors.map(\.name) == SmallModel.spec().parameters().map(\.name))

        let deleted = try await Run.orchard(["process", "delete", id] + server, environment: token, in: files.url)
        #expect(deleted.status == 0 && deleted.output == "deleted \(id)\n")
        let again = try await Run.orchard(["process", "status", id] + server, environment: token, in: files.url)
        #expect(again.status == 1 && again.output.isEmpty)
        #expect(again.errorLines == ["error: unknown_process: no process '\(id)'"])
        await coordinator.stop()
    }

    /// `process create --eval-data` and `process evaluation`: held-out data attached, shown in status, replaced and
    /// detached; a file that does not fit is refused after the process is hosted, naming the way to retry.
    @Test func serverSideEvaluationFromTheCommandLine() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let files = try TemporaryDirectory()
        defer { files.remove() }
        var spec = SmallModel.spec()
        spec.training = TrainingSpec(loss: .meanSquaredError, optimizer: .sgd(learningRate: 0.1))
        let model = try files.write("model.json", SmallModel.json(spec))
        let weights = try files.write("weights.safetensors", bytes: SmallModel.weights())
        func data(width: Int) throws -> [UInt8] {
            DeviceDataFile.encode(
                try TensorDataset(
                    inputs: ["x": Tensor(shape: [4, width], scalars: (0..<(4 * width)).map { Float($0) / 10 })],
                    targets: Tensor(shape: [4, 1], scalars: [0, 1, 0.5, 2])))
        }
        let good = try files.write("eval.safetensors", bytes: try data(width: 3))
        let bad = try files.write("bad.safetensors", bytes: try data(width: 5))
        let token: [String: String?] = ["ORCHARD_ADMIN_TOKEN": LoopbackCoordinator.adminToken]
        let server = ["--server", coordinator.url, "--timeout", "120"]
        let create = ["process", "create"] + server + ["--model", model, "--weights", weights, "--version", "1.0"]

        let created = try await Run.orchard(create + ["--name", "evaluated", "--eval-data", good], environment: token, in: files.url)
        #expect(created.status == 0, "\(created.error)")
        #expect(created.output.contains("evaluation  checkpoint 0 on 4 samples: loss "), "\(created.output)")
        let id = try #require(created.output.split(separator: " ").dropFirst(2).first.map(String.init))
        let shown = try await Run.orchard(["process", "status", id] + server, environment: token, in: files.url)
        #expect(shown.output.contains("evaluation  checkpoint 0 on 4 samples: loss ") && shown.output.contains(", mae "), "\(shown.output)")
        let listed = try await Run.orchard(["process", "evaluation", id] + server, environment: token, in: files.url)
        #expect(listed.status == 0 && listed.output.contains("held-out data: ") && listed.output.contains("CHECKPOINT  SAMPLES  LOSS"), "\(listed.output)")
        let json = try await Run.orchard(["process", "evaluation", id, "--json"] + server, environment: token, in: files.url)
        let answer = try JSONDecoder().decode(ProcessEvaluations.self, from: Data(json.output.utf8))
        #expect(answer.dataSamples == 4 && answer.evaluations.map(\.checkpoint) == [0])

        let refused = try await Run.orchard(["process", "evaluation", id, "--data", bad] + server, environment: token, in: files.url)
        #expect(
            refused.status == 1 && refused.errorLines.first?.hasPrefix("error: invalid_request: the evaluation data does not fit model") == true,
            "\(refused.error)")
        let removed = try await Run.orchard(["process", "evaluation", id, "--remove"] + server, environment: token, in: files.url)
        #expect(removed.status == 0 && removed.output.contains("held-out data: none attached"), "\(removed.output)")
        let both = try await Run.orchard(["process", "evaluation", id, "--remove", "--data", good] + server, environment: token, in: files.url)
        #expect(both.status == 64 && both.error.contains("--data and --remove cannot both be given"))

        let halfDone = try await Run.orchard(create + ["--name", "second", "--eval-data", bad], environment: token, in: files.url)
        #expect(halfDone.status == 1)
        #expect(
            halfDone.error.contains("was hosted, but --eval-data was refused") && halfDone.error.contains("orchard process evaluation "), "\(halfDone.error)")
        let missing = try await Run.orchard(create + ["--name", "third", "--eval-data", "nowhere.safetensors"], environment: token, in: files.url)
        #expect(missing.status == 1 && missing.error.contains("--eval-data 'nowhere.safetensors'"), "\(missing.error)")
        let processes = try await Run.orchard(["process", "list", "--json"] + server, environment: token, in: files.url)
        #expect(try JSONDecoder().decode(ProcessList.self, from: Data(processes.output.utf8)).processes.map(\.name).sorted() == ["evaluated", "second"])
        await coordinator.stop()
    }

    @Test func failuresAreOneLineOnStandardError() async throws {
        let coordinator = try await LoopbackCoordinator.start()
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let model = try files.write("model.json", SmallModel.json())
        let weights = try files.write("weights.safetensors", bytes: SmallModel.weights(hidden: 5))
        let wrongToken = try files.write("token", "wrong\n")
        // Private, as a token file should be (one other users can read adds a warning line before the error).
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: wrongToken)
        let server = ["--server", coordinator.url, "--timeout", "120"]

        let refused = try await Run.orchard(["process", "list", "--admin-token-file", wrongToken] + server, in: files.url)
        #expect(refused.status == 1)
        #expect(
            refused.errorLines == [
                "error: unauthorized: the admin token was refused by \(coordinator.url) (admin token required); check ORCHARD_ADMIN_TOKEN or --admin-token-file"
            ])

        let both = try await Run.orchard(
            ["process", "list", "--admin-token-file", wrongToken] + server, environment: ["ORCHARD_ADMIN_TOKEN": "x"], in: files.url)
        #expect(both.errorLines == ["error: unauthorized: the admin token is given 2 ways (--admin-token-file, ORCHARD_ADMIN_TOKEN); give it one way"])

        let mismatch = try await Run.orchard(
            ["process", "create"] + server + ["--name", "small", "--version", "1", "--model", model, "--weights", weights],
            environment: ["ORCHARD_ADMIN_TOKEN": LoopbackCoordinator.adminToken], in: files.url
        )
        #expect(mismatch.status == 1)
        #expect(mismatch.errorLines.count == 1)
        #expect(
            mismatch.errorLines.first?.hasPrefix(
                "error: invalid_weights: --weights '\(weights)' does not match the model 'small': weight 'dense1.bias' has shape [5]") == true,
            "\(mismatch.error)")

        let unreachable = try await Run.orchard(
            ["process", "list", "--server", "http://127.0.0.1:1"], environment: ["ORCHARD_ADMIN_TOKEN": "t"], in: files.url)
        #expect(
            unreachable.errorLines == [
                "error: unreachable: cannot reach the coordinator at http://127.0.0.1:1 (connection refused); check that `orchard serve` is running there and --server is right"
            ])
        await coordinator.stop()
    }

    @Test func dataPrepareWritesWhatTheClientReads() async throws {
        let files = try TemporaryDirectory()
        defer { files.remove() }
        let (spec, _) = try DataPrepareTests.savedModel(in: files.url)
        let csv = try files.write("rows.csv", DataPrepareTests.csv.replacingOccurrences(of: "note,y,", with: "note,price,"))
        let out = files.path("data.safetensors")
        let run = try await Run.orchard(["data", "prepare", "--model", spec.path, "--csv", csv, "--target", "price", "-o", out], in: files.url)
        #expect(run.status == 0, "\(run.error)")
        #expect(run.output == "wrote 3 rows to \(out): c [3, 1], numeric [3, 2], target [3, 1]\n")
        // Row 3's category was never seen in training: written as the reserved index, with a warning naming it.
        #expect(run.errorLines == ["warning: --csv row 3: c '7' was not seen in training; it is encoded as the reserved index for unseen categories"])
        let read = try DeviceDataFile.read(contentsOf: URL(fileURLWithPath: out))
        #expect(read.targets.scalars == DataPrepareTests.targets)
        #expect(read.inputs[0].scalars == DataPrepareTests.categories)
        #expect(zip(read.inputs[1].scalars, DataPrepareTests.numeric).allSatisfy { abs($0 - $1) < 1e-6 })

        let missingTarget = try await Run.orchard(["data", "prepare", "--model", spec.path, "--csv", csv, "-o", out], in: files.url)
        #expect(missingTarget.status == 1)
        #expect(
            missingTarget.errorLines == [
                "error: unknown_column: --csv '\(csv)': no column 'y' (columns: note, price, c, b, a); name the target column with --target"
            ])

        let badValue = try files.write("bad.csv", "y,c,b,a\n5,3,12,2\n6,1,x,5\n")
        let bad = try await Run.orchard(["data", "prepare", "--model", spec.path, "--csv", badValue, "-o", out], in: files.url)
        #expect(bad.errorLines.count == 1)
        #expect(bad.errorLines.first?.hasPrefix("error: malformed_value at line 3, column 3: --csv '\(badValue)': ") == true, "\(bad.error)")

        // An output that is one of the inputs (the weights next to the model, by another spelling) is refused, and the
        // input is left as it was.
        let weights = spec.deletingPathExtension().appendingPathExtension("safetensors")
        let before = try Data(contentsOf: weights)
        let aliased = files.url.appendingPathComponent(".").appendingPathComponent(weights.lastPathComponent).path
        let clobber = try await Run.orchard(["data", "prepare", "--model", spec.path, "--csv", csv, "--target", "price", "-o", aliased], in: files.url)
        #expect(clobber.status == 1)
        #expect(
            clobber.errorLines == [
                "error: invalid_option: -o '\(aliased)' is the input the weights next to --model '\(weights.path)'; writing it would replace that file: choose another path"
            ], "\(clobber.error)")
        #expect(try Data(contentsOf: weights) == before)
    }
}

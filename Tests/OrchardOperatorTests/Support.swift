import Foundation
import OrchardCoordinator

import OrchardFormats
import OrchardML
import OrchardTesting

/// A temporary directory, removed by ``remove()``.
struct TemporaryDirectory {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-operator-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    /// Writes `text` to `name` and answers its path.
    @discardableResult
    func write(_ name: String, _ text: String) throws -> String {
        try Data(text.utf8).write(to: url.appendingPathComponent(name))
        return path(name)
    }

    /// Writes `bytes` to `name` and answers its path.
    @discardableResult
    func write(_ name: String, bytes: [UInt8]) throws -> String {
        try Data(bytes).write(to: url.appendingPathComponent(name))
        return path(name)
    }

    func remove() { try? FileManager.default.removeItem(at: url) }
}

/// A small model to host: 3 numbers → Dense 4 + ReLU → Dense 1.
enum SmallModel {
    static func spec(hidden: Int = 4, hiddenType: LayerType = .dense) -> ModelSpec {
        ModelSpec(
            name: "small", inputs: [InputSpec(name: "x", shape: [3])],
            layers: [
                LayerSpec(name: "dense1", type: hiddenType, inputs: ["x"], units: hidden),
                LayerSpec(name: "relu1", type: .relu, inputs: ["dense1"]),
                LayerSpec(name: "output", type: .dense, inputs: ["relu1"], units: 1),
            ]
        )
    }

    static func json(_ spec: ModelSpec = spec()) throws -> String {
        String(decoding: try spec.jsonData(), as: UTF8.self)
    }

    static func weights(hidden: Int = 4) throws -> [UInt8] {
        try Model(spec: spec(hidden: hidden), seed: 3).weightsSafetensors()
    }
}

/// One finished run of the `orchard` executable.
typealias Run = OrchardExecutable.Run

extension OrchardExecutable.Run {
    /// Runs `orchard arguments…` in `directory` with `environment` added to (or, for nil values, removed from) this
    /// process's, without the operator's `ORCHARD_ADMIN_TOKEN`.
    static func orchard(_ arguments: [String], environment: [String: String?] = [:], in directory: URL) async throws -> Run {
        try await OrchardExecutable.run(arguments, environment: ["ORCHARD_ADMIN_TOKEN": nil].merging(environment) { $1 }, in: directory)
    }

    /// Standard error's lines.
    var errorLines: [String] { error.split(separator: "\n").map(String.init) }
}

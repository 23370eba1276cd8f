public import Foundation
import OrchardCharts
import OrchardProtocol
import OrchardSupport

/// Writes a run's results into a directory: `metrics.jsonl` (one record a round, appended as the run goes, so a
/// crash keeps every finished round), `summary.json` and a self-contained `report.html`.
public struct ReportWriter: Sendable {
    /// The output directory.
    public let directory: URL

    /// Whether this writer made the directory (it did not exist before).
    public let createdDirectory: Bool

    /// Creates the directory (and its parents) and, unless `truncating` is false, empties `metrics.jsonl`; a runner that
    /// prepares its data first passes false and calls ``begin()`` once the run starts, so a run that fails before it
    /// leaves an earlier run's files as they were.
    public init(directory: URL, truncating: Bool = true) throws(SimulationError) {
        self.directory = directory
        createdDirectory = !FileManager.default.fileExists(atPath: directory.path)
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            throw SimulationError(.unwritable, "cannot prepare the output directory \(directory.path): \(FileAccessError(error, writing: true).message)")
        }
        guard FileManager.default.isWritableFile(atPath: directory.path) else {
            throw SimulationError(.unwritable, "cannot prepare the output directory \(directory.path): it is not writable")
        }
        if truncating { try begin() }
    }

    /// Empties `metrics.jsonl` for the run that starts now.
    public func begin() throws(SimulationError) {
        do {
            try Data().write(to: metricsURL)
        } catch {
            throw SimulationError(.unwritable, "cannot write \(metricsURL.path): \(FileAccessError(error, writing: true).message)")
        }
    }

    /// Removes the directory if this writer made it (a run that failed before it began).
    public func discardIfCreated() {
        if createdDirectory { try? FileManager.default.removeItem(at: directory) }
    }

    /// `DIR/metrics.jsonl`.
    public var metricsURL: URL { directory.appendingPathComponent("metrics.jsonl") }
    /// `DIR/summary.json`.
    public var summaryURL: URL { directory.appendingPathComponent("summary.json") }
    /// `DIR/report.html`.
    public var reportURL: URL { directory.appendingPathComponent("report.html") }

    /// Appends one round's record (a ``RoundMetrics``, or a ``ShardCycleMetrics`` against an external coordinator) as a
    /// JSON line and flushes it to disk.
    public func append(_ record: some Encodable) throws(SimulationError) {
        let encoder = Self.encoder()
        encoder.outputFormatting = [.sortedKeys]
        do {
            var line = try encoder.encode(record)
            line.append(UInt8(ascii: "\n"))
            let handle = try FileHandle(forWritingTo: metricsURL)
            defer { try? handle.close() }
            try handle.seekToEnd()
            try handle.write(contentsOf: line)
            try handle.synchronize()
        } catch {
            throw SimulationError(.unwritable, "cannot append to \(metricsURL.path): \(FileAccessError(error, writing: true).message)")
        }
    }

    /// Writes `summary.json` and `report.html`.
    public func finish(summary: SimulationSummary, rounds: [RoundMetrics], title: String) throws(SimulationError) {
        let encoder = Self.encoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        do {
            try encoder.encode(summary).write(to: summaryURL, options: .atomic)
            try Data(HTMLReport.render(title: title, summary: summary, rounds: rounds).utf8).write(to: reportURL, options: .atomic)
        } catch {
            throw SimulationError(.unwritable, "cannot write the report into \(directory.path): \(FileAccessError(error, writing: true).message)")
        }
    }

    /// Writes `summary.json` alone (a shard's run against an external coordinator, which has no HTML report).
    public func finish(summary: some Encodable) throws(SimulationError) {
        let encoder = Self.encoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        do {
            try encoder.encode(summary).write(to: summaryURL, options: .atomic)
        } catch {
            throw SimulationError(.unwritable, "cannot write \(summaryURL.path): \(FileAccessError(error, writing: true).message)")
        }
    }

    /// How a value that is not finite is written: a diverged global model's test loss is the string `"NaN"` or
    /// `"Infinity"`, which JSON has no number for.
    static let nonFinite = JSONDecoder.NonConformingFloatDecodingStrategy.convertFromString(
        positiveInfinity: "Infinity", negativeInfinity: "-Infinity", nan: "NaN")

    static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "Infinity", negativeInfinity: "-Infinity", nan: "NaN")
        return encoder
    }

    /// Reads `metrics.jsonl` back.
    public static func readMetrics(_ url: URL) throws(SimulationError) -> [RoundMetrics] {
        let text: String
        do { text = try String(contentsOf: url, encoding: .utf8) } catch {
            throw SimulationError(.unreadable, "cannot read \(url.path): \(FileAccessError(error).message)")
        }
        let decoder = JSONDecoder()
        decoder.nonConformingFloatDecodingStrategy = Self.nonFinite
        var records: [RoundMetrics] = []
        for (index, line) in text.split(separator: "\n").enumerated() {
            do { records.append(try decoder.decode(RoundMetrics.self, from: Data(line.utf8))) } catch {
                throw SimulationError(.unreadable, "\(url.lastPathComponent) line \(index + 1) is not a round record: \(error)")
            }
        }
        return records
    }
}

/// The HTML report: summary table and inline SVG charts (drawn by OrchardCharts, as the dashboard's are), no scripts,
/// no network.
public enum HTMLReport {
    /// Renders the page: the headline chart first (test accuracy for a classifier, RMSE for a regressor; quality charts
    /// start from the initial model at round 0), then loss, privacy, participation as stacked bars per round, traffic
    /// in MB and the fleet's availability.
    public static func render(title: String, summary: SimulationSummary, rounds: [RoundMetrics]) -> String {
        let round = Axis("round", format: .count)
        func series(_ name: String, _ color: ChartColor? = nil, style: SeriesStyle = .solid, _ value: (RoundMetrics) -> Double?) -> Series {
            Series(name, rounds.compactMap { r in value(r).map { (Double(r.round), $0) } }, color: color, style: style)
        }
        func perRound(_ caption: String, _ y: Axis, _ lines: [Series], headline: Bool = false, note: String? = nil) -> String {
            figure(caption, headline: headline, note: note) { LineChart(title: caption, x: round, y: y, series: lines, width: $0, height: $1).render() }
        }
        /// One series against an x other than the round.
        func against(_ caption: String, x: Axis, y: Axis, _ line: Series) -> String {
            figure(caption) { LineChart(title: caption, x: x, y: y, series: [line], width: $0, height: $1).render() }
        }
        /// A quality metric per round, from the initial model's at round 0.
        func quality(_ name: String, _ color: ChartColor, initial: Double?, _ value: (RoundMetrics) -> Double?) -> Series {
            var line = series(name, color, value)
            if let initial { line.points.insert(Point(x: 0, y: initial), at: 0) }
            return line
        }
        /// The federated evaluation of `metric`, at each evaluated checkpoint's number (checkpoint r is the model after
        /// round r, the test curve's point at r); nil without federated evaluation.
        func federated(_ metric: String) -> Series? {
            let points = rounds.compactMap { r in r.federatedEvaluation.flatMap { e in e.metrics[metric].map { (Double(e.checkpoint), $0) } } }
            return points.isEmpty ? nil : Series("devices' held-out samples (federated)", points, color: .orange, style: .outline)
        }
        let federatedNote =
            "The dashed line is federated evaluation: each checkpoint run by devices on the samples they hold out, aggregated by the coordinator, drawn at the checkpoint's round."
        var charts: [String] = []
        let accuracy = rounds.contains { $0.testAccuracy != nil }, rmse = rounds.contains { $0.testRMSE != nil }
        if accuracy {
            let line = quality("test set", .blue, initial: summary.initial.accuracy, \.testAccuracy)
            let devices = federated("accuracy")
            charts.append(
                perRound(
                    "Test accuracy", Axis("accuracy", format: .percent), [line] + (devices.map { [$0] } ?? []), headline: true,
                    note: devices == nil ? nil : federatedNote))
        }
        // The housing targets are median home values in thousands of dollars.
        let rmseAxis = Axis(summary.settings["dataset"] == "housing" ? "RMSE, $1000s" : "RMSE")
        if rmse {
            var line = quality("test set", .blue, initial: summary.initial.rmse, \.testRMSE)
            var notes: [String] = []
            // The initial model's error can dwarf the rounds': left off, the scale shows what the rounds did.
            if let initial = summary.initial.rmse, let peak = rounds.compactMap(\.testRMSE).max(), initial > 2 * peak {
                line.points.removeAll { $0.x == 0 }
                notes.append("Round 0, the initial model, is left off the scale: RMSE \(String(format: "%.2f", initial)).")
            }
            var lines = [line]
            if var devices = federated("rmse") {
                if let first = line.points.first?.x { devices.points.removeAll { $0.x < first } }
                lines.append(devices)
                notes.append(federatedNote)
            }
            if let central = summary.centralRMSE, let first = line.points.first?.x, let last = line.points.last?.x {
                lines.append(Series("trained centrally", [(first, central), (last, central)], color: .grey, style: .outline))
                notes.append("The dashed line is the same model trained centrally on all the devices' rows: RMSE \(String(format: "%.2f", central)).")
            }
            charts.append(perRound("Test RMSE", rmseAxis, lines, headline: !accuracy, note: notes.isEmpty ? nil : notes.joined(separator: " ")))
        }
        if rounds.contains(where: { $0.testPerplexity != nil }) {
            charts.append(
                perRound(
                    "Test perplexity", Axis("perplexity per character"), [quality("test set", .blue, initial: summary.initial.perplexity, \.testPerplexity)],
                    headline: false, note: "exp of the mean cross-entropy per predicted character (padding left out); lower is better."))
        }
        // A regressor's loss is its mean squared error, the RMSE chart squared: drawn once.
        if accuracy || !rmse {
            let loss = quality("loss", .red, initial: summary.initial.loss, \.testLoss)
            charts.append(perRound("Test loss", Axis("loss"), [loss], headline: !accuracy && !rmse))
        }
        if rounds.contains(where: { $0.testRMSE != nil && $0.epsilon != nil }) {
            // Differential privacy on a regressor: what each step of error cost.
            let caption = "Test RMSE vs privacy spent (ε at δ = \(summary.settings["dp_delta"] ?? "?"))"
            let points = rounds.compactMap { r in r.testRMSE.flatMap { e in r.epsilon.map { (x: $0, y: e) } } }
            charts.append(against(caption, x: Axis("privacy spent ε"), y: rmseAxis, Series("RMSE", points, color: .purple)))
        }
        if rounds.contains(where: { $0.testAccuracy != nil && $0.epsilon != nil }) {
            // Differential privacy: what each point of accuracy cost.
            let caption = "Test accuracy vs privacy spent (ε at δ = \(summary.settings["dp_delta"] ?? "?"))"
            let points = rounds.compactMap { r in r.testAccuracy.flatMap { a in r.epsilon.map { (x: $0, y: a) } } }
            charts.append(against(caption, x: Axis("privacy spent ε"), y: Axis("accuracy", format: .percent), Series("accuracy", points, color: .purple)))
        }
        if accuracy {
            // Either aggregation mode on the same clock: what matters to a fleet that trains in background windows.
            let caption = "Test accuracy over virtual time"
            let points = rounds.compactMap { r in r.testAccuracy.map { (x: r.virtualEnd / 3600, y: $0) } }
            charts.append(against(caption, x: Axis("virtual hours"), y: Axis("accuracy", format: .percent), Series("test set", points, color: .blue)))
        }
        if rounds.contains(where: { $0.inFlight != nil }) {
            // Buffered aggregation: how stale the released reports were, and how many devices were training.
            charts.append(perRound("Staleness of the released reports", Axis("checkpoints behind (mean)"), [series("staleness", .purple, \.staleness)]))
            charts.append(perRound("Devices training when the round ended", Axis("devices"), [series("in flight", .blue) { $0.inFlight.map(Double.init) }]))
        }
        if rounds.contains(where: { $0.clippingNorm != nil }) {
            charts.append(perRound("Privacy clipping bound", Axis("clipping norm"), [series("clipping norm", .brown, \.clippingNorm)]))
        }
        // Every assigned device ends a round in exactly one of these: the stack is the round's selection.
        let participation = [
            series("aggregated", .blue) { Double($0.participants) },
            series("reported, not aggregated", .purple) { Double(max(0, $0.selected - $0.participants - $0.dropouts - $0.late)) },
            series("dropped out", .red) { Double($0.dropouts) },
            series("late", .orange, style: .outline) { Double($0.late) },
        ]
        charts.append(
            figure("Participation per round", note: "Each bar is the devices assigned to the round, by what became of them.") {
                BarChart(title: "Participation per round", x: round, y: Axis("devices", format: .count), series: participation, width: $0, height: $1).render()
            })
        if rounds.contains(where: { $0.expirations > 0 || $0.resumed > 0 }) {
            charts.append(
                perRound(
                    "Background windows per round", Axis("trainings", format: .count),
                    [
                        series("window expired mid-training", .orange) { Double($0.expirations) },
                        series("resumed from a checkpoint", .teal) { Double($0.resumed) },
                    ]))
        }
        if rounds.contains(where: { $0.secureAggregation != nil }) {
            // Secure aggregation: how many devices each stage kept.
            func stage(_ name: String, _ color: ChartColor, _ count: @escaping (SecureStageCounts) -> Int) -> Series {
                series(name, color) { r in r.secureAggregation.map { Double(count($0)) } }
            }
            charts.append(
                perRound(
                    "Secure aggregation: devices per stage", Axis("devices", format: .count),
                    [
                        stage("advertised", .blue, \.advertised), stage("shared", .orange, \.shared), stage("masked input", .green, \.masked),
                        stage("unmasked", .red, \.unmasked),
                    ]))
        }
        charts.append(
            perRound(
                "Data transferred per round", Axis("bytes", format: .bytes),
                [
                    series("down (models)", .blue) { Double($0.bytesDown) }, series("up (reports)", .green) { Double($0.bytesUp) },
                ]))
        let eligibility =
            "The share of the fleet whose conditions allow background work (on power, online, within the owner's routine) "
            + "when each round opens, against virtual time since the start (18:00 for a device without a time-zone shift). The first "
            + "round opens only once enough devices are eligible for a cycle's goal, so the chart starts hours in."
        charts.append(
            figure("Fleet eligible at round start", note: summary.settings["availability"] == "always" ? nil : eligibility) {
                LineChart(
                    title: "Fleet eligible at round start", x: Axis("virtual time", format: .seconds), y: Axis("eligible", format: .percent, range: 0...1),
                    series: [Series("eligible fraction", rounds.map { ($0.virtualStart, $0.availableFraction) }, color: .brown)], width: $0, height: $1
                ).render()
            })
        let settings = summary.settings.keys.sorted().map { "<tr><th>\(escapeXML($0))</th><td>\(escapeXML(summary.settings[$0]!))</td></tr>" }.joined()
        func percent(_ value: Double) -> String { ValueFormat.percent.format(value) }
        var totals: [(String, String)] = [
            ("rounds (aggregated)", "\(summary.rounds) (\(summary.aggregatedRounds))"),
            ("wall time", String(format: "%.2f s rounds + %.2f s setup", summary.wallSeconds, summary.setupSeconds)),
            ("virtual time", String(format: "%.2f h", summary.virtualSeconds / 3600)),
            ("check-ins / turned away without running (modeled)", "\(summary.checkIns) / \(summary.turnedAwayModeled)"),
            ("selected / aggregated", "\(summary.selected) / \(summary.participants)"),
            ("dropouts / late", "\(summary.dropouts) / \(summary.late)"),
            ("expired windows / resumed", "\(summary.expirations) / \(summary.resumed)"),
            ("bytes up / down", "\(ValueFormat.bytes.format(Double(summary.bytesUp))) / \(ValueFormat.bytes.format(Double(summary.bytesDown)))"),
            ("test loss initial → final", String(format: "%.4f → %.4f", summary.initial.loss, summary.final.loss)),
        ]
        if let a = summary.final.accuracy, let a0 = summary.initial.accuracy {
            totals.insert(("test accuracy initial → final (best)", "\(percent(a0)) → \(percent(a)) (\(percent(summary.bestAccuracy ?? a)))"), at: 0)
        }
        if let p = summary.final.perplexity, let p0 = summary.initial.perplexity {
            totals.insert(("test perplexity initial → final", String(format: "%.2f → %.2f", p0, p)), at: 1)
        }
        if let epsilon = rounds.last(where: { $0.epsilon != nil })?.epsilon {
            totals.append(("privacy spent", String(format: "ε = %.3f at δ = %@", epsilon, summary.settings["dp_delta"] ?? "?")))
        }
        if let steps = summary.secureAggregation {
            if let signed = steps.signed {
                totals.append(
                    (
                        "secure aggregation: advertised / shared / masked / signed / unmasked",
                        "\(steps.advertised) / \(steps.shared) / \(steps.masked) / \(signed) / \(steps.unmasked)"
                    ))
            } else {
                totals.append(
                    (
                        "secure aggregation: advertised / shared / masked / unmasked",
                        "\(steps.advertised) / \(steps.shared) / \(steps.masked) / \(steps.unmasked)"
                    ))
            }
        }
        if let federated = summary.federatedEvaluation {
            let metric = federated.metrics["accuracy"].map { "accuracy \(percent($0))" } ?? federated.metrics["rmse"].map { String(format: "RMSE %.4f", $0) }
            totals.append(
                (
                    "federated evaluation, checkpoint \(federated.checkpoint)",
                    [metric, String(format: "loss %.4f", federated.metrics["loss"] ?? .nan), "\(federated.samples) held-out samples"].compactMap { $0 }
                        .joined(separator: ", ")
                ))
        }
        if let r = summary.final.rmse, let r0 = summary.initial.rmse {
            totals.append(("test RMSE initial → final", String(format: "%.4f → %.4f", r0, r)))
            if let central = summary.centralRMSE { totals.append(("test RMSE, the model trained centrally", String(format: "%.4f", central))) }
        }
        let totalRows = totals.map { "<tr><th>\(escapeXML($0.0))</th><td>\(escapeXML($0.1))</td></tr>" }.joined()
        return """
            <!DOCTYPE html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
            <title>\(escapeXML(title))</title>
            <style>
            body{font:16px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;padding:1rem 1.5rem 3rem;max-width:80rem;color:#1a1a1a;background:#fff}
            h1{font-size:1.5rem;margin:.5rem 0}h2{font-size:1.2rem;margin:2rem 0 .5rem}
            table{border-collapse:collapse;margin:.5rem 0;font-variant-numeric:tabular-nums}
            th,td{padding:.25rem .8rem .25rem 0;text-align:left;border-bottom:1px solid #d5d9df;vertical-align:top}th{font-weight:600}
            .charts{display:grid;gap:1.25rem}
            figure{margin:0;padding:.75rem 1rem;border:1px solid #d5d9df;border-radius:.5rem;background:#fff}
            figcaption{font-weight:600}figure.headline figcaption{font-size:1.2rem}
            .note{margin:.1rem 0 0;color:#4d4d4d;font-size:.9rem}
            .oc-chart{display:block;width:100%;height:auto}
            .narrow{display:none}
            @media (max-width:40rem){body{padding:.5rem .75rem 2rem}figure{padding:.5rem}.wide{display:none}.narrow{display:block}td,th{padding-right:.4rem}}
            </style></head><body>
            <h1>\(escapeXML(title))</h1>
            <h2>Summary</h2><table>\(totalRows)</table>
            <h2>Charts</h2>
            <div class="charts">
            \(charts.joined(separator: "\n"))
            </div>
            <h2>Settings</h2><table>\(settings)</table>
            </body></html>

            """
    }

    /// A chart at a laptop's width and at a phone's (the stylesheet shows one, so text stays legible on both), under a
    /// caption. `draw` makes the chart at a width and height.
    private static func figure(_ caption: String, headline: Bool = false, note: String? = nil, _ draw: (Double, Double) -> String) -> String {
        let scale = headline ? 1.35 : 1.0
        return "<figure\(headline ? " class=\"headline\"" : "")><figcaption>\(escapeXML(caption))</figcaption>"
            + (note.map { "<p class=\"note\">\(escapeXML($0))</p>" } ?? "")
            + "<div class=\"wide\">\(draw(960, 280 * scale))</div><div class=\"narrow\">\(draw(400, 260 * scale))</div></figure>"
    }
}

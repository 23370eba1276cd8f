public import Foundation
import OrchardSupport

/// Writes a run's results into a directory: `metrics.jsonl` (one record a round, appended as the run goes, so a
/// crash keeps every finished round), `summary.json` and a self-contained `report.html`.
public struct ReportWriter: Sendable {
    /// The output directory.
    public let directory: URL

    /// Creates the directory (and its parents) and truncates `metrics.jsonl`.
    public init(directory: URL) throws(SimulationError) {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try Data().write(to: metricsURL)
        } catch {
            throw SimulationError(.unwritable, "cannot prepare the output directory \(directory.path): \(error.localizedDescription)")
        }
    }

    /// `DIR/metrics.jsonl`.
    public var metricsURL: URL { directory.appendingPathComponent("metrics.jsonl") }
    /// `DIR/summary.json`.
    public var summaryURL: URL { directory.appendingPathComponent("summary.json") }
    /// `DIR/report.html`.
    public var reportURL: URL { directory.appendingPathComponent("report.html") }

    /// Appends one round's record (a ``RoundMetrics``, or a ``ShardRoundMetrics`` against an external coordinator) as a
    /// JSON line and flushes it to disk.
    public func append(_ record: some Encodable) throws(SimulationError) {
        let encoder = JSONEncoder()
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
            throw SimulationError(.unwritable, "cannot append to \(metricsURL.path): \(error.localizedDescription)")
        }
    }

    /// Writes `summary.json` and `report.html`.
    public func finish(summary: SimulationSummary, rounds: [RoundMetrics], title: String) throws(SimulationError) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        do {
            try encoder.encode(summary).write(to: summaryURL, options: .atomic)
            try Data(HTMLReport.render(title: title, summary: summary, rounds: rounds).utf8).write(to: reportURL, options: .atomic)
        } catch {
            throw SimulationError(.unwritable, "cannot write the report into \(directory.path): \(error.localizedDescription)")
        }
    }

    /// Writes `summary.json` alone (a shard's run against an external coordinator, which has no HTML report).
    public func finish(summary: some Encodable) throws(SimulationError) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        do {
            try encoder.encode(summary).write(to: summaryURL, options: .atomic)
        } catch {
            throw SimulationError(.unwritable, "cannot write \(summaryURL.path): \(error.localizedDescription)")
        }
    }

    /// Reads `metrics.jsonl` back.
    public static func readMetrics(_ url: URL) throws(SimulationError) -> [RoundMetrics] {
        let text: String
        do { text = try String(contentsOf: url, encoding: .utf8) } catch {
            throw SimulationError(.unreadable, "cannot read \(url.path): \(error.localizedDescription)")
        }
        let decoder = JSONDecoder()
        var records: [RoundMetrics] = []
        for (index, line) in text.split(separator: "\n").enumerated() {
            do { records.append(try decoder.decode(RoundMetrics.self, from: Data(line.utf8))) } catch {
                throw SimulationError(.unreadable, "\(url.lastPathComponent) line \(index + 1) is not a round record: \(error)")
            }
        }
        return records
    }
}

/// The HTML report: summary table and inline SVG line charts, no scripts, no network.
public enum HTMLReport {
    /// One series of a chart.
    public struct Series: Sendable {
        /// Legend label.
        public var label: String
        /// CSS colour.
        public var color: String
        /// Points (x, y).
        public var points: [(x: Double, y: Double)]

        /// Creates a series.
        public init(label: String, color: String, points: [(x: Double, y: Double)]) {
            self.label = label
            self.color = color
            self.points = points
        }
    }

    /// Renders the page.
    public static func render(title: String, summary: SimulationSummary, rounds: [RoundMetrics]) -> String {
        var charts: [String] = []
        if rounds.contains(where: { $0.testAccuracy != nil }) {
            charts.append(lineChart(title: "Test accuracy", xLabel: "round", series: [
                Series(label: "accuracy", color: "#1f77b4", points: rounds.compactMap { r in r.testAccuracy.map { (Double(r.round), $0) } }),
            ]))
        }
        if rounds.contains(where: { $0.testAccuracy != nil && $0.epsilon != nil }) {
            // Differential privacy: what each point of accuracy cost.
            let delta = summary.settings["dp_delta"] ?? "?"
            charts.append(lineChart(title: "Test accuracy vs privacy spent (ε at δ = \(delta))", xLabel: "ε", series: [
                Series(label: "accuracy", color: "#9467bd", points: rounds.compactMap { r in
                    guard let accuracy = r.testAccuracy, let epsilon = r.epsilon else { return nil }
                    return (epsilon, accuracy)
                }),
            ]))
        }
        if rounds.contains(where: { $0.clippingNorm != nil }) {
            charts.append(lineChart(title: "Privacy clipping bound", xLabel: "round", series: [
                Series(label: "clipping norm", color: "#8c564b", points: rounds.compactMap { r in r.clippingNorm.map { (Double(r.round), $0) } }),
            ]))
        }
        if rounds.contains(where: { $0.testRMSE != nil }) {
            charts.append(lineChart(title: "Test RMSE", xLabel: "round", series: [
                Series(label: "RMSE", color: "#1f77b4", points: rounds.compactMap { r in r.testRMSE.map { (Double(r.round), $0) } }),
            ]))
        }
        charts.append(lineChart(title: "Test loss", xLabel: "round", series: [
            Series(label: "loss", color: "#d62728", points: rounds.compactMap { r in r.testLoss.map { (Double(r.round), $0) } }),
        ]))
        charts.append(lineChart(title: "Participation per round", xLabel: "round", series: [
            Series(label: "selected", color: "#7f7f7f", points: rounds.map { (Double($0.round), Double($0.selected)) }),
            Series(label: "aggregated", color: "#2ca02c", points: rounds.map { (Double($0.round), Double($0.participants)) }),
            Series(label: "dropouts", color: "#d62728", points: rounds.map { (Double($0.round), Double($0.dropouts)) }),
            Series(label: "late", color: "#9467bd", points: rounds.map { (Double($0.round), Double($0.late)) }),
            Series(label: "expired windows", color: "#ff7f0e", points: rounds.map { (Double($0.round), Double($0.expirations)) }),
            Series(label: "resumed", color: "#17becf", points: rounds.map { (Double($0.round), Double($0.resumed)) }),
        ]))
        if rounds.contains(where: { $0.secureAggregation != nil }) {
            // Secure aggregation: how many devices each stage kept.
            func series(_ label: String, _ color: String, _ count: @escaping (SecureStageCounts) -> Int) -> Series {
                Series(label: label, color: color, points: rounds.compactMap { r in r.secureAggregation.map { (Double(r.round), Double(count($0))) } })
            }
            charts.append(lineChart(title: "Secure aggregation: devices per stage", xLabel: "round", series: [
                series("advertised", "#1f77b4", \.advertised), series("shared", "#ff7f0e", \.shared),
                series("masked input", "#2ca02c", \.masked), series("unmasked", "#d62728", \.unmasked),
            ]))
        }
        charts.append(lineChart(title: "Fleet eligible at round start (virtual hours)", xLabel: "virtual hours", series: [
            Series(label: "eligible fraction", color: "#8c564b", points: rounds.map { ($0.virtualStart / 3600, $0.availableFraction) }),
        ]))
        let settings = summary.settings.keys.sorted().map { "<tr><th>\(escape($0))</th><td>\(escape(summary.settings[$0]!))</td></tr>" }.joined()
        var totals: [(String, String)] = [
            ("rounds (aggregated)", "\(summary.rounds) (\(summary.aggregatedRounds))"),
            ("wall time", String(format: "%.2f s rounds + %.2f s setup", summary.wallSeconds, summary.setupSeconds)),
            ("virtual time", String(format: "%.2f h", summary.virtualSeconds / 3600)),
            ("selected / aggregated", "\(summary.selected) / \(summary.participants)"),
            ("dropouts / late", "\(summary.dropouts) / \(summary.late)"),
            ("expired windows / resumed", "\(summary.expirations) / \(summary.resumed)"),
            ("bytes up / down", "\(summary.bytesUp) / \(summary.bytesDown)"),
            ("test loss initial → final", String(format: "%.4f → %.4f", summary.initial.loss, summary.final.loss)),
        ]
        if let a = summary.final.accuracy, let a0 = summary.initial.accuracy {
            totals.append(("test accuracy initial → final", String(format: "%.4f → %.4f", a0, a)))
        }
        if let epsilon = rounds.last(where: { $0.epsilon != nil })?.epsilon {
            totals.append(("privacy spent", String(format: "ε = %.3f at δ = %@", epsilon, summary.settings["dp_delta"] ?? "?")))
        }
        if let steps = summary.secureAggregation {
            totals.append(("secure aggregation: advertised / shared / masked / unmasked", "\(steps.advertised) / \(steps.shared) / \(steps.masked) / \(steps.unmasked)"))
        }
        if let r = summary.final.rmse, let r0 = summary.initial.rmse {
            totals.append(("test RMSE initial → final", String(format: "%.4f → %.4f", r0, r)))
        }
        let totalRows = totals.map { "<tr><th>\(escape($0.0))</th><td>\(escape($0.1))</td></tr>" }.joined()
        return """
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8"><title>\(escape(title))</title>
        <style>
        body{font-family:-apple-system,system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
        table{border-collapse:collapse;margin:1em 0}th,td{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}
        th{font-weight:600}figure{margin:1.5em 0}figcaption{font-weight:600;margin-bottom:.3em}
        </style></head><body>
        <h1>\(escape(title))</h1>
        <h2>Summary</h2><table>\(totalRows)</table>
        \(charts.joined(separator: "\n"))
        <h2>Settings</h2><table>\(settings)</table>
        </body></html>

        """
    }

    /// An SVG line chart with axes, ticks and a legend.
    public static func lineChart(title: String, xLabel: String, series: [Series], width: Double = 720, height: Double = 300) -> String {
        let left = 60.0, right = 150.0, top = 15.0, bottom = 40.0
        let all = series.flatMap(\.points).filter { $0.x.isFinite && $0.y.isFinite }
        let xs = all.map(\.x), ys = all.map(\.y)
        var (x0, x1) = (xs.min() ?? 0, xs.max() ?? 1)
        var (y0, y1) = (min(ys.min() ?? 0, 0), ys.max() ?? 1)
        if x1 <= x0 { x1 = x0 + 1 }
        if y1 <= y0 { y1 = y0 + 1 }
        if ys.allSatisfy({ $0 >= 0 }) { y0 = 0 } else { y0 = ys.min()! }
        let plotW = width - left - right, plotH = height - top - bottom
        func px(_ x: Double) -> Double { left + (x - x0) / (x1 - x0) * plotW }
        func py(_ y: Double) -> Double { top + plotH - (y - y0) / (y1 - y0) * plotH }
        var svg = "<figure><figcaption>\(escape(title))</figcaption>"
        svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" role=\"img\" aria-label=\"\(escape(title))\">"
        svg += "<rect x=\"\(left)\" y=\"\(top)\" width=\"\(plotW)\" height=\"\(plotH)\" fill=\"none\" stroke=\"#999\"/>"
        for i in 0...4 {
            let y = y0 + (y1 - y0) * Double(i) / 4
            svg += "<line x1=\"\(left)\" x2=\"\(left + plotW)\" y1=\"\(fmt(py(y)))\" y2=\"\(fmt(py(y)))\" stroke=\"#eee\"/>"
            svg += "<text x=\"\(left - 6)\" y=\"\(fmt(py(y) + 4))\" font-size=\"11\" text-anchor=\"end\">\(tick(y))</text>"
            let x = x0 + (x1 - x0) * Double(i) / 4
            svg += "<text x=\"\(fmt(px(x)))\" y=\"\(fmt(top + plotH + 16))\" font-size=\"11\" text-anchor=\"middle\">\(tick(x))</text>"
        }
        svg += "<text x=\"\(fmt(left + plotW / 2))\" y=\"\(fmt(height - 6))\" font-size=\"12\" text-anchor=\"middle\">\(escape(xLabel))</text>"
        for (index, s) in series.enumerated() {
            let points = s.points.filter { $0.x.isFinite && $0.y.isFinite }
            if points.count == 1 {
                svg += "<circle cx=\"\(fmt(px(points[0].x)))\" cy=\"\(fmt(py(points[0].y)))\" r=\"3\" fill=\"\(s.color)\"/>"
            } else if !points.isEmpty {
                let path = points.map { "\(fmt(px($0.x))),\(fmt(py($0.y)))" }.joined(separator: " ")
                svg += "<polyline fill=\"none\" stroke=\"\(s.color)\" stroke-width=\"1.8\" points=\"\(path)\"/>"
            }
            let ly = top + 14 + Double(index) * 18
            svg += "<line x1=\"\(fmt(width - right + 12))\" x2=\"\(fmt(width - right + 32))\" y1=\"\(fmt(ly - 4))\" y2=\"\(fmt(ly - 4))\" stroke=\"\(s.color)\" stroke-width=\"3\"/>"
            svg += "<text x=\"\(fmt(width - right + 38))\" y=\"\(fmt(ly))\" font-size=\"12\">\(escape(s.label))</text>"
        }
        svg += "</svg></figure>"
        return svg
    }

    private static func fmt(_ value: Double) -> String { String(format: "%.1f", value) }

    private static func tick(_ value: Double) -> String {
        if value == value.rounded() && abs(value) < 1e6 { return String(Int(value)) }
        return abs(value) >= 100 ? String(format: "%.0f", value) : String(format: "%.3g", value)
    }

    /// Escapes text for HTML.
    static func escape(_ text: String) -> String {
        var out = ""
        for ch in text {
            switch ch {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            default: out.append(ch)
            }
        }
        return out
    }
}

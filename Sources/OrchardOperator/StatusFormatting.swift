public import Foundation
import OrchardPrivacy
public import OrchardProtocol
public import OrchardSupport

/// How `orchard process` shows the coordinator's answers to a person: pure functions of the status and the time
/// (so they are tested without a server or a terminal).
public enum OperatorFormat {
    /// A span of seconds, rounded down, in its two largest units: `45s`, `4m 12s`, `2h 05m`, `3d 4h`.
    public static func duration(_ seconds: Double) -> String {
        guard seconds.isFinite else { return "—" }
        let total = Int(max(0, seconds).rounded(.down))
        let days = total / 86_400, hours = total % 86_400 / 3600, minutes = total % 3600 / 60, secs = total % 60
        if days > 0 { return "\(days)d \(hours)h" }
        if hours > 0 { return "\(hours)h \(String(format: "%02d", minutes))m" }
        if minutes > 0 { return "\(minutes)m \(String(format: "%02d", secs))s" }
        return "\(secs)s"
    }

    /// `in 4m 12s`, or `passed 3s ago` once the deadline is behind `now`.
    public static func countdown(to deadline: Double, now: Date) -> String {
        let left = deadline - now.timeIntervalSince1970
        return left >= 0 ? "in \(duration(left))" : "passed \(duration(-left)) ago"
    }

    /// A date as ISO 8601 in UTC, to the second.
    public static func timestamp(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        formatter.timeZone = TimeZone(identifier: "UTC")
        return formatter.string(from: date)
    }

    /// A number as written in JSON configuration: `32`, `0.01`.
    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }

    /// Rows as columns separated by two spaces, each as wide as its widest cell (counts such as `3` or `0/5` right-aligned).
    public static func table(_ header: [String], _ rows: [[String]]) -> [String] {
        let widths = header.indices.map { i in ([header[i]] + rows.map { $0[i] }).map(\.count).max() ?? 0 }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { i, cell in
                let pad = String(repeating: " ", count: widths[i] - cell.count)
                let numeric = !cell.isEmpty && cell.allSatisfy { $0.isNumber || $0 == "/" }
                return numeric ? pad + cell : (i == cells.count - 1 ? cell : cell + pad)
            }.joined(separator: "  ")
        }
        return [line(header)] + rows.map(line)
    }

    /// `orchard process list`: one row per process.
    public static func processList(_ list: ProcessList, now: Date) -> [String] {
        guard !list.processes.isEmpty else { return ["no processes"] }
        let rows = list.processes.map { p -> [String] in
            let cycle = p.currentCycle
            return [
                p.processID, p.name, p.version.description, p.state.rawValue, cycle.map { "\($0.number)" } ?? "—",
                cycle.map { "\($0.reported)/\($0.goal)" } ?? "—", "\(p.latestCheckpoint)",
                cycle.map { countdown(to: $0.deadline, now: now) } ?? "—",
            ]
        }
        return table(["ID", "NAME", "VERSION", "STATE", "CYCLE", "REPORTED", "CHECKPOINT", "DEADLINE"], rows)
    }

    /// `orchard process status`: one `field  value` line per fact.
    public static func status(_ status: ProcessStatus, now: Date) -> [String] {
        var rows: [(String, String)] = [
            ("process", status.processID),
            ("name", "\(status.name) \(status.version)"),
            ("state", status.state.rawValue),
            ("checkpoint", "\(status.latestCheckpoint) (stored: \(status.checkpoints.map(String.init).joined(separator: ", ")))"),
            (
                "cycles",
                "\(status.cyclesCompleted) completed, \(status.cyclesAbandoned) abandoned"
                    + (status.serverConfig.cycles > 0 ? " of \(status.serverConfig.cycles)" : "")
            ),
        ]
        if let cycle = status.currentCycle {
            rows += [
                ("cycle", "\(cycle.number) (from checkpoint \(cycle.checkpoint)), opened \(timestamp(Date(timeIntervalSince1970: cycle.openedAt)))"),
                ("assigned", "\(cycle.assigned) of \(cycle.capacity)"),
                ("reported", "\(cycle.reported) of \(cycle.goal) (goal)"),
                ("deadline", "\(timestamp(Date(timeIntervalSince1970: cycle.deadline))) (\(countdown(to: cycle.deadline, now: now)))"),
            ]
            if let secure = cycle.secureAggregation { rows.append(("secure agg.", secureAggregation(secure, now: now))) }
            if let buffer = cycle.buffered { rows.append(("buffer", buffered(buffer))) }
        }
        let server = status.serverConfig
        rows.append(
            (
                "server",
                [
                    "goal_count \(server.goalCount)", "over_selection \(number(server.overSelection))", "cycle_length \(duration(server.cycleLength))",
                    "aggregator \(server.aggregator.kind)", "authentication \(server.authentication.mode)",
                ].joined(separator: ", ")
            ))
        rows.append(("client", clientConfig(status.clientConfig)))
        if let privacy = status.privacy {
            let target = privacy.targetEpsilon.map { " of \(number($0))" } ?? ""
            rows.append(
                (
                    "privacy",
                    "ε \(String(format: "%.3f", privacy.epsilon))\(target) at δ \(privacy.delta), \(privacy.releases) releases, noise multiplier \(number(privacy.noiseMultiplier))"
                ))
        }
        if let evaluation = status.evaluation { rows.append(("evaluation", Self.evaluation(evaluation))) }
        if let federated = status.federatedEvaluation { rows.append(("federated evaluation", Self.evaluation(federated))) }
        let width = rows.map(\.0.count).max() ?? 0
        return rows.map { $0.0.padding(toLength: width, withPad: " ", startingAt: 0) + "  " + $0.1 }
    }

    /// A checkpoint's server-side evaluation on one line: `checkpoint 7 on 1000 samples: loss 0.412, accuracy 0.861`
    /// (the loss first, then the other metrics by name).
    /// A federated evaluation says its devices (`on 412 samples from 20 devices`) or its ε when noised.
    public static func evaluation(_ evaluation: CheckpointEvaluation) -> String {
        let names = ["loss"] + evaluation.metrics.keys.filter { $0 != "loss" }.sorted()
        let values = names.compactMap { name in evaluation.metrics[name].map { "\(name) \(String(format: "%.4g", $0))" } }
        let devices = evaluation.devices.map { " from \($0) device\($0 == 1 ? "" : "s")" } ?? ""
        let noised = evaluation.epsilon.map { " (noised, ε \(String(format: "%.3f", $0)))" } ?? ""
        return "checkpoint \(evaluation.checkpoint) on \(evaluation.samples) samples\(devices)\(noised): " + values.joined(separator: ", ")
    }

    /// `orchard process evaluation`: the data attached and one row per evaluated checkpoint.
    public static func evaluations(_ list: ProcessEvaluations) -> [String] {
        let data = list.dataBytes.map { "held-out data: \($0) bytes, \(list.dataSamples ?? 0) samples" } ?? "held-out data: none attached"
        let names = Array(Set(list.evaluations.flatMap(\.metrics.keys)).subtracting(["loss"]).sorted())
        let rows = list.evaluations.map { evaluation in
            ["\(evaluation.checkpoint)", "\(evaluation.samples)"]
                + (["loss"] + names).map { name in
                    evaluation.metrics[name].map { String(format: "%.4g", $0) } ?? "—"
                } + [timestamp(Date(timeIntervalSince1970: evaluation.evaluatedAt))]
        }
        let serverSide =
            rows.isEmpty ? ["no checkpoint evaluated yet"] : table(["CHECKPOINT", "SAMPLES", "LOSS"] + names.map { $0.uppercased() } + ["EVALUATED"], rows)
        guard !list.federated.isEmpty else { return [data] + serverSide }
        let federatedNames = Array(Set(list.federated.flatMap(\.metrics.keys)).subtracting(["loss"]).sorted())
        let federatedRows = list.federated.map { evaluation in
            ["\(evaluation.checkpoint)", "\(evaluation.samples)", evaluation.devices.map(String.init) ?? "noised"]
                + (["loss"] + federatedNames).map { name in evaluation.metrics[name].map { String(format: "%.4g", $0) } ?? "—" }
                + [timestamp(Date(timeIntervalSince1970: evaluation.evaluatedAt))]
        }
        return [data] + serverSide + ["", "federated evaluation (devices' held-out samples):"]
            + table(["CHECKPOINT", "SAMPLES", "DEVICES", "LOSS"] + federatedNames.map { $0.uppercased() } + ["EVALUATED"], federatedRows)
    }

    /// The client configuration's keys, or `architecture defaults` when none is set.
    static func clientConfig(_ config: ClientConfig) -> String {
        var parts: [String] = []
        if let v = config.batchSize { parts.append("batch_size \(v)") }
        if let v = config.learningRate { parts.append("learning_rate \(number(v))") }
        if let v = config.localEpochs { parts.append("local_epochs \(v)") }
        if let v = config.maxUpdates { parts.append("max_updates \(v)") }
        for key in config.extra.keys.sorted() { parts.append(key) }
        return parts.isEmpty ? "the architecture's training settings" : parts.joined(separator: ", ")
    }

    /// A buffered process's open buffer: fill, devices training, releases and staleness.
    static func buffered(_ b: BufferedStatus) -> String {
        let staleness = b.meanStaleness.map { "staleness mean \(number($0)), max \(b.maxStaleness ?? 0)" } ?? "no reports yet"
        return "\(b.bufferFill) of \(b.bufferSize) reports, \(b.inFlight) of \(b.maxConcurrency) devices training, \(b.releases) releases, \(staleness)"
    }

    static func secureAggregation(_ s: SecureAggregationStatus, now: Date) -> String {
        "stage \(s.stage.rawValue) (closes \(countdown(to: s.stageDeadline, now: now))), advertised \(s.advertised), shared \(s.shared), masked \(s.masked)\(s.stage == .consistencyCheck || s.signed > 0 ? ", signed \(s.signed)" : ""), unmasked \(s.unmasked), dropped \(s.dropped)"
    }
}

/// One frame of `orchard process watch`.
public enum WatchFrame {
    /// How the frame is shown.
    public enum Style: Sendable, Hashable {
        /// A terminal: several lines redrawn in place, with a progress bar, cut to `width` columns.
        case terminal(width: Int)
        /// A pipe or a file: one self-contained line per poll, starting with the time.
        case plain
    }

    /// The width of the progress bar's inside.
    public static let barWidth = 30

    /// The frame's lines for `status` at `now`.
    public static func lines(_ status: ProcessStatus, now: Date, style: Style) -> [String] {
        let cycles = status.serverConfig.cycles > 0 ? "/\(status.serverConfig.cycles)" : ""
        let head = "\(status.name) \(status.version) (\(status.processID))"
        switch style {
        case .plain:
            var line = "\(OperatorFormat.timestamp(now)) \(status.processID) \(status.state)"
            if let cycle = status.currentCycle {
                line +=
                    " cycle \(cycle.number)\(cycles): assigned \(cycle.assigned)/\(cycle.capacity), reported \(cycle.reported)/\(cycle.goal), deadline \(OperatorFormat.countdown(to: cycle.deadline, now: now)), checkpoint \(status.latestCheckpoint)"
            } else {
                line += ": checkpoint \(status.latestCheckpoint), \(status.cyclesCompleted) cycles completed, \(status.cyclesAbandoned) abandoned"
            }
            if let evaluation = status.evaluation { line += "; evaluation " + OperatorFormat.evaluation(evaluation) }
            if let federated = status.federatedEvaluation { line += "; federated evaluation " + OperatorFormat.evaluation(federated) }
            return [line]
        case .terminal(let width):
            var lines = [
                "\(head)  \(status.state)  checkpoint \(status.latestCheckpoint)  cycles \(status.cyclesCompleted)\(cycles) done, \(status.cyclesAbandoned) abandoned"
            ]
            if let cycle = status.currentCycle {
                lines.append(
                    "cycle \(cycle.number)  assigned \(cycle.assigned)/\(cycle.capacity)  reported \(cycle.reported)/\(cycle.goal)  deadline \(OperatorFormat.countdown(to: cycle.deadline, now: now))"
                )
                lines.append(bar(reported: cycle.reported, goal: cycle.goal))
                if let secure = cycle.secureAggregation { lines.append("secure aggregation: " + OperatorFormat.secureAggregation(secure, now: now)) }
                if let buffer = cycle.buffered { lines.append("buffer: " + OperatorFormat.buffered(buffer)) }
            } else {
                lines.append("completed: no open cycle")
            }
            if let evaluation = status.evaluation { lines.append("evaluation: " + OperatorFormat.evaluation(evaluation)) }
            if let federated = status.federatedEvaluation { lines.append("federated evaluation: " + OperatorFormat.evaluation(federated)) }
            return lines.map { cut($0, to: width) }
        }
    }

    /// `[█████░░░…]  17% of goal`.
    public static func bar(reported: Int, goal: Int) -> String {
        let fraction = goal > 0 ? min(1, max(0, Double(reported) / Double(goal))) : 0
        let filled = Int((fraction * Double(barWidth)).rounded(.down))
        let percent = String(format: "%3d%%", Int((fraction * 100).rounded(.down)))
        return "[" + String(repeating: "█", count: filled) + String(repeating: "░", count: barWidth - filled) + "] \(percent) of goal"
    }

    /// What to write to a terminal to replace the previous frame (`previous` lines) with `lines`: the cursor goes
    /// back up to the frame's first line, and each line is cleared to its end.
    public static func redraw(previous: Int, lines: [String]) -> String {
        var out = previous > 0 ? "\u{1B}[\(previous)F" : ""
        for line in lines { out += line + "\u{1B}[K\n" }
        // A shorter frame: clear what is left of the longer one below it.
        if previous > lines.count { out += "\u{1B}[J" }
        return out
    }

    private static func cut(_ line: String, to width: Int) -> String {
        guard width > 1, line.count >= width else { return line }
        return String(line.prefix(width - 2)) + "…"
    }
}

/// The polling loop of `orchard process watch`: fetch the status, show a frame, sleep `interval` on the injected
/// clock, until the process completes, `once` is set, or the task is cancelled (Ctrl-C).
public enum ProcessWatcher {
    /// How the loop ended.
    public enum Ending: Sendable, Hashable {
        /// The process completed.
        case completed
        /// One frame was asked for.
        case once
        /// The task was cancelled.
        case cancelled
    }

    /// Runs the loop.
    /// - Parameters:
    ///   - interval: The time between two polls.
    ///   - once: Stop after the first frame.
    ///   - clock: The clock the loop sleeps on and frames read the time from.
    ///   - fetch: One poll of the status endpoint.
    ///   - show: Shows one frame of a status at a time.
    /// - Throws: The first failed poll's ``OperatorError``.
    public static func run(
        interval: Duration, once: Bool = false, clock: any WallClock,
        fetch: @Sendable () async throws(OperatorError) -> ProcessStatus,
        show: (ProcessStatus, Date) -> Void
    ) async throws(OperatorError) -> Ending {
        while true {
            if Task.isCancelled { return .cancelled }
            let status: ProcessStatus
            do {
                status = try await fetch()
            } catch {
                if Task.isCancelled { return .cancelled }
                throw error
            }
            show(status, clock.date)
            if status.state == .completed { return .completed }
            if once { return .once }
            do {
                try await clock.sleep(until: clock.now.advanced(by: interval), tolerance: nil)
            } catch {
                return .cancelled
            }
        }
    }
}

/// Escapes text for XML and HTML (`& < > " '`); characters XML cannot hold (controls other than tab and newline)
/// become U+FFFD.
public func escapeXML(_ text: String) -> String {
    var out = ""
    out.reserveCapacity(text.utf8.count)
    for scalar in text.unicodeScalars {
        switch scalar {
        case "&": out += "&amp;"
        case "<": out += "&lt;"
        case ">": out += "&gt;"
        case "\"": out += "&quot;"
        case "'": out += "&#39;"
        case "\t", "\n", "\r": out.unicodeScalars.append(scalar)
        case _ where scalar.value < 0x20 || scalar.value == 0xFFFE || scalar.value == 0xFFFF: out += "\u{FFFD}"
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out
}

/// A coordinate to one decimal ("12.5", "40"); 0 for a non-finite value, so no SVG ever holds NaN.
func coordinate(_ value: Double) -> String {
    guard value.isFinite else { return "0" }
    let tenths = (value * 10).rounded()
    guard abs(tenths) < 1e15 else { return "0" }
    let whole = Int(tenths) / 10, fraction = abs(Int(tenths) % 10)
    if fraction == 0 { return String(whole) }
    return (tenths < 0 && whole == 0 ? "-" : "") + "\(whole).\(fraction)"
}

/// Where the plot sits in the drawing and how values map onto it.
struct Frame {
    let left: Double, top: Double, plotWidth: Double, plotHeight: Double
    let xAxis: Axis, yAxis: Axis
    let xUnit: DisplayUnit, yUnit: DisplayUnit
    /// Extents in display units (the horizontal one spans the data, the vertical one is widened to ticks).
    let xScale: NiceScale, yScale: NiceScale
    /// Tick positions in display units.
    let xTicks: [Double], yTicks: [Double]

    /// The horizontal position of data value `x`.
    func px(_ x: Double) -> Double { left + xScale.fraction(x / xUnit.divisor) * plotWidth }
    /// The vertical position of data value `y`.
    func py(_ y: Double) -> Double { top + plotHeight * (1 - yScale.fraction(y / yUnit.divisor)) }
}

/// The SVG being written: the root element, title, description, legend, axes; charts add their marks to ``body``.
struct Canvas {
    /// How a legend entry's sample is drawn.
    enum Swatch { case line, box }

    /// One legend entry.
    struct LegendEntry {
        let name: String, color: ChartColor, style: SeriesStyle, swatch: Swatch
    }

    static let fontSize = 12.0
    static let textColor = "#1a1a1a", mutedColor = "#4d4d4d", gridColor = "#d5d9df", axisColor = "#5f6368"

    let title: String, summary: String
    let width: Double, height: Double
    /// The legend's entries with their positions.
    private let legend: [(entry: LegendEntry, x: Double, y: Double)]
    private let legendHeight: Double
    /// The marks, axes and legend so far.
    var body = ""

    init(title: String, summary: String, width: Double, height: Double, legend: [LegendEntry]) {
        self.title = title
        self.summary = summary
        self.width = width.isFinite ? min(max(width, 200), 4000) : 720
        self.height = height.isFinite ? min(max(height, 120), 3000) : 280
        // Entries flow left to right and wrap, above the plot (so a narrow chart keeps its plot wide).
        var placed: [(LegendEntry, Double, Double)] = []
        var x = 8.0, row = 0.0
        for entry in legend {
            let entryWidth = 22 + textWidth(entry.name)
            if x > 8, x + entryWidth > self.width - 8 {
                x = 8
                row += 1
            }
            placed.append((entry, x, 8 + row * 20))
            x += entryWidth + 18
        }
        self.legend = placed
        legendHeight = legend.isEmpty ? 0 : (row + 1) * 20 + 4
    }

    /// Lays out the axes for the data (`xPadding`: room on each side of the horizontal extent, e.g. half a bar).
    func frame(x: Axis, y: Axis, xValues: [Double], yValues: [Double], xPadding: Double) -> Frame {
        let top = 12 + legendHeight, bottom = 50.0
        let plotHeight = max(40, height - top - bottom)

        let yUnit = y.format.displayUnit(for: magnitude(y.range.map { [$0.lowerBound, $0.upperBound] } ?? yValues))
        let yCount = max(3, min(8, Int(plotHeight / 38) + 1))
        let yScale =
            y.range.map { NiceScale(fixed: $0.lowerBound / yUnit.divisor...$0.upperBound / yUnit.divisor, maxCount: yCount, integral: yUnit.integral) }
            ?? NiceScale(
                covering: yValues.map { $0 / yUnit.divisor }, includesZero: y.includesZero ?? y.format.isAmount, maxCount: yCount, integral: yUnit.integral)
        let yTicks = yScale.ticks
        let yLabelWidth = yTicks.map { textWidth(tickLabel($0, step: yScale.step)) }.max() ?? 0
        let left = 36 + yLabelWidth

        let xUnit = x.format.displayUnit(for: magnitude(x.range.map { [$0.lowerBound, $0.upperBound] } ?? xValues))
        let finite = xValues.filter(\.isFinite).map { $0 / xUnit.divisor }
        var lo = x.range.map { $0.lowerBound / xUnit.divisor } ?? finite.min() ?? 0
        var hi = x.range.map { $0.upperBound / xUnit.divisor } ?? finite.max() ?? 1
        let padding = xPadding.isFinite ? xPadding / xUnit.divisor : 0
        if lo == hi && padding == 0 {
            (lo, hi) = xUnit.integral || x.format.isIntegral ? (lo - 1, hi + 1) : (lo - max(abs(lo) / 10, 1), hi + max(abs(hi) / 10, 1))
        }
        let integral = xUnit.integral || (x.format.isIntegral && xUnit.divisor == 1)
        // As many ticks as fit under the plot without their labels touching.
        var right = 16.0, xTicks: [Double] = [], step = 1.0
        for count in stride(from: 12, through: 2, by: -1) {
            let ticks = niceTicks(from: lo, to: hi, maxCount: count, integral: integral)
            step = ticks.count > 1 ? ticks[1] - ticks[0] : niceStep(span: hi - lo, maxCount: count, integral: integral)
            let widest = ticks.map { textWidth(tickLabel($0, step: step)) }.max() ?? 0
            right = max(16, widest / 2 + 4)
            xTicks = ticks
            if Double(ticks.count) * (widest + 14) <= width - left - right { break }
        }
        let xScale = NiceScale(fixed: (lo - padding)...(hi + padding), integral: integral)
        return Frame(
            left: left, top: top, plotWidth: max(40, width - left - right), plotHeight: plotHeight, xAxis: x, yAxis: y,
            xUnit: xUnit, yUnit: yUnit, xScale: xScale, yScale: yScale, xTicks: xTicks, yTicks: yTicks
        )
    }

    /// Draws the legend, grid, axes, ticks and axis labels (and "No data" on an empty chart).
    mutating func drawAxes(_ frame: Frame, empty: Bool) {
        let bottom = frame.top + frame.plotHeight, right = frame.left + frame.plotWidth
        let xStep = frame.xTicks.count > 1 ? frame.xTicks[1] - frame.xTicks[0] : 1
        body += "<g class=\"oc-grid\" stroke=\"\(Self.gridColor)\" stroke-width=\"1\">"
        for tick in frame.yTicks {
            let y = coordinate(frame.py(tick * frame.yUnit.divisor))
            body += "<line x1=\"\(coordinate(frame.left))\" x2=\"\(coordinate(right))\" y1=\"\(y)\" y2=\"\(y)\"/>"
        }
        body += "</g><g class=\"oc-axis\" stroke=\"\(Self.axisColor)\" stroke-width=\"1\">"
        body += "<line x1=\"\(coordinate(frame.left))\" x2=\"\(coordinate(frame.left))\" y1=\"\(coordinate(frame.top))\" y2=\"\(coordinate(bottom))\"/>"
        body += "<line x1=\"\(coordinate(frame.left))\" x2=\"\(coordinate(right))\" y1=\"\(coordinate(bottom))\" y2=\"\(coordinate(bottom))\"/>"
        for tick in frame.xTicks {
            let x = coordinate(frame.px(tick * frame.xUnit.divisor))
            body += "<line x1=\"\(x)\" x2=\"\(x)\" y1=\"\(coordinate(bottom))\" y2=\"\(coordinate(bottom + 5))\"/>"
        }
        body += "</g><g class=\"oc-tick\" fill=\"\(Self.mutedColor)\" text-anchor=\"end\">"
        for tick in frame.yTicks {
            let y = frame.py(tick * frame.yUnit.divisor)
            body += "<text x=\"\(coordinate(frame.left - 6))\" y=\"\(coordinate(y + 4))\">\(escapeXML(tickLabel(tick, step: frame.yScale.step)))</text>"
        }
        body += "</g><g class=\"oc-tick\" fill=\"\(Self.mutedColor)\" text-anchor=\"middle\">"
        for tick in frame.xTicks {
            let x = frame.px(tick * frame.xUnit.divisor)
            body += "<text x=\"\(coordinate(x))\" y=\"\(coordinate(bottom + 18))\">\(escapeXML(tickLabel(tick, step: xStep)))</text>"
        }
        body += "</g>"
        body += "<text class=\"oc-label\" x=\"\(coordinate(frame.left + frame.plotWidth / 2))\" y=\"\(coordinate(height - 8))\" text-anchor=\"middle\">"
        body += "\(escapeXML(axisTitle(frame.xAxis, frame.xUnit)))</text>"
        body += "<text class=\"oc-label\" transform=\"rotate(-90)\" x=\"\(coordinate(-(frame.top + frame.plotHeight / 2)))\" y=\"16\" text-anchor=\"middle\">"
        body += "\(escapeXML(axisTitle(frame.yAxis, frame.yUnit)))</text>"
        if empty {
            body += "<text class=\"oc-tick\" fill=\"\(Self.mutedColor)\" x=\"\(coordinate(frame.left + frame.plotWidth / 2))\" "
            body += "y=\"\(coordinate(frame.top + frame.plotHeight / 2))\" text-anchor=\"middle\">No data</text>"
        }
        drawLegend()
    }

    private mutating func drawLegend() {
        guard !legend.isEmpty else { return }
        body += "<g class=\"oc-legend\">"
        for (entry, x, y) in legend {
            body += "<g class=\"\(entry.color.cssClass)\" color=\"\(entry.color.hex)\">"
            switch (entry.swatch, entry.style) {
            case (.box, .solid):
                body += "<rect x=\"\(coordinate(x))\" y=\"\(coordinate(y + 1))\" width=\"14\" height=\"14\" rx=\"2\" fill=\"currentColor\"/>"
            case (.box, .outline):
                body +=
                    "<rect x=\"\(coordinate(x + 0.7))\" y=\"\(coordinate(y + 1.7))\" width=\"12.6\" height=\"12.6\" rx=\"2\" fill=\"currentColor\" fill-opacity=\"0.14\" "
                body += "stroke=\"currentColor\" stroke-width=\"1.4\" stroke-dasharray=\"4 3\"/>"
            case (.line, let style):
                body +=
                    "<line x1=\"\(coordinate(x))\" x2=\"\(coordinate(x + 16))\" y1=\"\(coordinate(y + 8))\" y2=\"\(coordinate(y + 8))\" stroke=\"currentColor\" stroke-width=\"3\""
                body += style == .outline ? " stroke-dasharray=\"5 3\"/>" : "/>"
            }
            body += "</g><text x=\"\(coordinate(x + 20))\" y=\"\(coordinate(y + 12.5))\">\(escapeXML(entry.name))</text>"
        }
        body += "</g>"
    }

    /// Opens a series' group (`</g>` closes it): its colour as a class and as `color`, which marks paint with.
    mutating func openSeries(_ series: Series, index: Int) {
        let color = series.resolvedColor(index: index)
        body += "<g class=\"oc-series \(color.cssClass)\" color=\"\(color.hex)\">"
    }

    /// The whole SVG element.
    func finish() -> String {
        let label = escapeXML(title)
        return "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"oc-chart\" viewBox=\"0 0 \(coordinate(width)) \(coordinate(height))\" width=\"100%\" "
            + "role=\"img\" aria-label=\"\(label)\" font-family=\"system-ui, -apple-system, Segoe UI, Roboto, sans-serif\" "
            + "font-size=\"\(coordinate(Self.fontSize))\" fill=\"\(Self.textColor)\"><title>\(label)</title><desc>\(escapeXML(summary))</desc>"
            + body + "</svg>"
    }
}

/// "accuracy (%)", "bytes (MB)", "round".
private func axisTitle(_ axis: Axis, _ unit: DisplayUnit) -> String {
    unit.symbol.isEmpty ? axis.label : "\(axis.label) (\(unit.symbol))"
}

/// The largest finite magnitude among `values` (0 for none).
private func magnitude(_ values: [Double]) -> Double {
    values.lazy.filter(\.isFinite).map(abs).max() ?? 0
}

/// The width of `text` at the chart's font size, roughly (0.56 em a character).
func textWidth(_ text: String) -> Double {
    Double(text.count) * Canvas.fontSize * 0.56
}

/// A point of a series.
public struct Point: Sendable, Hashable {
    /// Horizontal value (a round, a time, ε).
    public var x: Double
    /// Vertical value.
    public var y: Double

    /// Creates a point.
    public init(x: Double, y: Double) {
        self.x = x
        self.y = y
    }
}

/// The palette: each colour has at least 4.5:1 contrast on white, and a CSS class (`oc-blue`, …) whose `color` a page
/// may set (e.g. for a dark theme); the SVG's marks paint with `currentColor`.
public enum ChartColor: String, Sendable, Hashable, CaseIterable {
    case blue, orange, green, purple, red, teal, brown, grey

    /// The colour used where no stylesheet sets one (contrast ≥ 4.5:1 on white).
    public var hex: String {
        switch self {
        case .blue: "#1f5fad"
        case .orange: "#b45309"
        case .green: "#177245"
        case .purple: "#7b3fa6"
        case .red: "#b3261e"
        case .teal: "#0f7482"
        case .brown: "#8a5a2b"
        case .grey: "#5f6368"
        }
    }

    /// The CSS class carrying the colour: `oc-` and the name.
    public var cssClass: String { "oc-\(rawValue)" }
}

/// How a series is drawn.
public enum SeriesStyle: Sendable, Hashable {
    /// Solid line or filled bar.
    case solid
    /// Dashed line, or a bar outlined with a dashed stroke and a faint fill (a reference such as "assigned").
    case outline
}

/// A named series of points.
public struct Series: Sendable, Hashable {
    /// The legend's name.
    public var name: String
    /// The points, in drawing order; non-finite ones are left out (a line breaks there).
    public var points: [Point]
    /// The colour; nil takes the palette's next one by position.
    public var color: ChartColor?
    /// Solid or outlined.
    public var style: SeriesStyle

    /// Creates a series.
    public init(_ name: String, points: [Point], color: ChartColor? = nil, style: SeriesStyle = .solid) {
        self.name = name
        self.points = points
        self.color = color
        self.style = style
    }

    /// Creates a series from (x, y) pairs.
    public init(_ name: String, _ pairs: [(x: Double, y: Double)], color: ChartColor? = nil, style: SeriesStyle = .solid) {
        self.init(name, points: pairs.map { Point(x: $0.x, y: $0.y) }, color: color, style: style)
    }
}

/// An axis: its label, how its values are written, and its extent.
public struct Axis: Sendable, Hashable {
    /// What the axis measures ("round", "accuracy"); the unit is added in parentheses.
    public var label: String
    /// How values are written (and whether ticks are whole numbers).
    public var format: ValueFormat
    /// Whether a value axis starts from 0; nil: when sensible (see ``NiceScale``). Horizontal axes span the data.
    public var includesZero: Bool?
    /// A fixed extent in data units (e.g. 0…1 for a fraction), nil to follow the data.
    public var range: ClosedRange<Double>?

    /// Creates an axis.
    public init(_ label: String, format: ValueFormat = .plain, includesZero: Bool? = nil, range: ClosedRange<Double>? = nil) {
        self.label = label
        self.format = format
        self.includesZero = includesZero
        self.range = range
    }
}

/// A line chart: several series against one horizontal axis, a legend when there is more than one, optional markers.
public struct LineChart: Sendable, Hashable {
    /// The chart's accessible name (`<title>`, `aria-label`); the page shows its own heading.
    public var title: String
    /// A longer text alternative (`<desc>`); nil: a summary of each series is written.
    public var summary: String?
    /// The horizontal axis.
    public var x: Axis
    /// The vertical axis.
    public var y: Axis
    /// The lines.
    public var series: [Series]
    /// Whether points get markers (with a tooltip each); nil: when a series has at most 60 points.
    public var markers: Bool?
    /// The drawing's width in `viewBox` units (CSS pixels at 100 % zoom when drawn at that width).
    public var width: Double
    /// The drawing's height in `viewBox` units.
    public var height: Double

    /// Creates a line chart.
    public init(
        title: String, summary: String? = nil, x: Axis, y: Axis, series: [Series], markers: Bool? = nil, width: Double = 720, height: Double = 280
    ) {
        self.title = title
        self.summary = summary
        self.x = x
        self.y = y
        self.series = series
        self.markers = markers
        self.width = width
        self.height = height
    }

    /// The chart as an SVG element (width 100 %, scaled by its `viewBox`).
    public func render() -> String {
        let lines = series.map { $0.finitePoints }
        let all = lines.flatMap { $0 }
        var canvas = Canvas(
            title: title, summary: summary ?? describe(kind: "Line chart", x: x, y: y, series: series), width: width, height: height,
            legend: series.count > 1 ? legendEntries(series, swatch: .line) : []
        )
        let frame = canvas.frame(x: x, y: y, xValues: all.map(\.x), yValues: all.map(\.y), xPadding: 0)
        canvas.drawAxes(frame, empty: all.isEmpty)
        for (index, line) in lines.enumerated() where !line.isEmpty {
            let s = series[index]
            let showMarkers = line.count == 1 || (markers ?? (line.count <= 60))
            canvas.openSeries(s, index: index)
            for segment in s.segments where segment.count > 1 {
                let path = segment.map { "\(coordinate(frame.px($0.x))),\(coordinate(frame.py($0.y)))" }.joined(separator: " ")
                canvas.body +=
                    "<polyline points=\"\(path)\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"2.2\" stroke-linejoin=\"round\" stroke-linecap=\"round\""
                canvas.body += s.style == .outline ? " stroke-dasharray=\"6 4\"/>" : "/>"
            }
            if showMarkers {
                for p in line {
                    canvas.body += "<circle cx=\"\(coordinate(frame.px(p.x)))\" cy=\"\(coordinate(frame.py(p.y)))\" r=\"3.2\" fill=\"currentColor\">"
                    canvas.body += "<title>\(escapeXML("\(s.name) at \(x.label) \(x.format.format(p.x)): \(y.format.format(p.y))"))</title></circle>"
                }
            }
            canvas.body += "</g>"
        }
        return canvas.finish()
    }
}

/// A stacked bar chart: one bar per horizontal value (a round, a cycle), each series a segment stacked in order from
/// the bottom, so a bar's height is the sum of its series' values (negative and non-finite values count as 0).
public struct BarChart: Sendable, Hashable {
    /// The chart's accessible name (`<title>`, `aria-label`).
    public var title: String
    /// A longer text alternative (`<desc>`); nil: a summary of each series is written.
    public var summary: String?
    /// The horizontal axis (the bars' categories).
    public var x: Axis
    /// The vertical axis (it always starts from 0).
    public var y: Axis
    /// The stacked series, bottom first.
    public var series: [Series]
    /// The drawing's width in `viewBox` units.
    public var width: Double
    /// The drawing's height in `viewBox` units.
    public var height: Double

    /// Creates a stacked bar chart.
    public init(title: String, summary: String? = nil, x: Axis, y: Axis, series: [Series], width: Double = 720, height: Double = 280) {
        self.title = title
        self.summary = summary
        self.x = x
        self.y = y
        self.series = series
        self.width = width
        self.height = height
    }

    /// Each category's stack: its horizontal value and the (bottom, top) of each series' segment, in data units.
    public func stacks() -> [(x: Double, segments: [(bottom: Double, top: Double)])] {
        let categories = Set(series.flatMap { $0.finitePoints.map(\.x) }).sorted()
        let values = series.map { s in Dictionary(s.finitePoints.map { ($0.x, max(0, $0.y)) }, uniquingKeysWith: +) }
        return categories.map { category in
            var bottom = 0.0
            return (
                category,
                values.map { value in
                    let top = bottom + (value[category] ?? 0)
                    defer { bottom = top }
                    return (bottom, top)
                }
            )
        }
    }

    /// The chart as an SVG element (width 100 %, scaled by its `viewBox`).
    public func render() -> String {
        let stacks = stacks()
        let categories = stacks.map(\.x)
        let gaps = zip(categories.dropFirst(), categories).map { $0 - $1 }
        let band = gaps.min() ?? 1
        var axis = y
        axis.includesZero = true
        var canvas = Canvas(
            title: title, summary: summary ?? describe(kind: "Stacked bar chart", x: x, y: y, series: series), width: width, height: height,
            legend: legendEntries(series, swatch: .box)
        )
        let frame = canvas.frame(x: x, y: axis, xValues: categories, yValues: stacks.map { $0.segments.last?.top ?? 0 }, xPadding: band / 2)
        canvas.drawAxes(frame, empty: stacks.isEmpty)
        let barWidth = max(1, frame.px(band) - frame.px(0)) * (stacks.count > 60 ? 0.9 : 0.72)
        for (index, s) in series.enumerated() {
            canvas.openSeries(s, index: index)
            for stack in stacks {
                let (bottom, top) = stack.segments[index]
                guard top > bottom else { continue }
                let y0 = frame.py(bottom), y1 = frame.py(top)
                canvas.body +=
                    "<rect x=\"\(coordinate(frame.px(stack.x) - barWidth / 2))\" y=\"\(coordinate(y1))\" width=\"\(coordinate(barWidth))\" height=\"\(coordinate(y0 - y1))\""
                canvas.body +=
                    s.style == .outline
                    ? " fill=\"currentColor\" fill-opacity=\"0.14\" stroke=\"currentColor\" stroke-width=\"1.4\" stroke-dasharray=\"4 3\">"
                    : " fill=\"currentColor\">"
                canvas.body += "<title>\(escapeXML("\(x.label) \(x.format.format(stack.x)), \(s.name): \(y.format.format(top - bottom))"))</title></rect>"
            }
            canvas.body += "</g>"
        }
        return canvas.finish()
    }
}

extension Series {
    /// The finite points.
    var finitePoints: [Point] { points.filter { $0.x.isFinite && $0.y.isFinite } }

    /// Runs of finite points (a non-finite point breaks the line).
    var segments: [[Point]] {
        var runs: [[Point]] = [[]]
        for p in points {
            if p.x.isFinite && p.y.isFinite { runs[runs.count - 1].append(p) } else if !runs[runs.count - 1].isEmpty { runs.append([]) }
        }
        return runs.filter { !$0.isEmpty }
    }

    /// The colour of the series at `index`.
    func resolvedColor(index: Int) -> ChartColor { color ?? ChartColor.allCases[index % ChartColor.allCases.count] }
}

/// The `<desc>` of a chart: what each series goes through.
private func describe(kind: String, x: Axis, y: Axis, series: [Series]) -> String {
    var parts = ["\(kind) of \(y.label) by \(x.label)."]
    for s in series {
        let points = s.finitePoints
        guard let first = points.first, let last = points.last, let low = points.map(\.y).min(), let high = points.map(\.y).max() else {
            parts.append("\(s.name): no data.")
            continue
        }
        parts.append(
            "\(s.name): \(points.count) point\(points.count == 1 ? "" : "s"), \(y.format.format(first.y)) at \(x.label) \(x.format.format(first.x)) to "
                + "\(y.format.format(last.y)) at \(x.label) \(x.format.format(last.x)), lowest \(y.format.format(low)), highest \(y.format.format(high))."
        )
    }
    return parts.joined(separator: " ")
}

/// The legend's entries.
private func legendEntries(_ series: [Series], swatch: Canvas.Swatch) -> [Canvas.LegendEntry] {
    series.enumerated().map { Canvas.LegendEntry(name: $1.name, color: $1.resolvedColor(index: $0), style: $1.style, swatch: swatch) }
}

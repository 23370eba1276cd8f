import OrchardCharts
import Testing

@Suite struct NiceTicksTests {
    @Test func aValueAxisStepsByOneTwoOrFive() {
        #expect(niceTicks(from: 0, to: 8.3) == [0, 2, 4, 6, 8])
        #expect(niceTicks(from: 0, to: 0.5) == [0, 0.1, 0.2, 0.3, 0.4, 0.5], "no 0.30000000000000004")
        #expect(niceTicks(from: 0, to: 100) == [0, 20, 40, 60, 80, 100])
        #expect(niceTicks(from: 8.3, to: 0) == [0, 2, 4, 6, 8], "reversed bounds")
        #expect(niceTicks(from: -3, to: 3) == [-2, 0, 2])
        #expect(niceTicks(from: -3, to: 3, maxCount: 7) == [-3, -2, -1, 0, 1, 2, 3])
        for (lo, hi) in [(0.0, 8.3), (0.013, 0.92), (-47.0, 3.5), (1.0, 1_234_567), (0.7, 0.85)] {
            let ticks = niceTicks(from: lo, to: hi)
            #expect(ticks.count >= 2 && ticks.count <= 6, "\(lo)…\(hi): \(ticks)")
            let step = ticks[1] - ticks[0]
            let mantissa = step / pow10(step)
            #expect([1.0, 2, 5].contains { abs(mantissa - $0) < 1e-9 }, "\(lo)…\(hi): step \(step)")
        }
    }

    @Test func anIntegralAxisNeverHasFractionalTicks() {
        #expect(niceTicks(from: 1, to: 30, integral: true) == [10, 20, 30])
        #expect(niceTicks(from: 1, to: 30, maxCount: 12, integral: true) == [5, 10, 15, 20, 25, 30])
        #expect(niceTicks(from: 1, to: 3, integral: true) == [1, 2, 3])
        #expect(niceTicks(from: 1, to: 2, maxCount: 10, integral: true) == [1, 2])
        #expect(niceTicks(from: 1.2, to: 1.8, integral: true) == [], "no whole number in between")
        #expect(niceTicks(from: 1, to: 4, maxCount: 2, integral: true) == [2, 4], "a step of 5 would miss the range")
        for hi in 1...300 {
            for count in 2...12 {
                let ticks = niceTicks(from: 1, to: Double(hi), maxCount: count, integral: true)
                #expect(!ticks.isEmpty && ticks.count <= max(count, 3), "1…\(hi) in \(count): \(ticks)")
                let whole = ticks.allSatisfy { (tick: Double) -> Bool in tick == tick.rounded() && tick >= 1 && tick <= Double(hi) }
                #expect(whole, "1…\(hi) in \(count): \(ticks)")
            }
        }
    }

    @Test func tinyAndHugeRangesStayFinite() {
        #expect(niceTicks(from: 0, to: 1e-9) == [0, 2e-10, 4e-10, 6e-10, 8e-10, 1e-9])
        #expect(niceTicks(from: 0, to: 1e12) == [0, 2e11, 4e11, 6e11, 8e11, 1e12])
        let widest = niceTicks(from: -Double.greatestFiniteMagnitude, to: .greatestFiniteMagnitude)
        #expect(!widest.isEmpty && widest.count <= 6 && widest.allSatisfy(\.isFinite))
        let narrow = niceTicks(from: 1e15, to: 1e15 + 8)
        let base = 1e15
        #expect(narrow == [base, base + 2, base + 4, base + 6, base + 8])
        #expect(niceTicks(from: .nan, to: 1).isEmpty && niceTicks(from: 0, to: .infinity).isEmpty)
    }

    @Test func aPointAndEqualValuesGetAScaleFromZero() {
        #expect(niceTicks(from: 5, to: 5) == [5])
        let point = NiceScale(covering: [5])
        #expect(point.lower == 0 && point.upper == 5 && point.ticks == [0, 1, 2, 3, 4, 5])
        let equal = NiceScale(covering: [0.5, 0.5, 0.5])
        #expect(equal.lower == 0 && equal.upper >= 0.5 && equal.ticks.allSatisfy(\.isFinite))
        let zeros = NiceScale(covering: [0, 0])
        #expect(zeros.lower == 0 && zeros.upper == 1)
        let none = NiceScale(covering: [Double]())
        #expect(none.lower == 0 && none.upper == 1)
        let negative = NiceScale(covering: [-4, -4])
        #expect(negative.upper == 0 && negative.lower <= -4)
    }

    @Test func aScaleWidensToWholeStepsAndStartsFromZeroWhenSensible() {
        let scale = NiceScale(covering: [0, 8.3])
        #expect(scale.lower == 0 && scale.upper == 10 && scale.ticks == [0, 2, 4, 6, 8, 10])
        #expect(NiceScale(covering: [0.1, 0.85]).lower == 0, "a wide spread starts from 0")
        let narrow = NiceScale(covering: [70, 85])
        #expect(narrow.lower == 70 && narrow.upper == 85, "a narrow band is zoomed: \(narrow)")
        #expect(NiceScale(covering: [70, 85], includesZero: true).lower == 0)
        #expect(NiceScale(covering: [0.3, 0.5]).lower == 0.3, "0.3 / 0.1 is not floored to 2")
        #expect(NiceScale(covering: [7.9743, 7.9753]).lower == 0, "values within 1 % of each other are not zoomed into noise")
        #expect(NiceScale(covering: [1, 30], integral: true).ticks.allSatisfy { $0 == $0.rounded() })
        #expect(NiceScale(fixed: 0...100).ticks == [0, 20, 40, 60, 80, 100])
        let fixed = NiceScale(fixed: 2.69...3.86, maxCount: 7)
        #expect(fixed.lower == 2.69 && fixed.upper == 3.86 && fixed.ticks == [2.8, 3, 3.2, 3.4, 3.6, 3.8], "a fixed range is kept, ticks inside it")
    }

    private func pow10(_ value: Double) -> Double {
        var p = 1.0
        while p * 10 <= value * (1 + 1e-12) { p *= 10 }
        while p > value * (1 + 1e-12) { p /= 10 }
        return p
    }
}

@Suite struct ValueFormatTests {
    @Test func bytesAreShownInTheirUnit() {
        #expect(ValueFormat.bytes.format(4_084_360) == "4.1 MB")
        #expect(ValueFormat.bytes.format(512) == "512 B")
        #expect(ValueFormat.bytes.format(1500) == "1.5 kB")
        #expect(ValueFormat.bytes.format(2.5e9) == "2.5 GB")
        #expect(ValueFormat.bytes.format(0) == "0 B")
        #expect(ValueFormat.bytes.displayUnit(for: 4_084_360) == DisplayUnit(divisor: 1e6, symbol: "MB", integral: false))
    }

    @Test func percentSecondsAndCounts() {
        #expect(ValueFormat.percent.format(0.8523) == "85.2 %")
        #expect(ValueFormat.percent.format(1) == "100 %")
        #expect(ValueFormat.seconds.format(5400) == "1.5 h")
        #expect(ValueFormat.seconds.format(45) == "45 s")
        #expect(ValueFormat.seconds.format(0.25) == "250 ms")
        #expect(ValueFormat.count.format(12) == "12")
        #expect(ValueFormat.plain.format(0.45238) == "0.452")
        #expect(ValueFormat.plain.format(2.5e7) == "25 ×10⁶")
        #expect(ValueFormat.unit("ε").format(1.234) == "1.23 ε")
        #expect(ValueFormat.plain.format(.nan) == "–" && ValueFormat.bytes.format(.infinity) == "–")
    }
}

@Suite struct ChartRenderingTests {
    let rounds = Axis("round", format: .count)

    /// The `text` contents of the horizontal axis's tick labels.
    private func xTickLabels(_ svg: String) throws -> [String] {
        let group = try #require(svg.firstMatch(of: /text-anchor="middle">((?:<text [^>]*>[^<]*<\/text>)*)<\/g>/))
        return group.1.matches(of: /<text [^>]*>([^<]*)<\/text>/).map { String($0.1) }
    }

    @Test func theSVGFillsItsContainerAndIsLabelled() {
        let svg = LineChart(title: "Test accuracy", x: rounds, y: Axis("accuracy", format: .percent), series: [Series("accuracy", [(1, 0.5), (2, 0.7)])])
            .render()
        #expect(svg.hasPrefix("<svg xmlns=\"http://www.w3.org/2000/svg\""))
        #expect(svg.contains("viewBox=\"0 0 720 280\"") && svg.contains("width=\"100%\"") && svg.contains("role=\"img\""))
        #expect(svg.contains("aria-label=\"Test accuracy\"") && svg.contains("<title>Test accuracy</title>") && svg.contains("<desc>"))
        #expect(svg.contains("accuracy (%)") && svg.contains(">round<"))
        #expect(svg.contains("class=\"oc-series oc-blue\" color=\"#1f5fad\""), "colours by class, overridable by a page's CSS")
        #expect(!svg.contains("style="), "no inline style (a strict CSP would refuse it)")
    }

    @Test func roundsAreTickedWithWholeNumbers() throws {
        for count in [3, 8, 23, 30, 97] {
            let points = (1...count).map { (x: Double($0), y: Double($0) * 0.1) }
            for width in [320.0, 720, 1200] {
                let svg = LineChart(title: "t", x: rounds, y: Axis("loss"), series: [Series("loss", points)], width: width).render()
                let labels = try xTickLabels(svg)
                #expect(labels.count >= 2, "\(count) rounds at \(width): \(labels)")
                #expect(labels.allSatisfy { Int($0) != nil }, "\(count) rounds at \(width): \(labels)")
            }
        }
    }

    @Test func bytesAxesAreInMegabytesWithOneTwoFiveTicks() throws {
        let svg = LineChart(
            title: "Bytes per round", x: rounds, y: Axis("bytes", format: .bytes),
            series: [Series("up", [(1, 4_084_360), (2, 4_084_360), (3, 8_168_720)])]
        ).render()
        #expect(svg.contains("bytes (MB)"))
        #expect(!svg.contains("4084360"))
        let yLabels = try #require(svg.firstMatch(of: /text-anchor="end">((?:<text [^>]*>[^<]*<\/text>)*)<\/g>/))
        let values = yLabels.1.matches(of: /<text [^>]*>([^<]*)<\/text>/).map { String($0.1) }
        #expect(values == ["0", "2", "4", "6", "8", "10"] || values == ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"], "\(values)")
    }

    @Test func stackedBarsSumToTheirTotals() throws {
        let chart = BarChart(
            title: "Participation", x: rounds, y: Axis("devices", format: .count),
            series: [
                Series("aggregated", [(1, 5), (2, 0), (3, 7)], color: .blue),
                Series("dropouts", [(1, 2), (2, 3), (3, 1)], color: .red),
                Series("late", [(1, 1), (2, 4), (3, 0)], color: .orange, style: .outline),
            ])
        let stacks = chart.stacks()
        #expect(stacks.map(\.x) == [1, 2, 3])
        #expect(stacks.map { $0.segments.last!.top } == [8, 7, 8])
        #expect(stacks.allSatisfy { zip($0.segments, $0.segments.dropFirst()).allSatisfy { $0.top == $1.bottom } && $0.segments[0].bottom == 0 })

        // In the drawing: per bar, segments touch and their heights add up in proportion to the totals.
        let svg = chart.render()
        var bars: [String: [(y: Double, height: Double)]] = [:]
        for match in svg.matches(of: /<rect x="([-0-9.]+)" y="([-0-9.]+)" width="[-0-9.]+" height="([-0-9.]+)"[^>]*><title>/) {
            bars[String(match.1), default: []].append((Double(match.2)!, Double(match.3)!))
        }
        try #require(bars.count == 3, "\(bars)")
        let sorted = bars.sorted { Double($0.key)! < Double($1.key)! }.map { $0.value.sorted { $0.y < $1.y } }
        let baselines = sorted.map { $0.last!.y + $0.last!.height }
        #expect(baselines.allSatisfy { abs($0 - baselines[0]) < 0.15 }, "\(baselines)")
        for bar in sorted {
            for (upper, lower) in zip(bar, bar.dropFirst()) { #expect(abs(upper.y + upper.height - lower.y) < 0.15, "\(bar)") }
        }
        let heights = sorted.map { $0.reduce(0) { $0 + $1.height } }
        #expect(abs(heights[0] / heights[1] - 8.0 / 7.0) < 0.01 && abs(heights[0] - heights[2]) < 0.2, "\(heights)")
        #expect(svg.contains("stroke-dasharray=\"4 3\""), "the outlined series")
        #expect(svg.contains("<title>round 1, aggregated: 5</title>"))
    }

    @Test func titlesLegendsAndLabelsAreEscaped() {
        let nasty = "a<b & \"c\" 'd'"
        let line = LineChart(
            title: nasty, x: Axis("x<y"), y: Axis("m&m"),
            series: [Series(nasty, [(1, 1), (2, 2)]), Series("</svg><script>alert(1)</script>", [(1, 2), (2, 3)])]
        ).render()
        let bar = BarChart(title: nasty, x: rounds, y: Axis("n", format: .count), series: [Series(nasty, [(1, 1)])]).render()
        for svg in [line, bar] {
            #expect(svg.contains("a&lt;b &amp; &quot;c&quot; &#39;d&#39;"))
            #expect(!svg.contains("a<b") && !svg.contains("<script") && !svg.contains("\"c\""))
            #expect(svg.matches(of: /<\/svg>/).count == 1, "one closing tag")
        }
        #expect(line.contains("x&lt;y") && line.contains("m&amp;m"))
        #expect(escapeXML("bell\u{7}") == "bell\u{FFFD}")
    }

    @Test func degenerateDataNeverWritesNaNOrInfinity() {
        let cases: [[Series]] = [
            [],
            [Series("empty", points: [])],
            [Series("one", [(3, 0.5)])],
            [Series("equal", [(1, 2), (2, 2), (3, 2)])],
            [Series("zeros", [(1, 0), (2, 0)])],
            [Series("holes", [(1, 1), (2, .nan), (3, .infinity), (.nan, 4), (5, 2)])],
            [Series("huge", [(0, -1e308), (1, 1e308)])],
            [Series("tiny", [(0, 1e-300), (1e-300, 2e-300)])],
            [Series("same x", [(7, 1), (7, 2)])],
        ]
        for series in cases {
            for format in [ValueFormat.plain, .count, .bytes, .percent, .seconds] {
                let line = LineChart(title: "t", x: Axis("x", format: format), y: Axis("y", format: format), series: series).render()
                let bar = BarChart(title: "t", x: Axis("x", format: format), y: Axis("y", format: format), series: series).render()
                let narrow = LineChart(title: "t", x: rounds, y: Axis("y", format: format), series: series, width: .nan, height: -5).render()
                for svg in [line, bar, narrow] {
                    let lower = svg.lowercased()
                    #expect(!lower.contains("nan") && !lower.contains("inf"), "\(series.map(\.name)) \(format): \(svg)")
                }
            }
        }
        #expect(LineChart(title: "t", x: rounds, y: Axis("y"), series: []).render().contains("No data"))
    }
}

import OrchardProtocol
import Testing

/// Names (processes, metrics) and reported metrics: what one device or operator can put in front of another person on
/// the dashboard, in the cycle history and in the charts.
@Suite struct NameAndMetricLimitsTests {
    @Test func namesThatCouldPassForOthersAreRefused() {
        for good in ["loss", "train_loss", "num-examples", "précision", "Keyboard v2", "検証"] {
            #expect(WireLimits.nameFailure(good, field: "name") == nil, "\(good)")
        }
        let bad: [(String, String)] = [
            ("ssol\u{202E}", "a right-to-left override"), ("lo\u{200B}ss", "a zero-width space"), ("loss\u{2028}", "a line separator"),
            ("a\u{0085}b", "a C1 control"), ("a\u{7F}", "DEL"), ("\tloss", "a tab"), (" log perplexity", "a leading space"),
            ("loss ", "a trailing space"), ("", "nothing"), (String(repeating: "a", count: WireLimits.maximumNameLength + 1), "too long"),
        ]
        for (name, what) in bad { #expect(WireLimits.nameFailure(name, field: "name") != nil, "\(what)") }
    }

    @Test func reportedMetricsAreBoundedNamedAndFinite() {
        #expect(WireLimits.metricsFailure(["loss": 0.5, "accuracy": 0.9]) == nil)
        #expect(WireLimits.metricsFailure(Dictionary(uniqueKeysWithValues: (0..<17).map { ("m\($0)", 1.0) }))?.contains("at most 16") == true)
        #expect(WireLimits.metricsFailure(["loss": .nan]) != nil && WireLimits.metricsFailure(["loss": .infinity]) != nil)
        #expect(WireLimits.metricsFailure(["loss": 1.7e308])?.contains("magnitude") == true)
        #expect(WireLimits.metricsFailure([" log perplexity": -40]) != nil)
    }
}

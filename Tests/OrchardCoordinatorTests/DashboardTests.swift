import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import OrchardCoordinator
import OrchardProtocol
import OrchardSupport
import OrchardTesting
import Testing

/// Does not follow redirects, so a test sees the 303 and its `Set-Cookie`.
private final class NoRedirects: NSObject, URLSessionTaskDelegate, Sendable {
    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse, newRequest request: URLRequest,
        completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        completionHandler(nil)
    }
}

/// A browser-like client of the dashboard's HTML routes (not in the OpenAPI document): no redirects followed, no
/// cookie jar (cookies are sent by hand).
private struct Browser {
    let base: URL
    let session: URLSession

    init(base: URL) {
        self.base = base
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        configuration.urlCache = nil
        session = URLSession(configuration: configuration, delegate: NoRedirects(), delegateQueue: nil)
    }

    func send(_ path: String, method: String = "GET", cookie: String? = nil, token: String? = nil, form: String? = nil) async throws -> HTTPResult {
        var request = URLRequest(url: URL(string: base.absoluteString + path)!)
        request.httpMethod = method
        if let cookie { request.setValue("\(Dashboard.cookieName)=\(cookie)", forHTTPHeaderField: "Cookie") }
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        if let form {
            request.httpBody = Data(form.utf8)
            request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        }
        let (data, response) = try await session.data(for: request)
        let http = try #require(response as? HTTPURLResponse)
        var fields: [String: String] = [:]
        for (key, value) in http.allHeaderFields { fields["\(key)"] = "\(value)" }
        return HTTPResult(status: http.statusCode, headers: fields, body: [UInt8](data))
    }
}

extension HTTPResult {
    fileprivate var text: String { String(decoding: body, as: UTF8.self) }

    /// The session in a `Set-Cookie: orchard_dashboard=…` header.
    fileprivate var sessionCookie: String? {
        guard let header = header("Set-Cookie"), let range = header.range(of: "\(Dashboard.cookieName)=") else { return nil }
        return String(header[range.upperBound...].prefix { $0 != ";" })
    }
}

@Suite struct DashboardAccessTests {
    let start = WallInstant(sinceEpoch: .seconds(1_700_000_000))

    @Test func aLoginTokenWorksOnceAndOnlyBeforeItExpires() {
        var access = DashboardAccess(loginLifetime: .seconds(60), sessionLifetime: .seconds(600))
        let token = access.issueLoginToken(now: start)
        #expect(token.count == 64)
        let session = access.redeem(loginToken: token, now: start.advanced(by: .seconds(59)))
        #expect(session != nil && session != token)
        #expect(access.redeem(loginToken: token, now: start.advanced(by: .seconds(59))) == nil, "a second use")
        let late = access.issueLoginToken(now: start)
        #expect(access.redeem(loginToken: late, now: start.advanced(by: .seconds(60))) == nil, "expired")
        #expect(access.redeem(loginToken: late, now: start) == nil, "refused once, forgotten")
        #expect(access.redeem(loginToken: "forged", now: start) == nil)
        #expect(access.issueLoginToken(now: start) != access.issueLoginToken(now: start))
    }

    @Test func aSessionLastsItsLifetime() throws {
        var access = DashboardAccess(loginLifetime: .seconds(60), sessionLifetime: .seconds(600))
        let token = access.issueLoginToken(now: start)
        let redeemed = access.redeem(loginToken: token, now: start)
        let session = try #require(redeemed)
        #expect(access.isValid(session: session, now: start.advanced(by: .seconds(599))))
        #expect(!access.isValid(session: session, now: start.advanced(by: .seconds(600))))
        #expect(!access.isValid(session: nil, now: start))
        #expect(!access.isValid(session: session + "0", now: start))
        let other = access.startSession(now: start)
        access.end(session: other)
        #expect(!access.isValid(session: other, now: start))
    }

    @Test func theOldestSessionGivesWayBeyondTheCap() {
        var access = DashboardAccess(maximumSessions: 2)
        let first = access.startSession(now: start)
        let second = access.startSession(now: start.advanced(by: .seconds(1)))
        let third = access.startSession(now: start.advanced(by: .seconds(2)))
        let now = start.advanced(by: .seconds(3))
        #expect(!access.isValid(session: first, now: now))
        #expect(access.isValid(session: second, now: now) && access.isValid(session: third, now: now))
        #expect(access.sessionCount == 2)
    }
}

@Suite struct DashboardTests {
    static let secretName = "secret-process-name"

    private func started() async throws -> (Harness, Browser, ProcessStatus) {
        let harness = try await Harness.start()
        let hosted = try await harness.host(Fixture.host(name: Self.secretName, goal: 1, minimum: 1, overSelection: 1, cycleLength: 60))
        return (harness, Browser(base: harness.http.base), hosted)
    }

    @Test func withoutASessionThePageShowsNoAdminDataAndTheAdminAPIRefuses() async throws {
        let (harness, browser, hosted) = try await started()
        try await harness.stopping {
            let page = try await browser.send(Endpoint.dashboard)
            #expect(page.status == 200)
            #expect(page.header("Content-Type")?.hasPrefix("text/html") == true)
            #expect(page.text.contains("login URL") && page.text.contains("orchard serve"))
            #expect(!page.text.contains(Self.secretName) && !page.text.contains(hosted.processID))
            #expect(!page.text.contains("<script"), "the sign-in page runs nothing")
            #expect(try await harness.http.send("GET", Endpoint.processes).status == 401)
            #expect(try await harness.http.send("GET", Endpoint.process(hosted.processID)).status == 401)
            #expect(try await harness.http.send("GET", Endpoint.cycles(hosted.processID)).status == 401)
            #expect(try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, "0")).status == 401)
            // A forged cookie changes nothing.
            #expect(try await browser.send(Endpoint.dashboard, cookie: "forged").text.contains("login URL"))
            #expect(
                try await harness.http.send("GET", Endpoint.processes, headers: ["Cookie": "\(Dashboard.cookieName)=\(String(repeating: "0", count: 64))"])
                    .status == 401)
        }
    }

    @Test func theLoginURLSetsAStrictHttpOnlyCookieThatOpensTheAdminAPIForReading() async throws {
        let (harness, browser, hosted) = try await started()
        try await harness.stopping {
            let token = harness.instance.dashboard.issueLoginToken()
            let login = try await browser.send(Endpoint.dashboardLogin + "?token=\(token)")
            #expect(login.status == 303)
            #expect(login.header("Location") == Endpoint.dashboard)
            let setCookie = try #require(login.header("Set-Cookie"))
            let attributes = Set(setCookie.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces).lowercased() })
            #expect(attributes.contains("httponly"))
            #expect(attributes.contains("samesite=strict"))
            #expect(attributes.contains("path=/"))
            #expect(!attributes.contains("secure"), "plain HTTP here; Secure is set over TLS")
            let session = try #require(login.sessionCookie)
            #expect(session.count == 64 && session != token)

            // The cookie admits the page's reads, through the documented (conformance-checked) admin API.
            let cookie = ["Cookie": "\(Dashboard.cookieName)=\(session)"]
            let list = try await harness.http.send("GET", Endpoint.processes, headers: cookie)
            #expect(list.status == 200)
            #expect(try list.decode(ProcessList.self).processes.map(\.name) == [Self.secretName])
            #expect(try await harness.http.send("GET", Endpoint.process(hosted.processID), headers: cookie).status == 200)
            #expect(try await harness.http.send("GET", Endpoint.cycles(hosted.processID), headers: cookie).status == 200)
            #expect(try await harness.http.send("GET", Endpoint.checkpoint(hosted.processID, "0"), headers: cookie).status == 200)
            // Not writes: hosting and deleting still take the admin token.
            #expect(try await harness.http.send("DELETE", Endpoint.process(hosted.processID), headers: cookie).status == 401)
            let page = try await browser.send(Endpoint.dashboard, cookie: session)
            #expect(page.status == 200 && page.text.contains("Reports per cycle") && page.text.contains("<script>"))

            // The link works once.
            let again = try await browser.send(Endpoint.dashboardLogin + "?token=\(token)")
            #expect(again.status == 401)
            #expect(again.header("Set-Cookie") == nil)
            #expect(try await browser.send(Endpoint.dashboardLogin + "?token=forged").status == 401)
            #expect(try await browser.send(Endpoint.dashboardLogin).status == 401)

            // Signing out ends the session.
            let out = try await browser.send(Endpoint.dashboardLogout, method: "POST", cookie: session)
            #expect(out.status == 303)
            #expect(try await harness.http.send("GET", Endpoint.processes, headers: cookie).status == 401)
        }
    }

    @Test func theCookieIsSecureOverTLS() {
        // The router sets `secureCookie` when the application serves TLS (`CoordinatorServer.application(tls:)`).
        let attributes = { (secure: Bool) in
            Set(
                CoordinatorServer.sessionCookie("abc", maxAge: 60, secure: secure).split(separator: ";").map {
                    $0.trimmingCharacters(in: .whitespaces).lowercased()
                })
        }
        #expect(attributes(true).isSuperset(of: ["orchard_dashboard=abc", "secure", "httponly", "samesite=strict", "path=/", "max-age=60"]))
        #expect(!attributes(false).contains("secure"))
    }

    @Test func anExpiredLoginTokenIsRefused() async throws {
        let (harness, browser, _) = try await started()
        try await harness.stopping {
            let token = harness.instance.dashboard.issueLoginToken()
            harness.clock.advance(bySeconds: 24 * 3600)
            let login = try await browser.send(Endpoint.dashboardLogin + "?token=\(token)")
            #expect(login.status == 401)
            #expect(login.sessionCookie == nil)
            // A session expires too.
            let fresh = harness.instance.dashboard.issueLoginToken()
            let session = try #require(try await browser.send(Endpoint.dashboardLogin + "?token=\(fresh)").sessionCookie)
            #expect(try await harness.http.send("GET", Endpoint.processes, headers: ["Cookie": "\(Dashboard.cookieName)=\(session)"]).status == 200)
            harness.clock.advance(bySeconds: 12 * 3600)
            #expect(try await harness.http.send("GET", Endpoint.processes, headers: ["Cookie": "\(Dashboard.cookieName)=\(session)"]).status == 401)
        }
    }

    @Test func theAdminTokenOpensThePageAsABearerOrThroughTheForm() async throws {
        let (harness, browser, _) = try await started()
        try await harness.stopping {
            #expect(try await browser.send(Endpoint.dashboard, token: Harness.adminToken).text.contains("Reports per cycle"))
            #expect(try await browser.send(Endpoint.dashboard, token: "wrong").text.contains("login URL"))
            let refused = try await browser.send(Endpoint.dashboardLogin, method: "POST", form: "token=wrong")
            #expect(refused.status == 401 && refused.sessionCookie == nil)
            let login = try await browser.send(Endpoint.dashboardLogin, method: "POST", form: "token=\(Harness.adminToken)")
            #expect(login.status == 303)
            let session = try #require(login.sessionCookie)
            #expect(try await harness.http.send("GET", Endpoint.processes, headers: ["Cookie": "\(Dashboard.cookieName)=\(session)"]).status == 200)
            // A login token through the form works once, too.
            let token = harness.instance.dashboard.issueLoginToken()
            #expect(try await browser.send(Endpoint.dashboardLogin, method: "POST", form: "token=\(token)").status == 303)
            #expect(try await browser.send(Endpoint.dashboardLogin, method: "POST", form: "token=\(token)").status == 401)
        }
    }

    @Test func withoutAnAdminTokenThereIsNoDashboard() async throws {
        let harness = try await Harness.start(configuration: CoordinatorConfiguration())
        try await harness.stopping { () async throws in
            let browser = Browser(base: harness.http.base)
            #expect(try await browser.send(Endpoint.dashboard).status == 404)
            let token = harness.instance.dashboard.issueLoginToken()
            #expect(try await browser.send(Endpoint.dashboardLogin + "?token=\(token)").status == 404)
            let session = harness.instance.dashboard.startSession()
            #expect(try await harness.http.send("GET", Endpoint.processes, headers: ["Cookie": "\(Dashboard.cookieName)=\(session)"]).status == 401)
        }
    }

    @Test func thePagesAreSelfContained() async throws {
        let (harness, browser, _) = try await started()
        try await harness.stopping {
            for page in [try await browser.send(Endpoint.dashboard), try await browser.send(Endpoint.dashboard, token: Harness.adminToken)] {
                let html = page.text.lowercased()
                for external in ["http://", "https://", "src=\"//", "href=\"//", "url(", "@import", "<link", "<iframe", "<img"] {
                    #expect(!html.contains(external), "the page holds \(external)")
                }
                #expect(html.contains("<html lang=\"en\">") && html.contains("name=\"viewport\""))
                let policy = try #require(page.header("Content-Security-Policy"))
                #expect(policy.contains("default-src 'none'") && policy.contains("connect-src 'self'") && !policy.contains("unsafe-inline"))
                #expect(page.header("Cache-Control") == "no-store")
            }
        }
    }

    @Test func theCycleHistoryRecordsOutcomesParticipationAndMeanMetrics() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 2, minimum: 2, overSelection: 1, cycleLength: 60))
            let empty = try await harness.http.send("GET", Endpoint.cycles(hosted.processID), token: Harness.adminToken)
            #expect(try empty.decode(ProcessCycles.self) == ProcessCycles(processID: hosted.processID, cycles: []))

            // Cycle 1: one report of two, abandoned at the deadline.
            let first = try await harness.device()
            #expect(try await harness.report(first, try await harness.join(first), diff: Fixture.diff(0.1), samples: 5).status == 200)
            harness.clock.advance(bySeconds: 61)
            await harness.coordinator.tick()
            // Cycle 2: two reports, aggregated.
            let devices = [try await harness.device(), try await harness.device()]
            for device in devices {
                #expect(try await harness.report(device, try await harness.join(device), diff: Fixture.diff(0.2), samples: 5).status == 200)
            }
            let result = try await harness.http.send("GET", Endpoint.cycles(hosted.processID), token: Harness.adminToken)
            #expect(result.status == 200)
            let cycles = try result.decode(ProcessCycles.self).cycles
            try #require(cycles.count == 2)
            #expect(
                cycles[0].cycle == 1 && cycles[0].outcome == .abandoned && cycles[0].assigned == 1 && cycles[0].reported == 1 && cycles[0].checkpoint == nil)
            #expect(cycles[1].cycle == 2 && cycles[1].outcome == .aggregated && cycles[1].assigned == 2 && cycles[1].reported == 2 && cycles[1].checkpoint == 1)
            #expect(cycles.allSatisfy { $0.metrics == ["loss": 0.5] })
            #expect(cycles[0].closedAt == harness.clock.date.timeIntervalSince1970)
            #expect(cycles[0].openedAt.map { $0 < harness.clock.date.timeIntervalSince1970 } == true)
            let text = String(decoding: result.body, as: UTF8.self)
            #expect(text.contains("\"closed_at\"") && text.contains("\"outcome\":\"aggregated\""))

            // The history is the store's: a restarted coordinator shows the same cycles.
            try await harness.restart()
            let restarted = try await harness.http.send("GET", Endpoint.cycles(hosted.processID), token: Harness.adminToken)
            #expect(try restarted.decode(ProcessCycles.self).cycles == cycles)

            #expect(try await harness.http.send("GET", Endpoint.cycles("p_0000000000000000"), token: Harness.adminToken).errorCode == "unknown_process")
            #expect(try await harness.http.send("GET", Endpoint.cycles(hosted.processID)).status == 401)
        }
    }

    /// The charts the page swaps in are drawn by the coordinator (OrchardCharts), for an admin only.
    @Test func theDashboardChartsTheHeldOutMetricsPerCheckpoint() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(ServerEvaluationTests.host())
            #expect(try await ServerEvaluationTests.attach(harness, hosted.processID, try ServerEvaluationTests.data()).status == 200)
            try await ServerEvaluationTests.publish(harness, scale: 0.2)
            await harness.coordinator.evaluationsSettled()
            // A dashboard route (not part of the documented API): fetched as the page's script does.
            let charts = try await Browser(base: harness.http.base).send(DashboardPage.chartsPath(hosted.processID) + "?width=600", token: Harness.adminToken)
            let html = charts.text
            #expect(charts.status == 200)
            for metric in ["loss", "mae", "rmse"] {
                #expect(html.contains("<h3>Held-out \(metric) per checkpoint</h3>"), "\(metric)")
                #expect(html.contains("aria-label=\"Held-out \(metric) of each evaluated checkpoint of evaluated\""), "\(metric)")
            }
            let evaluation = try #require(try await harness.status(hosted.processID).evaluation)
            #expect(html.contains("<title>server-side at checkpoint 1: "), "\(html.prefix(600))")
            #expect(evaluation.checkpoint == 1)
        }
    }

    @Test func theChartsRouteDrawsTheCycleHistoryForAdminsOnly() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let browser = Browser(base: harness.http.base)
            let hosted = try await harness.host(Fixture.host(goal: 1, minimum: 1, overSelection: 1, cycleLength: 60))
            let path = DashboardPage.chartsPath(hosted.processID)
            let none = try await browser.send(path + "?width=600", token: Harness.adminToken)
            #expect(none.status == 200 && none.text.contains("No cycle has closed") && !none.text.contains("<svg"))

            // Cycle 1 aggregated (the goal is one report); cycle 2 abandoned at its deadline with nobody reporting.
            let device = try await harness.device()
            #expect(try await harness.report(device, try await harness.join(device), diff: Fixture.diff(0.1), samples: 5).status == 200)
            _ = try await harness.join(try await harness.device())
            harness.clock.advance(bySeconds: 61)
            await harness.coordinator.tick()

            for refused in [try await browser.send(path), try await browser.send(path, cookie: "forged"), try await browser.send(path, token: "wrong")] {
                #expect(refused.status == 401)
                #expect(refused.errorCode == "unauthorized" && refused.header("Content-Type")?.hasPrefix("application/json") == true)
                #expect(!refused.text.contains(hosted.name) && !refused.text.contains("<svg"))
            }
            let charts = try await browser.send(path + "?width=375", token: Harness.adminToken)
            #expect(charts.status == 200 && charts.header("Content-Type")?.hasPrefix("text/html") == true)
            #expect(charts.header("Cache-Control") == "no-store")
            let html = charts.text
            #expect(html.contains("aria-label=\"Reports per cycle of \(hosted.name):"))
            #expect(html.contains("viewBox=\"0 0 375 250\""), "drawn at the width asked for")
            #expect(html.contains("<title>cycle 1, reported, aggregated: 1</title>"))
            #expect(html.contains("<title>cycle 2, assigned, no report: 1</title>"))
            #expect(html.contains("aria-label=\"Mean loss reported by devices per cycle of \(hosted.name)\""))
            #expect(html.contains("<title>loss at cycle 1: 0.5</title>"))
            #expect(!html.lowercased().contains("nan") && !html.contains("<script") && !html.contains("style="))

            // The session cookie admits it too; an unknown process is a 404.
            let token = harness.instance.dashboard.issueLoginToken()
            let session = try #require(try await browser.send(Endpoint.dashboardLogin + "?token=\(token)").sessionCookie)
            #expect(try await browser.send(path, cookie: session).text.contains("<svg"))
            let unknown = try await browser.send(DashboardPage.chartsPath("p_0000000000000000"), token: Harness.adminToken)
            #expect(unknown.status == 404 && unknown.errorCode == "unknown_process")
        }
    }
}

/// The page in a real browser: Chromium (headless) opens the login URL, follows the redirect with its cookie, runs
/// the page's script against the admin API and shows the hosted process. Skipped when no Chromium is installed,
/// unless ORCHARD_REQUIRE_BROWSER=1 (CI), which makes its absence a failure.
@Suite struct DashboardBrowserTests {
    static let required = ProcessInfo.processInfo.environment["ORCHARD_REQUIRE_BROWSER"] == "1"
    static let browser: String? = {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            for directory in path.split(separator: ":") {
                let candidate = "\(directory)/\(name)"
                if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            }
        }
        return nil
    }()

    /// Runs the browser with `arguments` and returns its standard output (at most 90 s). The output goes to a file
    /// through the shell (`timeout` ends a browser that hangs): no pipe is read in this process while Chromium and its
    /// helpers run.
    private func run(_ executable: String, _ arguments: [String]) async throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-chromium-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("dom.html")
        let words =
            [
                "timeout", "90", executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--user-data-dir=\(directory.appendingPathComponent("profile").path)", "--virtual-time-budget=5000",
            ] + arguments
        let quoted = words.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", "\(quoted) > '\(output.path)' 2>/dev/null"]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        while process.isRunning { try await Task.sleep(for: .milliseconds(100)) }
        return (try? String(contentsOf: output, encoding: .utf8)) ?? ""
    }

    @Test(.enabled(if: browser != nil || required, "no chromium (set ORCHARD_REQUIRE_BROWSER=1 to require it)"))
    func aBrowserSignsInWithTheLoginURLAndSeesTheProcess() async throws {
        let executable = try #require(Self.browser, "ORCHARD_REQUIRE_BROWSER=1 but no chromium, chromium-browser or google-chrome is on PATH")
        let harness = try await Harness.start()
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(name: "browser-visible-process", goal: 2, minimum: 1, cycleLength: 600))
            // Three closed cycles for the charts: aggregated, abandoned (one report short of the minimum), aggregated.
            for round in 0..<3 {
                let devices = [try await harness.device(name: hosted.name), try await harness.device(name: hosted.name)]
                for (index, device) in devices.enumerated() where round != 1 || index == 0 {
                    guard case .accepted(let assignment) = try await harness.requestCycle(device, name: hosted.name) else {
                        Issue.record("device rejected")
                        return
                    }
                    if round != 1 { #expect(try await harness.report(device, assignment, diff: Fixture.diff(0.1), samples: 4).status == 200) }
                }
                if round == 1 {
                    harness.clock.advance(bySeconds: 601)
                    await harness.coordinator.tick()
                }
            }
            func login() -> String { Dashboard.loginURL(base: harness.http.base.absoluteString, token: harness.instance.dashboard.issueLoginToken()) }

            let dom = try await run(executable, ["--window-size=375,812", "--dump-dom", login()])
            #expect(dom.contains("browser-visible-process"), "the rendered page does not show the process: \(dom.prefix(2000))")
            #expect(dom.contains(hosted.processID))
            #expect(dom.contains("Assigned: 0 / "), "the open cycle's participation")
            #expect(dom.contains("aria-label=\"Reports per cycle of browser-visible-process:"), "the participation chart")
            #expect(dom.contains("aria-label=\"Mean loss reported by devices per cycle"), "the metric chart")
            #expect(dom.contains("/checkpoints/2\" download="), "the checkpoint links")
            #expect(dom.contains("No checkpoint evaluated: attach held-out data"), "the model quality card")
            #expect(!dom.contains("Or enter the admin token"), "the browser was not signed in")
            #expect(dom.contains("role=\"alert\" hidden=\"\"></p>"), "the page reported a problem")
            // A malformed fragment (a link to `#%`) once stopped the script before its first refresh.
            let fragment = try await run(executable, ["--window-size=375,812", "--dump-dom", login() + "#%"])
            #expect(fragment.contains("browser-visible-process"), "a bad fragment stopped the page: \(fragment.prefix(2000))")

            // Screenshots at a phone's and a laptop's width, for a person to look at.
            if let directory = ProcessInfo.processInfo.environment["ORCHARD_DASHBOARD_SCREENSHOTS"] {
                for (width, height) in [(375, 1800), (1280, 1400)] {
                    _ = try await run(
                        executable, ["--window-size=\(width),\(height)", "--screenshot=\(directory)/dashboard-\(width).png", "--hide-scrollbars", login()])
                }
            }
        }
    }
}

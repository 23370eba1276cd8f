import Crypto
import Foundation
import OrchardCharts
import OrchardProtocol

/// The dashboard's page: one self-contained HTML document (inline CSS and script, nothing fetched from elsewhere).
/// The signed-in page holds no admin data itself: its script polls the admin JSON API (with the session cookie)
/// every 2 s and shows the processes, the open cycle, ε spent and the checkpoints, and swaps in the per-cycle charts
/// the coordinator draws with OrchardCharts (``charts(name:cycles:width:)``, the same component as the simulator's
/// report.html).
enum DashboardPage {
    /// The `Content-Security-Policy` of both pages: only this page's own style and script (by hash), requests to
    /// this origin, forms posted here.
    static let contentSecurityPolicy: String = {
        func hash(_ text: String) -> String { "'sha256-\(Data(SHA256.hash(data: Data(text.utf8))).base64EncodedString())'" }
        return "default-src 'none'; style-src \(hash(style)); script-src \(hash(script)); connect-src 'self'; img-src 'self'; "
            + "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    }()

    /// The page for a browser without a session: no admin data, how to sign in.
    static func signIn(message: String?) -> String {
        let notice = message.map { "<p class=\"notice\" role=\"alert\">\(escape($0))</p>\n" } ?? ""
        return document(
            title: "Orchard — sign in",
            body: """
                <main class="narrow">
                <h1>Orchard dashboard</h1>
                \(notice)<p>Sign in with the login URL that <code>orchard serve</code> printed when it started (the
                <code>dashboard_url</code> of its <code>listening</code> line). Each link works once.</p>
                <form method="post" action="/dashboard/login">
                <label for="token">Or enter the admin token</label>
                <input id="token" name="token" type="password" autocomplete="current-password" required>
                <button type="submit">Sign in</button>
                </form>
                </main>
                """, script: false)
    }

    /// The page for a signed-in browser (its data comes from the admin API).
    static let signedIn: String = document(
        title: "Orchard dashboard",
        body: """
            <header class="bar">
            <h1>Orchard dashboard</h1>
            <p id="updated" class="muted" aria-live="polite">Loading…</p>
            <form method="post" action="/dashboard/logout"><button type="submit">Sign out</button></form>
            </header>
            <main>
            <p id="problem" class="notice" role="alert" hidden></p>
            <section aria-labelledby="processes-title">
            <h2 id="processes-title">Processes</h2>
            <div class="scroll"><table id="processes">
            <caption class="visually-hidden">Hosted processes</caption>
            <thead><tr><th scope="col">Process</th><th scope="col">State</th><th scope="col">Cycle</th><th scope="col">Reported / goal</th><th scope="col">Checkpoint</th><th scope="col">ε spent</th></tr></thead>
            <tbody></tbody>
            </table></div>
            <p id="none" class="muted" hidden>No process is hosted. Create one with <code>orchard process create</code>.</p>
            </section>
            <section id="detail" aria-live="off" hidden>
            <h2 id="detail-title"></h2>
            <div class="cards">
            <article class="card" aria-labelledby="cycle-title"><h3 id="cycle-title">Open cycle</h3><div id="cycle"></div></article>
            <article class="card" aria-labelledby="privacy-title"><h3 id="privacy-title">Differential privacy</h3><div id="privacy"></div></article>
            <article class="card" aria-labelledby="quality-title"><h3 id="quality-title">Model quality (held-out data)</h3><div id="quality"></div></article>
            <article class="card" aria-labelledby="checkpoints-title"><h3 id="checkpoints-title">Checkpoints</h3><ul id="checkpoints" class="plain"></ul></article>
            </div>
            <div id="charts"><article class="card wide"><h3>Reports per cycle</h3><p class="muted">Loading…</p></article></div>
            <details class="card wide"><summary>Cycles as a table</summary><div class="scroll"><table id="cycles">
            <thead><tr><th scope="col">Cycle</th><th scope="col">Outcome</th><th scope="col">Assigned</th><th scope="col">Reported</th><th scope="col">Checkpoint</th><th scope="col">Closed</th><th scope="col">Metrics (mean)</th></tr></thead>
            <tbody></tbody></table></div></details>
            </section>
            </main>
            """, script: true)

    private static func document(title: String, body: String, script: Bool) -> String {
        """
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <meta name="referrer" content="no-referrer">
        <title>\(escape(title))</title>
        <style>\(style)</style>
        </head>
        <body>
        \(body)
        \(script ? "<script>\(Self.script)</script>" : "")
        </body>
        </html>

        """
    }

    static func escape(_ text: String) -> String { escapeXML(text) }

    /// `GET ?width=N` (admin: session cookie or admin token): ``charts(name:cycles:width:)`` of a process, the HTML the
    /// page's script swaps in. A dashboard route, not part of the documented admin API.
    static func chartsPath(_ processID: String) -> String { "/dashboard/processes/\(processID)/charts" }

    /// The charts of a process's recent cycles, as an HTML fragment the page swaps in: reports per cycle as bars
    /// stacked by outcome (with the assigned devices that did not report on top), and per metric (at most six) the
    /// devices' mean reported value per cycle as a line. `width` is the width the page will show them at, in CSS
    /// pixels (so their text stays 12 px on a phone and a laptop). Names from the process and its devices are escaped.
    ///
    /// Each chart comes twice, at `width` and at a phone's (the stylesheet shows the second below 30rem): a page laid out
    /// wider than it is finally shown (a rotated phone, a headless browser's screenshot) still shows legible text.
    static func charts(
        name: String, cycles: [CycleRecord], evaluations: [CheckpointEvaluation] = [], federated: [CheckpointEvaluation] = [], width: Double
    ) -> String {
        let cycleAxis = Axis("cycle", format: .count)
        func sized(_ draw: (Double) -> String) -> String {
            "<div class=\"chart-wide\">\(draw(width))</div><div class=\"chart-narrow\">\(draw(320))</div>"
        }
        // The global model's quality per evaluated checkpoint: on the operator's held-out data (server-side) and on the
        // devices' held-out samples (federated).
        var quality = ""
        func points(_ list: [CheckpointEvaluation], _ metric: String) -> [(x: Double, y: Double)] {
            list.compactMap { e in e.metrics[metric].map { (Double(e.checkpoint), $0) } }
        }
        for metric in Set((evaluations + federated).flatMap(\.metrics.keys)).sorted().prefix(4) {
            var series: [Series] = []
            if !points(evaluations, metric).isEmpty { series.append(Series("server-side", points(evaluations, metric), color: .blue)) }
            if !points(federated, metric).isEmpty {
                series.append(Series("federated (devices)", points(federated, metric), color: .orange, style: .outline))
            }
            let line = sized {
                LineChart(
                    title: "Held-out \(metric) of each evaluated checkpoint of \(name)", x: Axis("checkpoint", format: .count), y: Axis(metric),
                    series: series, width: $0, height: 210
                ).render()
            }
            quality += "<article class=\"card wide\"><h3>Held-out \(escape(metric)) per checkpoint</h3>\(line)</article>"
        }
        guard !cycles.isEmpty else {
            return quality
                + "<article class=\"card wide\"><h3>Reports per cycle</h3><p class=\"muted\">No cycle has closed since the coordinator started.</p></article>"
        }
        func count(_ value: (CycleRecord) -> Int) -> [(x: Double, y: Double)] { cycles.map { (Double($0.cycle), Double(value($0))) } }
        let participation = sized {
            BarChart(
                title:
                    "Reports per cycle of \(name): each bar is the devices assigned, split into reports aggregated or abandoned and devices that did not report",
                x: cycleAxis, y: Axis("devices", format: .count),
                series: [
                    Series("reported, aggregated", count { $0.outcome == .aggregated ? $0.reported : 0 }, color: .blue),
                    Series("reported, abandoned", count { $0.outcome == .aggregated ? 0 : $0.reported }, color: .red),
                    Series("assigned, no report", count { max(0, $0.assigned - $0.reported) }, color: .grey, style: .outline),
                ],
                width: $0, height: 250
            ).render()
        }
        var html = quality + "<article class=\"card wide\"><h3>Reports per cycle</h3>\(participation)</article>"
        for metric in Set(cycles.flatMap(\.metrics.keys)).sorted().prefix(6) {
            let line = sized {
                LineChart(
                    title: "Mean \(metric) reported by devices per cycle of \(name)", x: cycleAxis, y: Axis("mean \(metric)"),
                    series: [Series(metric, cycles.compactMap { c in c.metrics[metric].map { (Double(c.cycle), $0) } }, color: .blue)],
                    width: $0, height: 210
                ).render()
            }
            html += "<article class=\"card wide\"><h3>Mean \(escape(metric)) reported per cycle</h3>\(line)</article>"
        }
        return html
    }

    static let style = """
        :root{--fg:#1a1a1a;--muted:#4d4d4d;--bg:#fff;--card:#f5f6f8;--line:#c4c8cf;--accent:#0b57d0;--bad:#b3261e;--focus:#a13d00;--c-blue:#1f5fad;--c-red:#b3261e;--c-grey:#5f6368}
        @media (prefers-color-scheme:dark){:root{--fg:#eceff3;--muted:#c0c5cc;--bg:#121417;--card:#1d2025;--line:#4a4f57;--accent:#8ab4f8;--bad:#f28b82;--focus:#ffb870;--c-blue:#8ab4f8;--c-red:#f28b82;--c-grey:#bdc1c6}}
        *{box-sizing:border-box}
        body{margin:0;font:16px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
        main{padding:0 1rem 2rem;max-width:80rem;margin:0 auto}
        main.narrow{max-width:36rem;padding-top:2rem}
        h1{font-size:1.35rem;margin:0}
        h2{font-size:1.2rem;margin:1.5rem 0 .5rem}
        h3{font-size:1rem;margin:0 0 .5rem}
        code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em}
        .bar{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:center;justify-content:space-between;padding:.75rem 1rem;border-bottom:1px solid var(--line)}
        .bar form{margin:0}
        .muted{color:var(--muted);margin:0}
        .notice{border:2px solid var(--bad);padding:.5rem .75rem;border-radius:.4rem}
        button,input{font:inherit;color:inherit}
        button{background:var(--card);border:1px solid var(--line);border-radius:.4rem;padding:.35rem .8rem;cursor:pointer;min-height:2.25rem}
        button[aria-pressed=true]{border-color:var(--accent);outline:2px solid var(--accent)}
        input{display:block;width:100%;margin:.25rem 0 .75rem;padding:.5rem;border:1px solid var(--line);border-radius:.4rem;background:var(--bg)}
        :focus-visible{outline:3px solid var(--focus);outline-offset:2px}
        a{color:var(--accent)}
        .scroll{overflow-x:auto}
        table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
        th,td{text-align:left;padding:.4rem .5rem;border-bottom:1px solid var(--line);white-space:nowrap}
        .cards{display:grid;gap:1rem;grid-template-columns:repeat(auto-fit,minmax(16rem,1fr))}
        .card{background:var(--card);border:1px solid var(--line);border-radius:.5rem;padding:.75rem 1rem;margin:0 0 1rem}
        .wide{margin-top:1rem}
        .plain{list-style:none;padding:0;margin:0}
        .plain li{padding:.15rem 0}
        dl{display:grid;grid-template-columns:auto 1fr;gap:.2rem .75rem;margin:0}
        dt{color:var(--muted)}
        dd{margin:0;font-variant-numeric:tabular-nums}
        progress{width:100%;height:.9rem;accent-color:var(--accent)}
        .oc-chart{display:block;width:100%;height:auto;fill:var(--fg)}
        .oc-chart .oc-tick{fill:var(--muted)}
        .oc-chart .oc-grid{stroke:var(--line)}
        .oc-chart .oc-axis{stroke:var(--muted)}
        .oc-chart .oc-blue{color:var(--c-blue)}
        .oc-chart .oc-red{color:var(--c-red)}
        .oc-chart .oc-grey{color:var(--c-grey)}
        .chart-narrow{display:none}
        .visually-hidden{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}
        @media (max-width:40rem){th,td{padding:.35rem .3rem;font-size:.9rem}h1{font-size:1.15rem}}
        @media (max-width:30rem){.chart-wide{display:none}.chart-narrow{display:block}}
        """

    static let script = #"""
        "use strict";
        const api = "/v1/admin/processes";
        let selected = null;
        // A malformed fragment (`#%`) must not stop the page before its first refresh.
        try { selected = decodeURIComponent(location.hash.slice(1)) || null; } catch (e) { selected = null; }
        let skew = 0, current = null, timer = null;
        const $ = (id) => document.getElementById(id);
        function el(tag, attrs, ...children) {
          const node = document.createElement(tag);
          for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
          for (const c of children) node.append(c);
          return node;
        }
        function fmt(n, digits) { return Number(n).toLocaleString(undefined, {maximumFractionDigits: digits ?? 2}); }
        function when(seconds) { return new Date(seconds * 1000).toLocaleString(); }
        function span(seconds) {
          seconds = Math.max(0, Math.round(seconds));
          const h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
          return (h ? h + " h " : "") + (h || m ? m + " min " : "") + s + " s";
        }
        // The admin API's JSON, or with asText the body as text (the charts' HTML).
        async function get(path, asText) {
          const response = await fetch(path, {credentials: "same-origin", cache: "no-store"});
          if (response.status === 401) throw Object.assign(new Error("Your session has ended: sign in again with a new login URL."), {signedOut: true});
          if (!response.ok) {
            let message = response.status + " " + response.statusText;
            try { const body = await response.json(); message = body.error.code + ": " + body.error.message; } catch (_) {}
            throw new Error(message);
          }
          const date = Date.parse(response.headers.get("Date") || "");
          if (!isNaN(date)) skew = date - Date.now();
          return asText ? response.text() : response.json();
        }
        function row(process) {
          const cycle = process.current_cycle;
          const button = el("button", {type: "button", "aria-pressed": String(process.process_id === selected)}, `${process.name} ${process.version}`);
          button.addEventListener("click", () => { selected = process.process_id; location.hash = encodeURIComponent(selected); refresh(); });
          const privacy = process.privacy ? fmt(process.privacy.epsilon, 3) + (process.privacy.target_epsilon ? " / " + fmt(process.privacy.target_epsilon, 3) : "") : "—";
          return el("tr", {}, el("th", {scope: "row"}, button), el("td", {}, process.state), el("td", {}, cycle ? String(cycle.number) : "—"),
            el("td", {}, cycle ? `${cycle.reported} / ${cycle.goal}` : "—"), el("td", {}, String(process.latest_checkpoint)), el("td", {}, privacy));
        }
        function meter(label, value, max) {
          const id = "m" + Math.random().toString(36).slice(2);
          return el("div", {}, el("label", {for: id}, `${label}: ${value} / ${max}`), el("progress", {id, value: String(Math.min(value, max)), max: String(Math.max(max, 1))}));
        }
        function showCycle(process) {
          const box = $("cycle");
          const cycle = process.current_cycle;
          if (!cycle) { box.replaceChildren(el("p", {class: "muted"}, process.state === "completed" ? "The process has completed." : "No cycle is open.")); return; }
          const countdown = el("dd", {id: "countdown"});
          box.replaceChildren(
            el("p", {}, `Cycle ${cycle.number}, training from checkpoint ${cycle.checkpoint}`),
            meter("Assigned", cycle.assigned, cycle.capacity), meter("Reported", cycle.reported, cycle.goal),
            el("dl", {}, el("dt", {}, "Deadline"), el("dd", {}, when(cycle.deadline)), el("dt", {}, "Closes in"), countdown,
              el("dt", {}, "Aggregated"), el("dd", {}, String(process.cycles_completed)), el("dt", {}, "Abandoned"), el("dd", {}, String(process.cycles_abandoned))));
          const b = cycle.buffered;
          if (b) box.append(el("p", {}, "Buffered aggregation"), meter("Buffer", b.buffer_fill, b.buffer_size), meter("Training", b.in_flight, b.max_concurrency),
            el("dl", {}, el("dt", {}, "Releases"), el("dd", {}, String(b.releases)),
              el("dt", {}, "Staleness (mean / max)"), el("dd", {}, b.mean_staleness == null ? "—" : `${fmt(b.mean_staleness, 2)} / ${b.max_staleness}`)));
          tick();
        }
        function tick() {
          const node = $("countdown");
          if (node && current && current.current_cycle) node.textContent = span(current.current_cycle.deadline - (Date.now() + skew) / 1000);
        }
        function showPrivacy(process) {
          const p = process.privacy;
          if (!p) { $("privacy").replaceChildren(el("p", {class: "muted"}, "Not used by this process.")); return; }
          const items = [["ε spent", fmt(p.epsilon, 4)], ["δ", String(p.delta)], ["Budget (ε)", p.target_epsilon ? fmt(p.target_epsilon, 4) : "none"],
            ["Releases", String(p.releases)], ["Noise multiplier", fmt(p.noise_multiplier, 4)], ["Clipping norm", fmt(p.clipping_norm, 4)]];
          const list = el("dl", {});
          for (const [k, v] of items) list.append(el("dt", {}, k), el("dd", {}, v));
          const parts = [list];
          if (p.target_epsilon) parts.unshift(el("label", {for: "epsilon"}, "Budget spent"), el("progress", {id: "epsilon", value: String(Math.min(p.epsilon, p.target_epsilon)), max: String(p.target_epsilon)}));
          $("privacy").replaceChildren(...parts);
        }
        function showQuality(process) {
          const parts = [];
          for (const [title, e] of [["Server-side", process.evaluation], ["Federated (devices' held-out samples)", process.federated_evaluation]]) {
            if (!e) continue;
            const names = ["loss", ...Object.keys(e.metrics).filter((k) => k !== "loss").sort()];
            const list = el("dl", {}, el("dt", {}, "Checkpoint"), el("dd", {}, String(e.checkpoint)), el("dt", {}, "Samples"), el("dd", {}, String(e.samples)));
            if (e.devices != null) list.append(el("dt", {}, "Devices"), el("dd", {}, String(e.devices)));
            if (e.epsilon != null) list.append(el("dt", {}, "ε (noised)"), el("dd", {}, fmt(e.epsilon, 4)));
            for (const name of names) if (name in e.metrics) list.append(el("dt", {}, name), el("dd", {}, fmt(e.metrics[name], 4)));
            list.append(el("dt", {}, "Evaluated"), el("dd", {}, when(e.evaluated_at)));
            parts.push(el("h4", {}, title), list);
          }
          if (!parts.length) {
            $("quality").replaceChildren(el("p", {class: "muted"}, "No checkpoint evaluated: attach held-out data with orchard process evaluation ID --data FILE, or set server_config.evaluation for devices to evaluate."));
            return;
          }
          $("quality").replaceChildren(...parts);
        }
        function showCheckpoints(process) {
          const items = [...process.checkpoints].reverse().map((n) => el("li", {},
            el("a", {href: `${api}/${encodeURIComponent(process.process_id)}/checkpoints/${n}`, download: `${process.name}-${process.version}-checkpoint-${n}.safetensors`},
              `Checkpoint ${n}` + (n === process.latest_checkpoint ? " (latest)" : ""))));
          $("checkpoints").replaceChildren(...(items.length ? items : [el("li", {class: "muted"}, "None stored.")]));
        }
        // The coordinator draws the charts (OrchardCharts, as in the simulator's report) at the width they are shown at.
        async function showCharts(id) {
          const box = $("charts");
          const width = Math.round(Math.max(280, Math.min(1600, (box.clientWidth || 672) - 34)));
          const html = await get(`/dashboard/processes/${id}/charts?width=${width}`, true);
          box.replaceChildren(...new DOMParser().parseFromString(html, "text/html").body.childNodes);
        }
        function showCycles(cycles) {
          const list = cycles.cycles;
          $("cycles").tBodies[0].replaceChildren(...[...list].reverse().map((c) => el("tr", {}, el("td", {}, String(c.cycle)), el("td", {}, c.outcome),
            el("td", {}, String(c.assigned)), el("td", {}, String(c.reported)), el("td", {}, c.checkpoint == null ? "—" : String(c.checkpoint)),
            el("td", {}, when(c.closed_at)), el("td", {}, Object.entries(c.metrics).map(([k, v]) => `${k} ${fmt(v, 4)}`).join(", ") || "—"))));
        }
        async function refresh() {
          clearTimeout(timer);
          try {
            const list = (await get(api)).processes;
            if (!list.some((p) => p.process_id === selected)) selected = list.length ? list[0].process_id : null;
            $("processes").tBodies[0].replaceChildren(...list.map(row));
            $("none").hidden = list.length > 0;
            if (selected) {
              const id = encodeURIComponent(selected);
              const [status, cycles] = await Promise.all([get(`${api}/${id}`), get(`${api}/${id}/cycles`)]);
              current = status;
              $("detail").hidden = false;
              $("detail-title").textContent = `${status.name} ${status.version} (${status.process_id}) — ${status.state}`;
              showCycle(status); showPrivacy(status); showQuality(status); showCheckpoints(status); showCycles(cycles);
              await showCharts(id);
            } else {
              current = null;
              $("detail").hidden = true;
            }
            $("problem").hidden = true;
            $("updated").textContent = "Updated " + new Date().toLocaleTimeString();
          } catch (error) {
            $("problem").textContent = error.message;
            $("problem").hidden = false;
            if (error.signedOut) return;
          }
          timer = setTimeout(refresh, 2000);
        }
        setInterval(tick, 1000);
        refresh();
        """#
}

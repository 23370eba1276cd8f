import Crypto
import Foundation

/// The dashboard's page: one self-contained HTML document (inline CSS and script, nothing fetched from elsewhere).
/// The signed-in page holds no admin data itself: its script polls the admin JSON API (with the session cookie)
/// every 2 s and draws the processes, the open cycle, per-cycle charts, ε spent and the checkpoints.
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
        return document(title: "Orchard — sign in", body: """
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
    static let signedIn: String = document(title: "Orchard dashboard", body: """
        <header class="bar">
        <h1>Orchard dashboard</h1>
        <p id="updated" class="muted" aria-live="polite">Loading…</p>
        <form method="post" action="/dashboard/logout"><button type="submit">Sign out</button></form>
        </header>
        <svg id="svg-namespace" aria-hidden="true" width="0" height="0"></svg>
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
        <article class="card" aria-labelledby="checkpoints-title"><h3 id="checkpoints-title">Checkpoints</h3><ul id="checkpoints" class="plain"></ul></article>
        </div>
        <article class="card wide" aria-labelledby="participation-title">
        <h3 id="participation-title">Reports per cycle</h3>
        <p class="legend"><span class="swatch aggregated"></span> reported, aggregated <span class="swatch abandoned"></span> reported, abandoned <span class="swatch assigned"></span> assigned</p>
        <div id="participation" class="chart"></div>
        </article>
        <div id="metrics"></div>
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

    static func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }

    static let style = """
        :root{--fg:#1a1a1a;--muted:#4d4d4d;--bg:#fff;--card:#f5f6f8;--line:#c4c8cf;--accent:#0b57d0;--ok:#1d5fb4;--bad:#b3261e;--focus:#a13d00}
        @media (prefers-color-scheme:dark){:root{--fg:#eceff3;--muted:#c0c5cc;--bg:#121417;--card:#1d2025;--line:#4a4f57;--accent:#8ab4f8;--ok:#78a9f0;--bad:#f28b82;--focus:#ffb870}}
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
        .legend{margin:0 0 .25rem;color:var(--muted)}
        .swatch{display:inline-block;width:.9rem;height:.9rem;vertical-align:-.1rem;border-radius:2px}
        .swatch.aggregated{background:var(--ok)}
        .swatch.assigned{border:1.5px dashed var(--muted)}
        .swatch.abandoned{background:repeating-linear-gradient(45deg,var(--bad) 0 3px,transparent 3px 5px);border:1px solid var(--bad)}
        .chart svg{width:100%;height:auto;display:block}
        .chart text{fill:var(--fg);font-size:12px}
        .chart .axis{stroke:var(--muted)}
        .chart .grid{stroke:var(--line);stroke-dasharray:2 3}
        .chart .aggregated{fill:var(--ok)}
        .chart .abandoned{fill:var(--bad);fill-opacity:.35;stroke:var(--bad);stroke-width:1.5}
        .chart .assigned{fill:none;stroke:var(--muted);stroke-width:1.5;stroke-dasharray:4 3}
        .chart .line{fill:none;stroke:var(--accent);stroke-width:2}
        .chart .dot{fill:var(--accent)}
        .visually-hidden{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}
        @media (max-width:40rem){th,td{padding:.35rem .3rem;font-size:.9rem}h1{font-size:1.15rem}}
        """

    static let script = #"""
        "use strict";
        const api = "/v1/admin/processes";
        const svgNS = document.getElementById("svg-namespace").namespaceURI;
        let selected = decodeURIComponent(location.hash.slice(1)) || null;
        let skew = 0, current = null, timer = null;
        const $ = (id) => document.getElementById(id);
        function el(tag, attrs, ...children) {
          const node = document.createElement(tag);
          for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
          for (const c of children) node.append(c);
          return node;
        }
        function svg(tag, attrs, ...children) {
          const node = document.createElementNS(svgNS, tag);
          for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
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
        async function get(path) {
          const response = await fetch(path, {credentials: "same-origin", cache: "no-store"});
          if (response.status === 401) throw Object.assign(new Error("Your session has ended: sign in again with a new login URL."), {signedOut: true});
          if (!response.ok) {
            let message = response.status + " " + response.statusText;
            try { const body = await response.json(); message = body.error.code + ": " + body.error.message; } catch (_) {}
            throw new Error(message);
          }
          const date = Date.parse(response.headers.get("Date") || "");
          if (!isNaN(date)) skew = date - Date.now();
          return response.json();
        }
        // Round axis ticks: steps of 1, 2 or 5 × 10^k, whole numbers for counts.
        function ticks(max, count, integer) {
          if (!(max > 0)) max = 1;
          let step = Math.pow(10, Math.floor(Math.log10(max / count)));
          for (const f of [1, 2, 5, 10]) { if (max / (step * f) <= count) { step *= f; break; } }
          if (integer) step = Math.max(1, Math.round(step));
          const top = Math.ceil(max / step) * step, out = [];
          for (let v = 0; v <= top + step / 2; v += step) out.push(Number(v.toPrecision(12)));
          return out;
        }
        function chart(label, rows, value, options) {
          // Drawn at the container's width in CSS pixels, so text stays 12 px on a phone and on a laptop.
          const W = Math.max(280, Math.min(1200, $("participation").clientWidth || 640)), H = 220, L = 48, R = 12, T = 12, B = 40;
          const values = rows.map(value);
          const ys = ticks(Math.max(...values, ...(options.bars ? rows.map((r) => r.assigned) : []), options.integer ? 1 : 0), 5, options.integer);
          let min = 0;
          if (!options.integer) {
            const lo = Math.min(...values), hi = Math.max(...values);
            if (lo > 0 && hi > lo) { const t = ticks(hi - lo, 5, false), step = t[1] - t[0]; min = Math.floor(lo / step) * step; ys.length = 0; for (let v = min; v <= hi + step / 2 + 1e-12; v += step) ys.push(Number(v.toPrecision(12))); if (ys[ys.length - 1] < hi) ys.push(Number((ys[ys.length - 1] + step).toPrecision(12))); }
          }
          const top = ys[ys.length - 1] - min || 1;
          const y = (v) => T + (H - T - B) * (1 - (v - min) / top);
          const n = rows.length, band = (W - L - R) / Math.max(n, 1);
          const x = (i) => L + band * (i + 0.5);
          const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label});
          root.append(svg("title", {}, label));
          for (const v of ys) {
            root.append(svg("line", {class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v)}));
            root.append(svg("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end"}, fmt(v, 4)));
          }
          root.append(svg("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}));
          root.append(svg("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
          const every = Math.max(1, Math.ceil(n / 10));
          rows.forEach((row, i) => {
            if (i % every === 0 || i === n - 1) root.append(svg("text", {x: x(i), y: H - B + 16, "text-anchor": "middle"}, String(row.cycle)));
          });
          root.append(svg("text", {x: L + (W - L - R) / 2, y: H - 6, "text-anchor": "middle"}, "cycle"));
          if (options.bars) {
            rows.forEach((row, i) => {
              const v = value(row), w = Math.max(2, Math.min(band * 0.7, 48));
              root.append(svg("rect", {class: "assigned", x: x(i) - w / 2, y: y(row.assigned), width: w, height: Math.max(0, y(0) - y(row.assigned))}));
              root.append(svg("rect", {class: row.outcome, x: x(i) - w / 2, y: Math.min(y(v), y(0) - 2), width: w, height: Math.max(2, y(0) - y(v))},
                svg("title", {}, `cycle ${row.cycle}: ${v} reported of ${row.assigned} assigned, ${row.outcome}`)));
            });
          } else {
            root.append(svg("polyline", {class: "line", points: rows.map((row, i) => `${x(i)},${y(value(row))}`).join(" ")}));
            rows.forEach((row, i) => root.append(svg("circle", {class: "dot", cx: x(i), cy: y(value(row)), r: 3.5},
              svg("title", {}, `cycle ${row.cycle}: ${fmt(value(row), 4)}`))));
          }
          return root;
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
        function showCheckpoints(process) {
          const items = [...process.checkpoints].reverse().map((n) => el("li", {},
            el("a", {href: `${api}/${encodeURIComponent(process.process_id)}/checkpoints/${n}`, download: `${process.name}-${process.version}-checkpoint-${n}.safetensors`},
              `Checkpoint ${n}` + (n === process.latest_checkpoint ? " (latest)" : ""))));
          $("checkpoints").replaceChildren(...(items.length ? items : [el("li", {class: "muted"}, "None stored.")]));
        }
        function showCycles(process, cycles) {
          const list = cycles.cycles;
          const box = $("participation");
          box.replaceChildren(list.length ? chart(`Reports per cycle of ${process.name}: solid bars are reports, coloured by outcome; dashed outlines are devices assigned`, list, (c) => c.reported, {bars: true, integer: true})
            : el("p", {class: "muted"}, "No cycle has closed since the coordinator started."));
          const names = [...new Set(list.flatMap((c) => Object.keys(c.metrics)))].sort().slice(0, 6);
          $("metrics").replaceChildren(...names.map((name) => {
            const rows = list.filter((c) => typeof c.metrics[name] === "number");
            return el("article", {class: "card wide", "aria-label": `Mean ${name} per cycle`}, el("h3", {}, `Mean ${name} reported per cycle`),
              el("div", {class: "chart"}, chart(`Mean ${name} reported by devices per cycle`, rows, (c) => c.metrics[name], {integer: false})));
          }));
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
              showCycle(status); showPrivacy(status); showCheckpoints(status); showCycles(status, cycles);
              $("detail").hidden = false;
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

// The dashboard: polls GET /v1/dashboard every few seconds and redraws (charts are server SVG).
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const { el, pct, num } = arloop;
  const every = Number(new URLSearchParams(location.search).get("refresh") || 5) * 1000;
  const CHARTS = ["held_out", "live", "reward", "kl", "entropy", "clip_ratio", "completions/mean_length", "loss"];
  // The only markup a page writes from a string: the charts, SVG the server made from numbers
  // and escaped labels, through the one Trusted Types policy the CSP allows (security_headers.py).
  const identity = { createHTML: (svg) => svg };
  const svg = window.trustedTypes ? window.trustedTypes.createPolicy("arloop-svg", identity) : identity;

  function table(node, head, rows) {
    node.replaceChildren(el("tr", {}, ...head.map((h) => el("th", { text: h }))), ...rows);
  }
  const cell = (text, cls) => el("td", cls ? { class: cls, text: String(text) } : { text: String(text) });

  function versions(data) {
    table($("versions"), ["version", "status", "aliases", "held-out success [95% CI]", "thumbs-up", "feedback rate (runs)", "gate", "served by"],
      data.versions.map((v) => {
        const h = v.held_out, t = v.traffic || {}, g = v.gate;
        const held = h ? pct(h.rate) + (h.solved !== null && h.solved !== undefined ? " (" + h.solved + "/" + h.n + ")" : "") + " [" + pct(h.low) + ", " + pct(h.high) + "]" : "–";
        const gate = el("td", { class: "verdict-" + (g.verdict || "none") }, (g.verdict || "–") + (g.failed.length ? " (" + g.failed.join(", ") + ")" : ""));
        if (g.summary) gate.append(el("details", {}, el("summary", { text: "report" }), el("pre", { class: "report", text: g.summary })));
        const row = el("tr", { "data-version": v.version },
          cell(v.version), cell(v.status + (v.error ? " – " + v.error : ""), v.status === "broken" ? "warn" : ""), cell(v.aliases.join(", ")),
          cell(held), cell(pct(t.thumbs_up_rate) + (t.thumbs_up !== undefined ? " (" + t.thumbs_up + "/" + (t.thumbs_up + t.thumbs_down) + ")" : ""), "num"),
          cell(pct(t.feedback_rate) + " (" + (t.runs || 0) + ")", "num"), gate, cell(v.served_by, "num"));
        return row;
      }));
  }

  // The arms are the registry's aliases; the figures are the learner's last check of these two.
  function canaryLine(c, state) {
    const arms = "Canary: " + c.candidate + " (candidate) vs " + c.champion + " (champion) on " + pct(c.share) + " of new threads";
    const waiting = { running: ": waiting for the learner's check", lagging: ": waiting for the learner's check",
      stopped: ": no learner is running to decide it", never: ": no learner is running to decide it" };
    if (!c.checked) return arms + "; not checked yet" + (waiting[state.state] || "");
    return arms + "; runs with feedback " + c.n_candidate + " vs " + c.n_champion + "; reward diff " + num(c.diff) +
      " (always-valid CI " + num(c.ci_low) + " .. " + num(c.ci_high) + ") → " + c.action;
  }

  function serving(data) {
    table($("delivery"), ["alias", "version", "servers serving it", "checkpoint digests", "state"],
      data.delivery.map((d) => el("tr", { "data-alias": d.alias }, cell(d.alias), cell(d.version), cell(d.servers + " of " + d.of, "num"),
        cell(d.digests.join(", ") || "–"), cell(!d.servers ? "NOT DELIVERED" : !d.delivered ? "partly delivered" : !d.consistent ? "DIGESTS DIFFER" : "delivered", d.delivered && d.consistent ? "" : "warn"))));
    const c = data.canary;
    $("canary").replaceChildren(c ? el("p", { id: "canary-state", text: canaryLine(c, data.learner_state) })
      : el("p", { class: "muted", text: "No canary out." }));
  }

  function learner(data) {
    const l = data.learner, state = data.learner_state;
    $("learner").dataset.state = state.state;
    const parts = [state.line];
    if (l && l.last_round) parts.push("last round: " + l.last_round.version + " in " + num(l.last_round.seconds, 1) + " s");
    if (l && l.release) parts.push("release: " + l.release);
    if (l && l.last_error) parts.push("last error: " + l.last_error);
    $("learner").replaceChildren(...parts.map((p, i) => el("p", i === 0 ? { id: "learner-state", class: state.state === "running" ? "" : "warn", text: p }
      : { class: p.startsWith("last error") ? "error" : "", text: p })));
    const s = data.streams;
    table($("streams"), ["stream", "length", "lag (undelivered)", "oldest unread", "pending (unacked)"],
      s.streams.map((x) => el("tr", { "data-stream": x.stream }, cell(x.stream), cell(x.length, "num"), cell(x.lag + (x.lag_capped ? "+" : ""), "num"), cell(num(x.lag_seconds, 1) + " s", "num"), cell(x.pending, "num")))
        .concat([el("tr", { "data-stream": "dead" }, cell("dead letters"), cell(s.dead_letters, "num"), cell(""), cell(""), cell(""))]));
    table($("servers"), ["process", "endpoint", "serving", "checkpoint digests", "last heartbeat"],
      data.servers.map((p) => el("tr", {}, cell(p.instance), cell(p.url), cell(Object.entries(p.serving).map(([a, v]) => a + " → " + v).join(", ")),
        cell(Object.entries(p.digests).map(([v, d]) => v + ": " + d).join(", ")), cell(Math.round(data.at - p.updated_at) + " s ago", "num"))));
  }

  function charts(data) {
    $("charts").replaceChildren(...CHARTS.map((name) => {
      const fig = el("figure", { "data-chart": name });
      fig.innerHTML = svg.createHTML(data.charts[name]);
      return fig;
    }));
  }

  let latest = 0;
  async function refresh() {
    const mine = ++latest;  // answers can arrive out of order: only the newest call's is drawn
    try {
      const data = await (await arloop.api("/v1/dashboard")).json();
      if (mine !== latest) return;
      serving(data); versions(data); charts(data); learner(data);
      $("status").className = "muted";
      $("status").textContent = "updated " + new Date(data.at * 1000).toLocaleTimeString() + " · every " + every / 1000 + " s";
      document.body.dataset.loaded = String(data.at);
    } catch (err) {
      if (mine !== latest) return;
      $("status").className = "error";
      $("status").textContent = "Cannot load the dashboard (" + err.message + "): check the API key above.";
    }
  }

  arloop.bindWho();
  document.addEventListener("arloop:key", refresh);
  refresh();
  setInterval(refresh, every);
})();

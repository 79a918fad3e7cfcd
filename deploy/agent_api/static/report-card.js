// The report card: polls GET /v1/report-card.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const { el, pct } = arloop;
  const CASES = ["empty", "long", "contradictory", "injection"];
  const rate = (m) => m.n ? pct(m.rate) + " (" + m.hits + "/" + m.n + ")" : "–";
  const cell = (text) => el("td", { text: String(text) });

  async function refresh() {
    try {
      const data = await (await arloop.api("/v1/report-card")).json();
      const head = ["agent", "version", "runs", "goal consistency", "error recovery", "self-reflection", ...CASES.map((c) => "stress: " + c)];
      $("card").replaceChildren(el("tr", {}, ...head.map((h) => el("th", { text: h }))), ...data.agents.map((a) =>
        el("tr", { "data-agent": a.agent, "data-version": a.version }, cell(a.agent), cell(a.version), cell(a.runs), cell(rate(a.goal_consistency)),
          cell(rate(a.error_recovery)), cell(rate(a.self_reflection)),
          ...CASES.map((c) => cell(a.stress[c] ? a.stress[c].passed + "/" + a.stress[c].runs : "–")))));
      const nodes = data.agents.flatMap((a) => Object.entries(a.nodes || {}).map(([node, n]) =>
        el("tr", { "data-agent": a.agent, "data-version": a.version, "data-node": node }, cell(a.agent), cell(a.version),
          cell(node), cell(n.calls), cell(n.tool_calls), cell(Math.round(n.latency_ms) + " ms"))));
      const nodeHead = ["agent", "version", "node", "model calls", "asked for tools", "mean latency"];
      $("nodes").replaceChildren(el("tr", {}, ...nodeHead.map((h) => el("th", { text: h }))), ...nodes);
      $("nodes-panel").hidden = nodes.length === 0;
      $("status").className = "muted";
      $("status").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (err) {
      $("status").className = "error";
      $("status").textContent = "Cannot load the report card (" + err.message + "): check the API key above.";
    }
  }
  arloop.bindWho();
  document.addEventListener("arloop:key", refresh);
  refresh();
  setInterval(refresh, 10000);
})();

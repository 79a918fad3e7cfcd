// One run whole (GET /v1/runs/{id}): its steps and tool calls, the guard's verdict, its feedback.
// Shared by the runs view and the review queue; every text is written as text, never markup.
"use strict";
const arloopRuns = (() => {
  const { el } = arloop;
  const when = (t) => t ? new Date(t * 1000).toLocaleString() : "–";
  const text = (s) => el("pre", { class: "text", text: s === null || s === undefined ? "" : String(s) });
  const args = (a) => typeof a === "string" ? a : JSON.stringify(a);

  function feedbackBadges(f) {
    const out = [];
    if (f.thumbs_up) out.push(el("span", { class: "badge up", text: "thumbs up " + f.thumbs_up }));
    if (f.thumbs_down) out.push(el("span", { class: "badge down", text: "thumbs down " + f.thumbs_down }));
    const others = f.kinds.filter((k) => k !== "thumbs" && k !== "review");
    if (others.length) out.push(el("span", { class: "badge", text: others.join(", ") }));
    if (f.reviewed) out.push(el("span", { class: "badge reviewed", text: "reviewed" }));
    return out.length ? out : [el("span", { class: "muted", text: "–" })];
  }

  // A table of run summaries; `open(item)` is called when a row is clicked.
  function rows(items, open, extra) {
    return items.map((r) => {
      const row = el("tr", { "data-trajectory": r.trajectory_id, "data-cursor": r.cursor, tabindex: "0", class: "run-row" },
        el("td", { text: when(r.started_at) }), el("td", { text: r.agent }), el("td", { text: r.policy_version }),
        el("td", { text: r.status, class: "status-" + r.status }),
        el("td", { text: r.answered_by, class: "answered-" + r.answered_by }),
        el("td", {}, ...feedbackBadges(r.feedback)),
        ...(extra ? [extra(r)] : []),
        el("td", { class: "excerpt", text: r.input }), el("td", { class: "excerpt", text: r.output }));
      row.addEventListener("click", () => open(r, row));
      row.addEventListener("keydown", (e) => { if (e.key === "Enter") open(r, row); });
      return row;
    });
  }
  function header(extra) {
    const names = ["time", "agent", "version", "status", "answered by", "feedback", ...(extra || []), "input", "output"];
    return el("tr", {}, ...names.map((h) => el("th", { text: h })));
  }

  function step(s) {
    if (s.kind === "model") {
      const calls = s.tool_calls.map((c) => el("li", { class: "tool-call", text: c.name + "(" + c.arguments + ")" }));
      return el("li", { class: "step model", "data-kind": "model" },
        el("div", { class: "step-head", text: "model call " + s.index + (s.node ? " · " + s.node : "") + " · " + s.policy_version + " · " + (s.finish_reason || "?") + " · " + Math.round(s.latency_ms) + " ms" }),
        ...(s.output ? [text(s.output)] : []),
        ...(calls.length ? [el("div", { class: "muted", text: "asked for" }), el("ul", {}, ...calls)] : []));
    }
    return el("li", { class: "step tool", "data-kind": "tool" },
      el("div", { class: "step-head", text: "tool " + s.name + " · " + Math.round(s.latency_ms) + " ms" + (s.error ? " · error: " + s.error : "") + (s.truncated ? " · truncated" : "") }),
      el("div", { class: "muted", text: "arguments" }), text(args(s.arguments)),
      el("div", { class: "muted", text: "result" }), text(s.output));
  }

  function guard(g) {
    const findings = Object.entries(g.findings);
    return el("div", { class: "guard path-" + g.answered_by, id: "guard" },
      el("div", { class: "step-head answered-" + g.answered_by, text: "Answered by: " + g.answered_by }),
      ...(g.model_output !== null ? [el("div", { class: "muted", text: "the model's own answer, replaced" }), text(g.model_output)] : []),
      ...(findings.length ? [el("ul", {}, ...findings.map(([k, v]) => el("li", { text: k + ": " + v })))] : []));
  }

  function feedbackTable(items) {
    if (!items.length) return el("p", { class: "muted", id: "run-feedback", text: "No feedback yet." });
    return el("table", { id: "run-feedback" },
      el("tr", {}, ...["kind", "value", "text", "from", "when"].map((h) => el("th", { text: h }))),
      ...items.map((f) => el("tr", { "data-kind": f.kind },
        el("td", { text: f.kind + (f.key ? ":" + f.key : "") }), el("td", { text: f.value === null ? "–" : String(f.value) }),
        el("td", { class: "excerpt", text: f.text || "" }), el("td", { text: f.source }), el("td", { text: when(f.created_at) }))));
  }

  function render(box, run) {
    const meta = [["agent", run.agent], ["policy version", run.policy_version], ["status", run.status], ["thread", run.thread_id],
      ["user", run.user_id], ["started", when(run.started_at)], ["took", Math.round((run.finished_at - run.started_at) * 1000) + " ms"]];
    box.replaceChildren(
      el("h2", { text: "Run " + run.trajectory_id }),
      el("dl", { class: "meta" }, ...meta.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })])),
      el("h3", { text: "Input" }), text(run.input),
      el("h3", { text: "Answer returned" }), el("div", { id: "run-output" }, text(run.output)),
      el("h3", { text: "Guard" }), guard(run.guard),
      el("h3", { text: "Steps" }), el("ol", { id: "steps", class: "steps" }, ...run.steps.map(step)),
      el("h3", { text: "Feedback" }), feedbackTable(run.feedback));
    box.hidden = false;
  }

  async function open(box, item) {
    const q = new URLSearchParams({ cursor: item.cursor });
    const run = await (await arloop.api("/v1/runs/" + encodeURIComponent(item.trajectory_id) + "?" + q)).json();
    render(box, run);
    return run;
  }

  async function agents(select) {
    try {
      const data = await (await arloop.api("/v1/agents")).json();
      select.replaceChildren(el("option", { value: "", text: "any" }), ...data.agents.map((a) => el("option", { value: a.name, text: a.name })));
    } catch (err) { /* the list shows its own error */ }
  }

  return { rows, header, open, render, agents, when };
})();

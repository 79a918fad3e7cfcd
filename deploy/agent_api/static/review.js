// The review queue: GET /v1/review/queue; a verdict is POST /v1/review/{id} (a reviewer's key).
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const { el } = arloop;
  let cursor = null, current = null;

  function query() {
    const q = new URLSearchParams({ limit: "20" });
    if ($("f-agent").value) q.set("agent", $("f-agent").value);
    if ($("f-reason").value) q.set("reason", $("f-reason").value);
    const share = Math.min(100, Math.max(0, Number($("f-sample").value) || 0)) / 100;
    q.set("sample", String(share));
    return q;
  }
  const reasons = (r) => el("td", {}, ...r.reasons.map((x) => el("span", { class: "badge reason-" + x, text: x })));

  async function openRun(item, row) {
    try {
      document.querySelectorAll("#queue tr.open").forEach((r) => r.classList.remove("open"));
      row.classList.add("open");
      await arloopRuns.open($("run"), item);
      current = { item, row };
      $("verdict").reset();
      $("verdict-panel").hidden = false;
      $("verdict-submit").disabled = false;
      $("run").scrollIntoView({ block: "start" });
    } catch (err) {
      $("status").className = "error";
      $("status").textContent = "Cannot open the run (" + err.message + ").";
    }
  }
  async function load(more) {
    try {
      const q = query();
      if (more && cursor) q.set("cursor", cursor);
      const page = await (await arloop.api("/v1/review/queue?" + q)).json();
      const rows = arloopRuns.rows(page.items, openRun, reasons);
      if (more) $("queue").append(...rows); else $("queue").replaceChildren(arloopRuns.header(["why"]), ...rows);
      cursor = page.next_cursor;
      $("more").hidden = !cursor;
      count();
      document.body.dataset.loaded = "1";
    } catch (err) {
      $("status").className = "error";
      $("status").textContent = "Cannot read the review queue (" + err.message + "): it takes a reviewer's API key (scope review).";
    }
  }
  function count(prefix) {
    const n = $("queue").querySelectorAll("tr.run-row").length;
    $("status").className = "muted";
    $("status").textContent = (prefix || "") + n + " run" + (n === 1 ? "" : "s") + " waiting" + (cursor ? "; more below" : "");
  }
  async function submit(e) {
    e.preventDefault();
    if (!current) return;
    const score = Number(new FormData($("verdict")).get("score"));
    const text = $("verdict-text").value.trim();
    $("verdict-submit").disabled = true;
    try {
      const body = { score, cursor: current.item.cursor, ...(text ? { text } : {}) };
      const answer = await (await arloop.api("/v1/review/" + encodeURIComponent(current.item.trajectory_id), {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })).json();
      current.row.remove();
      $("verdict-panel").hidden = true;
      $("run").hidden = true;
      current = null;
      count("Review recorded (" + answer.event_id + "). ");
      $("status").dataset.recorded = answer.event_id;
    } catch (err) {
      $("verdict-submit").disabled = false;
      $("status").className = "error";
      $("status").textContent = "The review was not recorded (" + err.message + ").";
    }
  }
  arloop.bindWho();
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); load(false); });
  $("more").addEventListener("click", () => load(true));
  $("verdict").addEventListener("submit", submit);
  document.addEventListener("arloop:key", () => { arloopRuns.agents($("f-agent")); load(false); });
  arloopRuns.agents($("f-agent"));
  load(false);
})();

// The runs view: GET /v1/runs with the filters, a run opened with GET /v1/runs/{id}.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  let cursor = null;

  function seconds(input) {  // a datetime-local field as seconds since the epoch (local time)
    if (!input.value) return null;
    const t = new Date(input.value).getTime();
    return Number.isNaN(t) ? null : String(Math.floor(t / 1000));
  }
  function query() {
    const q = new URLSearchParams({ limit: "50" });
    const add = (k, v) => { if (v) q.set(k, v); };
    add("agent", $("f-agent").value); add("version", $("f-version").value.trim()); add("status", $("f-status").value);
    add("answered_by", $("f-answered-by").value); add("feedback", $("f-feedback").value);
    add("since", seconds($("f-since"))); add("until", seconds($("f-until")));
    return q;
  }
  async function openRun(item, row) {
    try {
      document.querySelectorAll("#runs tr.open").forEach((r) => r.classList.remove("open"));
      row.classList.add("open");
      await arloopRuns.open($("run"), item);
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
      const page = await (await arloop.api("/v1/runs?" + q)).json();
      const rows = arloopRuns.rows(page.items, openRun);
      if (more) $("runs").append(...rows); else $("runs").replaceChildren(arloopRuns.header(), ...rows);
      cursor = page.next_cursor;
      $("more").hidden = !cursor;
      const shown = $("runs").querySelectorAll("tr.run-row").length;
      $("status").className = "muted";
      $("status").textContent = shown + " run" + (shown === 1 ? "" : "s") + " shown" + (cursor ? "; older runs below" : "") +
        (page.partial_feedback ? " (feedback of the oldest runs not all read)" : "");
      document.body.dataset.loaded = "1";
    } catch (err) {
      $("status").className = "error";
      $("status").textContent = "Cannot list runs (" + err.message + "): check the API key above.";
    }
  }
  arloop.bindWho();
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); load(false); });
  $("more").addEventListener("click", () => load(true));
  document.addEventListener("arloop:key", () => { arloopRuns.agents($("f-agent")); load(false); });
  arloopRuns.agents($("f-agent"));
  load(false);
})();

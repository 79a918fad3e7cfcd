// The chat page: pick an agent, stream its answer (POST .../runs/stream), give feedback.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const agents = {};
  const threads = {};  // agent -> thread id, so a conversation continues
  let busy = false;

  async function loadAgents() {
    $("status").textContent = "";
    try {
      const list = (await (await arloop.api("/v1/agents")).json()).agents;
      $("agent").replaceChildren(...list.map((a) => { agents[a.name] = a; return arloop.el("option", { value: a.name, text: a.name }); }));
      showAgent();
    } catch (err) {
      $("status").textContent = "Cannot list agents (" + err.message + "): enter the API key above.";
      $("status").className = "error";
    }
  }

  function showAgent() {
    const a = agents[$("agent").value];
    if (!a) return;
    const tools = a.tools.length ? " · tools: " + a.tools.join(", ") : "";
    $("agent-about").textContent = a.description + tools + (a.disclaimer ? " · " + a.disclaimer : "");
  }

  function parseEvents(buffer, onEvent) {  // complete SSE events out of the buffer; the rest back
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(name, JSON.parse(data));
    }
    return buffer;
  }

  function addMessage(role, text) {
    const box = arloop.el("div", { class: "msg " + role });
    if (role === "user") box.textContent = text;
    $("conversation").append(box);
    box.scrollIntoView({ block: "end" });
    return box;
  }

  async function send(event) {
    event.preventDefault();
    const text = $("input").value;
    if (busy || !text.trim()) return;
    const agent = $("agent").value;
    busy = true; $("send").disabled = true; $("status").textContent = "";
    addMessage("user", text);
    $("input").value = "";
    const box = addMessage("assistant");
    const answer = arloop.el("div", { class: "answer" });
    const steps = arloop.el("details", { class: "steps" }, arloop.el("summary", { text: "tool calls and checks (0)" }));
    box.append(answer);
    let stepCount = 0;
    const body = { input: text, user_id: arloop.user() };
    if (threads[agent]) body.thread_id = threads[agent];
    try {
      const response = await arloop.api("/v1/agents/" + encodeURIComponent(agent) + "/runs/stream", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      const onEvent = (name, data) => {
        if (name === "metadata") { threads[agent] = data.thread_id; box.dataset.runId = data.run_id; }
        else if (name === "messages/partial" && data[0].node === "model") answer.textContent = data[0].content;
        else if (name === "messages/complete") {
          const m = data[0];
          if (m.type === "ai" && m.node === "model" && !m.tool_calls.length) answer.textContent = m.content;
          else {
            const line = m.type === "tool"
              ? (m.node === "evaluate" ? "check " : "tool ") + m.name + " → " + m.content + (m.error ? " (" + m.error + ")" : "")
              : (m.tool_calls.length ? "calls " + m.tool_calls.map((c) => c.name + "(" + c.args + ")").join(", ") : m.node + ": " + m.content);
            steps.append(arloop.el("pre", { class: "step", text: line }));
            stepCount += 1;
            steps.querySelector("summary").textContent = "tool calls and checks (" + stepCount + ")";
            if (stepCount === 1) box.append(steps);
          }
        } else if (name === "end") finish(box, answer, data);
        else if (name === "error") { box.append(arloop.el("div", { class: "error", text: "Error " + data.status + ": " + data.message })); }
      };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer = parseEvents(buffer + decoder.decode(value, { stream: true }), onEvent);
      }
    } catch (err) {
      box.append(arloop.el("div", { class: "error", text: err.message }));
    } finally {
      busy = false; $("send").disabled = false;
    }
  }

  function finish(box, answer, run) {
    answer.textContent = run.output;
    box.dataset.trajectoryId = run.trajectory_id;
    if (run.escalation) box.append(arloop.el("div", { class: "escalation", role: "alert", text: run.escalation }));
    if (run.disclaimer) box.append(arloop.el("div", { class: "disclaimer", text: run.disclaimer }));
    box.append(feedbackBar(run));
  }

  function feedbackBar(run) {
    const bar = arloop.el("div", { class: "feedback" });
    const said = arloop.el("span", { class: "said", role: "status" });
    const give = async (kind, value, text, button) => {
      const body = { trajectory_id: run.trajectory_id, feedback_token: run.feedback_token, kind: kind };
      if (value !== null) body.value = value;
      if (text) body.text = text;
      try {
        await arloop.api("/v1/feedback", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
        said.className = "said"; said.textContent = "Thanks: " + kind + " recorded.";
        if (button) button.disabled = true;
      } catch (err) { said.className = "error"; said.textContent = err.message; }
    };
    const up = arloop.el("button", { type: "button", class: "thumbs-up", title: "Good answer", "aria-label": "thumbs up", text: "👍 Good" });
    const down = arloop.el("button", { type: "button", class: "thumbs-down", title: "Bad answer", "aria-label": "thumbs down", text: "👎 Bad" });
    up.onclick = () => { give("thumbs", 1, null, up); down.disabled = true; };
    down.onclick = () => { give("thumbs", -1, null, down); up.disabled = true; };
    const rating = arloop.el("select", { class: "rating", "aria-label": "rating" }, ...["", "1", "2", "3", "4", "5"].map((v) => arloop.el("option", { value: v, text: v || "rate 1-5" })));
    rating.onchange = () => { if (rating.value) { give("rating", Number(rating.value), null); rating.disabled = true; } };
    const fix = arloop.el("details", { class: "correction" }, arloop.el("summary", { text: "Write a correction" }));
    const fixText = arloop.el("textarea", { "aria-label": "correction" });
    const fixSend = arloop.el("button", { type: "button", text: "Send correction" });
    fixSend.onclick = () => { if (fixText.value.trim()) give("correction", null, fixText.value, fixSend); };
    fix.append(fixText, fixSend);
    bar.append(up, down, rating, said, fix);
    return bar;
  }

  arloop.bindWho();
  $("agent").addEventListener("change", showAgent);
  $("new-thread").addEventListener("click", () => { delete threads[$("agent").value]; $("conversation").replaceChildren(); });
  $("ask").addEventListener("submit", send);
  $("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask").requestSubmit(); } });
  document.addEventListener("arloop:key", loadAgents);
  loadAgents();
})();

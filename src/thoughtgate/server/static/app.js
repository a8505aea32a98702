// thoughtgate web page: sign in with a key, list runs, watch one run's thread live and after reload.
// Every byte shown here came through the server's one output filter; this page never sees more
// than the key's role allows (a viewer's browser never receives raw reasoning).
"use strict";

const MARKER = "visible_reasoning_v1";
const TERMINAL = new Set(["message.completed", "message.partially_completed", "run.failed",
  "run.error", "run.settlement.completed", "run.interrupted"]);
const RUN_TERMINAL = new Set(["run.failed", "run.error", "run.settlement.completed", "run.interrupted"]);

let key = sessionStorage.getItem("tg_key") || "";
let source = null;

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
};

async function api(path, options = {}) {
  const res = await fetch(path, { ...options, headers: { ...(options.headers || {}),
    "authorization": `Bearer ${key}`, "content-type": "application/json" } });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(body.error?.message || body.detail || res.statusText), { status: res.status });
  return body;
}

// ---- thread reconstruction (same rules as thoughtgate.events.thread) -----------------------
function newThread() {
  return { items: [], cards: new Map(), steps: new Map(), text: "", final: null, raw: "",
    receipt: null, terminal: null, lastSeq: 0 };
}

function toolCard(thread, env) {
  const p = env.payload || {};
  const callId = p.callId ?? p.toolCallId ?? env.stepId ?? `seq-${env.seq}`;
  let card = thread.cards.get(callId);
  if (!card) {
    card = { kind: "tool", callId, toolKey: p.toolKey ?? p.key ?? "tool", label: "", status: "pending",
      input: undefined, output: undefined, error: undefined, explanation: undefined };
    thread.cards.set(callId, card);
    thread.items.push(card);
  }
  const a = p.activity;
  card.label = (a && a.label) || p.label || card.label || card.toolKey;
  if (p.input !== undefined || p.args !== undefined) card.input = p.input ?? p.args;
  if (p.data !== undefined || p.output !== undefined) card.output = p.data ?? p.output;
  if (p.error !== undefined) card.error = p.error;
  return card;
}

const TOOL_STATUS = { "tool.started": "executing", "tool.progress": "executing",
  "tool.approval_required": "pending", "tool.approval_timeout": "skipped",
  "tool.completed": "completed", "tool.failed": "failed", "tool.degraded": "degraded" };

function validStep(p) {
  return p && p.marker === MARKER && typeof p.summary === "string" && p.summary.length > 0
    && typeof (p.step_id ?? p.stepId) === "string";
}

function apply(thread, env) {
  if (env.seq <= thread.lastSeq) return;  // replay overlap: never show an event twice
  thread.lastSeq = env.seq;
  const t = env.type, p = env.payload || {};
  if (t === "reasoning.delta") { thread.raw += p.text || ""; return; }
  if (t === "message.delta") { thread.text += p.text || ""; return; }
  if (t === "message.completed" || t === "message.partially_completed") {
    thread.final = { text: p.text ?? thread.text, partial: t !== "message.completed", error: p.error };
  }
  if (t.startsWith("tool.")) {
    const card = toolCard(thread, env);
    if (t === "tool.approval_response") card.status = p.decision === "reject" ? "rejected" : "executing";
    else if (TOOL_STATUS[t]) card.status = TOOL_STATUS[t];
  } else if (t === "cot.step" || t === "cot.phase") {
    if (!validStep(p)) return;  // unmarked or malformed: discarded, never blocks anything
    const id = p.step_id ?? p.stepId;
    const existing = thread.steps.get(id);
    if (existing) { existing.summary = p.summary; existing.phase = p.phase; }
    else {
      const step = { kind: t === "cot.step" ? "step" : "phase", id, summary: p.summary, phase: p.phase };
      thread.steps.set(id, step); thread.items.push(step);
    }
  } else if (t === "cot.tool.reasoning") {
    if (!validStep(p)) return;
    const callId = p.tool_call_id ?? p.toolCallId;
    const card = callId && thread.cards.get(callId);
    if (card) card.explanation = p.summary;
  } else if (t === "cot.completed") {
    if (p.marker === MARKER) thread.receipt = p.receipt || p;
  } else if (t === "capability.resolved") {
    thread.items.push({ kind: "phase", id: `cap-${env.seq}`, summary: `Mode: ${p.chain_of_thought}` });
  } else if (t === "plan.step_added") {
    thread.items.push({ kind: "step", id: `plan-${env.seq}`, summary: p.summary || p.title || "Plan step" });
  } else if (t.startsWith("artifact.") || t.startsWith("preview.")) {
    thread.items.push({ kind: "artifact", id: `art-${env.seq}`, summary: p.label || p.name || t });
  }
  if (RUN_TERMINAL.has(t)) thread.terminal = t;
}

// ---- rendering --------------------------------------------------------------------------------
function render(thread, live) {
  const root = $("#thread");
  root.replaceChildren();
  if (live) root.append(el("p", { class: "live", "data-testid": "live" }, "● live"));
  for (const item of thread.items) {
    if (item.kind === "tool") {
      const card = el("div", { class: `item tool ${item.status}`, "data-testid": "tool-card",
        "data-status": item.status }, el("span", { class: "status" }, item.status),
        el("strong", {}, `⚙ ${item.label}`));
      if (item.explanation) card.append(el("div", { class: "why" }, item.explanation));
      if (item.input !== undefined) card.append(el("pre", { "data-testid": "tool-input" }, JSON.stringify(item.input, null, 1)));
      if (item.output !== undefined) card.append(el("pre", { "data-testid": "tool-output" }, String(item.output)));
      if (item.error !== undefined) card.append(el("pre", { class: "error" }, String(item.error)));
      root.append(card);
    } else {
      root.append(el("div", { class: `item ${item.kind}`, "data-testid": `vr-${item.kind}` }, item.summary));
    }
  }
  const answer = thread.final ? thread.final.text : thread.text;
  if (answer) {
    root.append(el("div", { class: "item answer", "data-testid": "answer" },
      el("h3", {}, thread.final?.partial ? "Answer (partial)" : "Answer"), answer));
  }
  if (thread.receipt) {
    const r = thread.receipt;
    const bits = [];
    if (r.raw_reasoning_exists) bits.push(`Raw reasoning exists and is visible to ${r.raw_reasoning_visible_to || "developers"} and above.`);
    if (r.steps_dropped_by_policy) bits.push(`${r.steps_dropped_by_policy} step(s) withheld by policy.`);
    root.append(el("div", { class: "item receipt", "data-testid": "receipt" }, el("h3", {}, "What was withheld"),
      bits.join(" ") || "Nothing was withheld from you."));
  }
  if (thread.raw) {
    root.append(el("div", { class: "item raw", "data-testid": "raw-reasoning" },
      el("h3", {}, "Raw reasoning (developer)"), el("pre", {}, thread.raw)));
  }
}

// ---- runs, reload and live --------------------------------------------------------------------
async function loadRuns() {
  const body = await api("/v1/runs");
  const runs = body.runs || [];
  const nav = $("#runs");
  nav.replaceChildren();
  for (const run of runs) {
    const link = el("a", { href: `#${run.run_id}`, "data-run": run.run_id },
      (run.prompt || "").slice(0, 60), el("div", { class: "meta" }, `${run.status} · ${run.chain_of_thought} · ${run.model || ""}`));
    nav.append(link);
  }
}

async function openRun(runId) {
  if (source) { source.close(); source = null; }
  document.querySelectorAll("#runs a").forEach((a) => a.classList.toggle("active", a.dataset.run === runId));
  const thread = newThread();
  let after = 0;
  for (;;) {  // reload: the persisted events alone rebuild the thread
    const body = await api(`/v1/runs/${runId}/events?after=${after}&limit=1000`);
    (body.events || []).forEach((e) => apply(thread, e));
    const next = body.next_after ?? after;
    if (next <= after) break;  // no raw event left after `after`
    after = next;
  }
  thread.lastSeq = Math.max(thread.lastSeq, after);
  render(thread, false);
  if (thread.terminal) return;
  const { ticket } = await api("/v1/tickets", { method: "POST", body: JSON.stringify({ run_id: runId }) });
  source = new EventSource(`/v1/runs/${runId}/stream?ticket=${encodeURIComponent(ticket)}&last_event_id=${thread.lastSeq}`);
  const onEvent = (msg) => {
    const env = JSON.parse(msg.data);
    apply(thread, env);
    render(thread, !thread.terminal);
    if (thread.terminal) { source.close(); source = null; loadRuns(); }
  };
  source.onmessage = onEvent;
  source.addEventListener("event", onEvent);
  source.onerror = () => { if (source && source.readyState === EventSource.CLOSED) { source = null; setTimeout(() => openRun(runId), 500); } };
  render(thread, true);
}

async function start() {
  try {
    const me = await api("/v1/me");
    $("#who").textContent = `${me.name} · ${me.role}`;
    $("#signin").hidden = true; $("#app").hidden = false; $("#signout").hidden = false;
    await loadRuns();
    if (location.hash.length > 1) await openRun(location.hash.slice(1));
  } catch (err) {
    $("#signin").hidden = false; $("#app").hidden = true;
    if (key) $("#signin-error").textContent = err.status === 401 ? "That key was not accepted." : err.message;
  }
}

$("#signin-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  key = $("#key").value.trim();
  sessionStorage.setItem("tg_key", key);
  start();
});
$("#signout").addEventListener("click", () => { sessionStorage.removeItem("tg_key"); key = ""; location.hash = ""; location.reload(); });
window.addEventListener("hashchange", () => { if (location.hash.length > 1) openRun(location.hash.slice(1)); });
start();

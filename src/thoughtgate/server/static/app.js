// thoughtgate web page: sign in with a key, list runs, open one, watch its thread live and after
// a reload. The page only renders what the server sent: every byte came through the server's one
// output filter for the key's role (a viewer's browser never receives raw reasoning). The thread
// model is thread.js, which keeps the rules of thoughtgate.events.thread.
"use strict";

const { Thread } = TG_THREAD;

const STATUS_TEXT = {
  pending: "waiting", executing: "running", completed: "done", failed: "failed",
  degraded: "degraded", rejected: "rejected", skipped: "skipped",
};
const ERROR_KIND_TEXT = {
  invalid_arguments: "The tool was called with arguments it does not accept.",
  tool_error: "The tool failed.",
  unknown_tool: "The model asked for a tool that does not exist.",
  fallback_failed: "The tool and its fallback both failed.",
  interrupted: "Interrupted when its process stopped; not run again (it may have had its effect).",
};
const RUN_STATUS_TEXT = {
  pending: "pending", running: "running", completed: "completed", partial: "partial",
  failed: "failed", error: "failed", interrupted: "interrupted",
};

const OUTCOME_TEXT = {
  partial: "the answer was cut off", failed: "no answer", interrupted: "the run was interrupted",
};

function answerTitle(status, outcome, text) {
  if (outcome === null) return status === "partial" ? "Answer (partial)" : status === "running" ? "Answer (writing…)" : "Answer";
  if (outcome === "completed") return "Answer";
  if (!text) return "No answer";
  return `Answer (${outcome === "failed" ? "partial" : outcome})`;
}

const state = {
  key: sessionStorage.getItem("tg_key") || "",
  me: null,
  view: null, // { runId, thread, source, generation, run, retries, timer }
  generation: 0,
  open: new Set(), // <details> the reader opened, kept across re-renders
  frame: 0,
};

const $ = (sel) => document.querySelector(sel);
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v; else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const res = await fetch(path, {
    ...options,
    cache: "no-store",
    headers: { ...(options.headers || {}), authorization: `Bearer ${state.key}`, "content-type": "application/json" },
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new ApiError(res.status, body.error?.message || res.statusText);
  return body;
}

const runPath = (runId, tail = "") => `/v1/runs/${encodeURIComponent(runId)}${tail}`;

function ago(ts) {
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(ts * 1000).toLocaleDateString();
}

function pill(status, text, testid) {
  return el("span", { class: `pill s-${status}`, "data-testid": testid }, text);
}

// ---- rendering the thread ------------------------------------------------------------------

function pretty(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function disclosure(id, summary, body) {
  const d = el("details", { "data-key": id, open: state.open.has(id) }, el("summary", {}, summary), body);
  d.addEventListener("toggle", () => { if (d.open) state.open.add(id); else state.open.delete(id); });
  return d;
}

function renderCard(card, captions, canAnswer, runEnded) {
  const node = el("li", { class: `item tool t-${card.status}`, "data-testid": "tool-card", "data-status": card.status,
    "data-call": card.call_id },
  el("div", { class: "tool-head" },
    el("span", { class: "tool-icon", "aria-hidden": "true" }, "⚙"),
    el("span", { class: "tool-label" }, card.label),
    card.tool_key && card.tool_key !== card.label ? el("code", { class: "tool-key" }, card.tool_key) : null,
    pill(card.status, STATUS_TEXT[card.status] || card.status, "tool-status")));
  for (const c of captions) node.append(el("div", { class: "caption" }, c));
  for (const why of card.reasoning) node.append(el("div", { class: "why", "data-testid": "tool-why" }, why.summary));
  if (card.input !== null) node.append(disclosure(`in:${card.call_id}`, "Input", el("pre", { "data-testid": "tool-input" }, pretty(card.input))));
  if (card.output !== null) node.append(disclosure(`out:${card.call_id}`, "Output", el("pre", { "data-testid": "tool-output" }, pretty(card.output))));
  // A viewer gets no error text (it can quote the tool's input), only its kind.
  const error = card.error || (card.error_kind ? ERROR_KIND_TEXT[card.error_kind] || card.error_kind : null);
  if (error) node.append(el("div", { class: "error", "data-testid": "tool-error" }, error));
  if (card.status === "pending" && canAnswer && !runEnded) {
    const answer = (decision) => api(runPath(state.view.runId, `/approvals/${encodeURIComponent(card.call_id)}`),
      { method: "POST", body: JSON.stringify({ decision }) }).catch((err) => alert(err.message));
    node.append(el("div", { class: "approval" },
      button("Approve", () => answer("approve"), "approve"), button("Reject", () => answer("reject"), "reject")));
  }
  return node;
}

// One model turn's reasoning, as the provider returned it, next to that turn's tool calls. Only a
// developer's stream (on a surface run) carries it; each segment is named for what it is.
function renderReasoning(item) {
  const node = el("li", { class: "item raw", "data-testid": "reasoning-turn", "data-turn": item.turn ?? "" },
    el("h3", {}, item.turn === null ? "Model turn" : `Model turn ${item.turn + 1}`, " ",
      el("span", { class: "badge" }, "developer only")));
  let label = null;
  for (const seg of item.segments) {
    if (seg.label !== label) {
      node.append(el("div", { class: "raw-label", "data-testid": "reasoning-label", "data-kind": seg.kind ?? "" }, seg.label));
      label = seg.label;
    }
    node.append(el("pre", { "data-testid": "raw-text", "data-kind": seg.kind ?? "" }, seg.text.trimEnd()));
  }
  return node;
}

function button(label, onClick, cls) {
  const b = el("button", { type: "button", class: cls }, label);
  b.addEventListener("click", onClick);
  return b;
}

// where the steps came from, in the words of thoughtgate.events.visible.SOURCE_LABELS
const SOURCE_LABELS = {
  phases: "the run's progress",
  narration: "notes the agent wrote for you",
  provider_summary: "the provider's summaries of the model's reasoning",
  model: "the operator's summarizer model",
};

// the same sentences as thoughtgate.events.visible.describe_receipt
function receiptText(r, thread) {
  const parts = [];
  const sources = Object.entries(r.step_sources || {});
  parts.push(sources.length
    ? `Steps shown came from ${sources.map(([k, v]) => `${SOURCE_LABELS[k] || k} (${v})`).join(", ")}, checked by policy.`
    : "No steps were shown.");
  parts.push(...(r.notes || []));
  if (r.raw_reasoning_exists) {
    parts.push(thread.raw !== null
      ? "The model's reasoning is shown next to each turn (developer view)."
      : r.raw_reasoning_surface === "trace"
        ? "The model's reasoning exists; only developers can read it, in the trace."
        : "The model's reasoning exists; only developers and above can read it.");
  } else if (r.opaque_reasoning_exists) {
    parts.push("The provider returned encrypted reasoning that nobody can read.");
  }
  if (r.steps_dropped_by_policy) {
    const why = Object.entries(r.dropped_by_reason).map(([k, v]) => `${k.replace(/_/g, " ")} ×${v}`).join(", ");
    parts.push(`${r.steps_dropped_by_policy} step(s) were withheld by policy (${why}).`);
  }
  return parts.join(" ");
}

function renderThread() {
  state.frame = 0;
  const view = state.view;
  if (!view) return;
  const { thread, run } = view;
  const root = $("#thread");
  const live = !thread.runEnded && !!view.source;
  const items = thread.list();
  const cards = new Set(items.filter((i) => i.kind === "tool").map((i) => i.call_id));
  const captions = new Map(); // phases that name a card are shown on the card
  for (const i of items) {
    if (i.kind === "phase" && i.step.tool_call_id && cards.has(i.step.tool_call_id)) {
      captions.set(i.step.tool_call_id, [...(captions.get(i.step.tool_call_id) || []), i.step.summary]);
    }
  }
  const canAnswer = !!state.me?.permissions?.answer_approvals;
  const list = el("ol", { class: "timeline", "data-testid": "thread-items" });
  for (const i of items) {
    if (i.kind === "tool") list.append(renderCard(i, captions.get(i.call_id) || [], canAnswer, thread.runEnded));
    else if (i.kind === "step") {
      list.append(el("li", { class: `item step p-${i.step.phase}`, "data-testid": "vr-step", "data-phase": i.step.phase },
        el("span", { class: "step-text" }, i.step.summary)));
    } else if (i.kind === "phase") {
      if (i.step.tool_call_id && cards.has(i.step.tool_call_id)) continue;
      list.append(el("li", { class: `item phase p-${i.step.phase}`, "data-testid": "vr-phase", "data-phase": i.step.phase },
        i.step.summary));
    } else if (i.kind === "reasoning") {
      list.append(renderReasoning(i));
    } else {
      list.append(el("li", { class: `item notice n-${i.kind}`, "data-testid": "notice" }, i.label));
    }
  }
  if (!items.length && !thread.message) list.append(el("li", { class: "item phase" }, live ? "Waiting for the agent…" : "Nothing to show yet."));

  // A run that ended without completing always says why, on the answer itself: an empty
  // "Answer" box is never all a reader gets for an outage.
  const answerText = thread.message;
  const outcome = thread.runEnded ? thread.status : null;
  const unfinished = outcome !== null && outcome !== "completed";
  const why = unfinished ? (run?.error || OUTCOME_TEXT[outcome] || outcome) : null;
  const answer = answerText || thread.final || unfinished
    ? el("section", { class: `answer${thread.final || outcome ? "" : " streaming"}${unfinished ? " unfinished" : ""}`,
      "data-testid": "answer", "data-outcome": outcome },
      el("h3", {}, answerTitle(thread.status, outcome, answerText)),
      answerText ? el("p", { "data-testid": "answer-text" }, answerText) : null,
      why ? el("p", { class: "error", "data-testid": "answer-error" }, `${RUN_STATUS_TEXT[outcome] || outcome}: ${why}`) : null)
    : null;
  const receipt = thread.receipt
    ? el("section", { class: "receipt", "data-testid": "receipt" }, el("h3", {}, "About the reasoning"),
      el("p", {}, receiptText(thread.receipt, thread)))
    : null;

  const runStatus = thread.runEnded ? thread.status : live ? "running" : (run?.status || thread.status);
  const header = el("header", { class: "run-head" },
    el("h2", { "data-testid": "run-title" }, run?.prompt || view.runId),
    el("div", { class: "run-meta" },
      pill(runStatus, RUN_STATUS_TEXT[runStatus] || runStatus, "run-status"),
      live ? el("span", { class: "live", "data-testid": "live" }, "live") : null,
      run ? el("span", {}, run.model || "") : null,
      run ? el("span", {}, `reasoning: ${run.chain_of_thought}`) : null,
      view.notice ? el("span", { class: "notice-text", "data-testid": "stream-notice" }, view.notice) : null),
    suspendedNote(run, thread));
  const body = el("div", { class: "thread-body", "data-testid": "thread-body" }, list, answer, receipt);
  root.replaceChildren(header, body);
}

// A durable run whose process stopped (ADR 0012): why, and -- for a run that waits for someone
// to continue it -- a Resume button for members and above.
function suspendedNote(run, thread) {
  const waiting = run?.metadata?.suspended;
  if (!waiting || thread.runEnded) return null;
  const note = el("div", { class: "notice-text", "data-testid": "suspended" },
    `Paused: ${waiting.reason}. `, waiting.resume === "manual" ? "It continues from its last completed step when resumed." : "Another replica takes it up shortly.");
  if (waiting.resume === "manual" && state.me?.permissions?.start_runs) {
    note.append(button("Resume", () => api(runPath(run.run_id, "/resume"), { method: "POST" })
      .then(() => openRun(run.run_id)).catch((err) => alert(err.message)), "approve"));
  }
  return note;
}

function scheduleRender() {
  if (!state.frame) state.frame = requestAnimationFrame(renderThread);
}

// ---- runs ------------------------------------------------------------------------------------

async function loadRuns() {
  const { runs = [] } = await api("/v1/runs?limit=100");
  const nav = $("#runs-list");
  nav.replaceChildren(...runs.map((run) => el("li", {},
    el("a", { href: `#${encodeURIComponent(run.run_id)}`, "data-run": run.run_id,
      class: state.view?.runId === run.run_id ? "active" : null },
    el("span", { class: "run-prompt" }, run.prompt || run.run_id),
    el("span", { class: "run-line" },
      pill(run.status, RUN_STATUS_TEXT[run.status] || run.status, "run-list-status"),
      el("span", { class: "muted" }, `${run.chain_of_thought} · ${ago(run.created_at)}`)),
    run.error && run.status !== "completed"
      ? el("span", { class: "run-error error", "data-testid": "run-list-error", title: run.error }, run.error)
      : null))));
  if (!runs.length) nav.append(el("li", { class: "muted empty" }, "No runs yet."));
}

function closeStream(view) {
  if (view?.source) { view.source.close(); view.source = null; }
  if (view?.timer) { clearTimeout(view.timer); view.timer = null; }
}

async function openRun(runId) {
  closeStream(state.view);
  const generation = ++state.generation;
  const view = { runId, thread: new Thread(), source: null, run: null, retries: 0, timer: null, notice: "" };
  state.view = view;
  document.querySelectorAll("#runs-list a").forEach((a) => a.classList.toggle("active", a.dataset.run === runId));
  const current = () => state.generation === generation;
  try {
    view.run = await api(runPath(runId));
    let after = 0;
    for (;;) { // reload: the persisted events alone rebuild the thread
      const page = await api(runPath(runId, `/events?after=${after}&limit=1000`));
      if (!current()) return;
      for (const e of page.events || []) view.thread.feed(e);
      const next = page.next_after ?? after;
      if (next <= after) break;
      after = next;
    }
    // resume after the last event read, including ones the filter kept from this reader
    view.thread.lastSeq = Math.max(view.thread.lastSeq, after);
  } catch (err) {
    if (!current()) return;
    $("#thread").replaceChildren(el("p", { class: "error", "data-testid": "run-error" },
      err.status === 404 ? "No such run." : err.message));
    return;
  }
  renderThread();
  if (!view.thread.runEnded) connect(view, current);
}

async function connect(view, current) {
  let ticket;
  try {
    ({ ticket } = await api("/v1/tickets", { method: "POST", body: JSON.stringify({ run_id: view.runId }) }));
  } catch (err) {
    if (current()) retry(view, current, err.status === 401 || err.status === 403 ? null : err.message);
    return;
  }
  if (!current()) return;
  const url = `${runPath(view.runId, "/stream")}?ticket=${encodeURIComponent(ticket)}&last_event_id=${view.thread.lastSeq}`;
  const source = new EventSource(url);
  view.source = source;
  source.onmessage = (msg) => {
    if (!current()) return;
    view.retries = 0;
    view.notice = "";
    view.thread.feed(JSON.parse(msg.data));
    if (view.thread.runEnded) {
      // The server ends the stream right after this event; close it ourselves only if it lingers.
      view.timer = setTimeout(() => closeStream(view), 2000);
      renderThread();
      api(runPath(view.runId)).then((run) => { if (current()) { view.run = run; renderThread(); } }).catch(() => {});
      loadRuns().catch(() => {});
      return;
    }
    scheduleRender();
  };
  // A lagging reader is closed by the server: resume at once from the last id we applied.
  source.addEventListener("lagging", () => { closeStream(view); if (current()) connect(view, current); });
  source.addEventListener("failed", () => { closeStream(view); if (current()) retry(view, current, "reconnecting…"); });
  // The key was revoked or lost the role this stream was opened with: what is on screen may be
  // more than the key may now see, so rebuild the run from scratch with the key as it is now.
  source.addEventListener("access_revoked", () => { closeStream(view); if (current()) openRun(view.runId); });
  // Any other drop: our own reconnect with a fresh ticket (the old one may have expired).
  source.onerror = () => {
    closeStream(view); // also the normal end: the server closed the stream after the run ended
    if (current() && !view.thread.runEnded) retry(view, current, "reconnecting…");
  };
  scheduleRender();
}

function retry(view, current, notice) {
  if (notice === null || view.retries >= 8) {
    view.notice = notice === null ? "Your key can no longer follow this run." : "Lost the live connection; reload to try again.";
    renderThread();
    return;
  }
  view.retries += 1;
  view.notice = notice;
  scheduleRender();
  view.timer = setTimeout(() => { view.timer = null; if (current()) connect(view, current); }, 250 * view.retries);
}

// ---- sign in -----------------------------------------------------------------------------------

function showSignIn(message) {
  closeStream(state.view);
  state.view = null;
  state.me = null;
  $("#signin").hidden = false;
  $("#app").hidden = true;
  $("#signout").hidden = true;
  $("#who").replaceChildren();
  $("#signin-error").textContent = message || "";
  $("#key").focus();
}

async function start() {
  if (!state.key) { showSignIn(""); return; }
  try {
    state.me = await api("/v1/me");
  } catch (err) {
    sessionStorage.removeItem("tg_key");
    state.key = "";
    showSignIn(err.status === 401 ? "That key was not accepted. Check it and try again." : `Could not sign in: ${err.message}`);
    return;
  }
  $("#who").replaceChildren(el("span", { class: "who-name" }, state.me.name),
    el("span", { class: `role r-${state.me.role}`, "data-testid": "role" }, state.me.role));
  $("#signin").hidden = true;
  $("#app").hidden = false;
  $("#signout").hidden = false;
  const can = state.me.permissions;
  $("#role-note").textContent = can.read_reasoning
    ? "Your role also reads tool inputs and outputs and, on surface runs, the model's reasoning next to each turn."
    : can.answer_approvals
      ? "You see visible steps, tool cards with their inputs and outputs, and answers; the model's reasoning is not sent to your role."
      : "You see visible steps, tool cards (label and status) and answers; the model's reasoning is not sent to your role.";
  await loadRuns();
  if (location.hash.length > 1) await openRun(decodeURIComponent(location.hash.slice(1)));
}

$("#signin-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.key = $("#key").value.trim();
  $("#key").value = "";
  sessionStorage.setItem("tg_key", state.key);
  start();
});
$("#signout").addEventListener("click", () => {
  sessionStorage.removeItem("tg_key");
  state.key = "";
  history.replaceState(null, "", location.pathname);
  showSignIn("");
});
$("#refresh").addEventListener("click", () => loadRuns().catch((err) => alert(err.message)));
window.addEventListener("hashchange", () => {
  if (state.me && location.hash.length > 1) openRun(decodeURIComponent(location.hash.slice(1)));
});
start();

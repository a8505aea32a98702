// One run, as the key's role may see it: rebuilt from GET /v1/runs/{id}/events, then followed
// live on GET /v1/runs/{id}/stream. Viewers and members read the thread in the order things
// happened; developers and above read it per model turn: that turn's reasoning (named for what it
// is), what it said, its visible steps and its tool calls, with its model, tokens, time to first
// token, duration, finish reason and any error; the run's totals; and the trace of telemetry_only
// runs. The page only renders what the server sent through its one output filter.

import {
  $, RUN_STATUS_TEXT, api, button, can, disclosure, el, num, pill, runPath, seconds, state, time,
} from "./util.js";

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
const OUTCOME_TEXT = {
  partial: "the answer was cut off", failed: "no answer", interrupted: "the run was interrupted",
};
// where the steps came from, in the words of thoughtgate.events.visible.SOURCE_LABELS
const SOURCE_LABELS = {
  phases: "the run's progress",
  narration: "notes the agent wrote for you",
  provider_summary: "the provider's summaries of the model's reasoning",
  model: "the operator's summarizer model",
};

let hooks = { listChanged: () => {} };
export function setupView(options) { hooks = options; }

const debugView = () => can("read_reasoning"); // developer and above: the per-turn timeline

function answerTitle(status, outcome, text) {
  if (outcome === null) return status === "partial" ? "Answer (partial)" : status === "running" ? "Answer (writing…)" : "Answer";
  if (outcome === "completed") return "Answer";
  if (!text) return "No answer";
  return `Answer (${outcome === "failed" ? "partial" : outcome})`;
}

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

// ---- items -------------------------------------------------------------------------------------

const pretty = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));

function renderCard(card, captions, runEnded) {
  const node = el("li", { class: `item tool t-${card.status}`, "data-testid": "tool-card", "data-item": "tool",
    "data-status": card.status, "data-call": card.call_id, "data-turn": card.turn ?? "" },
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
  if (error) {
    node.append(el("div", { class: "error", "data-testid": "tool-error" },
      card.error && card.error_kind ? el("code", { class: "err-class", "data-testid": "tool-error-class" }, card.error_kind) : null,
      card.error && card.error_kind ? " " : null, error));
  }
  if (card.status === "pending" && can("answer_approvals") && !runEnded) {
    const answer = (decision) => api(runPath(state.view.runId, `/approvals/${encodeURIComponent(card.call_id)}`),
      { method: "POST", body: JSON.stringify({ decision }) }).catch((err) => alert(err.message));
    node.append(el("div", { class: "approval" },
      button("Approve", () => answer("approve"), { class: "approve" }),
      button("Reject", () => answer("reject"), { class: "reject" })));
  }
  return node;
}

// One model turn's reasoning, as the provider returned it, next to that turn's tool calls. Only a
// developer's stream (on a surface run) carries it; each segment is named for what it is.
function renderReasoning(item, inTurn) {
  const title = inTurn ? "Reasoning" : item.turn === null ? "Model turn" : `Model turn ${item.turn + 1}`;
  const node = el("li", { class: "item raw", "data-testid": "reasoning-turn", "data-item": "reasoning", "data-turn": item.turn ?? "" },
    el("h3", {}, title, " ", el("span", { class: "badge" }, "developer only")));
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

function renderSaid(item) {
  return el("li", { class: "item said", "data-testid": "said", "data-item": "said", "data-turn": item.turn ?? "" },
    el("span", { class: "said-label" }, "The agent said"),
    el("p", { "data-testid": "said-text" }, item.text.trim()));
}

function renderItem(i, captions, cards, runEnded, inTurn) {
  if (i.kind === "tool") return renderCard(i, captions.get(i.call_id) || [], runEnded);
  if (i.kind === "step") {
    return el("li", { class: `item step p-${i.step.phase}`, "data-testid": "vr-step", "data-item": "step", "data-phase": i.step.phase },
      el("span", { class: "step-text" }, i.step.summary));
  }
  if (i.kind === "phase") {
    if (i.step.tool_call_id && cards.has(i.step.tool_call_id)) return null;
    return el("li", { class: `item phase p-${i.step.phase}`, "data-testid": "vr-phase", "data-item": "phase", "data-phase": i.step.phase },
      i.step.summary);
  }
  if (i.kind === "reasoning") return renderReasoning(i, inTurn);
  if (i.kind === "text") return renderSaid(i);
  return el("li", { class: `item notice n-${i.kind}`, "data-testid": "notice", "data-item": "notice" }, i.label);
}

// ---- the answer --------------------------------------------------------------------------------

const sameTask = (a, b) => (a.taskId ?? null) === (b.taskId ?? null);

// The text of the last turn that said something is the answer (shown in the answer box, not in the
// timeline) unless that turn also called a tool or a later turn began: then it was said before a
// tool call and stays where it was said.
function answerCandidate(items, thread) {
  const said = items.filter((i) => i.kind === "text" && i.text.trim());
  const last = said[said.length - 1];
  if (!last) return null;
  const after = items.slice(items.indexOf(last) + 1);
  if (items.some((i) => i.kind === "tool" && sameTask(i, last) && i.turn === last.turn)) return null;
  if (after.some((i) => ["tool", "reasoning", "text"].includes(i.kind) && sameTask(i, last) && i.turn !== last.turn)) return null;
  const info = thread.turns.get(JSON.stringify([last.taskId ?? null, last.turn]));
  if (info && info.tool_calls > 0) return null;
  if (thread.final && thread.message.trim() !== last.text.trim()) return null;
  return last;
}

// ---- per-turn metrics (developer and above) ----------------------------------------------------

// Billed counts reach developers and above only (ADR 0163): a copy without them says so.
function tokensText(u) {
  return u.input_tokens == null && u.output_tokens == null
    ? "tokens withheld"
    : `${num(u.input_tokens)} in · ${num(u.output_tokens)} out`;
}

function turnMetrics(info) {
  if (!info) return el("div", { class: "turn-metrics pending", "data-testid": "turn-metrics" }, "streaming…");
  const u = info.usage || {};
  const bits = [
    info.model ? el("span", { "data-testid": "turn-model" }, info.model) : null,
    el("span", { "data-testid": "turn-tokens", "data-in": u.input_tokens ?? "", "data-out": u.output_tokens ?? "",
      "data-reasoning": u.reasoning_tokens ?? "" }, tokensText(u),
    Object.hasOwn(u, "reasoning_tokens") ? ` · ${num(u.reasoning_tokens)} reasoning` : ""),
    el("span", { "data-testid": "turn-ttft", "data-value": info.ttft_s ?? "", title: "time to first token" }, `TTFT ${seconds(info.ttft_s)}`),
    el("span", { "data-testid": "turn-duration", "data-value": info.duration_s ?? "", title: "duration of the model turn" }, seconds(info.duration_s)),
    info.finish_reason ? el("span", { "data-testid": "turn-finish", title: "finish reason" }, info.finish_reason) : null,
    info.started_at !== null ? time(info.started_at, "clock", "turn-started") : null,
  ];
  return el("div", { class: "turn-metrics", "data-testid": "turn-metrics" }, ...bits.filter(Boolean).flatMap((b, i) => (i ? [" · ", b] : [b])));
}

function turnSection(key, first, thread, multiTask) {
  const info = thread.turns.get(key);
  const title = `${multiTask && first.taskId ? `Task ${first.taskId.slice(-6)} · ` : ""}Model turn ${first.turn + 1}`;
  return el("li", { class: "turn", "data-testid": "turn", "data-turn": first.turn, "data-key": `turn:${key}`, tabindex: "-1",
    "aria-label": title },
    el("div", { class: "turn-head" }, el("h3", {}, title), turnMetrics(info)),
    info?.error ? el("div", { class: "error turn-error", "data-testid": "turn-error" },
      info.error_type ? el("code", { class: "err-class", "data-testid": "turn-error-type" }, info.error_type) : null,
      info.error_type ? " " : null, info.error) : null,
    info?.error_detail ? saidLine(info.error_detail, "turn-error-detail") : null,
    el("ol", { class: "turn-items" }));
}

// The failure's own words (error_detail: a provider's error text, a library's exception), shown
// as they are in the reader's copy of the event: the server's one output filter sends them to
// developers and above only, where the run records reasoning (ADR 0073). The page decides
// nothing: no field, no line -- not even an empty element.
function saidLine(detail, testid) {
  return el("p", { class: "error-detail", "data-testid": testid }, el("span", { class: "said" }, "said: "),
    el("code", {}, detail));
}

function totalsLine(thread) {
  const t = thread.totals();
  const parts = [
    el("span", { "data-testid": "total-turns", "data-value": t.turns }, `${t.turns} model turn${t.turns === 1 ? "" : "s"}`),
    el("span", { "data-testid": "total-tools", "data-value": t.tool_calls }, `${t.tool_calls} tool call${t.tool_calls === 1 ? "" : "s"}`),
    el("span", { "data-testid": "total-tokens", "data-in": t.input_tokens ?? "", "data-out": t.output_tokens ?? "",
      "data-reasoning": t.reasoning_tokens ?? "" }, tokensText(t),
    t.reasoning_tokens !== null ? ` · ${num(t.reasoning_tokens)} reasoning` : ""),
    el("span", { "data-testid": "total-duration", "data-value": t.duration_s ?? "" }, t.duration_s === null ? "running" : seconds(t.duration_s)),
  ];
  return el("div", { class: "totals", "data-testid": "totals" }, ...parts.flatMap((b, i) => (i ? [" · ", b] : [b])));
}

// ---- the trace (developer and above) -----------------------------------------------------------

function renderTrace(view) {
  const trace = view.trace;
  if (!trace) return null;
  if (trace.error) return el("section", { class: "trace", "data-testid": "trace" }, el("p", { class: "error" }, trace.error));
  const tasks = trace.events.map((e, n) => {
    const p = e.payload;
    const t = p.trace || {};
    const u = p.usage || {};
    return el("div", { class: "trace-task", "data-testid": "trace-task" },
      el("h4", {}, `Task ${n + 1}${p.model ? ` · ${p.model}` : ""}`),
      el("div", { class: "turn-metrics" },
        `${p.status} · ${p.turns} model turn${p.turns === 1 ? "" : "s"} · ${seconds(p.duration_s)} · `
        + tokensText(u)
        + (Object.hasOwn(u, "reasoning_tokens") ? ` · ${num(u.reasoning_tokens)} reasoning` : "")
        + (p.finish_reason ? ` · ${p.finish_reason}` : "")),
      typeof t.reasoning === "string"
        ? el("div", { class: "raw" },
          el("div", { class: "raw-label" }, `Reasoning, all turns of this task (${num(t.reasoning_chars)} characters) `,
            el("span", { class: "badge" }, "developer only")),
          el("pre", { "data-testid": "trace-reasoning" }, t.reasoning.trimEnd() || "(none)"))
        : el("p", { class: "muted" }, "No reasoning was recorded for this task."),
      (t.continuity || []).length
        ? el("p", { class: "muted small-text" }, `Continuity carriers (kept in the process, never shown): ${t.continuity.map((c) => c.carrier).join(", ")}`)
        : null);
  });
  return el("section", { class: "trace", "data-testid": "trace" },
    el("h3", {}, "Trace ", el("span", { class: "badge" }, "developer only")),
    tasks.length ? tasks : el("p", { class: "muted" }, "No task has finished yet."));
}

async function openTrace(view) {
  try {
    view.trace = await api(runPath(view.runId, "/trace"));
  } catch (err) {
    view.trace = { error: err.message };
  }
  if (state.view === view) renderThread();
}

// ---- the thread --------------------------------------------------------------------------------

export function renderThread() {
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
  const keys = new Map(thread.order.map((k) => [thread.items.get(k), k])); // stable ids for the DOM
  const candidate = answerCandidate(items, thread);
  const debug = debugView();
  const multiTask = new Set(items.filter((i) => i.taskId).map((i) => i.taskId)).size > 1;
  const list = el("ol", { class: `timeline${debug ? " by-turn" : ""}`, "data-testid": "thread-items" });
  // Developer view: one section per model turn. A turn with nothing to show (an outage before the
  // first token) still gets its section, before the next turn of its task, for its metrics and error.
  const sections = new Map();
  const pendingTurns = debug ? thread.turnList().filter((t) => t.turn !== null) : [];
  const section = (taskId, turn) => {
    const key = JSON.stringify([taskId ?? null, turn]);
    if (!sections.has(key)) {
      for (const t of pendingTurns.filter((p) => sameTask({ taskId: p.task_id }, { taskId }) && p.turn < turn)) {
        section(t.task_id, t.turn);
      }
      const node = turnSection(key, { taskId, turn }, thread, multiTask);
      sections.set(key, node);
      list.append(node);
    }
    return sections.get(key).querySelector(".turn-items");
  };
  let open = null; // the section items go into while they keep to one turn
  for (const i of items) {
    if (i === candidate) continue; // shown as the answer
    const inTurn = debug && typeof i.turn === "number";
    const node = renderItem(i, captions, cards, thread.runEnded, inTurn);
    if (!node) continue;
    node.dataset.key = keys.get(i);
    if (!inTurn) { list.append(node); open = null; continue; }
    const key = JSON.stringify([i.taskId ?? null, i.turn]);
    if (!open || open.key !== key || !sections.has(key)) open = { key, items: section(i.taskId, i.turn) };
    open.items.append(node);
  }
  for (const t of pendingTurns) section(t.task_id, t.turn);
  if (!items.length && !thread.message) list.append(el("li", { class: "item phase" }, live ? "Waiting for the agent…" : "Nothing to show yet."));

  // A run that ended without completing always says why, on the answer itself: an empty
  // "Answer" box is never all a reader gets for an outage.
  const outcome = thread.runEnded ? thread.status : null;
  const answerText = thread.final ? thread.message : candidate ? candidate.text : "";
  const unfinished = outcome !== null && outcome !== "completed";
  const ending = thread.ending;
  const why = unfinished ? (ending?.error || run?.error || ending?.reason || OUTCOME_TEXT[outcome] || outcome) : null;
  const answer = answerText || thread.final || unfinished
    ? el("section", { class: `answer${thread.final || outcome ? "" : " streaming"}${unfinished ? " unfinished" : ""}`,
      "data-testid": "answer", "data-outcome": outcome },
      el("h3", {}, answerTitle(thread.status, outcome, answerText)),
      answerText ? el("p", { "data-testid": "answer-text" }, answerText) : null,
      why ? el("p", { class: "error", "data-testid": "answer-error" }, `${RUN_STATUS_TEXT[outcome] || outcome}: ${why}`,
        ending?.error_type ? el("code", { class: "err-class", "data-testid": "run-error-type" }, ending.error_type) : null) : null,
      unfinished && ending?.error_detail ? saidLine(ending.error_detail, "run-error-detail") : null)
    : null;
  const traceable = can("read_trace") && run && run.chain_of_thought !== "hidden";
  const receipt = thread.receipt
    ? el("section", { class: "receipt", "data-testid": "receipt" }, el("h3", {}, "About the reasoning"),
      el("p", {}, receiptText(thread.receipt, thread)))
    : null;

  const runStatus = thread.runEnded ? thread.status : live ? "running" : (run?.status || thread.status);
  const header = el("header", { class: "run-head" },
    el("h2", { "data-testid": "run-title" }, run?.prompt || view.runId),
    el("div", { class: "run-meta" },
      pill(runStatus, RUN_STATUS_TEXT[runStatus] || runStatus, "run-status"),
      el("span", { class: `live${live ? "" : " off"}`, "data-testid": live ? "live" : null, "aria-hidden": live ? null : "true" }, "live"),
      run?.model ? el("span", { "data-testid": "run-model" }, run.model) : null,
      run ? el("span", {}, `reasoning: ${run.chain_of_thought}`) : null,
      run ? el("span", {}, "started ", time(run.created_at, "full", "run-started")) : null,
      el("span", { class: "notice-text", "data-testid": view.notice ? "stream-notice" : null }, view.notice || ""),
      !traceable ? null
        : thread.runEnded
          ? button(view.trace ? "Reload trace" : "Open trace", () => openTrace(view), { class: "small", "data-testid": "open-trace" })
          // its place, kept while the run streams: the button is taller than the line's text, so
          // adding it at the end would move everything below down
          : el("button", { type: "button", class: "small off", disabled: true, "aria-hidden": "true" }, "Open trace")),
    debug ? totalsLine(thread) : null,
    suspendedNote(run, thread));
  const body = el("div", { class: "thread-body", "data-testid": "thread-body" }, list, answer, receipt, renderTrace(view));
  root.replaceChildren(header, body);
}

// A durable run whose process stopped (ADR 0013): why, and -- for a run that waits for someone
// to continue it -- a Resume button for members and above (POST /v1/runs/{id}/resume).
function suspendedNote(run, thread) {
  const waiting = run?.metadata?.suspended;
  if (!waiting || thread.runEnded) return null;
  const note = el("div", { class: "notice-text", "data-testid": "suspended" },
    `Paused: ${waiting.reason}. `,
    waiting.resume === "manual" ? "It continues from its last completed step when resumed. " : "Another replica takes it up shortly.");
  if (waiting.resume === "manual" && can("start_runs")) {
    note.append(button("Resume", () => api(runPath(run.run_id, "/resume"), { method: "POST" })
      .then(() => openRun(run.run_id)).catch((err) => alert(err.message)), { class: "small", "data-testid": "resume" }));
  }
  return note;
}

function scheduleRender() {
  if (!state.frame) state.frame = requestAnimationFrame(renderThread);
}

// ---- following a run ---------------------------------------------------------------------------

export function closeStream(view) {
  if (view?.source) { view.source.close(); view.source = null; }
  if (view?.timer) { clearTimeout(view.timer); view.timer = null; }
}

// Signing out: the open run (its thread, reasoning and trace included) leaves the page, and a
// run still loading is never rendered for the next key.
export function forgetRun() {
  closeStream(state.view);
  state.view = null;
  state.generation += 1;
  state.open.clear();
  $("#thread").replaceChildren(el("p", { class: "hint" }, "Open a run to see what the agent did: its visible steps, the tools it used and its answer."));
}

// A change of the open run seen on the run list stream (its status, usage, error).
export function runChanged(run) {
  const view = state.view;
  if (view && view.runId === run.run_id && view.run) { view.run = run; scheduleRender(); }
}

export async function openRun(runId) {
  closeStream(state.view);
  const generation = ++state.generation;
  const view = { runId, thread: new Thread(), source: null, run: null, retries: 0, timer: null, notice: "", trace: null };
  state.view = view;
  hooks.listChanged(runId);
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

// j / k: the next or previous model turn (developer view)
export function jumpTurn(step) {
  const turns = [...document.querySelectorAll("#thread [data-testid=turn]")];
  if (!turns.length) return;
  const i = turns.indexOf(document.activeElement);
  const to = turns[Math.max(0, Math.min(turns.length - 1, i < 0 ? (step > 0 ? 0 : turns.length - 1) : i + step))];
  to.focus();
  to.scrollIntoView({ block: "nearest" });
}

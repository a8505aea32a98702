// The thread model: the same rules as thoughtgate.events.thread (ThreadBuilder), in JavaScript.
// Feed it events (the JSON envelopes of GET /v1/runs/{id}/events and of the SSE stream) one by
// one; live and reload give the same thread. Events at or below the last applied seq are ignored.
// Unmarked or malformed cot.* payloads are discarded; reasoning is never taken from tool input or
// output or any provider field; reasoning.delta text only ever goes into one "reasoning" item per
// model turn (labelled by its kind: "Raw reasoning" only when raw) and into `raw`; both stay absent
// unless the server sent such events (it sends them to developer+ only). Nothing waits for a step.
// Payloads are read as the event catalogue declares them (docs/events.md): snake_case, no aliases;
// a field the reader's role may not see is simply absent.
"use strict";

const TG_THREAD = (() => {
  const MARKER = "visible_reasoning_v1";
  const MAX_SUMMARY = 280;
  const MAX_STEP_ID = 128;
  const PHASES = ["planning", "thinking", "acting", "writing", "done"];
  const SOURCES = ["phases", "narration", "provider_summary", "model"];
  const REASONING_LABELS = { raw: "Raw reasoning", summary: "Reasoning (provider summary)" };
  const reasoningLabel = (kind) => (kind && Object.hasOwn(REASONING_LABELS, kind) ? REASONING_LABELS[kind] : "Reasoning");
  // the receipt's plain statement for each summarizer the operator opted into (visible.SOURCE_NOTES)
  const SOURCE_NOTES = {
    provider_summaries: "The operator chose to show you summaries that the model provider wrote of the model's "
      + "reasoning; each passed the same policy checks.",
    model: "The operator's summarizer model may write steps; it reads only what you can see (the "
      + "agent's answer text and tool names), never the model's reasoning.",
  };
  const LATER_RECEIPT_KEYS = new Set(["step_sources", "notes"]);
  const FINAL_TOOL = new Set(["completed", "failed", "degraded", "rejected", "skipped"]);
  const TOOL_EVENT_STATUS = {
    "tool.approval_required": "pending",
    "tool.started": "executing",
    "tool.progress": "executing",
    "tool.completed": "completed",
    "tool.failed": "failed",
    "tool.degraded": "degraded",
    "tool.approval_timeout": "skipped", // nobody answered: never ran ("rejected" is an explicit no)
  };
  const RUN_TERMINAL = new Set(["run.failed", "run.error", "run.settlement.completed", "run.interrupted"]);
  const DISPLAY_TERMINAL = new Set([...RUN_TERMINAL, "message.completed", "message.partially_completed"]);
  const TERMINAL_STATUS = {
    "message.completed": "completed",
    "message.partially_completed": "partial",
    "run.failed": "failed",
    "run.error": "failed",
    "run.interrupted": "interrupted",
  };
  // A run-terminal event's payload.status (the run's own verdict, over all its tasks).
  const RUN_OUTCOME = {
    completed: "completed", partial: "partial", failed: "failed", error: "failed", interrupted: "interrupted",
  };

  const isMapping = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  const isInt = (v) => typeof v === "number" && Number.isInteger(v);
  const optInt = (v) => (isInt(v) ? v : null);
  const optNum = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const chars = (s) => [...s].length; // code points, as Python's len()
  const coalesce = (...values) => values.find((v) => v !== null && v !== undefined) ?? null;
  const optStr = (v) => (typeof v === "string" ? v : null);
  const textOf = (p) => optStr(p.text);
  const text = (v, limit) => (typeof v === "string" && v.trim() && chars(v) <= limit ? v : null);

  // parse_visible_payload
  function parseStep(p, type) {
    if (!isMapping(p) || p.marker !== MARKER) return null;
    const stepId = text(p.step_id, MAX_STEP_ID);
    const summary = text(p.summary, MAX_SUMMARY);
    const ts = typeof p.ts === "number" && Number.isFinite(p.ts) ? p.ts : null;
    const source = p.source === undefined || p.source === null ? "phases" : p.source;
    const callId = p.tool_call_id ?? null;
    if (stepId === null || summary === null || ts === null) return null;
    if (!PHASES.includes(p.phase) || !SOURCES.includes(source)) return null;
    if (callId !== null && text(callId, MAX_STEP_ID) === null) return null;
    if (type === "cot.tool.reasoning" && callId === null) return null;
    return { step_id: stepId, summary, phase: p.phase, ts, tool_call_id: callId, source };
  }

  const count = (v) => (isInt(v) && v >= 0 ? v : null);

  function sameJSON(a, b) {
    if (isMapping(a) && isMapping(b)) {
      const ka = Object.keys(a), kb = Object.keys(b);
      return ka.length === kb.length && ka.every((k) => k in b && sameJSON(a[k], b[k]));
    }
    if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((v, i) => sameJSON(v, b[i]));
    return a === b;
  }

  // parse_receipt: only a receipt exactly as the server writes it
  function parseReceipt(p) {
    if (!isMapping(p) || p.marker !== MARKER || !isMapping(p.receipt)) return null;
    const b = p.receipt;
    const counts = ["steps_shown", "phases_shown", "summarizer_failures"].map((k) => count(b[k]));
    const flags = [b.raw_reasoning_exists, b.opaque_reasoning_exists];
    if (counts.some((c) => c === null) || !flags.every((f) => typeof f === "boolean")) return null;
    if (typeof b.mode !== "string" || !isMapping(b.dropped_by_reason)) return null;
    if (!Array.isArray(b.summarizers) || !b.summarizers.every((s) => typeof s === "string")) return null;
    const sources = b.step_sources === undefined ? {} : b.step_sources;
    if (!isMapping(sources)) return null;
    const dropped = {};
    for (const [k, v] of Object.entries(b.dropped_by_reason)) {
      if (count(v) === null) return null;
      if (v) dropped[k] = v;
    }
    const shown = {};
    for (const [k, v] of Object.entries(sources)) {
      if (count(v) === null) return null;
      if (v) shown[k] = v;
    }
    const raw = flags[0];
    const receipt = {
      mode: b.mode,
      raw_reasoning_exists: raw,
      opaque_reasoning_exists: flags[1],
      raw_reasoning_visible_to: raw ? "developer" : null,
      raw_reasoning_surface: raw ? (b.mode === "telemetry_only" ? "trace" : "display") : null,
      steps_shown: counts[0],
      phases_shown: counts[1],
      steps_dropped_by_policy: Object.values(dropped).reduce((a, v) => a + v, 0),
      dropped_by_reason: dropped,
      summarizers: [...b.summarizers],
      summarizer_failures: counts[2],
      step_sources: Object.fromEntries(Object.keys(shown).sort().map((k) => [k, shown[k]])),
      notes: b.summarizers.filter((s) => Object.hasOwn(SOURCE_NOTES, s)).map((s) => SOURCE_NOTES[s]),
    };
    for (const k of Object.keys(receipt)) {
      if (LATER_RECEIPT_KEYS.has(k) && !(k in b)) continue; // recorded before these keys existed
      if (!sameJSON(receipt[k], b[k] ?? null)) return null;
    }
    return receipt;
  }

  class Thread {
    constructor() {
      this.order = [];          // item keys in first-seen order
      this.items = new Map();   // key -> item
      this.text = [];
      this.final = false;
      this.status = "running";
      this.terminal = null;     // last display-terminal event type
      this.runEnded = false;    // a run-terminal event arrived: the stream is over
      this.receipt = null;
      this.raw = null;          // stays null unless reasoning.delta events arrive (developer+)
      this.discarded = 0;
      this.lastSeq = 0;
      this.anonymous = 0;
      this.taskId = null;
      this.turnOf = new Map();  // task id -> its current model turn
      this.turns = new Map();   // "task:turn" -> what agent.response recorded of that turn
      this.startedAt = null;
      this.endedAt = null;
      this.ending = null;
      this.ts = null;
    }

    get message() { return this.text.join(""); }
    list() { return this.order.map((k) => this.items.get(k)); }

    feed(env) {
      if (!isMapping(env)) return false;
      if (isInt(env.seq)) {
        if (env.seq <= this.lastSeq) return false; // replay overlap: never twice
        this.lastSeq = env.seq;
      }
      this.taskId = optStr(env.task_id);
      this.ts = optNum(env.ts);
      if (typeof env.type === "string") this.apply(env.type, isMapping(env.payload) ? env.payload : {});
      return true;
    }

    upsert(key, item) {
      if (!this.items.has(key)) this.order.push(key);
      this.items.set(key, item);
    }

    currentTurn() { return this.turnOf.has(this.taskId) ? this.turnOf.get(this.taskId) : null; }

    apply(type, p) {
      const turn = optInt(p.turn);
      if (turn !== null) this.turnOf.set(this.taskId, turn);
      const family = type.split(".", 1)[0];
      if (family === "cot") this.applyCot(type, p);
      else if (type in TOOL_EVENT_STATUS || type === "tool.approval_response") this.applyTool(type, p);
      else if (type === "message.delta") {
        this.text.push(textOf(p) || "");
        this.applySaid(textOf(p) || "");
      }
      else if (type === "agent.response") this.applyResponse(p);
      else if (type === "run.started") this.startedAt = this.ts;
      else if (type === "reasoning.delta") {
        (this.raw ??= []).push(textOf(p) || "");
        this.applyReasoning(p);
      }
      else if (type === "capability.resolved") this.applyNotice(p);
      if (DISPLAY_TERMINAL.has(type)) this.applyTerminal(type, p);
      if (RUN_TERMINAL.has(type)) {
        this.runEnded = true;
        this.endedAt = this.ts;
        this.ending = { type, status: optStr(p.status), error: optStr(p.error), error_type: optStr(p.error_type),
          reason: optStr(p.reason), error_detail: optStr(p.error_detail) };
      }
    }

    // what the model said in the current turn, placed where that turn first said something
    applySaid(text) {
      const turn = this.currentTurn();
      const key = `${this.taskId || ""}:${turn === null ? "" : turn}`;
      const old = this.items.get(`text:${key}`);
      const said = old && old.kind === "text" ? old : { kind: "text", key, taskId: this.taskId, turn, text: "" };
      this.upsert(`text:${key}`, { ...said, text: said.text + text });
    }

    // one record per (task, turn); a repeated one replaces it in place
    applyResponse(p) {
      const turn = optInt(p.turn);
      const usage = isMapping(p.usage) ? Object.fromEntries(Object.entries(p.usage).filter(([, v]) => isInt(v))) : {};
      const times = isMapping(p.call) ? p.call : {};
      const started = optNum(times.started_at), first = optNum(times.first_chunk_at), ended = optNum(times.ended_at);
      this.turns.set(JSON.stringify([this.taskId, turn]), {
        task_id: this.taskId, turn, model: optStr(p.model), provider: optStr(p.provider), usage,
        finish_reason: optStr(p.finish_reason), started_at: started,
        ttft_s: first === null || started === null ? null : first - started,
        duration_s: ended === null || started === null ? null : ended - started,
        error: optStr(p.error), error_type: optStr(p.error_type), error_detail: optStr(p.error_detail),
        tool_calls: Array.isArray(p.tool_calls) ? p.tool_calls.length : 0, ts: this.ts,
      });
    }

    turnList() { return [...this.turns.values()]; }

    // the run's totals as this reader may see them (ThreadView.totals)
    totals() {
      const usage = this.turnList().map((t) => t.usage);
      // null when no turn showed the count (billed counts below developer, ADR 0163): never a 0
      const total = (name) => {
        const shown = usage.filter((u) => Object.hasOwn(u, name)).map((u) => u[name]);
        return shown.length ? shown.reduce((a, v) => a + v, 0) : null;
      };
      return {
        turns: this.turns.size,
        tool_calls: this.list().filter((i) => i.kind === "tool").length,
        input_tokens: total("input_tokens"),
        output_tokens: total("output_tokens"),
        reasoning_tokens: total("reasoning_tokens"),
        duration_s: this.endedAt !== null && this.startedAt !== null ? this.endedAt - this.startedAt : null,
      };
    }

    // one item per model turn; a change of kind or index starts a new segment
    applyReasoning(p) {
      const turn = optInt(p.turn);
      const key = `${this.taskId || ""}:${turn === null ? "" : turn}`;
      const old = this.items.get(`reasoning:${key}`);
      const item = old && old.kind === "reasoning" ? old : { kind: "reasoning", key, taskId: this.taskId, turn, segments: [] };
      const kind = optStr(p.reasoning_kind);
      const index = optInt(p.index);
      const text = textOf(p) || "";
      const segments = [...item.segments];
      const last = segments[segments.length - 1];
      if (last && last.kind === kind && last.index === index) segments[segments.length - 1] = { ...last, text: last.text + text };
      else segments.push({ kind, index, label: reasoningLabel(kind), text });
      this.upsert(`reasoning:${key}`, { ...item, segments });
    }

    applyCot(type, p) {
      if (type === "cot.completed") {
        const receipt = parseReceipt(p);
        if (receipt === null) this.discarded += 1; else this.receipt = receipt;
        return;
      }
      const step = parseStep(p, type);
      if (step === null || !["cot.step", "cot.phase", "cot.tool.reasoning"].includes(type)) {
        this.discarded += 1; // unmarked or malformed: dropped, and it blocks nothing
        return;
      }
      const at = (kind) => { // an updated step stays where (and in the turn) it was first said
        const old = this.items.get(`${kind}:${step.step_id}`);
        return old && old.kind === kind ? { taskId: old.taskId, turn: old.turn } : { taskId: this.taskId, turn: this.currentTurn() };
      };
      if (type === "cot.step") this.upsert(`step:${step.step_id}`, { kind: "step", step, ...at("step") });
      else if (type === "cot.phase") this.upsert(`phase:${step.step_id}`, { kind: "phase", step, ...at("phase") });
      else this.attachToolReasoning(step);
    }

    attachToolReasoning(step) {
      const key = `tool:${step.tool_call_id}`;
      const card = this.items.get(key);
      if (!card || card.kind !== "tool") { this.discarded += 1; return; } // grants nothing
      const i = card.reasoning.findIndex((s) => s.step_id === step.step_id);
      const reasoning = [...card.reasoning];
      if (i < 0) reasoning.push(step); else reasoning[i] = step;
      this.items.set(key, { ...card, reasoning });
    }

    applyTool(type, p) {
      const callId = optStr(p.call_id) ?? `anonymous-${++this.anonymous}`;
      const key = `tool:${callId}`;
      const old = this.items.get(key);
      const card = old && old.kind === "tool" ? old
        : { kind: "tool", call_id: callId, tool_key: null, status: "pending", label: "", input: null,
            output: null, error: null, error_kind: null, reasoning: [], taskId: this.taskId, turn: this.currentTurn() };
      const toolKey = coalesce(optStr(p.tool_key), card.tool_key);
      this.upsert(key, {
        ...card,
        tool_key: toolKey,
        status: this.toolStatus(type, p, card.status),
        label: optStr(p.label) || card.label || toolKey || "tool",
        input: coalesce(p.input, card.input),
        output: coalesce(p.output, card.output),
        error: optStr(p.error) || card.error,
        error_kind: optStr(p.error_kind) || card.error_kind,
      });
    }

    toolStatus(type, p, current) {
      if (type === "tool.approval_response") return p.decision === "reject" ? "rejected" : current;
      if (type === "tool.progress" && FINAL_TOOL.has(current)) return current;
      return TOOL_EVENT_STATUS[type] ?? current; // approve: stays pending until tool.started
    }

    applyNotice(p) { // one run-level notice, updated in place
      const mode = optStr(p.chain_of_thought);
      this.upsert("capability:run", { kind: "capability", key: "run", label: mode ? `Mode: ${mode}` : "run", attrs: { ...p } });
    }

    // The JSON shape of ThreadView.to_dict() (tests compare the two builders with it).
    toDict() {
      const step = (i) => ({ kind: i.kind, marker: MARKER, ...i.step, task_id: i.taskId, turn: i.turn });
      const items = this.list().map((i) => {
        if (i.kind === "step" || i.kind === "phase") return step(i);
        if (i.kind === "tool") {
          return { kind: "tool", call_id: i.call_id, tool_key: i.tool_key, status: i.status, label: i.label,
            input: i.input, output: i.output, error: i.error, error_kind: i.error_kind,
            reasoning: i.reasoning.map((s) => ({ marker: MARKER, ...s })), task_id: i.taskId, turn: i.turn };
        }
        if (i.kind === "text") return { kind: i.kind, key: i.key, task_id: i.taskId, turn: i.turn, text: i.text };
        if (i.kind === "reasoning") {
          return { kind: i.kind, key: i.key, task_id: i.taskId, turn: i.turn,
            segments: i.segments.map((g) => ({ kind: g.kind, index: g.index, label: g.label, text: g.text })) };
        }
        return { kind: i.kind, key: i.key, label: i.label, attrs: i.attrs };
      });
      const toolCalls = this.list().filter((i) => i.kind === "tool")
        .map((c) => ({ call_id: c.call_id, tool_key: c.tool_key, status: c.status }));
      return { items, message: { text: this.message, final: this.final, tool_calls: toolCalls }, status: this.status,
        terminal: this.terminal, receipt: this.receipt, raw_reasoning: this.raw === null ? null : this.raw.join(""),
        discarded: this.discarded, last_seq: this.lastSeq, turns: this.turnList(), started_at: this.startedAt,
        ended_at: this.endedAt, ending: this.ending, totals: this.totals() };
    }

    applyTerminal(type, p) {
      this.terminal = type;
      if (type === "message.completed" || type === "message.partially_completed") {
        const final = textOf(p);
        if (final !== null) this.text = [final];
        this.final = true;
      }
      const outcome = RUN_TERMINAL.has(type) && typeof p.status === "string" ? p.status : null;
      if (outcome !== null && Object.hasOwn(RUN_OUTCOME, outcome)) this.status = RUN_OUTCOME[outcome];
      else if (type in TERMINAL_STATUS) this.status = TERMINAL_STATUS[type];
      else if (this.status === "running") this.status = "completed";
    }
  }

  return { Thread, parseStep, parseReceipt, reasoningLabel, MARKER };
})();

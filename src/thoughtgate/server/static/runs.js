// The run list: filters, search, keyset pages ("Load more"), and one live subscription
// (GET /v1/runs/stream) that keeps it current; and the form that starts a run (member+).
// Every run shown came through the daemon's one output filter for the key's role.

import { $, ApiError, RUN_STATUS_TEXT, ago, api, button, can, el, inert, pill, setText, state } from "./util.js";

const list = {
  runs: [], next: null, changes: 0, lastChange: 0, filters: {}, generation: 0,
  source: null, timer: null, retries: 0, topTimer: null, keys: new Map(), models: new Set(),
};

let hooks = { runChanged: () => {} };

// ---- filters -----------------------------------------------------------------------------------

// datetime-local (the reader's own time zone) -> Unix seconds
const epoch = (value, round) => (value ? round(new Date(value).getTime() / 1000) : null);

function readFilters() {
  return {
    q: $("#search").value.trim(),
    status: $("#f-status").value,
    mode: $("#f-mode").value,
    model: modelNamed($("#f-model").value.trim()),
    key: $("#f-key").value,
    since: epoch($("#f-since").value, Math.floor),
    until: epoch($("#f-until").value, Math.ceil),
  };
}

// A model's name as the suggestions show it is `inert` (a bidi control in it would reorder the
// dropdown and the field once picked); what goes back to the API is the name as the runs hold
// it: a suggestion picked is sent as the model it shows (ADR 0135).
function modelNamed(text) {
  if (!list.models.has(text)) for (const m of list.models) if (inert(m) === text) return m;
  return text;
}

function queryOf(f, extra = {}) {
  const q = new URLSearchParams({ limit: "50", ...extra });
  for (const [k, v] of Object.entries(f)) if (v !== "" && v !== null) q.set(k, String(v));
  return q.toString();
}

// What the list can decide from a run it was sent; null when only the daemon can (search, key)
function matches(run, f) {
  if (f.status && !f.status.split(",").includes(run.status)) return false;
  if (f.mode && run.chain_of_thought !== f.mode) return false;
  if (f.model && run.model !== f.model) return false;
  if (f.since !== null && run.created_at < f.since) return false;
  if (f.until !== null && run.created_at >= f.until) return false;
  return f.q || f.key ? null : true;
}

function countFilters(f) {
  const n = ["status", "mode", "model", "key", "since", "until"].filter((k) => f[k] !== "" && f[k] !== null).length;
  $("#filter-count").textContent = n ? `(${n})` : "";
}

// ---- rendering ---------------------------------------------------------------------------------

function runItem(run) {
  const ended = !["pending", "running", "completed"].includes(run.status);
  const who = run.started_by ? list.keys.get(run.started_by) || run.started_by : null;
  return el("li", { "data-status": run.status },
    el("a", { href: `#${encodeURIComponent(run.run_id)}`, "data-run": run.run_id, "data-testid": "run-link",
      class: `s-${run.status}${state.view?.runId === run.run_id ? " active" : ""}` },
    el("span", { class: "run-prompt", "data-testid": "run-prompt" }, run.prompt || run.run_id),
    el("span", { class: "run-line" },
      run.record_out_of_date
        // its record says it is under way, but its execution stopped on a write the store
        // refused: shown as stopped, the recorded status kept in the hover (ADR 0151)
        ? el("span", { title: `recorded as ${run.status}; the store refuses writes (${run.record_out_of_date}), so its end is not recorded yet` },
          pill("interrupted", "stopped · not recorded", "run-list-status"))
        : pill(run.status, RUN_STATUS_TEXT[run.status] || run.status, "run-list-status"),
      el("span", { class: "muted" }, `${run.chain_of_thought}${run.model ? ` · ${run.model}` : ""} · `,
        el("span", { title: new Date(run.created_at * 1000).toLocaleString() }, ago(run.created_at))),
      who ? el("span", { class: "muted", "data-testid": "run-key" }, `· ${who}`) : null),
    ended && run.error
      ? el("span", { class: "run-error error", "data-testid": "run-list-error", title: run.error }, run.error)
      : null));
}

function renderList() {
  const nav = $("#runs-list");
  const focused = document.activeElement?.closest?.("#runs-list a")?.dataset.run;
  nav.replaceChildren(...list.runs.map(runItem));
  if (!list.runs.length) nav.append(el("li", { class: "muted empty", "data-testid": "runs-empty" }, "No runs match."));
  $("#more").hidden = list.next === null;
  if (focused) nav.querySelector(`a[data-run="${CSS.escape(focused)}"]`)?.focus();
  const models = $("#models");
  for (const r of list.runs) if (r.model) list.models.add(r.model);
  models.replaceChildren(...[...list.models].sort().map((m) => el("option", { value: inert(m) })));
}

export function markActive(runId) {
  document.querySelectorAll("#runs-list a").forEach((a) => a.classList.toggle("active", a.dataset.run === runId));
}

// ---- pages -------------------------------------------------------------------------------------

export async function loadRuns() {
  const generation = ++list.generation;
  closeStream();
  const f = readFilters();
  countFilters(f);
  list.filters = f;
  $("#list-error").textContent = "";
  let page;
  try {
    page = await api(`/v1/runs?${queryOf(f)}`);
  } catch (err) {
    if (generation === list.generation) setText($("#list-error"), err.message);
    return;
  }
  if (generation !== list.generation) return;
  list.runs = page.runs;
  list.next = page.next;
  list.lastChange = page.changes;
  renderList();
  follow(generation);
}

async function loadMore() {
  if (list.next === null) return;
  const generation = list.generation;
  const page = await api(`/v1/runs?${queryOf(list.filters, { before: list.next })}`);
  if (generation !== list.generation) return;
  const known = new Set(list.runs.map((r) => r.run_id));
  list.runs.push(...page.runs.filter((r) => !known.has(r.run_id)));
  list.next = page.next;
  renderList();
}

// The newest page again, merged in: for a change only the daemon can match (search, key)
function refreshTop() {
  clearTimeout(list.topTimer);
  const generation = list.generation;
  list.topTimer = setTimeout(async () => {
    const page = await api(`/v1/runs?${queryOf(list.filters)}`).catch(() => null);
    if (!page || generation !== list.generation) return;
    for (const run of page.runs) place(run);
    renderList();
  }, 150);
}

// Put a run in its place (newest first), if it belongs to the part of the list already loaded.
function place(run) {
  const i = list.runs.findIndex((r) => r.run_id === run.run_id);
  if (i >= 0) { list.runs[i] = run; return; }
  const last = list.runs[list.runs.length - 1];
  if (list.next !== null && last && run.created_at < last.created_at) return; // on a later page
  const at = list.runs.findIndex((r) => r.created_at < run.created_at);
  list.runs.splice(at < 0 ? list.runs.length : at, 0, run);
}

function applyChange(run) {
  hooks.runChanged(run);
  const fit = matches(run, list.filters);
  const i = list.runs.findIndex((r) => r.run_id === run.run_id);
  if (fit === false) {
    if (i >= 0) { list.runs.splice(i, 1); renderList(); }
    return;
  }
  if (i >= 0) list.runs[i] = run; // already matched: a status change keeps it matching search/key
  else if (fit === null) { refreshTop(); return; }
  else place(run);
  renderList();
}

// ---- the live list -----------------------------------------------------------------------------

function closeStream() {
  if (list.source) { list.source.close(); list.source = null; }
  clearTimeout(list.timer);
  $("#list-live").hidden = true;
}

async function follow(generation) {
  const current = () => generation === list.generation;
  let ticket;
  try {
    ({ ticket } = await api("/v1/tickets", { method: "POST", body: JSON.stringify({ scope: "runs" }) }));
  } catch (err) {
    if (current() && !(err instanceof ApiError && [401, 403].includes(err.status))) retry(generation);
    return;
  }
  if (!current()) return;
  const source = new EventSource(`/v1/runs/stream?ticket=${encodeURIComponent(ticket)}&last_event_id=${list.lastChange}`);
  list.source = source;
  source.onopen = () => { if (current()) { list.retries = 0; $("#list-live").hidden = false; } };
  source.onmessage = (msg) => {
    if (!current()) return;
    list.lastChange = Math.max(list.lastChange, Number(msg.lastEventId) || 0);
    applyChange(JSON.parse(msg.data));
  };
  // The key was revoked or demoted: start over with what the key may see now.
  source.addEventListener("access_revoked", () => { closeStream(); if (current()) hooks.accessLost(); });
  const lost = () => { closeStream(); if (current()) retry(generation); };
  source.addEventListener("failed", lost);
  source.onerror = lost; // also a ticket that expired: reconnect with a fresh one, from the last id
}

function retry(generation) {
  list.retries = Math.min(list.retries + 1, 8);
  list.timer = setTimeout(() => { if (generation === list.generation) follow(generation); }, 250 * list.retries);
}

// ---- starting a run (member+) ------------------------------------------------------------------

export async function showNewRun(onStarted, onCancel) {
  if (!can("start_runs")) return;
  const tools = await api("/v1/tools").then((b) => b.tools).catch(() => []);
  const status = el("p", { class: "error", role: "alert", "data-testid": "new-run-error" });
  const prompt = el("textarea", { id: "nr-prompt", required: true, rows: 5, maxlength: 200000, "data-testid": "nr-prompt",
    placeholder: "What should the agent do?" });
  const model = el("input", { id: "nr-model", list: "models", required: true, "data-testid": "nr-model",
    placeholder: "provider:model (e.g. anthropic:claude-sonnet-4-5)", autocomplete: "off" });
  const mode = el("select", { id: "nr-mode", "data-testid": "nr-mode" },
    el("option", { value: "" }, "the daemon's default"),
    ...["hidden", "surface", "telemetry_only"].map((m) => el("option", { value: m }, m)));
  const toolBoxes = tools.map((t) => el("label", { class: "check" },
    el("input", { type: "checkbox", value: t.name, "data-testid": "nr-tool" }),
    ` ${t.label}`, t.requires_approval ? el("span", { class: "muted" }, " (asks for approval)") : null));
  const form = el("form", { class: "new-run", "data-testid": "new-run-form" },
    el("h2", {}, "Start a run"),
    el("label", { for: "nr-prompt" }, "Prompt"), prompt,
    el("div", { class: "row" },
      el("label", {}, "Model", model),
      el("label", {}, "Reasoning (disclosure mode)", mode)),
    toolBoxes.length ? el("fieldset", {}, el("legend", {}, "Tools"), ...toolBoxes) : null,
    el("div", { class: "row" }, el("button", { type: "submit", "data-testid": "nr-submit" }, "Start run"),
      button("Cancel", onCancel, { class: "small", "data-testid": "nr-cancel" })),
    status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    status.textContent = "";
    const body = { prompt: prompt.value, model: modelNamed(model.value.trim()) };
    if (mode.value) body.chain_of_thought = mode.value;
    const chosen = toolBoxes.map((l) => l.querySelector("input")).filter((i) => i.checked).map((i) => i.value);
    if (chosen.length) body.tools = chosen;
    try {
      const { run_id: runId } = await api("/v1/runs", { method: "POST", body: JSON.stringify(body) });
      onStarted(runId);
    } catch (err) {
      setText(status, err.message);
    }
  });
  form.addEventListener("keydown", (ev) => { if (ev.key === "Escape") onCancel(); });
  $("#thread").replaceChildren(form);
  prompt.focus();
}

// ---- setup -------------------------------------------------------------------------------------

export async function setupList(options) {
  hooks = options;
  const me = state.me;
  $("#new-run").hidden = !can("start_runs");
  $("#f-key-label").hidden = !can("start_runs") && !can("manage_keys");
  // Other keys' names and roles are operator detail: listed for a key that may manage keys,
  // and gone when the same page's key no longer may (signed out, or demoted while open).
  const keys = can("manage_keys") ? (await api("/v1/keys").catch(() => ({}))).keys || [] : [];
  if (state.me !== me) return; // signed out (or rebuilt) meanwhile
  list.keys = new Map(keys.map((k) => [k.key_id, k.name]));
  $("#f-key").replaceChildren(el("option", { value: "" }, "anyone"), el("option", { value: "me" }, `me (${me.name})`),
    ...keys.filter((k) => k.key_id !== me.key_id).map((k) => el("option", { value: k.key_id }, `${k.name} (${k.role})`)));
  await loadRuns();
}

export function stopList() {
  list.generation += 1;
  closeStream();
}

// Signing out: the list forgets what it was sent for that key -- its runs, the models seen in
// them, and (an admin's) the key names and roles of the "Started by" filter -- and its filters.
export function forgetList() {
  stopList();
  clearTimeout(list.topTimer);
  Object.assign(list, { runs: [], next: null, changes: 0, lastChange: 0, filters: {}, keys: new Map(), models: new Set() });
  $("#runs-list").replaceChildren();
  $("#models").replaceChildren();
  $("#more").hidden = true;
  $("#list-error").textContent = "";
  $("#f-key").replaceChildren(el("option", { value: "" }, "anyone"), el("option", { value: "me" }, "me"));
  for (const id of ["#search", "#f-status", "#f-mode", "#f-model", "#f-since", "#f-until"]) $(id).value = "";
  $("#filter-count").textContent = "";
}

let searchTimer = 0;
$("#search").addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(loadRuns, 250); });
$("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); clearTimeout(searchTimer); loadRuns(); });
for (const id of ["#f-status", "#f-mode", "#f-model", "#f-key", "#f-since", "#f-until"]) {
  $(id).addEventListener("change", () => loadRuns());
}
$("#clear-filters").addEventListener("click", () => {
  for (const id of ["#f-status", "#f-mode", "#f-model", "#f-key", "#f-since", "#f-until"]) $(id).value = "";
  loadRuns();
});
$("#more").addEventListener("click", () => loadMore().catch((err) => { setText($("#list-error"), err.message); }));
$("#refresh").addEventListener("click", () => loadRuns());

// Arrow keys move between runs; Enter opens one (it is a link).
$("#runs-list").addEventListener("keydown", (ev) => {
  const links = [...document.querySelectorAll("#runs-list a")];
  const i = links.indexOf(document.activeElement);
  if (i < 0) return;
  const to = { ArrowDown: i + 1, ArrowUp: i - 1, Home: 0, End: links.length - 1 }[ev.key];
  if (to === undefined) return;
  ev.preventDefault();
  links[Math.max(0, Math.min(links.length - 1, to))].focus();
});


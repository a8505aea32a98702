// Shared by the page's modules: the page state, DOM building, the API client, and formatting of
// numbers, durations and times (always in the reader's own time zone).

export const state = {
  key: sessionStorage.getItem("tg_key") || "",
  me: null,
  view: null, // the open run: { runId, thread, source, run, retries, timer, notice, trace }
  generation: 0,
  open: new Set(), // <details> the reader opened, kept across re-renders
  frame: 0,
};

export const $ = (sel) => document.querySelector(sel);

// Unicode's bidirectional embeddings, overrides and isolates (LRE .. RLO, LRI .. PDI): a browser
// obeys them, so a model's "invoice\u202etxt.exe" would read "invoiceexe.txt". Text another
// program chose (an answer, a step, a tool's name, input or output, an error, a prompt) is shown
// with them as visible "\u202e", as the CLI shows them (ADR 0135); LRM / RLM, which right-to-left
// text needs and which reorder nothing by themselves, stay. Only the display: the API's data and
// what the page sends back are untouched.
const BIDI = /[\u202a-\u202e\u2066-\u2069]/g;
export const inert = (text) =>
  String(text).replace(BIDI, (c) => `\\u${c.codePointAt(0).toString(16)}`);

// Attributes a reader sees (a tooltip, what a screen reader says): inert as text is.
const SHOWN_ATTRS = new Set(["title", "aria-label", "alt", "placeholder"]);

// The page builds its DOM here: every text child and shown attribute goes through `inert`.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : SHOWN_ATTRS.has(k) ? inert(v) : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(inert(c)));
  }
  return node;
}

// For the few nodes the page fills in place (an API error's message): through `inert` too.
export function setText(node, text) {
  node.textContent = inert(text ?? "");
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function api(path, options = {}) {
  const res = await fetch(path, {
    ...options,
    cache: "no-store",
    headers: { ...(options.headers || {}), authorization: `Bearer ${state.key}`, "content-type": "application/json" },
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new ApiError(res.status, body.error?.message || res.statusText);
  return body;
}

export const runPath = (runId, tail = "") => `/v1/runs/${encodeURIComponent(runId)}${tail}`;

export const can = (permission) => !!state.me?.permissions?.[permission];

export function button(label, onClick, attrs = {}) {
  const b = el("button", { type: "button", ...attrs }, label);
  b.addEventListener("click", onClick);
  return b;
}

export function pill(status, text, testid) {
  return el("span", { class: `pill s-${status}`, "data-testid": testid }, text);
}

export function disclosure(id, summary, body, attrs = {}) {
  const d = el("details", { "data-key": id, open: state.open.has(id), ...attrs }, el("summary", {}, summary), body);
  d.addEventListener("toggle", () => { if (d.open) state.open.add(id); else state.open.delete(id); });
  return d;
}

// ---- formatting --------------------------------------------------------------------------------

const numbers = new Intl.NumberFormat();
export const num = (n) => (typeof n === "number" ? numbers.format(n) : "–");

export function seconds(s) {
  if (typeof s !== "number") return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  return `${m} min ${Math.round(s - m * 60)} s`;
}

const pad = (n, w = 2) => String(n).padStart(w, "0");

// ISO 8601 in the reader's own time zone, with its offset ("2026-12-01T14:05:09+05:30")
export function localIso(ts) {
  const d = new Date(ts * 1000);
  const off = -d.getTimezoneOffset();
  const sign = off >= 0 ? "+" : "-";
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:`
    + `${pad(d.getMinutes())}:${pad(d.getSeconds())}${sign}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
}

export const timeZone = () => Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";

// A <time> in the reader's time zone; `style`: "full" (date and time) or "clock" (time of day)
export function time(ts, style = "full", testid = null) {
  if (typeof ts !== "number") return null;
  const d = new Date(ts * 1000);
  const text = style === "clock"
    ? d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" })
    : d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
  return el("time", { datetime: localIso(ts), title: `${d.toLocaleString()} (${timeZone()})`, "data-testid": testid }, text);
}

export function ago(ts) {
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(ts * 1000).toLocaleDateString();
}

export const RUN_STATUS_TEXT = {
  pending: "pending", running: "running", completed: "completed", partial: "partial",
  failed: "failed", error: "failed", interrupted: "interrupted",
};

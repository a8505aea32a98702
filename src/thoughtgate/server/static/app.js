// thoughtgate web page: sign in with a key, find runs (a live list with filters and search), open
// one and watch its thread live and after a reload, start a run (member+). The page only renders
// what the server sent: every byte came through the server's one output filter for the key's role
// (a viewer's browser never receives reasoning or tool detail). The thread model is thread.js,
// which keeps the rules of thoughtgate.events.thread.

import { $, api, can, el, setText, state } from "./util.js";
import { forgetList, loadRuns, markActive, setupList, showNewRun } from "./runs.js";
import { closeStream, forgetRun, jumpTurn, openRun, runChanged, setupView } from "./view.js";

function route() {
  const raw = location.hash.slice(1);
  let target = raw;
  try {
    target = decodeURIComponent(raw);
  } catch {
    // not an id this page wrote (cut short, not UTF-8): asked for as it stands, no such run
  }
  if (target === "new") {
    closeStream(state.view);
    state.view = null;
    state.generation += 1;
    markActive(null);
    showNewRun((runId) => { location.hash = encodeURIComponent(runId); }, () => {
      history.replaceState(null, "", location.pathname);
      $("#thread").replaceChildren(el("p", { class: "hint" }, "Open a run, or start one."));
    });
  } else if (target) {
    openRun(target);
  }
}

function showSignIn(message) {
  forgetRun(); // nothing one key was sent stays in the tab for the next
  forgetList();
  state.me = null;
  $("#signin").hidden = false;
  $("#app").hidden = true;
  $("#signout").hidden = true;
  $("#who").replaceChildren();
  setText($("#signin-error"), message || "");
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
  $("#role-note").textContent = can("read_reasoning")
    ? "Your role also reads tool inputs and outputs, each model turn's tokens and timings and, on surface runs, the model's reasoning next to each turn."
    : can("answer_approvals")
      ? "You see visible steps, tool cards with their inputs and outputs, and answers; the model's reasoning is not sent to your role."
      : "You see visible steps, tool cards (label and status) and answers; the model's reasoning is not sent to your role.";
  await setupList({ runChanged, accessLost: start });
  if (location.hash.length > 1) route();
}

setupView({ listChanged: markActive });

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
$("#new-run").addEventListener("click", () => { location.hash = "new"; });
$("#skip").addEventListener("click", () => $("#thread").focus());
window.addEventListener("hashchange", () => { if (state.me && location.hash.length > 1) route(); });

// Keyboard: "/" search, "n" new run, "j" / "k" next / previous model turn, "r" reload the list.
document.addEventListener("keydown", (ev) => {
  if (!state.me || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const typing = ev.target.closest?.("input, textarea, select, [contenteditable]");
  if (typing) return;
  const action = {
    "/": () => $("#search").focus(),
    n: () => { if (can("start_runs")) location.hash = "new"; },
    j: () => jumpTurn(1),
    k: () => jumpTurn(-1),
    r: () => loadRuns(),
  }[ev.key];
  if (action) { ev.preventDefault(); action(); }
});

start();

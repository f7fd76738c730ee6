// robot-lab dashboard: plain DOM + EventSource, no build step.
// Routes: #/ (overview, polled), #/dlq/<robot>, #/run/<id> (live over SSE).
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const kid of kids) node.append(kid instanceof Node ? kid : document.createTextNode(kid ?? ""));
  return node;
};
const SVG = "http://www.w3.org/2000/svg";
const svg = (tag, attrs = {}) => {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
};
const short = (id) => (id || "").slice(-12);
const money = (c) => "$" + Number(c || 0).toFixed(6);
const ago = (t) => t ? Math.max(0, Math.round(Date.now() / 1000 - t)) + "s ago" : "";
const clock = (t) => new Date(t * 1000).toLocaleTimeString();
const elapsed = (t) => (Math.max(0, Date.now() / 1000 - t)).toFixed(1) + "s";

let config = { actions: false };
let timer = null;
let source = null;

// Redis away: the server answers 503 {redis: "down"}; a banner says so until a call succeeds
function redisBanner(down, text) {
  $("#banner").hidden = !down;
  if (down) $("#banner").textContent = text || "Redis is not answering; retrying";
}

async function getJSON(url) {
  const res = await fetch(url);
  const data = await res.json().catch(() => ({}));
  if (res.status === 503 && data.redis === "down") { redisBanner(true, data.error); throw new Error(data.error); }
  if (!res.ok) throw new Error(data.error || res.statusText);
  redisBanner(false);
  return data;
}

async function act(url, body) {
  const token = $("#token").value || sessionStorage.getItem("robot-lab-token") || "";
  sessionStorage.setItem("robot-lab-token", token);
  const res = await fetch(url, { method: "POST", body: JSON.stringify(body || {}),
    headers: { "Content-Type": "application/json", "Authorization": "Bearer " + token } });
  const data = await res.json();
  if (!res.ok) alert(data.error || res.statusText);
  return data;
}

function show(id) {
  for (const view of ["overview-view", "dlq-view", "run-view"]) $("#" + view).hidden = view !== id;
}

function fill(table, rows) {
  const body = $(table + " tbody");
  body.replaceChildren(...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c)))));
}

// done/failed/skipped of all: a run whose tasks failed must not read as "completed 0/6"
const counts = (r) => `${r.done} done · ${r.failed} failed · ${r.skipped} skipped / ${r.tasks}`;

// --- overview ----------------------------------------------------------------------------
async function overview() {
  const data = await getJSON("/api/overview");
  $("#where").textContent = `${data.redis} · prefix ${data.prefix}`;
  $("#problems").replaceChildren(...data.problems.map((p) => el("div", { class: "problem" }, p)));
  fill("#robots", data.robots.map((r) => [r.robot, String(r.queued), String(r.running),
    String(r.workers), (r.rq_worker_names || []).join(", ") || "0", String(r.bus_length), String(r.bus_pending),
    String(r.bus_lag ?? "?"),
    r.dlq ? el("a", { href: `#/dlq/${encodeURIComponent(r.robot)}` }, String(r.dlq)) : "0"]));
  fill("#workers", data.workers.map((w) => [w.name, w.role || "", (w.robots || []).join(", "),
    w.host || "", String(w.pid || ""), ago(w.beat)]));
  fill("#active", data.active.map((r) => [el("a", { href: `#/run/${r.run_id}` }, short(r.run_id)), r.network,
    `${r.finished}/${r.tasks}`, r.age + "s", r.running.map((t) => t.task).join(", ")]));
  fill("#failed-tasks", (data.failed_tasks || []).map((f) => [
    el("a", { href: `#/run/${f.run_id}` }, short(f.run_id)), f.network, f.task, f.robot || "", String(f.attempt),
    el("pre", { class: "error" }, f.error || ""),
    config.actions && f.run_status !== "cancelled"
      ? el("button", { class: "action", onclick: () => rerun(f.run_id, f.task) }, "Re-run") : ""]));
  $("#failed-none").hidden = (data.failed_tasks || []).length > 0;
  fill("#recent", data.recent.map((r) => [el("a", { href: `#/run/${r.run_id}` }, short(r.run_id)), r.network,
    el("span", { class: "state " + r.status }, r.status), counts(r),
    r.duration == null ? "" : r.duration.toFixed(2) + "s", String(r.tokens), money(r.cost)]));
}

async function rerun(runId, task) {
  const done = await act(`/api/runs/${encodeURIComponent(runId)}/tasks/${encodeURIComponent(task)}/rerun`);
  if (done.status === "ok") location.hash = `#/run/${runId}`;
}

// --- dead letters ------------------------------------------------------------------------
async function deadLetters(robot) {
  $("#dlq-robot").textContent = robot;
  const letters = await getJSON(`/api/dlq/${encodeURIComponent(robot)}`);
  const replay = async (ids) => { await act(`/api/dlq/${encodeURIComponent(robot)}/replay`, { ids }); route(); };
  $("#replay-all").hidden = !config.actions || !letters.length;
  $("#replay-all").onclick = () => replay(null);
  fill("#dlq", letters.map((d) => [d.dlq_id, d.reason, d.error, String(d.deliveries), d.failed_at, d.content,
    config.actions ? el("button", { class: "action", onclick: () => replay([d.dlq_id]) }, "Replay") : ""]));
}

// --- one run, live -----------------------------------------------------------------------
// A tool result's content is {data: ...} on success, {error: "..."} on failure
// (ToolResultMessage): show the value or the error, never "[object Object]".
function toolOutput(out) {
  if (out && typeof out === "object" && !Array.isArray(out)) {
    if ("error" in out) return "error: " + (typeof out.error === "string" ? out.error : JSON.stringify(out.error));
    if ("data" in out) out = out.data;
  }
  return (typeof out === "string" ? out : JSON.stringify(out) ?? "").slice(0, 200);
}

const run = { tasks: new Map(), text: new Map(), calls: new Map(), id: null };

// an optional task hangs off the tasks that can route to it (its activators), not off nothing
const parents = (t) => [...t.deps, ...(t.optional ? t.activators || [] : [])];

function layout(tasks) {
  const depth = new Map();
  const visit = (t) => {
    if (depth.has(t.name)) return depth.get(t.name);
    depth.set(t.name, 0);
    const d = Math.max(-1, ...parents(t).map((n) => run.tasks.has(n) ? visit(run.tasks.get(n)) : -1)) + 1;
    depth.set(t.name, d);
    return d;
  };
  tasks.forEach(visit);
  const columns = [];
  for (const t of tasks) (columns[depth.get(t.name)] ||= []).push(t.name);
  const pos = new Map();
  columns.forEach((names, x) => names.forEach((n, y) => pos.set(n, { x: 20 + x * 190, y: 20 + y * 64 })));
  return { pos, width: 40 + columns.length * 190, height: 40 + Math.max(...columns.map((c) => c.length)) * 64 };
}

function drawDag() {
  const tasks = [...run.tasks.values()];
  const { pos, width, height } = layout(tasks);
  const root = $("#dag");
  root.setAttribute("width", width);
  root.setAttribute("height", height);
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
    markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#888", stroke: "none" }));
  defs.append(marker);
  const nodes = [defs];
  for (const t of tasks) for (const dep of parents(t)) {
    const a = pos.get(dep), b = pos.get(t.name);
    const routed = !t.deps.includes(dep);  // a routing edge: dashed, taken only when the router picks it
    if (a && b) nodes.push(svg("path", { class: routed ? "route" : "dep", "data-from": dep, "data-to": t.name,
      d: `M ${a.x + 150} ${a.y + 20} C ${a.x + 170} ${a.y + 20}, ${b.x - 20} ${b.y + 20}, ${b.x} ${b.y + 20}` }));
  }
  for (const t of tasks) {
    const p = pos.get(t.name);
    const g = svg("g", { "data-task": t.name, "data-state": t.state, class: "node" });
    g.append(svg("rect", { x: p.x, y: p.y, width: 150, height: 40, fill: `var(--${t.state}, #eee)` }));
    const label = svg("text", { x: p.x + 8, y: p.y + 16 });
    label.textContent = t.name + (t.optional ? " (optional)" : "");
    const sub = svg("text", { x: p.x + 8, y: p.y + 32, fill: "#333" });
    sub.textContent = `${t.robot} · ${t.state}`;
    g.append(label, sub);
    nodes.push(g);
  }
  root.replaceChildren(...nodes);
}

function drawTasks(status) {
  $("#run-status").textContent = status;
  $("#run-status").className = "state " + status;
  let tokens = 0, cost = 0;
  const cards = [];
  for (const t of run.tasks.values()) {
    tokens += (t.input_tokens || 0) + (t.output_tokens || 0);
    cost += Number(t.cost || 0);
    const text = t.reply ?? run.text.get(t.name) ?? "";
    const calls = run.calls.get(t.name) || [];
    const live = t.state === "running" && t.started
      ? el("span", { class: "running-info" }, ` · started ${clock(t.started)} · ${elapsed(t.started)} · on ${t.worker || "?"}`)
      : "";
    cards.push(el("div", { class: "task", id: "task-" + t.name },
      el("strong", {}, t.name), " ", el("span", { class: "muted" }, t.robot), " ",
      el("span", { class: "state " + t.state }, t.state), live,
      el("span", { class: "muted" }, ` · ${(t.input_tokens || 0) + (t.output_tokens || 0)} tokens · ${money(t.cost)}`
        + (t.duration ? ` · ${Number(t.duration).toFixed(2)}s` : "") + (t.attempt > 1 ? ` · attempt ${t.attempt}` : "")),
      t.input ? el("details", { class: "input" }, el("summary", {}, "input"), el("pre", {}, t.input)) : "",
      calls.length ? el("ul", { class: "calls" }, ...calls.map((c) => el("li", { class: "call" },
        el("code", {}, `${c.name}(${JSON.stringify(c.input ?? {})})`), c.output != null ? ` → ${toolOutput(c.output)}` : " …"))) : "",
      t.error ? el("pre", { class: "error" }, t.error) : "",
      t.state === "waiting" && t.asks ? asking(t.asks) : "",
      text ? el("pre", { class: "text" }, text) : ""));
  }
  $("#tasks").replaceChildren(...cards);
  const states = [...run.tasks.values()].map((t) => t.state);
  const n = (s) => states.filter((x) => x === s).length;
  $("#run-totals").textContent = `${counts({ done: n("done"), failed: n("failed"), skipped: n("skipped"),
    tasks: states.length })} · ${tokens} tokens · ${money(cost)}`;
  $("#cancel").hidden = !config.actions || !["running"].includes(status);
  drawDag();
}

// A task parked on a person's question (docs/durable.md): the question and, with actions
// on, the answer form (POST /api/answer/<request id>, token required).
function asking(req) {
  const box = el("div", { class: "asks" }, el("strong", {}, "asks: "), req.question || "",
    req.choices ? el("span", { class: "muted" }, " choices: " + req.choices.join(", ")) : "");
  if (!config.actions) return box;
  const input = el("input", { placeholder: req.kind === "approval" ? "why (for a denial)" : "answer" });
  const send = (body) => act(`/api/answer/${encodeURIComponent(req.id)}`, body);
  if (req.kind === "approval") {
    const yes = el("button", { class: "action" }, "Approve"), no = el("button", { class: "action" }, "Deny");
    yes.onclick = () => send({ approve: true });
    no.onclick = () => send({ approve: false, text: input.value });
    box.append(" ", input, " ", yes, " ", no);
  } else {
    const go = el("button", { class: "action" }, "Answer");
    go.onclick = () => send({ text: input.value });
    box.append(" ", input, " ", go);
  }
  return box;
}

function logLine(list, text) {
  const item = el("li", {}, text);
  $(list).append(item);
  item.scrollIntoView({ block: "nearest" });
}

function snapshot(data) {
  run.tasks = new Map(data.tasks.map((t) => [t.name, t]));
  $("#run-network").textContent = data.network;
  run.status = data.status;
  drawTasks(data.status);
}

function onEvent(ev) {
  const t = ev.task && run.tasks.get(ev.task);
  const d = ev.data || {};
  const states = { "task.queued": "queued", "task.started": "running", "task.completed": "done",
    "task.failed": "failed", "task.skipped": "skipped", "task.retrying": "queued" };
  if (t && states[ev.event]) t.state = states[ev.event];
  if (t && ev.event === "text.delta") run.text.set(t.name, (run.text.get(t.name) || "") + (d.delta || ""));
  if (t && ev.event === "usage.updated") Object.assign(t, { input_tokens: d.input_tokens, output_tokens: d.output_tokens, cost: d.cost });
  if (t && ev.event === "task.completed") Object.assign(t, { reply: d.reply, duration: d.duration });
  if (t && ev.event === "task.failed") t.error = d.error;
  // streamed text and tool calls belong to one attempt: a new attempt (a retry, a re-run and
  // the tasks after it) starts them afresh, also when a reload replays every attempt's events
  if (t && ev.event === "task.started") {
    Object.assign(t, { started: ev.ts, worker: d.worker, attempt: d.attempt, error: null, reply: null });
    run.text.delete(t.name);
    run.calls.delete(t.name);
  }
  if (t && ev.event === "task.rerun") for (const n of d.reset || []) {
    Object.assign(run.tasks.get(n) || {}, { state: "pending", error: null, reply: null });
    run.text.delete(n);
    run.calls.delete(n);
  }
  if (t && ev.event === "tool_call.started") (run.calls.get(t.name) || run.calls.set(t.name, []).get(t.name)).push({ id: d.id, name: d.name, input: d.input });
  if (t && ev.event === "tool_call.completed") {
    const call = (run.calls.get(t.name) || []).find((c) => c.id === d.id);
    if (call) call.output = d.output;
  }
  if (t && ev.event === "hitl.requested") Object.assign(t, { state: "waiting", asks: d });
  if (t && ev.event === "hitl.resolved") Object.assign(t, { state: "queued", asks: null });
  if (ev.event === "run.completed") run.status = d.status || "completed";
  if (ev.event === "task.rerun") run.status = "running";
  if (ev.event === "run.cancelled") run.status = "cancelled";
  const what = ev.event.startsWith("tool_call.") ? ` ${d.name}${ev.event === "tool_call.started" ? JSON.stringify(d.input ?? {}) : ""}` : "";
  if (ev.event !== "text.delta") logLine("#events", `${ev.seq} ${ev.event}${ev.task ? " " + ev.task : ""}${what}`);
  drawTasks(run.status);
}

function follow(id) {
  run.id = id;
  run.text = new Map();
  run.calls = new Map();
  $("#run-id").textContent = id;
  $("#events").replaceChildren();
  $("#memory").replaceChildren();
  $("#run-view").dataset.live = "connecting";
  $("#cancel").onclick = async () => { await act(`/api/runs/${id}/cancel`); };
  source = new EventSource(`/api/runs/${encodeURIComponent(id)}/stream`);
  source.addEventListener("snapshot", (m) => snapshot(JSON.parse(m.data)));
  source.addEventListener("redis", (m) => { const r = JSON.parse(m.data); redisBanner(r.down, r.error); });
  source.addEventListener("run", (m) => onEvent(JSON.parse(m.data)));
  source.addEventListener("memory", (m) => {
    const c = JSON.parse(m.data);
    logLine("#memory", `v${c.version} ${c.op} ${c.key}${c.writer ? " by " + c.writer : ""}: ${JSON.stringify(c.value)}`.slice(0, 240));
  });
  source.addEventListener("end", (m) => {
    $("#run-view").dataset.live = "ended";
    drawTasks(JSON.parse(m.data).status);
    source.close();
  });
  source.onopen = () => { $("#run-view").dataset.live = "live"; };
}

// --- routing -----------------------------------------------------------------------------
async function route() {
  clearInterval(timer);
  if (source) { source.close(); source = null; }
  const [, view, arg] = (location.hash || "#/").split("/");
  try {
    if (view === "run" && arg) { show("run-view"); follow(decodeURIComponent(arg)); }
    else if (view === "dlq" && arg) { show("dlq-view"); await deadLetters(decodeURIComponent(arg)); }
    else {
      show("overview-view");
      timer = setInterval(() => overview().catch(() => {}), 2000);  // keeps polling through an outage
      await overview();
    }
  } catch (err) {
    $("main").prepend(el("div", { class: "problem" }, String(err.message || err)));
  }
}

setInterval(() => { if (run.id && [...run.tasks.values()].some((t) => t.state === "running")) drawTasks(run.status); }, 1000);
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  config = await fetch("/api/config").then((r) => r.json());  // served without Redis
  $("#mode").textContent = config.actions ? "actions enabled" : "read-only";
  $("#token-box").hidden = !config.actions;
  $("#token").value = sessionStorage.getItem("robot-lab-token") || "";
  route();
});

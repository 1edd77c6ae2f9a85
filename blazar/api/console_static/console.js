// The Blazar console: plain DOM, no framework, no build step. Every value from the daemon (model names, paths,
// errors, event payloads) is untrusted and reaches the page only through textContent, never as HTML.

import { offerModels, setupTalk } from "./talk.js";

const KEY_STORE = "blazar.console.key";
const POLL_MS = 2000;
const EVENT_ROWS = 500; // rows the event log keeps; older ones are dropped as new ones arrive
const RECONNECT_MS = [1000, 2000, 5000, 10000];

const $ = (id) => document.getElementById(id);

// -- DOM helpers ---------------------------------------------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name === "title") node.title = String(value);
    else if (name === "onclick") node.addEventListener("click", value);
    else node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function td(value, cls) {
  return el("td", { class: cls, text: value ?? "" });
}

function button(label, onclick, cls) {
  return el("button", { type: "button", class: cls, text: label, onclick });
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(2)} GiB`;
  return `${Math.round(n / (1 << 20))} MiB`;
}

function ms(v) {
  if (v === null || v === undefined) return "-";
  if (Math.abs(v) < 1000) return `${Math.round(v)} ms`;
  return `${(v / 1000).toFixed(1)} s`;
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  const whole = Math.max(0, Math.round(s));
  if (whole < 60) return `${whole} s`;
  const m = Math.floor(whole / 60);
  return whole < 3600 ? `${m} min ${whole % 60} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

function time(ts) {
  return new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function clock(ts) {
  return new Date(ts * 1000).toISOString().slice(11, 19);
}

function notice(message) {
  const box = $("notice");
  box.textContent = message || "";
  box.hidden = !message;
}

// -- the API -------------------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(json) {
  const h = {};
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) h.Authorization = `Bearer ${key}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function errorOf(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    const err = body.error;
    message = typeof err === "string" ? err : (err && err.message) || message;
  } catch { /* not JSON: the status line says it */ }
  if (resp.status === 401 || resp.status === 403) {
    $("key-state").textContent = "an admin key is needed";
  }
  return new ApiError(resp.status, message);
}

async function api(path, { method = "GET", body, signal } = {}) {
  const resp = await fetch(path, {
    method, signal, headers: headers(body !== undefined), credentials: "omit", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!resp.ok) throw await errorOf(resp);
  // Some answers have no body (Ollama's DELETE /api/delete is a bare 200): read the text, then parse what is there.
  const text = await resp.text();
  const type = resp.headers.get("content-type") || "";
  return type.includes("json") && text ? JSON.parse(text) : text;
}

// Reads a streamed answer line by line (NDJSON, or SSE's lines), calling `line` for each.
async function readLines(resp, line) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const text = buffer.slice(0, nl).replace(/\r$/, "");
      buffer = buffer.slice(nl + 1);
      line(text);
    }
  }
  if (buffer) line(buffer);
}

async function run(action, what) {
  notice("");
  try {
    const result = await action();
    refreshSoon();
    return result;
  } catch (e) {
    notice(`${what}: ${e.message}`);
    return undefined;
  }
}

// -- the key -------------------------------------------------------------------------------------------------------

function showKeyState() {
  $("key-state").textContent = sessionStorage.getItem(KEY_STORE) ? "key set (this tab only)" : "";
}

$("key-save").addEventListener("click", () => {
  const value = $("key-input").value.trim();
  if (value) sessionStorage.setItem(KEY_STORE, value);
  $("key-input").value = "";
  showKeyState();
  refreshAll();
  followLog();
});
$("key-forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORE);
  showKeyState();
});

// -- instances, queues, requests ("blazar watch") ------------------------------------------------------------------

async function stopModel(model) {
  await run(() => api("/api/blazar/stop", { method: "POST", body: { model } }), `stop ${model}`);
}

async function loadModel(model, pin) {
  const body = pin === undefined ? { model } : { model, pin };
  await run(() => api("/api/blazar/load", { method: "POST", body }), `load ${model}`);
}

function keepAliveLeft(row) {
  if (row.pinned) return "pinned";
  if (row.in_flight) return "busy";
  if (row.state !== "ready") return "-";
  if (row.expires_at === null || row.expires_at === undefined) {
    return row.keep_alive_s === null || row.keep_alive_s === undefined ? "forever" : "-";
  }
  return duration(row.expires_at - Date.now() / 1000);
}

function renderInstances(rows) {
  const tbody = $("instances").tBodies[0];
  fill(tbody, rows.map((r) => el("tr", { "data-model": r.model, "data-state": r.state },
    td(r.kind && r.kind !== "llama-server" ? `${r.model} (${r.kind})` : r.model), td(r.instance_id, "mono"),
    td(r.state, r.state === "ready" ? "ok" : r.state === "failed" ? "bad" : "warn"),
    td(`${bytes(r.planned_bytes)} / ${bytes(r.measured_bytes)}`, "num"),
    td(`${r.in_flight ?? 0} / ${r.slots ?? "-"}`, "num"),
    td(keepAliveLeft(r)), td(r.ctx_tokens, "num"),
    el("td", { class: "actions" },
      button(r.pinned ? "unpin" : "pin", () => loadModel(r.model, !r.pinned)),
      button("stop", () => stopModel(r.model))))));
  $("instances-empty").hidden = rows.length > 0;
}

function renderPerModel(queues, rates, hits) {
  const names = new Set([...Object.keys(queues).filter((k) => !k.startsWith("_")), ...Object.keys(rates),
    ...Object.keys(hits || {})]);
  fill($("per-model").tBodies[0], [...names].sort().map((name) => {
    const q = queues[name] || {};
    const rate = rates[name];
    const hit = hits ? hits[name] ?? 0 : "-";  // the response cache's hits (the dashboard's; "-" without it)
    return el("tr", {}, td(name), td(`${q.busy ?? 0} / ${q.slots ?? "-"}`, "num"), td(q.queued ?? 0, "num"),
      td(rate === undefined ? "-" : Number(rate).toFixed(1), "num"), td(hit, "num"));
  }));
}

function traceLink(traceId) {
  return el("td", {}, button(traceId ? traceId.slice(0, 12) : "-", () => explainTrace(traceId), "link"));
}

function renderRequests(rows) {
  fill($("requests").tBodies[0], rows.map((r) => el("tr", { "data-trace": r.trace_id },
    traceLink(r.trace_id), td(r.model), td(r.status, r.status >= 400 ? "bad" : "ok"),
    td(ms(r.ttft_ms), "num"), td(ms(r.duration_ms), "num"))));
}

function renderFailures(rows) {
  fill($("failures").tBodies[0], rows.map((r) => el("tr", { "data-trace": r.trace_id },
    traceLink(r.trace_id), td(r.model), td(r.status, "bad"), td(r.verdict || r.reason || ""))));
}

// Clients whose last turns each changed their prompt early, so the engine prefilled it again (the dashboard's
// prefix_clients: flagged ones only; `blazar why --clients` lists them all).
function renderPrefixClients(rows) {
  fill($("prefix-clients").tBodies[0], rows.map((r) => el("tr", { "data-trace": r.break_trace_id || "" },
    td(r.actor + (r.agent ? ` (${r.agent})` : "")), td(r.streak, "bad"), td(`${r.breaks} / ${r.turns}`, "num"),
    td(r.changed || "-"), td(`${r.reprocessed_tokens} tokens, ${ms(r.prefill_ms)}`, "num"),
    traceLink(r.break_trace_id))));
}

// The dashboard route (blazar/queries/dashboard.py) when the daemon serves it; else what ps and queue say, and the
// last requests read from the event log.
let dashboardServed = true;

async function refreshWatch() {
  if (dashboardServed) {
    try {
      const d = await api("/api/blazar/dashboard");
      renderDashboard(d);
      return;
    } catch (e) {
      if (e.status !== 404 && e.status !== 405) throw e;
      dashboardServed = false;
    }
  }
  const [ps, queue, done] = await Promise.all([
    api("/api/blazar/ps"), api("/api/blazar/queue"),
    api("/api/blazar/events?type=request.completed,request.failed,request.rejected&limit=10"),
  ]);
  renderInstances(ps.instances);
  renderPerModel(queue.queues, {}, null);
  const requests = done.events.reverse().map((e) => ({
    trace_id: e.trace_id, model: e.data.model, status: e.data.status, duration_ms: e.data.duration_ms,
    reason: e.data.reason, // TTFT is the dashboard's (the request.first_token offset): "-" here
  }));
  renderRequests(requests);
  renderFailures(requests.filter((r) => r.status >= 400));
  $("dashboard-note").textContent = "tokens/s and why verdicts come from /api/blazar/dashboard, which this daemon "
    + "does not serve";
}

// The dashboard's rows (blazar/queries/dashboard.py, version 1) in the shapes the tables above take: its instances
// carry slots_busy and keep_alive_left_s, its queues only the waiting count per model.
function renderDashboard(d) {
  const now = Date.now() / 1000;
  const instances = (d.instances || []).map((r) => ({
    ...r,
    in_flight: r.slots_busy,
    // keep_alive_left_s is null when busy, pinned, forever or not ready; keepAliveLeft tells those apart.
    expires_at: r.keep_alive_left_s === null || r.keep_alive_left_s === undefined ? null : now + r.keep_alive_left_s,
    keep_alive_s: r.keep_alive_left_s === null || r.keep_alive_left_s === undefined ? null : r.keep_alive_left_s,
    ctx_tokens: r.ctx_tokens ?? "-",  // ctx_tokens is in the rows of daemons since version 1 grew it
  }));
  renderInstances(instances);
  const queues = {};
  for (const [name, waiting] of Object.entries(d.queues || {})) queues[name] = { queued: waiting };
  for (const r of d.instances || []) {
    const q = queues[r.model] || (queues[r.model] = { queued: 0 });
    q.slots = (q.slots ?? 0) + (r.slots ?? 0);
    if (r.slots_busy !== null && r.slots_busy !== undefined) q.busy = (q.busy ?? 0) + r.slots_busy;
  }
  renderPerModel(queues, d.tokens_per_s || {}, d.cache_hits || {});
  renderRequests(d.requests || []);
  renderFailures(d.failures || []);
  renderPrefixClients(d.prefix_clients || []);
  $("dashboard-note").textContent = d.window_s ? `tokens/s over the last ${d.window_s} s` : "";
}

// -- why -----------------------------------------------------------------------------------------------------------

async function explainTrace(trace) {
  if (!trace) return;
  $("why-input").value = trace;
  notice("");
  let x;
  try {
    x = await api(`/api/blazar/why/${encodeURIComponent(trace)}`);
  } catch (e) {
    notice(`why ${trace}: ${e.message}`);
    return;
  }
  $("why-trace").textContent = x.trace_id;
  $("why-head").textContent = [x.dialect, x.route, x.model, x.actor && `by ${x.actor}`, time(x.received_ts)]
    .filter(Boolean).join("  ");
  const verdict = $("why-verdict");
  verdict.textContent = x.verdict;
  verdict.className = x.outcome === "completed" ? "ok" : x.outcome === "in_progress" ? "warn" : "bad";
  $("why-figures").textContent = Object.entries(x.figures || {})
    .filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => `${k.replace(/_/g, " ")}: ${k.endsWith("_ms") ? ms(v) : Number(v).toFixed(1)}`).join(" · ");
  fill($("why-steps"), x.steps.map((s) => el("li", { "data-type": s.type },
    el("span", { class: "offset", text: `${s.offset_ms >= 0 ? "+" : ""}${ms(s.offset_ms)}` }),
    el("span", { class: "type", text: s.type }), el("span", { text: s.text }))));
  $("why-result").hidden = false;
  $("why").scrollIntoView({ block: "nearest" });
}

$("why-show").addEventListener("click", () => explainTrace($("why-input").value.trim()));
$("why-input").addEventListener("keydown", (e) => {
  if (e.key === "Enter") explainTrace($("why-input").value.trim());
});

// -- the model store -----------------------------------------------------------------------------------------------

function confirmRemove(name) {
  const dialog = $("confirm");
  $("confirm-text").textContent = `Remove ${name} from the store? Its files are deleted.`;
  return new Promise((resolve) => {
    const done = (answer) => {
      dialog.close();
      $("confirm-yes").removeEventListener("click", yes);
      $("confirm-no").removeEventListener("click", no);
      resolve(answer);
    };
    const yes = () => done(true);
    const no = () => done(false);
    $("confirm-yes").addEventListener("click", yes);
    $("confirm-no").addEventListener("click", no);
    dialog.addEventListener("cancel", no, { once: true });
    dialog.showModal();
  });
}

async function removeModel(name) {
  if (!(await confirmRemove(name))) return;
  await run(() => api("/api/delete", { method: "DELETE", body: { model: name } }), `remove ${name}`);
}

function fitCell(fit, kind) {
  const cell = el("td", { class: fit.fits ? "ok" : "bad", title: fit.summary });
  // A speech child (whisper, piper) has no context or KV cache: its kind's memory model is its whole charge.
  const shape = kind && kind !== "llama-server"
    ? `${bytes(fit.total_bytes)} (the ${kind} memory model)`
    : `ctx ${fit.ctx_per_slot} × ${fit.slots} slot(s), ${bytes(fit.total_bytes)}, KV ${fit.cache_type_k}`;
  cell.textContent = fit.fits ? `fits: ${shape}` : `does not fit: ${fit.summary}`;
  return cell;
}

async function refreshModels() {
  const { models } = await api("/api/blazar/models");
  fill($("models").tBodies[0], models.map((m) => {
    const loaded = m.instances.length > 0;
    const pinned = m.instances.some((i) => i.pinned);
    return el("tr", { "data-model": m.name },
      td(m.name), td(bytes(m.bytes), "num"),
      td(m.kind && m.kind !== "llama-server" ? m.kind : [m.architecture, m.file_type].filter(Boolean).join(" ")),
      fitCell(m.fit, m.kind), td(loaded ? m.instances.map((i) => i.state).join(", ") : "-"),
      el("td", { class: "actions" },
        button("load", () => loadModel(m.name)),
        button(pinned ? "unpin" : "pin", () => loadModel(m.name, !pinned)),
        button("stop", () => stopModel(m.name), undefined),
        button("rm", () => removeModel(m.name), "danger")));
  }));
  $("models-empty").hidden = models.length > 0;
  offerModels(models);
}

async function pull() {
  const target = $("pull-input").value.trim();
  if (!target) return;
  const bar = $("pull-progress");
  const status = $("pull-status");
  const go = $("pull-go");
  notice("");
  go.disabled = true;
  bar.hidden = false;
  bar.removeAttribute("value");
  status.textContent = "starting…";
  try {
    const resp = await fetch("/api/pull", {
      method: "POST", headers: headers(true), credentials: "omit", cache: "no-store",
      body: JSON.stringify({ model: target, stream: true }),
    });
    if (!resp.ok) throw await errorOf(resp);
    let failed = null;
    await readLines(resp, (text) => {
      if (!text.trim()) return;
      const line = JSON.parse(text);
      if (line.error) {
        failed = line.error;
      } else if (line.total) {
        bar.max = line.total;
        bar.value = line.completed || 0;
        status.textContent = `${bytes(line.completed || 0)} of ${bytes(line.total)}`;
      } else if (line.status) {
        status.textContent = line.status;
      }
    });
    if (failed) throw new Error(failed);
    status.textContent = `pulled ${target}`;
  } catch (e) {
    status.textContent = "";
    notice(`pull ${target}: ${e.message}`);
  } finally {
    go.disabled = false;
    bar.hidden = true;
    refreshSoon();
  }
}

$("pull-go").addEventListener("click", pull);

// -- engines -------------------------------------------------------------------------------------------------------

function verifiedText(v) {
  if (!v) return "-";
  return v.ok ? `ok, ${v.checked_files} files (${time(v.ts)})` : `FAILED: ${v.problems.join("; ")}`;
}

function smokeText(s) {
  if (!s) return "-";
  return s.passed ? `passed (${ms(s.duration_ms)})` : `FAILED${s.exit_code !== null ? ` (exit ${s.exit_code})` : ""}`;
}

async function refreshNodes() {
  // The gateways sharing this log (PostgreSQL): where each model is loaded, and in whose store it is.
  const { this_node: me, nodes } = await api("/api/blazar/nodes");
  $("nodes").hidden = nodes.length === 0;
  fill($("node-list").tBodies[0], nodes.map((n) => el("tr", {},
    td(n.name === me ? `${n.name} (this one)` : n.name), td(n.url),
    td(n.up ? "up" : `down (${n.down_reason || "?"})`, n.up ? "" : "bad"), td(time(n.last_seen_ts)),
    td(n.loaded.join(", ") || "-"), td(n.models.join(", ") || "-"))));
}

async function refreshEngines() {
  const { engines } = await api("/api/blazar/engines");
  fill($("engine-list").tBodies[0], engines.map((e) => el("tr", { "data-tag": e.tag },
    td(e.active ? "active" : e.rollback_target ? "previous" : "", e.active ? "ok" : "muted"), td(e.tag, "mono"),
    td((e.version && e.version.version) || "?"), td(e.source_kind), td(`${e.file_count} (${bytes(e.bytes)})`, "num"),
    td(verifiedText(e.verified), e.verified ? (e.verified.ok ? "ok" : "bad") : "muted"),
    td(smokeText(e.smoke), e.smoke ? (e.smoke.passed ? "ok" : "bad") : "muted"),
    el("td", { class: "actions" }, button("verify", () => run(
      () => api("/api/blazar/engines/verify", { method: "POST", body: { tag: e.tag } }), `verify ${e.tag}`))))));
  $("engines-empty").hidden = engines.length > 0;
}

// -- the event log, live -------------------------------------------------------------------------------------------

let follower = null; // the AbortController of the open follow
let lastSeq = 0;

function filters() {
  const q = new URLSearchParams();
  const type = $("filter-type").value.trim();
  const stream = $("filter-stream").value.trim();
  if (type) q.set("type", type);
  if (stream) q.set("stream", stream);
  return q;
}

function eventRow(e) {
  return el("tr", { "data-seq": e.seq, "data-type": e.type },
    td(e.seq, "num"), el("td", { class: "nowrap", text: clock(e.ts), title: time(e.ts) }), td(e.type, "mono"), td(e.stream, "mono"),
    e.trace_id ? traceLink(e.trace_id) : td(""), td(JSON.stringify(e.data), "data"));
}

function addEvents(events) {
  const tbody = $("events").tBodies[0];
  for (const e of events) {
    tbody.prepend(eventRow(e));
    lastSeq = Math.max(lastSeq, e.seq);
  }
  while (tbody.rows.length > EVENT_ROWS) tbody.deleteRow(-1);
}

async function loadLog() {
  const q = filters();
  q.set("limit", "200");
  const { events, last_seq: last } = await api(`/api/blazar/events?${q}`);
  $("events").tBodies[0].replaceChildren();
  addEvents(events);
  lastSeq = last;
}

function onLiveEvent(e) {
  addEvents([e]);
  if (/^(instance|model|engine|request)\./.test(e.type)) refreshSoon(e.type.startsWith("request.") ? 500 : 0, !e.type.startsWith("request."));
}

async function followLoop(controller) {
  let failures = 0;
  while (!controller.signal.aborted) {
    const q = filters();
    q.set("after", String(lastSeq));
    try {
      const resp = await fetch(`/api/blazar/events/follow?${q}`, {
        headers: headers(false), credentials: "omit", cache: "no-store", signal: controller.signal,
      });
      if (!resp.ok) throw await errorOf(resp);
      $("log-state").textContent = "live";
      $("conn").textContent = "connected";
      $("conn").className = "pill ok";
      failures = 0;
      let kind = "message";
      let data = "";
      await readLines(resp, (line) => {
        if (line === "") {
          if (kind === "event" && data) onLiveEvent(JSON.parse(data));
          kind = "message";
          data = "";
        } else if (line.startsWith("event:")) {
          kind = line.slice(6).trim();
        } else if (line.startsWith("data:")) {
          data += line.slice(5).trim();
        }
      });
    } catch (e) {
      if (controller.signal.aborted) return;
      $("log-state").textContent = `not live: ${e.message}`;
      if (e.status === 401 || e.status === 403) return; // waits for a key
      $("conn").textContent = "reconnecting…";
      $("conn").className = "pill warn";
      failures += 1;
    }
    const wait = RECONNECT_MS[Math.min(failures, RECONNECT_MS.length - 1)];
    await new Promise((resolve) => setTimeout(resolve, failures ? wait : 0));
  }
}

async function followLog() {
  if (follower) follower.abort();
  follower = null;
  try {
    await loadLog();
  } catch (e) {
    $("log-state").textContent = `cannot read the log: ${e.message}`;
    return;
  }
  if (!$("live").checked) {
    $("log-state").textContent = "paused";
    return;
  }
  follower = new AbortController();
  followLoop(follower);
}

$("filter-apply").addEventListener("click", followLog);
$("live").addEventListener("change", followLog);
for (const id of ["filter-type", "filter-stream"]) {
  $(id).addEventListener("keydown", (e) => {
    if (e.key === "Enter") followLog();
  });
}

// -- refreshing ----------------------------------------------------------------------------------------------------

let pending = null;
let pendingAll = false;

// A request event changes only what `watch` shows; an instance, model or engine event changes the store's and the
// engines' tables too (loaded, fit, active). One refresh at a time, of all three when any caller asked for all.
function refreshSoon(delay = 0, all = true) {
  pendingAll = pendingAll || all;
  if (pending) return;
  pending = setTimeout(() => {
    pending = null;
    const everything = pendingAll;
    pendingAll = false;
    if (everything) refreshAll();
    else refreshWatch().catch(() => {});
  }, delay);
}

async function refreshAll() {
  const parts = [refreshWatch(), refreshModels(), refreshEngines(), refreshNodes()];
  const results = await Promise.allSettled(parts);
  const failed = results.find((r) => r.status === "rejected");
  if (failed) {
    const e = failed.reason;
    $("conn").textContent = e.status ? `error ${e.status}` : "unreachable";
    $("conn").className = "pill bad";
    if (e.status === 401 || e.status === 403) notice(`${e.message} (enter an admin key above)`);
  } else {
    $("conn").textContent = "connected";
    $("conn").className = "pill ok";
  }
}

setInterval(() => {
  if (!document.hidden) refreshWatch().catch(() => {});
}, POLL_MS);

setupTalk({ key: () => sessionStorage.getItem(KEY_STORE), api, explainTrace });
showKeyState();
refreshAll();
followLog();

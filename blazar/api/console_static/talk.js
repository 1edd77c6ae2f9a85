// The console's Talk view: the browser's microphone into a realtime session over /v1/realtime (the same WebSocket
// the SDKs use), the answer played as it arrives. The key goes as OpenAI's browser clients send it, in a subprotocol
// (a browser cannot set headers on a WebSocket). Every value from the daemon reaches the page through textContent.

const IN_RATE = 24000; // the session's default formats: PCM16 24 kHz mono, both ways
const KEPT_LINES = 40; // transcript lines the view keeps
const KEPT_ERRORS = 20;
const ASKED_KEPT = 64; // client event ids remembered to name what an error answers
const TRACE_TRIES = 10; // the turn's trace is looked up in the log this many times, TRACE_WAIT_MS apart
const TRACE_WAIT_MS = 500;

const $ = (id) => document.getElementById(id);

let deps = null; // { key, api, explainTrace } from console.js
let talk = null; // the running conversation

function base64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function unbase64(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function setState(state, text) {
  const view = $("talk");
  view.dataset.state = state;
  $("talk-state").textContent = text || state;
  $("talk-start").disabled = state === "connecting" || state === "live";
  $("talk-stop").disabled = !(state === "connecting" || state === "live");
}

function count(name, n) {
  const view = $("talk");
  view.dataset[name] = String(Number(view.dataset[name] || 0) + n);
}

function keep(list, max) {
  while (list.children.length > max) list.firstElementChild.remove();
}

// One line of the conversation: the user's words or the answer's, keyed by item id or response id.
function line(kind, id) {
  const log = $("talk-log");
  const found = [...log.children].find((li) => li.dataset.id === id && li.dataset.kind === kind);
  if (found) return found;
  const li = document.createElement("li");
  li.className = kind;
  li.dataset.kind = kind;
  li.dataset.id = id;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = kind === "user" ? "you" : "answer";
  const text = document.createElement("span");
  text.className = "text";
  li.append(who, text);
  log.append(li);
  keep(log, KEPT_LINES);
  return li;
}

function say(li, text, append) {
  const span = li.querySelector(".text");
  span.textContent = append ? span.textContent + text : text;
}

function showError(err, asked) {
  const list = $("talk-errors");
  const message = err.message || "";
  const what = asked && !message.startsWith(asked) ? ` (to ${asked})` : "";
  const text = `${err.code || err.type || "error"}: ${message}${what}`;
  const last = list.lastElementChild;
  if (last && last.dataset.text === text) { // the same error again (one per append, say): counted, not repeated
    last.dataset.count = String(Number(last.dataset.count) + 1);
    last.textContent = `${text} (×${last.dataset.count})`;
    return;
  }
  const li = document.createElement("li");
  li.className = "bad";
  li.dataset.text = text;
  li.dataset.code = err.code || "";
  li.dataset.answers = asked || "";
  li.dataset.count = "1";
  li.textContent = text;
  list.append(li);
  keep(list, KEPT_ERRORS);
}

// -- audio out: PCM16 24 kHz deltas queued one after the other on the context's clock ----------------------------

function play(delta) {
  const bytes = unbase64(delta);
  const view = new DataView(bytes.buffer);
  const samples = new Float32Array(bytes.length >> 1);
  for (let i = 0; i < samples.length; i += 1) samples[i] = view.getInt16(i * 2, true) / 0x8000;
  if (!samples.length) return;
  const buffer = talk.ctx.createBuffer(1, samples.length, IN_RATE);
  buffer.copyToChannel(samples, 0);
  const source = talk.ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(talk.ctx.destination);
  const at = Math.max(talk.ctx.currentTime, talk.playAt);
  source.start(at);
  talk.playAt = at + buffer.duration;
  talk.playing.add(source);
  source.addEventListener("ended", () => talk && talk.playing.delete(source));
  count("playedBytes", samples.length * 2);
}

function silence() {
  for (const source of talk.playing) source.stop();
  talk.playing.clear();
  talk.playAt = 0;
}

// -- events from the session --------------------------------------------------------------------------------------

function send(event) {
  const id = `talk_${talk.sent += 1}`;
  talk.asked.set(id, event.type);
  if (talk.asked.size > ASKED_KEPT) talk.asked.delete(talk.asked.keys().next().value);
  talk.ws.send(JSON.stringify({ event_id: id, ...event }));
}

function onCreated(session) {
  talk.session = session.id;
  $("talk").dataset.session = session.id || "";
  setState("live", `live: ${session.model}`);
  const most = Number($("talk-max").value);
  if (Number.isInteger(most) && most > 0) send({ type: "session.update", session: { type: "realtime",
    max_output_tokens: most } });
  // Blazar transcribes every turn it answers; a session that shows the user's words only when asked
  // (`audio.input.transcription` null, as OpenAI's default) is asked.
  const input = session.audio && session.audio.input;
  if (input && input.transcription === null) {
    send({ type: "session.update", session: { type: "realtime", audio: { input: { transcription: {
      model: "whisper-1" } } } } });
  }
}

const HANDLERS = {
  "session.created": (e) => onCreated(e.session),
  "session.updated": (e) => { $("talk").dataset.maxOutputTokens = String(e.session.max_output_tokens ?? ""); },
  "input_audio_buffer.speech_started": (e) => {
    if (talk.playing.size) { // the user speaks over the answer: the server cancels it, the page stops playing it
      silence();
      count("interrupted", 1);
    }
    say(line("user", e.item_id), "…");
  },
  "conversation.item.input_audio_transcription.delta": (e) => say(line("user", e.item_id), e.delta, true),
  "conversation.item.input_audio_transcription.completed": (e) => say(line("user", e.item_id), e.transcript),
  "conversation.item.input_audio_transcription.failed": (e) => {
    say(line("user", e.item_id), "(not heard)");
    showError(e.error || {}, "transcription");
  },
  "response.created": (e) => line("answer", e.response.id),
  "response.output_audio_transcript.delta": (e) => say(line("answer", e.response_id), e.delta, true),
  "response.output_text.delta": (e) => say(line("answer", e.response_id), e.delta, true),
  "response.output_audio.delta": (e) => play(e.delta),
  "response.done": (e) => {
    const li = line("answer", e.response.id);
    li.dataset.status = e.response.status;
    findTrace(li, talk);
  },
  error: (e) => showError(e.error || {}, talk.asked.get((e.error || {}).event_id)),
};

function onMessage(message) {
  let event;
  try {
    event = JSON.parse(message.data);
  } catch {
    return;
  }
  count("events", 1);
  const handler = HANDLERS[event.type];
  if (handler) handler(event);
}

// -- the turn's trace: W's `realtime.turn` event of this session when the log has one, else the newest realtime
// request since the session began (read through the admin event route: an admin key's console) ----------------

function traceLink(li, trace, kind) {
  li.dataset.trace = trace;
  const link = document.createElement("button");
  link.type = "button";
  link.className = "link";
  link.textContent = `${kind} ${trace.slice(0, 12)}`;
  link.addEventListener("click", () => deps.explainTrace(trace));
  li.append(link);
}

async function findTrace(li, conversation) {
  const linked = conversation.traced;
  const unlinked = (e) => e.seq > conversation.since && !linked.has(e.trace_id);
  for (let i = 0; i < TRACE_TRIES && conversation === talk; i += 1) {
    let found = null;
    try {
      const turns = await deps.api("/api/blazar/events?type=realtime.turn&limit=50");
      found = turns.events.reverse().find((e) => e.data.session_id === conversation.session && unlinked(e));
      if (!found && i === TRACE_TRIES - 1) { // no turn event after every try: the request's own trace
        const asked = await deps.api("/api/blazar/events?type=request.received&limit=50");
        const chat = asked.events.reverse().find((e) => e.data.route === "/v1/realtime" && unlinked(e));
        if (chat) found = { ...chat, kind: "request" };
      }
    } catch {
      return; // not an admin key: no link
    }
    if (found) {
      linked.add(found.trace_id);
      traceLink(li, found.trace_id, found.kind || "turn");
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, TRACE_WAIT_MS));
  }
}

// -- start and stop -----------------------------------------------------------------------------------------------

function socketUrl(model) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}/v1/realtime?model=${encodeURIComponent(model)}`;
}

async function start() {
  const model = $("talk-model").value.trim();
  if (!model) {
    showError({ code: "no_model", message: "name a realtime profile or a chat model" });
    return;
  }
  if (!navigator.mediaDevices || !window.AudioWorkletNode) {
    showError({ code: "no_microphone", message: "this page cannot use the microphone: it needs https, or "
      + "http://localhost / 127.0.0.1" });
    return;
  }
  stop();
  // NOTE: the context is made in the click itself, so the browser lets it play.
  const conversation = { ctx: new AudioContext(), playing: new Set(), playAt: 0, sent: 0, asked: new Map(),
    session: null, since: 0, traced: new Set(), ws: null, stream: null, tap: null };
  talk = conversation;
  const view = $("talk");
  for (const name of ["sentBytes", "playedBytes", "events", "interrupted"]) view.dataset[name] = "0";
  delete view.dataset.maxOutputTokens;
  $("talk-log").replaceChildren(); // a new conversation: the last one's lines and errors go
  $("talk-errors").replaceChildren();
  setState("connecting", "asking for the microphone…");
  try {
    conversation.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1,
      echoCancellation: true, noiseSuppression: true, autoGainControl: true } });
    await conversation.ctx.audioWorklet.addModule("/console/static/talk-worklet.js");
    conversation.since = (await deps.api("/api/blazar/events?limit=1").catch(() => ({ last_seq: 0 }))).last_seq;
  } catch (e) { // the microphone refused (or absent), or the worklet not loaded
    if (talk === conversation) stop(`cannot start: ${e.message}`, true);
    return;
  }
  if (talk !== conversation) return; // stopped meanwhile
  const key = deps.key();
  const protocols = key ? ["realtime", `openai-insecure-api-key.${key}`] : ["realtime"];
  const ws = new WebSocket(socketUrl(model), protocols);
  conversation.ws = ws;
  setState("connecting", `connecting to ${model}…`);
  ws.addEventListener("message", (m) => talk === conversation && onMessage(m));
  ws.addEventListener("close", (e) => {
    if (talk === conversation) stop(`closed (${e.code}${e.reason ? `: ${e.reason}` : ""})`);
  });
  const source = conversation.ctx.createMediaStreamSource(conversation.stream);
  conversation.tap = new AudioWorkletNode(conversation.ctx, "blazar-talk-capture", { numberOfInputs: 1,
    numberOfOutputs: 0, channelCount: 1, channelCountMode: "explicit" });
  conversation.tap.port.addEventListener("message", (m) => {
    if (talk !== conversation || !conversation.session || ws.readyState !== WebSocket.OPEN) return;
    const bytes = new Uint8Array(m.data);
    send({ type: "input_audio_buffer.append", audio: base64(bytes) });
    count("sentBytes", bytes.length);
  });
  conversation.tap.port.start();
  source.connect(conversation.tap);
  await conversation.ctx.resume();
}

function stop(why, failed = false) {
  const conversation = talk;
  if (!conversation) return;
  talk = null;
  if (conversation.ws && conversation.ws.readyState <= WebSocket.OPEN) conversation.ws.close(1000);
  if (conversation.stream) for (const track of conversation.stream.getTracks()) track.stop();
  for (const source of conversation.playing) source.stop();
  if (conversation.tap) conversation.tap.disconnect();
  conversation.ctx.close().catch(() => {});
  setState(failed ? "failed" : "closed", why || "stopped");
}

// Chat models of the store, offered in the model field (a realtime profile is typed: `blazar realtime list`).
export function offerModels(models) {
  $("talk-models").replaceChildren(...models.filter((m) => !m.kind || m.kind === "llama-server").map((m) => {
    const option = document.createElement("option");
    option.value = m.name;
    return option;
  }));
}

export function setupTalk(given) {
  deps = given;
  setState("idle", "");
  $("talk-start").addEventListener("click", start);
  $("talk-stop").addEventListener("click", () => stop());
  $("talk-model").addEventListener("keydown", (e) => {
    if (e.key === "Enter") start();
  });
}

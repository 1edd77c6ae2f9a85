"""Two lanes of bench/overhead.py about the daemon's own costs, run through it (`--only cpu`, `--only flood`):
the CPU of the `blazar serve` process (idle, per short request, per relayed chunk; from /proc/<pid>/stat) and a
refusal flood (128 streams against 4 slots and a queue of 64: the 429s, their Retry-After, the drain).

Every span is bounded in time; nothing is pinned. CPU is utime + stime of the daemon process (all its threads) in
SC_CLK_TCK ticks, with the sum of its threads' schedstat run time (ns) beside it as a finer cross-check.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import overhead as ov

IDLE_S = 10.0
IDLE_SETTLE_S = 3.0  # after the warm-up: let deferred work (event writes, checkpoints) finish before idling
SHORT_REQUESTS = 40
SHORT_TOKENS = 2
LONG_TOKENS = 1500  # one stream from the real engine (context 2048 per slot)
FAKE_LONG_TOKENS = 480  # the fake engine's tiny model has 512 of context: several streams of this length
FAKE_LONG_REQUESTS = 8
FAKE_DELAY_MS = 1.0  # each chunk its own write, as an engine's decode loop gives them
SPAN_TIMEOUT_S = 600.0  # as ROUND_TIMEOUT_S: a loaded machine decodes at a tenth of its quiet speed
TARGET_IDLE_PCT = 0.2
TARGET_SHORT_MS = 1.0
TARGET_CHUNK_US = 30.0

FLOOD_STREAMS = 128
FLOOD_SLOTS = 4
FLOOD_QUEUE = 64
FLOOD_MAX_TOKENS = 32
FLOOD_TIMEOUT_S = 300.0  # the whole flood; about 40 s on a quiet 2-CPU machine
FLOOD_READ_TIMEOUT = httpx2.Timeout(FLOOD_TIMEOUT_S + 10, connect=10.0)
FLOOD_PROBES = 10
PROBE_QUIET_S = 0.3  # probes start once no refusal has come back for this long
RETRY_AFTER_FACTOR = 2.0


# -- CPU of a process -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float  # perf_counter
    cpu_s: float  # utime + stime, /proc/<pid>/stat
    sched_ns: int  # the sum over /proc/<pid>/task/*/schedstat (threads that exited meanwhile are missed)


def sample(pid: int) -> Sample:
    sched = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            sched += int(stat.read_text().split()[0])
    return Sample(time.perf_counter(), ov.cpu_seconds(pid), sched)


@dataclass
class Span:
    """The daemon's CPU over a stretch of wall time, and that CPU less what idling would have cost over it."""

    wall_s: float
    cpu_s: float
    sched_s: float
    idle_rate: float = 0.0  # CPU seconds per wall second when idle (0 for the idle span itself)

    @property
    def net_cpu_s(self) -> float:
        return self.cpu_s - self.idle_rate * self.wall_s

    @property
    def busy(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s else float("nan")

    def json(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s, "sched_s": self.sched_s, "idle_rate": self.idle_rate,
                "net_cpu_s": self.net_cpu_s}


def span(a: Sample, b: Sample, idle_rate: float = 0.0) -> Span:
    return Span(b.t - a.t, b.cpu_s - a.cpu_s, (b.sched_ns - a.sched_ns) / 1e9, idle_rate)


async def idle_span(pid: int, seconds: float) -> Span:
    a = sample(pid)
    await asyncio.sleep(seconds)
    return span(a, sample(pid))


async def streams_span(client: httpx2.AsyncClient, pid: int, url: str, payload: bytes, n: int, idle_rate: float,
                       *, tokens: int) -> tuple[Span, list[ov.Stream]]:
    """`n` streamed requests one after another, each checked: no error, `tokens` tokens."""
    async def run() -> list[ov.Stream]:
        return [await ov.stream_once(client, url, payload) for _ in range(n)]

    a = sample(pid)
    streams = await asyncio.wait_for(run(), SPAN_TIMEOUT_S)
    sp = span(a, sample(pid), idle_rate)
    bad = [s for s in streams if s.error or s.tokens != tokens]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} requests failed or came back short: {bad[0].error or bad[0].tokens}")
    return sp, streams


@dataclass(frozen=True)
class Long:
    """Streams to relay for the per-chunk figure: `requests` of `tokens` each, `delay_ms` apart (fake engine)."""

    name: str
    tokens: int
    requests: int
    delay_ms: float | None = None
    judged: bool = True


async def cpu_costs(client: httpx2.AsyncClient, home: ov.Home, model: str, *, idle_s: float, longs: list[Long],
                    say: Any) -> dict[str, Any]:
    """On a started daemon: idle before the model is loaded and with it loaded, then CPU per short request, then CPU
    per relayed chunk over each of `longs`; both less the loaded idle rate, the chunks less the per-request cost
    too."""
    assert home.daemon is not None
    pid = home.daemon.pid
    url = f"{home.url}/v1/chat/completions"
    out: dict[str, Any] = {"daemon_pid": pid}
    await asyncio.sleep(IDLE_SETTLE_S)
    say(f"  idle, nothing loaded: {idle_s:g} s")
    out["idle_unloaded"] = (await idle_span(pid, idle_s)).json()
    home.load(model)
    short = ov.chat_payload(model, SHORT_TOKENS)
    await streams_span(client, pid, url, short, 5, 0.0, tokens=SHORT_TOKENS)  # warm: routes, pools, caches
    await asyncio.sleep(IDLE_SETTLE_S)
    say(f"  idle, {model} loaded: {idle_s:g} s")
    idle = await idle_span(pid, idle_s)
    out["idle_loaded"] = idle.json()
    rate = idle.busy
    say(f"  {SHORT_REQUESTS} streamed chats of {SHORT_TOKENS} tokens, one after another")
    sp, _ = await streams_span(client, pid, url, short, SHORT_REQUESTS, rate, tokens=SHORT_TOKENS)
    per_request_s = sp.net_cpu_s / SHORT_REQUESTS
    out["short"] = sp.json() | {"requests": SHORT_REQUESTS, "tokens": SHORT_TOKENS,
                                "cpu_ms_per_request": 1000 * per_request_s,
                                "cpu_ms_per_request_gross": 1000 * sp.cpu_s / SHORT_REQUESTS}
    out["long"] = []
    for lg in longs:
        extra = {"fake_delay_ms": lg.delay_ms} if lg.delay_ms else {}
        payload = ov.chat_payload(model, lg.tokens, **extra)
        say(f"  {lg.requests} stream(s) of {lg.tokens} tokens" + (f", {lg.delay_ms:g} ms apart" if lg.delay_ms else ""))
        sp, streams = await streams_span(client, pid, url, payload, lg.requests, rate, tokens=lg.tokens)
        chunks = sum(s.events for s in streams)
        net = sp.net_cpu_s - lg.requests * per_request_s
        out["long"].append(sp.json() | {"name": lg.name, "requests": lg.requests, "tokens": lg.tokens,
                                        "delay_ms": lg.delay_ms, "judged": lg.judged, "chunks": chunks,
                                        "cpu_us_per_chunk": 1e6 * net / chunks,
                                        "cpu_us_per_chunk_gross": 1e6 * sp.cpu_s / chunks,
                                        "idle_share": sp.idle_rate * sp.wall_s / sp.cpu_s if sp.cpu_s else None,
                                        "chunks_per_s": chunks / sp.wall_s})
    return out


async def cpu_phase(client: httpx2.AsyncClient, root: Path, server: Path | None, model: Path | None, *, quick: bool,
                    say: Any) -> dict[str, Any]:
    """The daemon's CPU against the real engine (idle unloaded and loaded, 2-token chats, one 1,500-token stream) and
    against bench/fake_engine.py (2-token chats, and streams paced 1 ms a chunk: a per-chunk figure that no engine
    noise blurs)."""
    idle_s = IDLE_S / 2 if quick else IDLE_S
    res: dict[str, Any] = {"idle_s": idle_s, "clk_tck": ov.CLK_TCK}
    if server is not None and model is not None:
        say("cpu: the real engine; installing it, importing the model, starting blazar serve")
        home = ov.engine_home(root, "cpu-engine-home", server, model, 0)
        try:
            home.serve()
            longs = [Long("engine pace", LONG_TOKENS // 3 if quick else LONG_TOKENS, 1)]
            res["engine"] = await cpu_costs(client, home, "gemma", idle_s=idle_s, longs=longs, say=say)
            res["engine"]["daemon_argv"] = home.argv
        finally:
            home.stop()
    say("cpu: the fake engine; starting blazar serve")
    home = ov.fake_home(root, "cpu-fake-home")
    try:
        home.serve()
        n = FAKE_LONG_REQUESTS // 2 if quick else FAKE_LONG_REQUESTS
        longs = [Long(f"paced {FAKE_DELAY_MS:g} ms", FAKE_LONG_TOKENS, n, FAKE_DELAY_MS),
                 Long("unpaced", FAKE_LONG_TOKENS, n, judged=False)]  # chunks coalesce: the ceiling's regime
        res["fake"] = await cpu_costs(client, home, "fake", idle_s=idle_s / 2, longs=longs, say=say)
        res["fake"]["daemon_argv"] = home.argv
    finally:
        home.stop()
    return res


def cpu_verdicts(cpu: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    out = []
    for where in ("engine", "fake"):
        r = cpu.get(where)
        if r is None:
            continue
        name = "real engine" if where == "engine" else "fake engine"
        for key, what in (("idle_unloaded", "nothing loaded"), ("idle_loaded", "model loaded")):
            if key in r and where == "engine":
                pct = 100 * r[key]["cpu_s"] / r[key]["wall_s"]
                out.append((f"daemon idle, {what} ({r[key]['wall_s']:.0f} s)", f"{pct:.3f}% of a core",
                            f"< {TARGET_IDLE_PCT:g}%", pct < TARGET_IDLE_PCT))
        ms = r["short"]["cpu_ms_per_request"]
        out.append((f"daemon CPU per {SHORT_TOKENS}-token streamed chat, less idle ({name})", f"{ms:.3f} ms",
                    f"< {TARGET_SHORT_MS:g} ms", ms < TARGET_SHORT_MS))
        for lg in r["long"]:
            if lg["judged"]:
                us = lg["cpu_us_per_chunk"]
                out.append((f"daemon CPU per relayed chunk, less idle and per-request ({name}, {lg['name']})",
                            f"{us:.1f} µs", f"< {TARGET_CHUNK_US:g} µs", us < TARGET_CHUNK_US))
    return out


def print_cpu(cpu: dict[str, Any]) -> None:
    print(f"\ndaemon CPU (/proc/<pid>/stat utime+stime, {cpu['clk_tck']} ticks/s; schedstat beside it), nothing pinned")
    print("| engine | measure | wall s | CPU ms (stat) | CPU ms (schedstat) | result |")
    print("|---|---|---:|---:|---:|---:|")
    for where in ("engine", "fake"):
        r = cpu.get(where)
        if r is None:
            continue
        for key, what in (("idle_unloaded", "idle, nothing loaded"), ("idle_loaded", "idle, model loaded")):
            if key in r:
                m = r[key]
                print(f"| {where} | {what} | {m['wall_s']:.1f} | {1000 * m['cpu_s']:.0f} | {1000 * m['sched_s']:.1f} | "
                      f"{100 * m['cpu_s'] / m['wall_s']:.3f}% of a core (schedstat "
                      f"{100 * m['sched_s'] / m['wall_s']:.3f}%) |")
        m = r["short"]
        print(f"| {where} | {m['requests']} chats of {m['tokens']} tokens | {m['wall_s']:.1f} | "
              f"{1000 * m['cpu_s']:.0f} | {1000 * m['sched_s']:.1f} | {m['cpu_ms_per_request']:.3f} ms/request "
              f"less idle ({m['cpu_ms_per_request_gross']:.3f} gross) |")
        for m in r["long"]:
            print(f"| {where} | {m['requests']} x {m['tokens']}-token stream, {m['name']}, {m['chunks']} chunks | "
                  f"{m['wall_s']:.1f} | {1000 * m['cpu_s']:.0f} | {1000 * m['sched_s']:.1f} | "
                  f"{m['cpu_us_per_chunk']:.1f} µs/chunk less idle and per-request ({m['cpu_us_per_chunk_gross']:.1f} "
                  f"gross, idle {m['idle_share'] or 0:.0%} of it; {m['chunks_per_s']:,.0f} chunks/s) |")


# -- the refusal flood ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One request of the flood, times from the flood's start (perf_counter seconds)."""

    sent: float
    status: int = 0
    done: float = 0.0  # the 429's body read, or the stream's end
    first: float | None = None  # first content event (a 200)
    retry_after: str | None = None
    tokens: int | None = None
    error: str | None = None
    probe: bool = False

    @property
    def latency_ms(self) -> float:
        return (self.done - self.sent) * 1000


async def flood_request(client: httpx2.AsyncClient, url: str, payload: bytes, t0: float, *,
                        probe: bool = False) -> Outcome:
    o = Outcome(sent=time.perf_counter() - t0, probe=probe)
    buf = b""
    try:
        async with client.stream("POST", url, content=payload, headers={"content-type": "application/json"}) as r:
            o.status = r.status_code
            if r.status_code != 200:
                o.retry_after = r.headers.get("retry-after")
                await r.aread()
                return o
            async for block in r.aiter_raw():
                buf += block
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    if o.first is None and ov.OPENAI.content in ev:
                        o.first = time.perf_counter() - t0
                    elif b'"usage"' in ev or b'"error"' in ev:
                        o.tokens, o.error = ov.OPENAI.read(ev)
    except httpx2.HTTPError as e:
        o.error = f"{type(e).__name__}: {e}"
    finally:
        o.done = time.perf_counter() - t0
    return o


async def flood_phase(root: Path, server: Path, model: Path, *, max_tokens: int, say: Any) -> dict[str, Any]:
    """128 streamed chats sent at once to a daemon with 4 slots and a queue of 64: 4 run, 64 wait, the rest get 429
    with Retry-After at once. Then up to 10 probes one at a time while the queue is still full (a refusal's own
    latency, nothing else in flight on the client). Retry-After is judged against the drain: from the refusal to the
    moment the last waiting request got its first token (the queue empty again)."""
    say(f"flood: {FLOOD_SLOTS} slots, queue_depth {FLOOD_QUEUE}, {FLOOD_STREAMS} streams of {max_tokens} tokens")
    home = ov.engine_home(root, "flood-home", server, model, 0)
    home.cli("config", "set", "fit.slots", str(FLOOD_SLOTS))
    home.cli("config", "set", "queue.queue_depth", str(FLOOD_QUEUE))
    # A waiting request gets 503 after queue_timeout_s (120 s by default); on a slow machine that would cut the drain
    # short, so the flood's own bound applies instead.
    home.cli("config", "set", "queue.queue_timeout_s", str(FLOOD_TIMEOUT_S))
    limits = httpx2.Limits(max_connections=FLOOD_STREAMS + FLOOD_PROBES + 8,
                           max_keepalive_connections=FLOOD_STREAMS + FLOOD_PROBES + 8, keepalive_expiry=4.0)
    try:
        home.serve()
        home.load("gemma")
        assert home.daemon is not None
        url = f"{home.url}/v1/chat/completions"
        payload = ov.chat_payload("gemma", max_tokens)
        async with httpx2.AsyncClient(timeout=FLOOD_READ_TIMEOUT, limits=limits, trust_env=False) as client:
            # Warm: two full waves, so the slot-hold average behind Retry-After is of requests like these.
            warm = await asyncio.wait_for(asyncio.gather(*(ov.stream_once(client, url, ov.varied(payload, i))
                                                           for i in range(2 * FLOOD_SLOTS))), SPAN_TIMEOUT_S)
            hold_s = statistics.median(s.end - s.start for s in warm)
            if any(s.error for s in warm):
                raise RuntimeError(f"warm-up failed: {next(s.error for s in warm if s.error)}")
            say(f"  warm: {2 * FLOOD_SLOTS} requests, {hold_s:.2f} s each at C={FLOOD_SLOTS}")
            cpu0 = sample(home.daemon.pid)
            t0 = time.perf_counter()
            # Distinct requests (their seeds): identical ones would share one generation (single-flight).
            tasks = [asyncio.create_task(flood_request(client, url, ov.varied(payload, i), t0))
                     for i in range(FLOOD_STREAMS)]
            try:
                async with asyncio.timeout(FLOOD_TIMEOUT_S):
                    probes = await run_probes(client, url, payload, t0, tasks)
                    outcomes = await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()  # after a timeout: no request outlives the bench's bound
            cpu = span(cpu0, sample(home.daemon.pid))
            await asyncio.sleep(1.0)  # the refusals' events are group-committed, then folded
            refusal = refusal_histogram((await client.get(f"{home.url}/metrics")).text)
        return {"slots": FLOOD_SLOTS, "refusal_server": refusal,
                "queue_depth": FLOOD_QUEUE, "streams": FLOOD_STREAMS, "max_tokens": max_tokens,
                "warm_hold_s": hold_s, "daemon_argv": home.argv, "daemon_cpu": cpu.json(),
                "summary": summarize_flood(outcomes, probes),
                "requests": [o.__dict__ for o in outcomes], "probes": [o.__dict__ for o in probes]}
    finally:
        home.stop()


async def run_probes(client: httpx2.AsyncClient, url: str, payload: bytes, t0: float,
                     tasks: list[asyncio.Task[Outcome]]) -> list[Outcome]:
    """Once the flood's refusals have come back (none new for PROBE_QUIET_S), probes one at a time until one is not
    refused (the queue has moved on; that probe then waits and streams like the others)."""
    last_count, last_change = 0, time.perf_counter()
    while time.perf_counter() - t0 < 30.0:
        await asyncio.sleep(0.02)
        refused = sum(1 for t in tasks if t.done() and t.exception() is None and t.result().status == 429)
        if refused != last_count:
            last_count, last_change = refused, time.perf_counter()
        elif refused and time.perf_counter() - last_change >= PROBE_QUIET_S:
            break
        if all(t.done() for t in tasks):
            break
    probes: list[Outcome] = []
    for k in range(FLOOD_PROBES):
        o = await flood_request(client, url, ov.varied(payload, FLOOD_STREAMS + k), t0, probe=True)
        probes.append(o)
        if o.status != 429:
            break
    return probes


def _stats(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"p50": ov.pct(list(xs), 50), "p90": ov.pct(list(xs), 90), "max": max(xs), "min": min(xs), "n": len(xs)}


def summarize_flood(outcomes: list[Outcome], probes: list[Outcome]) -> dict[str, Any]:
    every = outcomes + probes
    statuses: dict[str, int] = {}
    for o in every:
        statuses[str(o.status or o.error)] = statuses.get(str(o.status or o.error), 0) + 1
    refused = [o for o in outcomes if o.status == 429]
    served = [o for o in every if o.status == 200]
    failed = [o for o in served if o.error or o.first is None]
    other = [o for o in every if o.status not in (200, 429)]
    retry = [float(o.retry_after) for o in refused + probes if o.status == 429 and o.retry_after]
    drained_at = max((o.first for o in served if o.first is not None), default=float("nan"))
    all_done_at = max((o.done for o in served), default=float("nan"))
    refused_at = statistics.median(o.done for o in refused) if refused else float("nan")
    drain_s = drained_at - refused_at
    # Each refusal's own Retry-After against the time from its refusal to the queue's drain.
    within = [o for o in refused if o.retry_after and
              drain_s > 0 and 1 / RETRY_AFTER_FACTOR <= float(o.retry_after) / (drained_at - o.done)
              <= RETRY_AFTER_FACTOR]
    ra = statistics.median(retry) if retry else float("nan")
    return {"statuses": statuses, "refused": len(refused),
            "refused_expected": FLOOD_STREAMS - FLOOD_SLOTS - FLOOD_QUEUE,
            "served": len(served), "served_failed": len(failed), "neither_served_nor_refused": len(other),
            "refused_without_retry_after": sum(1 for o in refused if not o.retry_after),
            "retry_after_s": _stats(retry), "refusal_latency_ms": _stats([o.latency_ms for o in refused]),
            "probe_refusal_latency_ms": _stats([o.latency_ms for o in probes if o.status == 429]),
            "probes": len(probes), "probes_refused": sum(1 for o in probes if o.status == 429),
            "refused_at_s_p50": refused_at, "last_refusal_at_s": max((o.done for o in refused), default=float("nan")),
            "queue_drained_at_s": drained_at, "all_done_at_s": all_done_at, "drain_after_refusal_s": drain_s,
            "retry_after_over_drain": ra / drain_s if drain_s > 0 else float("nan"),
            "refusals_within_factor": len(within), "retry_after_factor": RETRY_AFTER_FACTOR}


def refusal_histogram(text: str) -> dict[str, float]:
    """The daemon's own `blazar_refusal_seconds` (every model summed): count, mean, and how many within 5 ms."""
    count = total = within = 0.0
    for line in text.splitlines():
        if line.startswith("blazar_refusal_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
        elif line.startswith("blazar_refusal_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("blazar_refusal_seconds_bucket") and 'le="0.005"' in line:
            within += float(line.rsplit(" ", 1)[1])
    return {"count": count, "mean_ms": 1000 * total / count if count else float("nan"), "within_5ms": within}


def flood_verdicts(flood: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    s = flood["summary"]
    ratio = s["retry_after_over_drain"]
    ok = 1 / RETRY_AFTER_FACTOR <= ratio <= RETRY_AFTER_FACTOR
    r = flood.get("refusal_server") or {}
    server = [(f"flood: a refusal's time at the server (blazar_refusal_seconds, mean {r.get('mean_ms', 0):.2f} ms)",
               f"{r.get('within_5ms', 0):.0f} of {r.get('count', 0):.0f} within 5 ms", "all under 5 ms",
               bool(r.get("count")) and r.get("within_5ms") == r.get("count"))] if r else []
    return [*server,
            (f"flood: Retry-After p50 against the real drain ({s['drain_after_refusal_s']:.1f} s)", f"{ratio:.2f}x",
             f"within {RETRY_AFTER_FACTOR:g}x", ok),
            ("flood: every request streamed in full or refused with 429", f"{s['served'] - s['served_failed']} + "
             f"{s['refused']} of {s['served'] + s['refused'] + s['neither_served_nor_refused']}", "all",
             s["served_failed"] == 0 and s["neither_served_nor_refused"] == 0 and s["served"] > 0),
            ("flood: every 429 carried Retry-After", f"{s['refused'] - s['refused_without_retry_after']} of "
             f"{s['refused']}", "all", s["refused_without_retry_after"] == 0 and s["refused"] > 0)]


def print_flood(flood: dict[str, Any]) -> None:
    s = flood["summary"]

    def st(d: dict[str, float] | None, unit: str, fmt: str = ".1f") -> str:
        if d is None:
            return ""
        return (f"p50 {d['p50']:{fmt}} {unit}, p90 {d['p90']:{fmt}}, min {d['min']:{fmt}}, max {d['max']:{fmt}} "
                f"({d['n']:.0f})")

    print(f"\nrefusal flood: {flood['streams']} streamed chats of {flood['max_tokens']} tokens at once, "
          f"{flood['slots']} slots, queue_depth {flood['queue_depth']} (warm hold {flood['warm_hold_s']:.2f} s)")
    print("| measure | result |")
    print("|---|---:|")
    print(f"| statuses | {', '.join(f'{k}: {v}' for k, v in sorted(s['statuses'].items()))} |")
    print(f"| 429s | {s['refused']} (expected {s['refused_expected']}); without Retry-After: "
          f"{s['refused_without_retry_after']} |")
    print(f"| Retry-After | {st(s['retry_after_s'], 's', '.0f')} |")
    print(f"| 429 latency, client-side, in the flood | {st(s['refusal_latency_ms'], 'ms')} |")
    print(f"| 429 latency, client-side, probes one at a time | {st(s['probe_refusal_latency_ms'], 'ms', '.2f')} |")
    print(f"| refusals came back | p50 {s['refused_at_s_p50']:.3f} s, last {s['last_refusal_at_s']:.3f} s |")
    print(f"| queue drained (last waiting request's first token) | {s['queue_drained_at_s']:.1f} s |")
    print(f"| every stream done | {s['all_done_at_s']:.1f} s |")
    print(f"| drain after the refusals | {s['drain_after_refusal_s']:.1f} s |")
    print(f"| Retry-After p50 / drain | {s['retry_after_over_drain']:.2f}x; refusals within "
          f"{s['retry_after_factor']:g}x of their own wait: {s['refusals_within_factor']} of {s['refused']} |")
    cpu = flood["daemon_cpu"]
    print(f"| daemon CPU over the flood | {1000 * cpu['cpu_s']:.0f} ms in {cpu['wall_s']:.1f} s |")


def print_costs(res: dict[str, Any]) -> None:
    """The tables of the cpu and flood lanes, where they ran."""
    if res.get("cpu") is not None:
        print_cpu(res["cpu"])
    if res.get("flood") is not None:
        print_flood(res["flood"])

"""Benchmark of fair share per key (blazar/serving/fair_queue.py): a light key's wait beside a key that floods.

One key (`flood`) sends --flood requests at once to a model with --slots slots; another (`light`) sends one request
a second while the flood lasts. Three runs, each a fresh daemon on the same home (the `queue.fair_share` setting is
read when the daemon starts):

    alone   the light key's requests with no flood: its wait alone
    fifo    the flood and the light key, `queue.fair_share = false`: the order by arrival (before issue 40)
    fair    the flood and the light key, `queue.fair_share = true` (the default)

The engine is bench/fake_engine.py, whose answers take a fixed time (--tokens chunks --delay-ms apart): admission's
order is what is measured, not a model's speed. Per run and key: the time to the whole answer (client side, p50, p95,
max) and the wait in the queue (`request.admitted`'s `waited_ms`, the server's), and the flood's makespan (the slots
stay busy either way: share changes who waits, not how much work is done).

Run: `.venv/bin/python bench/fair_share.py [--flood 100] [--slots 2] [--tokens 20] [--delay-ms 10] [--out FILE]`
(about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.events.log_sqlite import SqliteEventLog
from blazar.paths import Paths

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_engine
from overhead import Home

MODEL = "fake"
RUNS = ("alone", "fifo", "fair")


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), nearest rank: with few samples, p95 is the worst but one or the worst."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"n": len(values), "p50_ms": round(statistics.median(values), 1), "p95_ms": round(pct(values, 0.95), 1),
            "max_ms": round(max(values), 1)}


async def ask(client: httpx2.AsyncClient, secret: str, tokens: int, delay_ms: int) -> tuple[str, float, float]:
    """One streamed chat (the fake engine spaces a stream's tokens): its trace id, the time to its whole answer (ms)
    and when it ended."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about the harbour."}],
            "max_tokens": tokens, "fake_delay_ms": delay_ms, "stream": True}
    start = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {secret}"}) as r:
        text = await r.aread()
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {text[:300]!r}")
    end = time.perf_counter()
    return r.headers["x-blazar-trace-id"], (end - start) * 1000, end


async def traffic(url: str, secrets: dict[str, str], *, flood: int, light: int, every_s: float, tokens: int,
                  delay_ms: int) -> dict[str, Any]:
    limits = httpx2.Limits(max_connections=flood + light + 8, max_keepalive_connections=flood + light + 8)
    async with httpx2.AsyncClient(base_url=url, trust_env=False, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        floods = [asyncio.create_task(ask(client, secrets["flood"], tokens, delay_ms)) for _ in range(flood)]
        lights = []
        for _ in range(light):
            await asyncio.sleep(every_s)
            lights.append(asyncio.create_task(ask(client, secrets["light"], tokens, delay_ms)))
        flood_done = await asyncio.gather(*floods)
        light_done = await asyncio.gather(*lights)
    makespan = (max(end for _, _, end in flood_done) - start) * 1000 if flood_done else None
    return {"flood": [(t, ms) for t, ms, _ in flood_done], "light": [(t, ms) for t, ms, _ in light_done],
            "flood_makespan_ms": None if makespan is None else round(makespan, 1)}


async def waits(db: Path, traces: set[str]) -> dict[str, float]:
    """`request.admitted`'s waited_ms per trace."""
    log = await SqliteEventLog.open(db, migrate=False)
    try:
        return {rec.trace_id: float(getattr(rec.event, "waited_ms", 0.0))
                async for rec in log.read(types=["request.admitted"]) if rec.trace_id in traces}
    finally:
        await log.close()


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    engine = fake_engine.write_executable(root / "files" / "fake-engine" / "llama-server")
    model = write_tiny_model(root / "files" / "tiny.gguf")
    home = Home(root, "home")
    home.cli("engine", "install", "--path", str(engine))
    home.cli("import", str(model), "--name", MODEL)
    for key, value in (("fit.slots", str(args.slots)), ("queue.queue_depth", str(args.flood + 64))):
        home.cli("config", "set", key, value)
    secrets = {name: json.loads(home.cli("keys", "create", name, "--json"))["secret"] for name in ("flood", "light")}
    hold_s = args.tokens * args.delay_ms / 1000
    light = max(3, int(args.flood * hold_s / args.slots / args.every_s))  # one a second while the flood lasts
    out: dict[str, Any] = {"flood": args.flood, "slots": args.slots, "hold_ms": round(hold_s * 1000, 1),
                           "light_requests": light, "every_s": args.every_s, "runs": {}}
    for name in RUNS:
        home.cli("config", "set", "queue.fair_share", "false" if name == "fifo" else "true")
        home.serve()
        try:
            home.load(MODEL)
            got = asyncio.run(traffic(home.url, secrets, flood=0 if name == "alone" else args.flood, light=light,
                                      every_s=args.every_s, tokens=args.tokens, delay_ms=args.delay_ms))
        finally:
            home.stop()
        db = Paths.from_env({"BLAZAR_HOME": str(home.dir)}).db
        queued = asyncio.run(waits(db, {t for t, _ in got["flood"] + got["light"]}))
        row: dict[str, Any] = {"flood_makespan_ms": got["flood_makespan_ms"]}
        for who in ("light", "flood"):
            row[who] = {"answer": summary([ms for _, ms in got[who]]),
                        "queue_wait": summary([queued[t] for t, _ in got[who] if t in queued])}
        out["runs"][name] = row
        print(name, json.dumps(row), file=sys.stderr)
    alone = out["runs"]["alone"]["light"]["answer"]["p95_ms"]
    out["light_p95_over_alone"] = {name: round(out["runs"][name]["light"]["answer"]["p95_ms"] / alone, 2)
                                   for name in ("fifo", "fair")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flood", type=int, default=100, help="requests the flooding key sends at once")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=20, help="tokens per answer")
    ap.add_argument("--delay-ms", type=int, default=10, help="the fake engine's time per token")
    ap.add_argument("--every-s", type=float, default=1.0, help="the light key's interval")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="blazar-bench-fair-") as tmp:
        result = {"machine": f"{platform.node()} {platform.machine()} {sys.platform}", **run(Path(tmp), args)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

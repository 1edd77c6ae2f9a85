"""Benchmark of the event log (`blazar/events/`) and the projection runner on one fresh BLAZAR_HOME.

Measures durable appends, group-commit appends, full replay, and start-up with and without checkpoints.
Run: `.venv/bin/python bench/log.py [--events N | --quick] [--database-url URL] [--out results.json]`; with
`--database-url` (an empty PostgreSQL database) the same measures run on PostgreSQL. BENCHMARK.md has the method.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import orjson

from blazar import config as settings
from blazar.bootstrap import bootstrap
from blazar.events.base import Event
from blazar.events.location import LogLocation, PostgresUrl, SqliteFile
from blazar.events.log import EventLog
from blazar.events.system import ConfigChanged
from blazar.events.types import register
from blazar.events.writer import GroupCommitWriter
from blazar.logdb import open_log
from blazar.paths import Paths
from blazar.projections import all_projections
from blazar.projections.checkpoints import drop_checkpoints
from blazar.projections.runner import ProjectionRunner

DEFAULT_EVENTS = 1_000_000
QUICK_EVENTS = 100_000
DURABLE_EVENTS = 2_000
# A request path hands events over in small bursts between awaits (one per request step), not all at once.
BURST = 64
# A producer that outruns the disk must wait rather than overflow the writer's buffer (which drops events):
# past this backlog it sleeps one gather interval, as a loaded gateway would while its requests stream.
HIGH_WATER = 50_000
STARTUP_REPEATS = 3
MODELS = ("qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "gemma-2-9b-it", "mistral-7b-instruct")

TARGETS: dict[str, tuple[str, float]] = {
    "group_commit_events_per_s": (">=", 20_000),
    "replay_events_per_s": (">=", 100_000),
    "startup_checkpoint_s": ("<", 1.0),
}


@register
class BenchRequestCompleted(Event):
    """Bench-only stand-in for a request event: the shape and size of what the token path records."""

    TYPE = "bench.request_completed"
    CONTROL = False
    AUDIT = False

    trace_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    duration_ms: float
    outcome: Literal["ok", "error"] = "ok"

    def stream_key(self) -> str:
        return f"trace:{self.trace_id}"


# Trace ids are random, as real ones are (blazar/ids.py): sequential ids would make the stream and trace
# indexes append-only and flatter the write numbers. Seeded, so every run writes the same log.
_trace_ids = random.Random(20261202)


def request_event(i: int) -> BenchRequestCompleted:
    return BenchRequestCompleted(
        trace_id=f"{_trace_ids.getrandbits(128):032x}",
        model=MODELS[i % len(MODELS)],
        prompt_tokens=100 + i % 900,
        completion_tokens=20 + i % 480,
        duration_ms=35.0 + (i % 1000) * 0.75,
    )


# Config changes mixed into the durable phase, so the config and audit projections have work too.
CONFIG_CYCLE: list[tuple[str, Any]] = [
    ("telemetry.log_level", "info"),
    ("log.checkpoint_every", 20_000),
    ("log.group_commit_ms", 2.5),
    ("telemetry.pii_scrub", False),
    ("telemetry.log_level", "warning"),
    ("telemetry.pii_scrub", None),
]


def config_event(i: int, overrides: dict[str, Any]) -> ConfigChanged:
    key, new = CONFIG_CYCLE[i % len(CONFIG_CYCLE)]
    ev = ConfigChanged(key=key, old=overrides.get(key), new=new)
    if new is None:
        overrides.pop(key, None)
    else:
        overrides[key] = new
    return ev


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


async def bench_durable(log: EventLog, n: int, overrides: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i in range(n):
        ev: Event = config_event(i // 20, overrides) if i % 20 == 0 else request_event(i)
        await log.append(ev, actor="cli:bench", trace_id=getattr(ev, "trace_id", None))
    dt = time.perf_counter() - t0
    return {"events": n, "seconds": dt, "events_per_s": rate(n, dt)}


async def bench_group_commit(log: EventLog, n: int, offset: int) -> dict[str, Any]:
    writer = GroupCommitWriter(log)
    writer.start()
    waits = 0
    t0 = time.perf_counter()
    for i in range(offset, offset + n):
        ev = request_event(i)
        writer.submit(ev, actor="gateway", trace_id=ev.trace_id)
        if i % BURST == BURST - 1:
            await asyncio.sleep(0)
            while writer.pending_count >= HIGH_WATER:
                waits += 1
                await asyncio.sleep(writer.interval)
    submitted = time.perf_counter() - t0
    await writer.flush()
    dt = time.perf_counter() - t0
    await writer.stop()
    assert writer.committed == n and writer.dropped == 0, (writer.committed, writer.dropped)
    return {
        "events": n,
        "seconds": dt,
        "submit_seconds": submitted,
        "events_per_s": rate(n, dt),
        "batches": writer.batches,
        "mean_batch": n / writer.batches if writer.batches else 0.0,
        "producer_waits": waits,
        "writer": {"interval_s": writer.interval, "max_batch": writer.max_batch},
    }


async def bench_replay(log: EventLog, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    runner = ProjectionRunner(log, all_projections())
    t0 = time.perf_counter()
    await runner.start(use_checkpoints=False)
    dt = time.perf_counter() - t0
    assert runner.folded_at_start == n and runner.seq == n, (runner.folded_at_start, runner.seq)
    assert all(s.halted is None for s in runner.status())
    assert runner.state("stats").total == n
    await runner.checkpoint()
    return {"events": n, "seconds": dt, "events_per_s": rate(n, dt)}, runner.views()


async def time_bootstrap(paths: Paths) -> tuple[float, dict[str, Any], int]:
    t0 = time.perf_counter()
    app = await bootstrap(paths=paths, actor="cli:bench")
    dt = time.perf_counter() - t0
    views, folded = app.runner.views(), app.folded_at_start
    await app.close()
    return dt, views, folded


def time_cli_state(home: Path, *, register_bench_type: bool) -> tuple[float, dict[str, Any]]:
    """Wall time of a whole `blazar state --json` process (interpreter start, imports, bootstrap, print)."""
    env = {**os.environ, "BLAZAR_HOME": str(home), "NO_COLOR": "1"}
    if register_bench_type:
        # Without checkpoints the process must decode the bench events, so it has to know their type.
        argv = [sys.executable, __file__, "--as-cli", "state", "--json"]
    else:
        argv = [sys.executable, "-m", "blazar.cli.main", "state", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, check=True, timeout=600)
    dt = time.perf_counter() - t0
    return dt, orjson.loads(proc.stdout)


async def run_bench(n: int, home: Path, progress: Callable[[str], None], url: str | None = None) -> dict[str, Any]:
    paths = Paths.from_env({"BLAZAR_HOME": str(home)})
    paths.ensure()
    location: LogLocation = PostgresUrl.parse(url) if url else SqliteFile(paths.db)
    durable_n = min(DURABLE_EVENTS, n // 10)
    overrides: dict[str, Any] = {}
    results: dict[str, Any] = {}

    log = await open_log(location)
    try:
        progress(f"durable appends ({durable_n} events, each committed and fsynced)")
        results["durable"] = await bench_durable(log, durable_n, overrides)
        progress(f"group commit ({n - durable_n} events)")
        results["group_commit"] = await bench_group_commit(log, n - durable_n, durable_n)
        progress(f"full replay ({n} events)")
        results["replay"], replayed = await bench_replay(log, n)
    finally:
        await log.close()
    # config.toml agrees with the log, so start-up's reconciliation records nothing and the log stays at n.
    settings.write_file(paths.config_file, {**overrides, **({"log.database_url": url} if url else {})})

    progress("start-up with checkpoints")
    boot = []
    for _ in range(STARTUP_REPEATS):
        dt, views, folded = await time_bootstrap(paths)
        assert folded == 0 and views == replayed, "start-up from checkpoints must equal the replay"
        boot.append(dt)
    cli = []
    for _ in range(STARTUP_REPEATS):
        dt, out = time_cli_state(home, register_bench_type=False)
        assert out == {"seq": n, "projections": replayed}, "`blazar state` must show the replayed state"
        cli.append(dt)
    results["startup_checkpoint"] = {"bootstrap_s": statistics.median(boot), "cli_state_s": statistics.median(cli),
                                     "runs": STARTUP_REPEATS}

    progress("start-up without checkpoints")
    log = await open_log(location)
    await drop_checkpoints(log)
    await log.close()
    dt_boot, views, folded = await time_bootstrap(paths)  # its close writes checkpoints again
    assert folded == n and views == replayed, "start-up by replay must equal the replay"
    log = await open_log(location)
    await drop_checkpoints(log)
    await log.close()
    dt_cli, out = time_cli_state(home, register_bench_type=True)
    assert out == {"seq": n, "projections": replayed}, "`blazar state` must show the replayed state"
    results["startup_no_checkpoint"] = {"bootstrap_s": dt_boot, "cli_state_s": dt_cli, "runs": 1}
    results["db_bytes"] = (await _database_bytes(url) if url else
                           sum(p.stat().st_size for p in paths.data_dir.glob("blazar.db*")))
    results["backend"] = "postgresql" if url else "sqlite"
    return results


async def _database_bytes(url: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(PostgresUrl.parse(url).driver)
    try:
        sql = "SELECT pg_total_relation_size('events') + pg_total_relation_size('checkpoints')"
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


def verdicts(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    measured = {
        "group_commit_events_per_s": results["group_commit"]["events_per_s"],
        "replay_events_per_s": results["replay"]["events_per_s"],
        "startup_checkpoint_s": results["startup_checkpoint"]["bootstrap_s"],
    }
    out = {}
    for name, (op, target) in TARGETS.items():
        value = measured[name]
        ok = value >= target if op == ">=" else value < target
        out[name] = {"value": value, "target": f"{op} {target:g}", "pass": ok}
    return out


def table(results: dict[str, Any], checks: dict[str, dict[str, Any]]) -> str:
    d, g, r = results["durable"], results["group_commit"], results["replay"]
    sc, sn = results["startup_checkpoint"], results["startup_no_checkpoint"]

    def target(name: str) -> tuple[str, str]:
        c = checks[name]
        return c["target"], "pass" if c["pass"] else "FAIL"

    rows = [
        ("measure", "result", "detail", "target", "ok"),
        ("durable append (fsync each)", f"{d['events_per_s']:,.0f} ev/s", f"{d['events']:,} events", "", ""),
        ("group commit (submit+commit)", f"{g['events_per_s']:,.0f} ev/s",
         f"{g['events']:,} events, {g['batches']:,} batches, mean {g['mean_batch']:,.0f}",
         *target("group_commit_events_per_s")),
        ("full replay (3 projections)", f"{r['events_per_s']:,.0f} ev/s",
         f"{r['events']:,} events in {r['seconds']:.2f} s", *target("replay_events_per_s")),
        ("start-up with checkpoints: bootstrap()", f"{sc['bootstrap_s']:.3f} s", f"median of {sc['runs']}",
         *target("startup_checkpoint_s")),
        ("start-up with checkpoints: `blazar state --json`", f"{sc['cli_state_s']:.3f} s",
         f"median of {sc['runs']}, whole process", "", ""),
        ("start-up without checkpoints: bootstrap()", f"{sn['bootstrap_s']:.3f} s", "replays the whole log", "", ""),
        ("start-up without checkpoints: `blazar state --json`", f"{sn['cli_state_s']:.3f} s",
         "whole process", "", ""),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    align = ["<", ">", "<", ">", "<"]
    return "\n".join(
        "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(row, align, widths, strict=True)).rstrip() for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=None, help=f"Events in the log (default {DEFAULT_EVENTS:,}).")
    parser.add_argument("--quick", action="store_true", help=f"Smoke run with {QUICK_EVENTS:,} events.")
    parser.add_argument("--out", type=Path, default=None, help="Write the results as JSON here.")
    parser.add_argument("--database-url", default=None,
                        help="An empty PostgreSQL database to run on instead of SQLite.")
    args = parser.parse_args(argv)
    n = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    if n < 1000:
        parser.error("--events must be at least 1000")

    def progress(msg: str) -> None:
        print(f"... {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="blazar-bench-") as tmp:
        results = asyncio.run(run_bench(n, Path(tmp) / "home", progress, args.database_url))
    checks = verdicts(results)
    report = {"events": n, "machine": machine(), "results": results, "targets": checks,
              "command": " ".join([".venv/bin/python", "bench/log.py", *(argv if argv is not None else sys.argv[1:])])}
    print(table(results, checks))
    if args.out:
        args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    return 0 if all(c["pass"] for c in checks.values()) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--as-cli"]:
        # The real CLI, in a process that also knows the bench event type (see time_cli_state).
        from blazar.cli.main import main as cli_main

        sys.argv = ["blazar", *sys.argv[2:]]
        cli_main()
    else:
        sys.exit(main())

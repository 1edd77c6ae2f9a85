"""Benchmark of log retention (`blazar/operations/archive.py`): a year of one request a second, never archived
against archived with the default policy (30 days).

The log is written straight into a fresh SQLite file (the schema's own triggers and indexes, rows in seq order, real
payloads), its timestamps spread evenly over a year, so the last 30 days hold 30/365 of it. Then, on the log as
built and again after `archive`: file and used size, group-commit appends, start-up from checkpoints and a full
replay (which reads the archive too once there is one); plus the archive run, the segments' size, `why` look-ups of
archived traces, and what a VACUUM would give back.
Run: `.venv/bin/python bench/archive.py [--events N | --quick] [--out results.json]`. BENCHMARK.md has the method.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from blazar.clock import FakeClock
from blazar.config import Settings
from blazar.events.base import Event
from blazar.events.log_sqlite import SqliteEventLog
from blazar.events.migrate import ensure_schema
from blazar.events.requests import (
    RequestAdmitted,
    RequestCompleted,
    RequestFirstToken,
    RequestReceived,
    RequestRouted,
)
from blazar.events.system import ConfigChanged
from blazar.events.types import encode
from blazar.events.writer import GroupCommitWriter
from blazar.operations.archive import archive
from blazar.projections import all_projections
from blazar.projections.runner import ProjectionRunner
from blazar.queries.why import load_trace, resolve_trace

DEFAULT_EVENTS = 10_000_000
QUICK_EVENTS = 20_000
YEAR_S = 365 * 86_400.0
END = 1_798_761_600.0  # the moment the year ends and archiving runs (2027-01-01)
PER_REQUEST = 5
CONTROL_EVERY = 1_000  # one control event (a config change) per this many requests
ROWS_PER_INSERT = 20_000
ROWS_PER_TRANSACTION = 1_000_000
APPEND_SHARE = 50  # the group-commit batch: 1/50 of the log (200k events at 10M), at least 1,000
LOOKUPS = 20
TRACE_SEED = 20261205
STARTUP_REPEATS = 3
BURST = 64
HIGH_WATER = 50_000
MODELS = ("qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "gemma-2-9b-it", "mistral-7b-instruct")
CONFIG_CYCLE: list[tuple[str, Any]] = [("log_level", "info"), ("checkpoint_every", 20_000), ("log_level", "warning"),
                                       ("pii_scrub", False), ("log_level", None), ("pii_scrub", None)]

# -- the events of one request, with the payload sizes the issue measured on main (350, 169, 163, 88, 515 B) --------


def request_events(trace: str, i: int) -> list[Event]:
    model, inst = MODELS[i % len(MODELS)], f"i-{i % 7:06x}"
    prompt, out = 200 + i % 1800, 20 + i % 700
    return [
        RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions", model=model, stream=True,
                        body_bytes=900 + i % 9000, max_tokens=1024, client=f"10.0.{i % 250}.{i % 199}:5{i % 9999:04d}"),
        RequestRouted(trace_id=trace, model=model, instance_id=inst, port=39000 + i % 1000, cold=i % 500 == 0,
                      ctx_tokens=8192),
        RequestAdmitted(trace_id=trace, model=model, instance_id=inst, waited_ms=round(i % 97 * 0.13, 2), slots=4,
                        busy=1 + i % 4, slot_id=i % 4),
        RequestFirstToken(trace_id=trace, model=model, ttft_ms=round(40 + i % 400 * 0.7, 1)),
        RequestCompleted(trace_id=trace, model=model, instance_id=inst, duration_ms=round(300 + i % 9000 * 0.9, 1),
                         prompt_tokens=prompt, completion_tokens=out, cached_tokens=prompt // 2, finish_reason="stop",
                         chunks=out + 1, engine_timings={
                             "prompt_n": float(prompt - prompt // 2), "prompt_ms": round(prompt * 0.21, 3),
                             "prompt_per_second": 4761.9, "predicted_n": float(out),
                             "predicted_ms": round(out * 7.3, 3), "predicted_per_second": 136.98,
                             "cache_n": float(prompt // 2), "draft_n": 0.0, "draft_n_accepted": 0.0}),
    ]


def trace_of(rnd: random.Random) -> str:
    return f"{rnd.getrandbits(128):032x}"  # random, as real ones are: the trace index grows as it does in use


def config_event(i: int, overrides: dict[str, Any]) -> ConfigChanged:
    key, new = CONFIG_CYCLE[i % len(CONFIG_CYCLE)]
    ev = ConfigChanged(key=key, old=overrides.get(key), new=new)
    if new is None:
        overrides.pop(key, None)
    else:
        overrides[key] = new
    return ev


# -- building the log ----------------------------------------------------------------------------------------------


def _rows(n: int, seed: int) -> Iterator[tuple[Any, ...]]:
    """`n` rows in seq order: requests of five events spread evenly over the year, a config change now and then."""
    rnd = random.Random(seed)
    requests = max(1, n // PER_REQUEST)
    step = YEAR_S / requests
    overrides: dict[str, Any] = {}
    seq, i = 0, 0
    while seq < n:
        ts = END - YEAR_S + i * step
        trace = trace_of(rnd)
        batch: list[tuple[Event, str | None, str]] = [(ev, trace, "gateway") for ev in request_events(trace, i)]
        if i % CONTROL_EVERY == CONTROL_EVERY - 1:
            batch.append((config_event(i // CONTROL_EVERY, overrides), None, "cli:admin"))
        for j, (ev, tr, actor) in enumerate(batch):
            if seq == n:
                return
            seq += 1
            # Each step of a request a little after the one before, as the token path records them.
            yield (seq, ts + j * 0.05, ev.TYPE, ev.V, ev.stream_key(), tr, actor, None, encode(ev))
        i += 1


def build(db: Path, n: int, progress: Callable[[str], None]) -> dict[str, Any]:
    ensure_schema(db)
    conn = sqlite3.connect(db, isolation_level=None)
    t0 = time.perf_counter()
    try:
        conn.execute("PRAGMA synchronous=OFF")  # a bench fixture, written once: durability is not what is measured
        conn.execute("PRAGMA cache_size=-1000000")
        # The gap-free trigger costs more than the insert itself; rows come in seq order by construction, so it is
        # set aside while building and put back exactly as the schema made it.
        (gap_free,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events_gap_free'").fetchone()
        conn.execute("DROP TRIGGER events_gap_free")
        rows = _rows(n, seed=TRACE_SEED)
        done = 0
        while done < n:
            conn.execute("BEGIN IMMEDIATE")
            in_tx = 0
            while in_tx < ROWS_PER_TRANSACTION and done < n:
                chunk = [row for _, row in zip(range(ROWS_PER_INSERT), rows, strict=False)]
                conn.executemany(f"INSERT INTO events VALUES ({', '.join('?' * 9)})", chunk)
                in_tx += len(chunk)
                done += len(chunk)
            conn.execute("COMMIT")
            progress(f"built {done:,} / {n:,} events ({time.perf_counter() - t0:.0f} s)")
        conn.execute(gap_free)
        assert conn.execute("SELECT MIN(seq), MAX(seq), COUNT(*) FROM events").fetchone() == (1, n, n)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return {"events": n, "seconds": time.perf_counter() - t0}


# -- measures ------------------------------------------------------------------------------------------------------


def sizes(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        page_size, pages, free = (conn.execute(f"PRAGMA {p}").fetchone()[0]
                                  for p in ("page_size", "page_count", "freelist_count"))
        live = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        conn.close()
    files = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    return {"file_bytes": files, "used_bytes": (pages - free) * page_size, "live_events": live}


async def group_commit(log: SqliteEventLog, n: int, seed: int) -> dict[str, Any]:
    """Append `n` request events (new traces, at the end of the year) through the group-commit writer."""
    rnd = random.Random(seed)
    writer = GroupCommitWriter(log)
    writer.start()
    t0 = time.perf_counter()
    i = waits = 0
    while i < n:
        trace = trace_of(rnd)
        for ev in request_events(trace, i)[: n - i]:
            writer.submit(ev, actor="gateway", trace_id=trace)
            i += 1
            if i % BURST == 0:
                await asyncio.sleep(0)
                while writer.pending_count >= HIGH_WATER:  # a producer that outruns the disk waits
                    waits += 1
                    await asyncio.sleep(writer.interval)
    await writer.flush()
    dt = time.perf_counter() - t0
    await writer.stop()
    assert writer.committed == n and writer.dropped == 0, (writer.committed, writer.dropped)
    return {"events": n, "seconds": dt, "events_per_s": n / dt, "batches": writer.batches, "producer_waits": waits}


async def replay(db: Path, clock: FakeClock) -> dict[str, Any]:
    """A full replay from the first event (through the archive, when there is one); leaves fresh checkpoints."""
    log = await SqliteEventLog.open(db, clock=clock)
    try:
        runner = ProjectionRunner(log, all_projections())
        t0 = time.perf_counter()
        await runner.start(use_checkpoints=False)
        dt = time.perf_counter() - t0
        assert all(s.halted is None for s in runner.status()), runner.status()
        assert runner.seq == await log.last_seq()
        await runner.checkpoint()
        return {"events": runner.folded_at_start, "seconds": dt, "events_per_s": runner.folded_at_start / dt}
    finally:
        await log.close()


async def startup(db: Path, clock: FakeClock) -> dict[str, Any]:
    """Open the log and start every projection from its checkpoint, as bootstrap does (median of a few)."""
    times, folded = [], 0
    for _ in range(STARTUP_REPEATS):
        t0 = time.perf_counter()
        log = await SqliteEventLog.open(db, clock=clock)
        runner = ProjectionRunner(log, all_projections())
        await runner.start()
        times.append(time.perf_counter() - t0)
        folded = runner.folded_at_start
        await log.close()
    return {"seconds": statistics.median(times), "runs": STARTUP_REPEATS, "folded_at_start": folded}


async def _why(log: SqliteEventLog, trace: str) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    full = await resolve_trace(log, trace[:12])
    recs = await load_trace(log, full)
    dt = time.perf_counter() - t0
    assert full == trace, (full, trace)
    return dt, [r.seq for r in recs]


async def lookups(db: Path, clock: FakeClock, traces: list[str]) -> dict[str, Any]:
    """`why` of each trace as the CLI finds it (a 12-character prefix resolved, then its records loaded): cold, each
    on a fresh handle, as a `blazar why` process does (it checks every segment's sha256 against the log before
    using it); then warm, all on one handle, as the daemon's long-lived log does (segments checked once)."""
    cold, found = [], {}
    for trace in traces:
        log = await SqliteEventLog.open(db, clock=clock)
        try:
            dt, found[trace] = await _why(log, trace)
            cold.append(dt)
        finally:
            await log.close()
    log = await SqliteEventLog.open(db, clock=clock)
    try:
        await _why(log, traces[0])
        warm = [(await _why(log, trace))[0] for trace in traces]
    finally:
        await log.close()
    return {"traces": len(traces), "median_s": statistics.median(cold), "max_s": max(cold),
            "warm_median_s": statistics.median(warm), "warm_max_s": max(warm), "seqs": found}


async def measure(db: Path, clock: FakeClock, n_append: int, traces: list[str], seed: int,
                  progress: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"size": sizes(db)}
    progress(f"group commit ({n_append:,} events)")
    log = await SqliteEventLog.open(db, clock=clock)
    try:
        out["group_commit"] = await group_commit(log, n_append, seed)
    finally:
        await log.close()
    progress("full replay")
    out["replay"] = await replay(db, clock)
    progress("start-up from checkpoints")
    out["startup"] = await startup(db, clock)
    progress(f"why of {len(traces)} old traces")
    out["why"] = await lookups(db, clock, traces)
    return out


async def run_bench(n: int, home: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    db = home / "blazar.db"
    clock = FakeClock(END)
    retention = Settings().retention_s()
    results: dict[str, Any] = {"retention_s": retention}
    progress(f"building a log of {n:,} events over a year")
    results["build"] = build(db, n, progress)
    # Old traces to look up: requests from the first eleven months (archived), regenerated from the build's seed.
    requests = n // PER_REQUEST
    archived = int(requests * (1 - retention / YEAR_S))
    picks = sorted(random.Random(7).sample(range(archived), min(LOOKUPS, archived)))
    gen = random.Random(TRACE_SEED)
    all_traces = [trace_of(gen) for _ in range(picks[-1] + 1)]
    traces = [all_traces[i] for i in picks]
    n_append = max(1_000, n // APPEND_SHARE)

    progress("never archived")
    results["never_archived"] = await measure(db, clock, n_append, traces, seed=1, progress=progress)

    progress("archiving with the default policy")
    log = await SqliteEventLog.open(db, clock=clock)
    try:
        t0 = time.perf_counter()
        run = await archive(log, cutoff=END - retention, now=END)
        dt = time.perf_counter() - t0
        assert log.archive is not None
        segment_bytes = log.archive.size_bytes()
    finally:
        await log.close()
    results["archive"] = {"seconds": dt, "segments": len(run.segments), "events": run.events,
                          "events_per_s": run.events / dt if dt else 0.0, "segment_data_bytes": run.bytes,
                          "archive_dir_bytes": segment_bytes}

    results["archived"] = await measure(db, clock, n_append, traces, seed=2, progress=progress)
    before, after = results["never_archived"]["why"]["seqs"], results["archived"]["why"]["seqs"]
    assert before == after, "why must find the same events in the archive as in the live log"
    for part in ("never_archived", "archived"):
        results[part]["why"].pop("seqs")

    progress("VACUUM (measured only: archiving does not run it)")
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        t0 = time.perf_counter()
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        vacuum_s = time.perf_counter() - t0
    finally:
        conn.close()
    results["vacuum"] = {"seconds": vacuum_s, **sizes(db)}
    progress("start-up after VACUUM")
    results["vacuum"]["startup"] = await startup(db, clock)
    return results


# -- report --------------------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "sqlite": sqlite3.sqlite_version}


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _ms(median: float, top: float) -> str:
    return f"{median * 1e3:,.1f} / {top * 1e3:,.1f} ms"


def table(r: dict[str, Any]) -> str:
    a, b, arc, vac = r["never_archived"], r["archived"], r["archive"], r["vacuum"]
    rows = [
        ("measure", "never archived", "archived (30 d)"),
        ("events in the live log", f"{a['size']['live_events']:,}", f"{b['size']['live_events']:,}"),
        ("database file (db + wal)", _mb(a["size"]["file_bytes"]), _mb(b["size"]["file_bytes"])),
        ("database used ((pages - free) x size)", _mb(a["size"]["used_bytes"]), _mb(b["size"]["used_bytes"])),
        ("group commit", f"{a['group_commit']['events_per_s']:,.0f} ev/s",
         f"{b['group_commit']['events_per_s']:,.0f} ev/s"),
        ("start-up from checkpoints", f"{a['startup']['seconds']:.3f} s", f"{b['startup']['seconds']:.3f} s"),
        ("full replay", f"{a['replay']['seconds']:,.1f} s ({a['replay']['events_per_s']:,.0f} ev/s)",
         f"{b['replay']['seconds']:,.1f} s ({b['replay']['events_per_s']:,.0f} ev/s)"),
        ("why of an old trace, cold: median / max", _ms(a["why"]["median_s"], a["why"]["max_s"]),
         _ms(b["why"]["median_s"], b["why"]["max_s"])),
        ("why of an old trace, warm: median / max", _ms(a["why"]["warm_median_s"], a["why"]["warm_max_s"]),
         _ms(b["why"]["warm_median_s"], b["why"]["warm_max_s"])),
        ("archive run", "", f"{arc['seconds']:,.1f} s, {arc['events']:,} events, {arc['segments']} segments"),
        ("archive directory", "", _mb(arc["archive_dir_bytes"])),
        ("after VACUUM: file / time", "", f"{_mb(vac['file_bytes'])} / {vac['seconds']:,.1f} s"),
        ("after VACUUM: start-up", "", f"{vac['startup']['seconds']:.3f} s"),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=None, help=f"Events in the log (default {DEFAULT_EVENTS:,}).")
    parser.add_argument("--quick", action="store_true", help=f"Smoke run with {QUICK_EVENTS:,} events.")
    parser.add_argument("--out", type=Path, default=None, help="Write the results as JSON here.")
    parser.add_argument("--dir", type=Path, default=None, help="Build the log here (default: a temporary directory).")
    args = parser.parse_args(argv)
    n = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    if n < 10_000:
        parser.error("--events must be at least 10000")

    def progress(msg: str) -> None:
        print(f"... {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="blazar-bench-archive-", dir=args.dir) as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        results = asyncio.run(run_bench(n, home, progress))
    report = {"events": n, "machine": machine(), "results": results,
              "command": " ".join([".venv/bin/python", "bench/archive.py",
                                   *(argv if argv is not None else sys.argv[1:])])}
    print(table(results))
    if args.out:
        args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reads answer the same across the archive, end to end: requests served by `blazar serve` (real llama-server, real
Gemma, the official openai SDK), then `blazar why` (full id and prefix), the daemon's why route, `blazar events
--trace/--since/--until` and `blazar state --at` taken before and after the request history is archived (with the
daemon running, and again once it is stopped): every answer identical, though the rows have left the live log."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import httpx2
import openai
import pytest

from blazar.bootstrap import open_log_only
from blazar.operations.archive import archive
from blazar.paths import Paths
from blazar.queries.archive_verify import verify_archive
from blazar.queries.why import MIN_PREFIX
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma, stop_daemon

MODEL = "gemma"


def _answers(home: Path, trace: str, seq: int, since: float, until: float) -> dict[str, object]:
    def cli(*args: str) -> object:
        out = blazar_cli(home, *args, timeout=120).stdout
        if args[0] == "events":  # one JSON object a line
            return [json.loads(line) for line in out.splitlines() if line.strip()]
        return json.loads(out)

    return {
        "why": cli("why", trace, "--json"),
        "why_prefix": cli("why", trace[:MIN_PREFIX + 2], "--json"),
        "events_trace": cli("events", "--trace", trace, "--json"),
        "events_window": cli("events", "--since", repr(since), "--until", repr(until), "--json"),
        "state_at": cli("state", "--at", str(seq), "--json"),
        "state_at_time": cli("state", "--at", repr(until), "--json"),
    }


def _daemon_why(port: int, trace: str) -> object:
    res = httpx2.get(f"http://127.0.0.1:{port}/api/blazar/why/{trace}", timeout=60)
    assert res.status_code == 200, res.text
    return res.json()


def _live_request_rows(home: Path, trace: str) -> int:
    conn = sqlite3.connect(f"file:{Paths.from_env({'BLAZAR_HOME': str(home)}).db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COUNT(*) FROM events WHERE trace_id = ?", (trace,)).fetchone()[0]
    finally:
        conn.close()


async def _archive_all(home: Path) -> int:
    """Archive everything archivable (a cutoff an hour ahead); returns the events moved."""
    log = await open_log_only(paths=Paths.from_env({"BLAZAR_HOME": str(home)}))
    try:
        now = time.time()
        run = await archive(log, cutoff=now + 3600, now=now)
        assert (await verify_archive(log)).ok
        return run.events
    finally:
        await log.close()


async def _lookups(home: Path, trace: str) -> tuple[bool, list[str], bool]:
    """has_trace, the trace ids its prefix names, and has_trace of an id that is only a prefix."""
    log = await open_log_only(paths=Paths.from_env({"BLAZAR_HOME": str(home)}))
    try:
        return (await log.has_trace(trace), await log.trace_ids_starting(trace[:MIN_PREFIX + 2], limit=5),
                await log.has_trace(trace[:-1]))
    finally:
        await log.close()


async def _timed_why(home: Path, trace: str) -> float:
    """Seconds for one in-process why of `trace` (resolve + load + explain), on a fresh log handle."""
    from blazar.queries.why import explain, load_trace, resolve_trace

    log = await open_log_only(paths=Paths.from_env({"BLAZAR_HOME": str(home)}))
    try:
        t0 = time.perf_counter()
        explain(await load_trace(log, await resolve_trace(log, trace)))
        return time.perf_counter() - t0
    finally:
        await log.close()


def _serve_two(port: int, home: Path) -> list[str]:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    traces = []
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8)
    traces.append(raw.headers["x-blazar-trace-id"])
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Count to three"}], max_tokens=8,
            stream=True) as stream:
        traces.append(stream.headers["x-blazar-trace-id"])
        for _ in stream.iter_lines():
            pass
    for trace in traces:
        wait_for(lambda t=trace: any(e["trace_id"] == t for e in read_events(home, "request.completed")),
                 f"request.completed of {trace}", timeout=30)
    return traces


@pytest.mark.parametrize("order", ["archive-while-serving", "archive-after-stop"])
def test_why_events_and_state_answer_the_same_live_and_archived(
        tmp_path: Path, engine_binary: Path, gemma_path: Path, order: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 1}) as (port, proc):
        traces = _serve_two(port, home)
        # The instance's story ends first: a trace's why tells what became of the instance that served it, so an
        # instance that exits later (when the daemon stops) would change the answer between the two reads.
        blazar_cli(home, "stop", MODEL)
        wait_for(lambda: read_events(home, "instance.exited"), "instance.exited", timeout=60)
        done = {e["trace_id"]: e for e in read_events(home, "request.completed")}
        received = {e["trace_id"]: e for e in read_events(home, "request.received")}
        since, until = received[traces[0]]["ts"], done[traces[1]]["ts"]
        before = {t: _answers(home, t, done[t]["seq"], since, until) for t in traces}
        before_route = {t: _daemon_why(port, t) for t in traces}
        assert before[traces[0]]["why"] == before[traces[0]]["why_prefix"] == before_route[traces[0]]
        assert before[traces[0]]["why"]["outcome"] == "completed"  # type: ignore[index]
        assert [e["type"] for e in before[traces[1]]["events_trace"]][-1] == "request.completed"  # type: ignore[index]
        live_ms = 1000 * asyncio.run(_timed_why(home, traces[0]))
        if order == "archive-while-serving":
            moved = asyncio.run(_archive_all(home))
            assert moved >= 10 and all(_live_request_rows(home, t) == 0 for t in traces)
            for t in traces:  # the running daemon reads the segments the other process wrote
                assert _daemon_why(port, t) == before_route[t]
                assert _answers(home, t, done[t]["seq"], since, until) == before[t]
        stop_daemon(proc)
    if order == "archive-after-stop":
        moved = asyncio.run(_archive_all(home))
        assert moved >= 10 and all(_live_request_rows(home, t) == 0 for t in traces)
    for t in traces:
        assert _answers(home, t, done[t]["seq"], since, until) == before[t]
        assert asyncio.run(_lookups(home, t)) == (True, [t], False)  # from the segments' indexes alone
    archived_ms = 1000 * asyncio.run(_timed_why(home, traces[0]))
    t0 = time.perf_counter()
    blazar_cli(home, "why", traces[0], "--json", timeout=120)
    cli_ms = 1000 * (time.perf_counter() - t0)
    # Reported, not asserted (tests check behaviour, never timings).
    print(f"\nwhy of a trace: live {live_ms:.1f} ms, archived {archived_ms:.1f} ms in-process; "
          f"`blazar why --json` of the archived trace {cli_ms:.0f} ms wall ({order})")

"""Trace ids are never reused across a restart, against a real `blazar serve` (on the fake engine): a client's old
trace id, long gone from the traces projection (more requests since than it keeps) and from the restarted daemon's
memory, still gets a fresh id, and the old trace (`blazar why OLD`) is unchanged."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2

from blazar.projections.traces import TRACES_KEPT
from tests.support.blazar_home import read_events
from tests.support.fake_serving import FakeDaemon, serving_fake, serving_home
from tests.support.serving import blazar_cli

MODEL = "tiny"
OLD = "old-trace-before-restart-0001"
OLD_PARENT = "4bf92f3577b34da6a3ce929d0e0e4736"  # a W3C traceparent's trace id
BODY = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}


def _chat(daemon: FakeDaemon, headers: dict[str, str]) -> httpx2.Response:
    with httpx2.Client(base_url=daemon.base, trust_env=False, timeout=30) as c:
        r = c.post("/v1/chat/completions", json=BODY, headers=headers)
    assert r.status_code == 200, r.text
    return r


def _many(daemon: FakeDaemon, count: int) -> None:
    """`count` requests, each its own new trace, on four connections at once."""
    def part(n: int) -> None:
        with httpx2.Client(base_url=daemon.base, trust_env=False, timeout=30) as c:
            for _ in range(n):
                assert c.post("/v1/chat/completions", json=BODY).status_code == 200

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(part, [count // 4 + (1 if i < count % 4 else 0) for i in range(4)]))


def _why(home: Path, trace_id: str) -> dict:
    return json.loads(blazar_cli(home, "why", trace_id, "--json").stdout)


def test_an_old_trace_id_brought_back_after_a_restart_gets_a_fresh_one(tmp_path: Path) -> None:
    home, files = tmp_path / "home", tmp_path / "files"
    files.mkdir()
    parent = {"traceparent": f"00-{OLD_PARENT}-00f067aa0ba902b7-01"}
    with serving_fake(home, files, MODEL) as daemon:
        assert _chat(daemon, {"x-blazar-trace-id": OLD}).headers["x-blazar-trace-id"] == OLD
        assert _chat(daemon, parent).headers["x-blazar-trace-id"] == OLD_PARENT
        _many(daemon, TRACES_KEPT + 10)  # both have left the traces projection
    before = {t: _why(home, t) for t in (OLD, OLD_PARENT)}
    events_before = {t: [e for e in read_events(home) if e["trace_id"] == t] for t in (OLD, OLD_PARENT)}

    with serving_home(home, files) as daemon:  # a new process: nothing of the first one's memory
        again = _chat(daemon, {"x-blazar-trace-id": OLD}).headers["x-blazar-trace-id"]
        again_parent = _chat(daemon, parent).headers["x-blazar-trace-id"]

    assert again != OLD and again_parent != OLD_PARENT
    for t in (OLD, OLD_PARENT):
        assert _why(home, t) == before[t]
        assert [e for e in read_events(home) if e["trace_id"] == t] == events_before[t]
    received = {e["trace_id"]: e["data"] for e in read_events(home, "request.received")}
    assert received[again]["client_trace_id"] == OLD  # the client's id is kept beside the fresh one
    assert received[again_parent]["parent_trace_id"] == OLD_PARENT  # the span still joins the client's trace

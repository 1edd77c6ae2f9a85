"""The daemon's archive schedule end to end: a real daemon (bench/fake_engine.py as the engine) with
archive_every_s=10 and request_retention=1h, over a log seeded with request history two hours old, archives it on
its own while it serves chats, none of which fails; the run is recorded by the archiver and the traces still read."""

from __future__ import annotations

import time
from pathlib import Path

import openai

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.conftest import Cli
from tests.support.blazar_home import seed_history
from tests.support.daemon import free_port, stop_home_daemon
from tests.support.fake_serving import fake_engine

# The first scheduled run comes archive_every_s (10 s) after start-up; this bounds the wait generously.
WAIT_S = 90.0


def test_the_daemon_archives_on_its_schedule_while_it_serves(cli: Cli, tmp_path: Path) -> None:
    binary = fake_engine.write_executable(tmp_path / "fake" / "llama-server")
    cli("engine", "install", "--path", str(binary), timeout=120)
    cli("import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", "tiny")
    port = free_port()
    cli("config", "set", "server.port", str(port))
    cli("config", "set", "retention.archive_every_s", "10")
    cli("config", "set", "retention.request_retention", "1h")
    seed_history(cli.home, age_s=2 * 3600, traces=20)
    old_trace = cli("events", "--trace", "old-7", "--json").json_lines()
    assert len(old_trace) == 2
    try:
        cli("load", "tiny", timeout=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30)
        served = 0
        archived: list[dict] = []
        deadline = time.monotonic() + WAIT_S
        while not archived and time.monotonic() < deadline:
            reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=3)  # raises on any failure
            assert reply.choices[0].message.content
            served += 1
            archived = cli("events", "--type", "log.archived", "--json").json_lines()
        assert archived, f"no scheduled archive run within {WAIT_S:.0f} s"
        for _ in range(3):  # and it goes on serving after the run
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        (rec,) = archived
        assert rec["actor"] == "archiver" and rec["data"]["count"] == 40  # the seeded traces; the new ones stay
        assert cli("events", "--type", "log.archive_failed", "--json").json_lines() == []
        assert cli("events", "--trace", "old-7", "--json").json_lines() == old_trace
        status = cli("log", "status", "--json").json()
        assert status["archive"]["count"] == 1 and status["retention"]["archivable_now"] == 0
        assert status["types"]["request.completed"]["live"] >= served + 3
    finally:
        stop_home_daemon(cli.home)

"""`blazar bench` end to end: the real CLI, the real llama-server and the real Gemma 3 270M in a temp home. The
numbers are checked for plausibility only (positive, within broad bounds, ordered where the arithmetic orders them):
the machine is shared and timing is noisy. Few requests and few tokens keep it short; the long workload's prompt
(~1600 tokens) dominates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"


@pytest.fixture
def gemma_home(cli: Cli, engine_binary: Path, gemma_path: Path) -> Cli:
    cli("engine", "install", "--path", str(engine_binary))
    cli("import", str(gemma_path), "--name", MODEL)
    return cli


def _engine_children(home: Path) -> list[int]:
    """pids of llama-server processes started with a file of `home`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "llama-server" in cmd and str(home) in cmd:
            found.append(int(pid))
    return found


@pytest.mark.slow(reason="six real measurements (three workloads at concurrency 1 and 2, the long one prefilling "
                         "~1,600 tokens three times) and a second bench for the table")
def test_bench_measures_every_workload_at_each_concurrency_records_it_and_history_shows_it(
        gemma_home: Cli, home: Path) -> None:
    res = gemma_home("bench", MODEL, "--concurrency", "1,2", "--requests", "1", "--max-tokens", "8", "--json",
                     timeout=600)
    data = json.loads(res.stdout)
    assert data["model"] == MODEL and data["purpose"] == "bench" and data["posture"]["spec_type"] is None
    assert data["engine_tag"] and data["ctx"] > 0 and data["peak_rss_bytes"] > 100 * 2**20
    assert len(data["machine"]["fingerprint"]) == 16 and data["machine"]["cores"] >= 1
    results = {(r["workload"], r["concurrency"]): r for r in data["results"]}
    assert set(results) == {(w, c) for w in ("chat", "code", "long") for c in (1, 2)}
    for (w, c), r in results.items():
        assert r["requests"] == c  # one request per stream
        assert r["completion_tokens"] > 0 and r["prompt_tokens"] > 0
        assert 0.1 < r["decode_tps_stream"] < 5000, (w, c, r)
        assert 0.01 < r["decode_tps_system"] < 10000, (w, c, r)
        assert r["prefill_tps"] is not None and 1 < r["prefill_tps"] < 100_000, (w, c, r)
        assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p95"], (w, c, r)
        assert r["draft_tokens"] is None  # the defaults do not speculate
    for c in (1, 2):
        assert results[("long", c)]["prompt_tokens"] > 5 * results[("chat", c)]["prompt_tokens"]
    recorded = read_events(home, "bench.recorded")
    assert [e["data"]["bench_id"] for e in recorded] == [data["bench_id"]]
    # the child is gone, and its scratch (key, engine log) with it
    assert _engine_children(home) == []
    assert not any((home / "run" / "bench").iterdir()) if (home / "run" / "bench").exists() else True

    table = gemma_home("bench", MODEL, "--workload", "chat", "--requests", "1", "--max-tokens", "4", timeout=300)
    assert "posture: the defaults" in table.stdout and "decode t/s/stream" in table.stdout
    assert "peak RSS" in table.stdout and "energy:" in table.stdout

    hist = gemma_home("bench", "--history", MODEL)
    assert data["engine_tag"] in hist.stdout and "defaults" in hist.stdout
    assert f"benches of {MODEL}" in hist.stdout and "chat" in hist.stdout and "long" in hist.stdout
    as_json = json.loads(gemma_home("bench", "--history", MODEL, "--json").stdout)
    assert len(as_json) == 2 and as_json[0]["bench_id"] == data["bench_id"]
    assert as_json[0]["seq"] < as_json[1]["seq"]


def test_bench_refuses_bad_input_with_a_clear_error_and_records_nothing(gemma_home: Cli, home: Path) -> None:
    missing = gemma_home("bench", "nope", check=False)
    assert missing.code == 2 and "no model named 'nope'" in missing.stderr
    for args in (("--concurrency", "0"), ("--concurrency", "1,x"), ("--workload", "poetry")):
        bad = gemma_home("bench", MODEL, *args, check=False)
        assert bad.code == 2 and ("--concurrency" in bad.stderr or "--workload" in bad.stderr), bad.stderr
    assert read_events(home, "bench.recorded") == []
    assert "no bench recorded" in gemma_home("bench", "--history", MODEL).stderr


def test_bench_beside_a_running_daemon_says_the_numbers_share_the_machine(
        tmp_path: Path, engine_binary: Path, gemma_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {}):
        res = blazar_cli(home, "bench", MODEL, "--workload", "chat", "--requests", "1", "--max-tokens", "4")
        assert "share the machine" in res.stdout
        hist = blazar_cli(home, "bench", "--history", MODEL, "--json")
        assert len(json.loads(hist.stdout)) == 1


_ADOPT = """
import asyncio
from blazar.adapters.machine import this_machine
from blazar.cli.common import opened
from blazar.events.tuning import Posture, ProfileAdopted
from blazar.store.engines import active_engine

async def main():
    async with opened() as app:
        await app.record(ProfileAdopted(model="gemma", posture=Posture(spec_type="ngram-simple"),
                                        engine_tag=active_engine(app).tag, machine=this_machine(), rule="test"))

asyncio.run(main())
"""


def test_bench_measures_the_adopted_profile_and_counts_what_it_drafted(gemma_home: Cli, home: Path) -> None:
    subprocess.run([sys.executable, "-c", _ADOPT], env={**os.environ, "BLAZAR_HOME": str(home)}, check=True,
                   timeout=60)
    res = gemma_home("bench", MODEL, "--workload", "code", "--requests", "1", "--max-tokens", "24", "--json",
                     timeout=300)
    data = json.loads(res.stdout)
    assert data["posture"]["spec_type"] == "ngram-simple"
    (r,) = data["results"]
    # the code workload's continuation repeats the file: n-gram drafts are made and some accepted
    assert r["draft_tokens"] is not None and r["draft_tokens"] > 0
    assert 0 <= r["accepted_tokens"] <= r["draft_tokens"]
    table = gemma_home("bench", MODEL, "--workload", "chat", "--requests", "1", "--max-tokens", "4")
    assert "posture: its adopted profile" in table.stdout and "spec=ngram-simple" in table.stdout


def test_a_bench_stopped_with_sigterm_stops_its_engine_child_and_records_nothing(gemma_home: Cli, home: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "bench", MODEL, "--workload", "long"],
                            env=gemma_home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _engine_children(home):  # the child is up: the bench is measuring
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in stderr
    deadline = time.monotonic() + 30
    while _engine_children(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _engine_children(home) == []
    assert read_events(home, "bench.recorded") == []

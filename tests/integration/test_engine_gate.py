"""The engine gate through the real CLI, the real llama-server and the real model: a build as fast as the active one
passes `engine use`; a throttled build is refused by `engine install` with the numbers (exit 6, the active engine
unchanged, `engine.gate_checked` passed=false); `engine use --force` activates it, recorded as forced.

NOTE: timing on a shared machine is noisy (other processes take the cores at will), so the test has large margins:
the threshold is set to 50%, and the slow build runs about a quarter of the time (measured at 0.3 to 0.5 of the
speed). A thread-count throttle (the same binary on one core with -t 1, the active one with 2 threads) is not reliably
slower here: on a busy 2-core machine one thread often beats two that spin-wait for each other, so the slow build is
the real binary stopped three quarters of the time by its wrapper script (SIGSTOP/SIGCONT).
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.support.blazar_home import read_events

pytestmark = pytest.mark.slow(reason="three gates of four engine starts each (about 4 minutes on a busy 2-core box)")

MODEL = "gemma"
GATE_TIMEOUT_S = 300  # one gate: 2 runs on each build of a short chat workload (32 tokens a request)


def throttled(path: Path, real: Path) -> Path:
    """A build whose server is the real `real`, stopped 0.3 s of every 0.4 s; --version and --help answer at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""#!/bin/sh
# A slow build for the engine gate's test: the real llama-server, running a quarter of the time.
case "$1" in --version|--help) exec "{real}" "$@" ;; esac
"{real}" "$@" &
child=$!
trap 'kill -CONT $child; kill -TERM $child; wait $child; exit 143' TERM INT
while kill -0 $child 2>/dev/null; do
  kill -STOP $child; sleep 0.3; kill -CONT $child; sleep 0.1
done
wait $child
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def gate_events(home: Path) -> list[dict]:
    return [e["data"] for e in read_events(home, "engine.gate_checked")]


def active(cli: Cli) -> str:
    (row,) = [r for r in cli("engine", "list", "--json").json() if r["active"]]
    return row["tag"]


def test_the_gate_passes_an_equal_build_refuses_a_slow_one_and_force_activates_it(
        cli: Cli, home: Path, engine_binary: Path, gemma_path: Path, tmp_path: Path) -> None:
    cli("engine", "install", "--path", str(engine_binary), "--tag", "fast")
    assert gate_events(home) == []  # the first engine: nothing to compare with
    cli("import", str(gemma_path), "--name", MODEL)
    cli("config", "set", "engine.engine_gate_models", MODEL)
    cli("config", "set", "engine.engine_gate_threshold", "0.5")
    cli("config", "set", "engine.engine_threads", "1")  # one thread per child: steadier on a shared machine

    # The same binary under another tag: as fast, so it passes.
    cli("engine", "install", "--path", str(engine_binary), "--tag", "twin", "--no-activate")
    res = cli("engine", "use", "twin", timeout=GATE_TIMEOUT_S)
    assert "active engine: twin" in res.stdout
    assert re.search(rf"^{MODEL}\s+[\d.]+\s+[\d.]+\s+[\d.]+$", res.stderr, re.MULTILINE), res.stderr
    (ok,) = gate_events(home)
    assert (ok["candidate_tag"], ok["active_tag"], ok["passed"], ok["forced"]) == ("twin", "fast", True, False)
    (m,) = ok["models"]
    assert m["model"] == MODEL and m["ratio"] > 0.5 and m["active_bench_id"] and m["candidate_bench_id"]

    # The throttled build: refused on install, with the numbers; the active engine stays.
    slow = throttled(tmp_path / "slow" / "llama-server", engine_binary)
    res = cli("engine", "install", "--path", str(slow), "--tag", "slow", check=False, timeout=GATE_TIMEOUT_S)
    assert res.code == 6, res.stderr
    err = res.stderr
    assert "engine slow failed the engine gate, so it was not activated (the active engine stays twin)" in err
    assert "more than 50%" in err and "--force" in err
    assert re.search(r"model\s+active t/s\s+candidate t/s\s+ratio", err)
    row = re.search(rf"^{MODEL}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", err, re.MULTILINE)
    assert row is not None, err
    assert active(cli) == "twin"
    refused = gate_events(home)[-1]
    assert (refused["candidate_tag"], refused["active_tag"], refused["passed"], refused["forced"]) == (
        "slow", "twin", False, False)
    (m,) = refused["models"]
    assert m["ratio"] < 0.5 and f"{m['ratio']:.2f}" == row.group(3)
    activated = [e["data"]["tag"] for e in read_events(home, "engine.activated")]
    assert activated == ["fast", "twin"]  # nothing else was recorded as activated

    # --force activates it, recorded as a forced failure.
    res = cli("engine", "use", "slow", "--force", timeout=GATE_TIMEOUT_S)
    assert "active engine: slow" in res.stdout and "anyway (--force)" in res.stderr
    forced = gate_events(home)[-1]
    assert (forced["candidate_tag"], forced["active_tag"], forced["passed"], forced["forced"]) == (
        "slow", "twin", False, True)
    assert active(cli) == "slow"
    benches = read_events(home, "bench.recorded")
    assert benches and {b["data"]["purpose"] for b in benches} == {"gate"}

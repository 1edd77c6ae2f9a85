"""`blazar watch` and `GET /api/blazar/dashboard` end to end: a real `blazar serve` with the real llama-server and
Gemma, a load and a chat through the HTTP API; the route's JSON; the dashboard drawn under a real pty (pexpect), its
redraws bounded, q and Ctrl-C quitting with the terminal restored; plain lines through a pipe; the log alone when the
daemon is down; and, keys on, the route for admin keys only while watch reaches /metrics with the CLI's credential."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.serving import blazar_cli, serving_gemma
from tests.support.terminal import Pty

pexpect = pytest.importorskip("pexpect")

MODEL = "gemma"
FRAME_WINDOW_S = 3.0
MAX_FRAMES_PER_S = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
           ) -> Iterator[tuple[Path, int]]:
    home = tmp_path_factory.mktemp("watch-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 2}) as (port, _proc):
        blazar_cli(home, "load", MODEL, "--keep-alive", "10m")
        chat(port)
        yield home, port


def chat(port: int) -> None:
    r = httpx2.post(f"http://127.0.0.1:{port}/v1/chat/completions", trust_env=False, timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})
    assert r.status_code == 200, r.text


def watch_env(home: Path) -> dict[str, str]:
    return {**os.environ, "BLAZAR_HOME": str(home), "TERM": "xterm-256color", "NO_COLOR": "1"}


def test_dashboard_route_shows_the_instance_and_the_request(served: tuple[Path, int]) -> None:
    _home, port = served
    r = httpx2.get(f"http://127.0.0.1:{port}/api/blazar/dashboard", trust_env=False, timeout=10)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["version"] == 1 and d["daemon"]["up"] is True
    [inst] = d["instances"]
    assert (inst["model"], inst["state"], inst["slots"], inst["slots_busy"]) == (MODEL, "ready", 2, 0)
    assert inst["planned_bytes"] > 0 and 0 < inst["keep_alive_left_s"] <= 600
    done = [q for q in d["requests"] if q["outcome"] == "completed"]
    assert done and done[0]["model"] == MODEL and done[0]["status"] == 200 and done[0]["ttft_ms"] > 0
    assert d["queues"].get(MODEL, 0) == 0


def test_dashboard_route_lists_a_failure_with_its_verdict(served: tuple[Path, int]) -> None:
    _home, port = served
    r = httpx2.post(f"http://127.0.0.1:{port}/v1/chat/completions", trust_env=False, timeout=30,
                    json={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404
    d = httpx2.get(f"http://127.0.0.1:{port}/api/blazar/dashboard", trust_env=False, timeout=10).json()
    fail = d["failures"][0]
    assert fail["outcome"] == "rejected" and fail["status"] == 404 and fail["verdict"].startswith("rejected 404")


def spawn_watch(home: Path) -> pexpect.spawn:
    """`blazar watch` under a real pty, in a shell that then shows its exit code and the terminal's settings."""
    # `trap : INT`: Ctrl-C ends watch, not this shell (a trapped signal is back to its default in the child).
    script = f"trap : INT; {sys.executable} -m blazar.cli.main watch; echo watch-rc=$?; stty -a"
    return pexpect.spawn("/bin/sh", ["-c", script], env=watch_env(home), dimensions=(50, 200), timeout=60,
                         encoding="utf-8", codec_errors="replace")


def end(child: pexpect.spawn) -> None:
    """Kill the shell and the watch it runs (one process group): a watch left behind would outlive the test."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.close(force=True)


def quit_and_check_terminal(child: pexpect.spawn, *, ctrl_c: bool = False) -> None:
    if ctrl_c:
        child.sendintr()
    else:
        child.send("q")
    child.expect(r"watch-rc=(\d+)", timeout=30)
    assert child.match.group(1) == "0"
    child.expect(pexpect.EOF, timeout=10)
    settings = child.before.split()
    # cbreak mode is undone: the line discipline echoes and is canonical again.
    assert "icanon" in settings and "echo" in settings, child.before


def test_watch_draws_under_a_pty_with_bounded_redraws_and_q_quits(served: tuple[Path, int]) -> None:
    home, _port = served
    child = spawn_watch(home)
    try:
        child.expect("daemon up at", timeout=60)
        child.expect("ready", timeout=30)
        child.expect(MODEL, timeout=10)
        # Count whole frames (each one starts with the title) over a few seconds.
        frames, deadline = 0, time.monotonic() + FRAME_WINDOW_S
        while time.monotonic() < deadline:
            idx = child.expect(["blazar watch", pexpect.TIMEOUT], timeout=max(0.05, deadline - time.monotonic()))
            frames += idx == 0
        # The keep-alive countdown changes every second, so it does redraw; never more than 4 times a second.
        assert 1 <= frames <= MAX_FRAMES_PER_S * FRAME_WINDOW_S + 1, frames
        quit_and_check_terminal(child)
    finally:
        end(child)


def test_watch_without_a_daemon_says_so_and_q_quits(home: Path) -> None:
    child = spawn_watch(home)
    try:
        child.expect("daemon down", timeout=60)
        child.expect("none", timeout=10)
        quit_and_check_terminal(child)
    finally:
        end(child)


def test_watch_ctrl_c_restores_the_terminal(home: Path) -> None:
    child = spawn_watch(home)
    try:
        child.expect("daemon down", timeout=60)
        quit_and_check_terminal(child, ctrl_c=True)
    finally:
        end(child)


def test_watch_ends_when_its_terminal_goes_away_even_with_hangups_ignored(home: Path) -> None:
    term = Pty(["watch"], watch_env(home), ignore_hangups=True)
    try:
        term.expect(b"daemon down", timeout=60)
        term.hang_up()  # no signal arrives (SIGHUP ignored, as under nohup); its reads of the terminal end
        term.proc.wait(timeout=60)  # it ends, instead of spinning on a dead terminal
    finally:
        term.kill()


def test_watch_without_a_daemon_prints_plain_lines(home: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "watch"], env=watch_env(home),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("blazar watch: following")
        assert proc.stdout.readline() == "daemon down: showing what the log says\n"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_watch_prints_plain_lines_through_a_pipe(served: tuple[Path, int]) -> None:
    home, port = served
    proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "watch"], env=watch_env(home),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("blazar watch: following")
        assert proc.stdout.readline().startswith("daemon up at http://127.0.0.1")
        chat(port)
        lines = []
        for _ in range(50):
            line = proc.stdout.readline()
            assert line, "watch ended early"
            lines.append(line)
            if line.startswith("request ") and " completed 200 " in line:
                break
        assert any(f" {MODEL} completed 200 ttft " in ln for ln in lines)
        assert not any("\x1b" in ln for ln in [first, *lines])
    finally:
        proc.terminate()
        proc.wait(timeout=20)


# NOTE: last in the module: from here on keys are on for the shared daemon.
def test_with_keys_on_the_route_needs_an_admin_key_and_watch_still_reads_metrics(served: tuple[Path, int]) -> None:
    home, port = served
    root = json.loads(blazar_cli(home, "keys", "create", "root", "--admin", "--json").stdout)["secret"]
    user = json.loads(blazar_cli(home, "keys", "create", "user", "--json").stdout)["secret"]
    url = f"http://127.0.0.1:{port}/api/blazar/dashboard"

    def get(secret: str | None) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx2.get(url, headers=headers, trust_env=False, timeout=10)

    assert get(None).status_code == 401
    assert get(user).status_code == 403
    ok = get(root)
    assert ok.status_code == 200 and ok.json()["instances"][0]["model"] == MODEL
    # /metrics is an admin route now: watch reaches it with the CLI's admin credential (run/admin.token).
    proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "watch"], env=watch_env(home),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("blazar watch: following")
        assert proc.stdout.readline().startswith("daemon up at http://127.0.0.1")
    finally:
        proc.terminate()
        proc.wait(timeout=20)

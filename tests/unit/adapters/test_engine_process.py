"""The process adapter against small stand-in programs: a server that turns healthy after a delay, one that never
does, one that exits with a code, one that ignores SIGTERM. Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from blazar.adapters.engines.process import (
    LoadTimeout,
    ProcessExited,
    child_env,
    free_port,
    log_tail,
    pid_alive,
    pid_cmdline,
    rss_bytes,
    spawn,
    stop_pid,
    stop_process,
    wait_healthy,
)
from blazar.errors import EngineError
from tests.support.bounds import HANG_S

BOUND_S = HANG_S  # the most any single wait in these tests may take

# One stand-in engine, its behaviour chosen by flags. It prints "ready" once its signal handling is set up.
STANDIN = textwrap.dedent('''
    import argparse, http.server, os, signal, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--healthy-after", type=float, default=0.0)  # negative: never healthy (503 forever)
    p.add_argument("--exit", type=int, default=None)
    p.add_argument("--signal", default=None)  # die of this signal, e.g. SIGILL
    p.add_argument("--ignore-term", action="store_true")
    a = p.parse_args()
    print("standin stdout", flush=True)
    print("standin stderr", file=sys.stderr, flush=True)
    print("stdin:", repr(sys.stdin.read()), "env:", os.environ.get("BLAZAR_STANDIN", "-"), flush=True)
    if a.signal:
        signal.signal(getattr(signal, a.signal), signal.SIG_DFL)
        os.kill(os.getpid(), getattr(signal, a.signal))
    if a.exit is not None:
        sys.exit(a.exit)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    start = time.monotonic()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = a.healthy_after >= 0 and time.monotonic() - start >= a.healthy_after
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}' if ok else b'{"error":"loading"}')

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", a.port), H)
    print("ready", flush=True)
    srv.serve_forever()
''')


@pytest.fixture
def standin(tmp_path: Path) -> Callable[..., list[str]]:
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)

    def argv(*args: str) -> list[str]:
        return [sys.executable, str(script), *args]

    return argv


@pytest.fixture
async def reaper() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Children a test started; any still running at the end are killed so no test leaks a process."""
    procs: list[asyncio.subprocess.Process] = []
    yield procs
    for p in procs:
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await asyncio.wait_for(p.wait(), BOUND_S)


async def _start(reaper: list[asyncio.subprocess.Process], argv: list[str], log: Path, **kw: object):
    kw.setdefault("env", child_env(os.environ))
    proc = await spawn(argv, log_path=log, **kw)  # type: ignore[arg-type]
    reaper.append(proc)
    return proc


async def _until(cond: Callable[[], bool], bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _has_line(log: Path, text: str) -> Callable[[], bool]:
    return lambda: text in log_tail(log, 50)


def test_free_port_can_be_bound() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


async def test_spawn_appends_stdout_and_stderr_to_the_log_with_stdin_closed(tmp_path, standin, reaper) -> None:
    log = tmp_path / "logs" / "engine.log"
    log.parent.mkdir()
    log.write_text("earlier run\n")
    proc = await _start(reaper, standin("--exit", "0"), log)
    assert await asyncio.wait_for(proc.wait(), BOUND_S) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier run"
    assert {"standin stdout", "standin stderr", "stdin: '' env: -"} <= set(lines)


async def test_spawn_passes_the_given_environment(tmp_path, standin, reaper) -> None:
    log = tmp_path / "engine.log"
    env = {"PATH": os.environ.get("PATH", ""), "BLAZAR_STANDIN": "yes"}
    proc = await _start(reaper, standin("--exit", "0"), log, env=env)
    await asyncio.wait_for(proc.wait(), BOUND_S)
    assert "stdin: '' env: yes" in log_tail(log)


async def test_spawn_puts_the_child_in_its_own_session(tmp_path, standin, reaper) -> None:
    log = tmp_path / "engine.log"
    proc = await _start(reaper, standin("--port", str(free_port())), log)
    await _until(_has_line(log, "ready"))
    assert os.getsid(proc.pid) == proc.pid != os.getsid(0)


async def test_spawn_of_a_missing_binary_is_an_engine_error(tmp_path) -> None:
    with pytest.raises(EngineError, match="no-such-engine"):
        await spawn([str(tmp_path / "no-such-engine")], log_path=tmp_path / "engine.log", env={})


async def test_wait_healthy_returns_the_wait_once_health_answers_200(tmp_path, standin, reaper) -> None:
    port = free_port()
    proc = await _start(reaper, standin("--port", str(port), "--healthy-after", "0.3"), tmp_path / "e.log")
    waited = await wait_healthy(proc, port, timeout_s=BOUND_S)
    assert 0.3 <= waited < BOUND_S
    assert proc.returncode is None


async def test_wait_healthy_times_out_and_leaves_the_child_running(tmp_path, standin, reaper) -> None:
    port = free_port()
    proc = await _start(reaper, standin("--port", str(port), "--healthy-after", "-1"), tmp_path / "e.log")
    with pytest.raises(LoadTimeout) as exc:
        await wait_healthy(proc, port, timeout_s=0.5)
    assert 0.5 <= exc.value.waited_s < 0.5 + BOUND_S
    assert exc.value.code == "engine_load_timeout" and isinstance(exc.value, EngineError)
    assert proc.returncode is None and pid_alive(proc.pid)


async def test_wait_healthy_raises_process_exited_with_the_exit_code(tmp_path, standin, reaper) -> None:
    proc = await _start(reaper, standin("--exit", "3"), tmp_path / "e.log")
    t0 = time.monotonic()
    with pytest.raises(ProcessExited) as exc:
        await wait_healthy(proc, free_port(), timeout_s=60)
    assert time.monotonic() - t0 < BOUND_S  # noticed the exit, did not wait out the timeout
    assert exc.value.returncode == 3
    assert "exited with code 3" in exc.value.message


async def test_wait_healthy_names_the_signal_that_killed_the_child(tmp_path, standin, reaper) -> None:
    proc = await _start(reaper, standin("--signal", "SIGILL"), tmp_path / "e.log")
    with pytest.raises(ProcessExited) as exc:
        await wait_healthy(proc, free_port(), timeout_s=BOUND_S)
    assert exc.value.returncode == -signal.SIGILL
    assert "SIGILL" in exc.value.message


async def test_stop_process_ends_a_child_with_sigterm(tmp_path, standin, reaper) -> None:
    port = free_port()
    proc = await _start(reaper, standin("--port", str(port)), tmp_path / "e.log")
    await wait_healthy(proc, port, timeout_s=BOUND_S)
    assert await stop_process(proc, grace_s=BOUND_S) == -signal.SIGTERM


async def test_stop_process_kills_a_child_that_ignores_sigterm_after_the_grace(tmp_path, standin, reaper) -> None:
    port = free_port()
    proc = await _start(reaper, standin("--port", str(port), "--ignore-term"), tmp_path / "e.log")
    await wait_healthy(proc, port, timeout_s=BOUND_S)  # healthy means the SIGTERM handler is in place
    t0 = time.monotonic()
    assert await stop_process(proc, grace_s=0.3) == -signal.SIGKILL
    assert 0.3 <= time.monotonic() - t0 < BOUND_S


async def test_stop_process_of_an_exited_child_returns_its_code(tmp_path, standin, reaper) -> None:
    proc = await _start(reaper, standin("--exit", "7"), tmp_path / "e.log")
    await asyncio.wait_for(proc.wait(), BOUND_S)
    assert await stop_process(proc, grace_s=0.1) == 7


@pytest.fixture
def foreign(tmp_path: Path, standin):
    """A stand-in started outside asyncio, as an orphan found at reconcile would be: stop_pid cannot wait() on it."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"foreign{len(started)}.log"
        with open(log, "wb") as out:
            p = subprocess.Popen(standin(*args), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append(p)
        return p, log

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(BOUND_S)


async def test_stop_pid_stops_a_process_whose_cmdline_matches(foreign) -> None:
    port = str(free_port())
    p, log = foreign("--port", port)
    await _until(_has_line(log, "ready"))
    assert await stop_pid(p.pid, grace_s=BOUND_S, expect_cmdline=f"--port {port}") is True
    assert not pid_alive(p.pid)
    assert p.wait(BOUND_S) == -signal.SIGTERM


async def test_stop_pid_never_signals_a_process_whose_cmdline_differs(foreign) -> None:
    p, log = foreign("--port", str(free_port()))
    await _until(_has_line(log, "ready"))
    assert await stop_pid(p.pid, grace_s=0.1, expect_cmdline="llama-server --port 1") is False
    assert pid_alive(p.pid) and p.poll() is None


async def test_stop_pid_kills_a_process_that_ignores_sigterm(foreign) -> None:
    p, log = foreign("--port", str(free_port()), "--ignore-term")
    await _until(_has_line(log, "ready"))
    t0 = time.monotonic()
    assert await stop_pid(p.pid, grace_s=0.3) is True
    assert 0.3 <= time.monotonic() - t0 < BOUND_S
    assert p.wait(BOUND_S) == -signal.SIGKILL


@pytest.fixture
def free_pid() -> int:
    """The pid of a process that has exited and been reaped: nothing runs under it (barring a rare reuse)."""
    p = subprocess.Popen(["true"])
    p.wait(BOUND_S)
    return p.pid


@pytest.fixture
def unreaped():
    """A child that exits at once and stays a zombie until the fixture reaps it."""
    p = subprocess.Popen(["true"])
    yield p
    p.wait(BOUND_S)


async def test_stop_pid_is_false_for_a_pid_that_is_not_running(free_pid) -> None:
    assert await stop_pid(free_pid, grace_s=0.1) is False


def test_pid_alive_is_false_for_a_zombie(unreaped) -> None:
    os.waitid(os.P_PID, unreaped.pid, os.WEXITED | os.WNOWAIT)  # returns once it has exited, leaving it unreaped
    assert Path(f"/proc/{unreaped.pid}").exists()  # /proc still lists it, as a zombie
    assert not pid_alive(unreaped.pid)
    assert pid_cmdline(unreaped.pid) is None and rss_bytes(unreaped.pid) is None


def test_proc_readers_describe_this_process_and_a_child_with_known_arguments() -> None:
    assert pid_alive(os.getpid())
    rss = rss_bytes(os.getpid())
    assert rss is not None and rss > 1 << 20
    argv = [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()", "an argument"]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        # Once it prints, its exec is complete (just after exec, /proc/PID/cmdline can read empty for a moment).
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert pid_cmdline(child.pid) == argv
    finally:
        child.communicate(b"", timeout=HANG_S)


def test_proc_readers_of_a_free_pid_say_none(free_pid) -> None:
    assert not pid_alive(free_pid)
    assert pid_cmdline(free_pid) is None and rss_bytes(free_pid) is None


def test_log_tail_returns_the_last_lines(tmp_path) -> None:
    log = tmp_path / "e.log"
    log.write_text("".join(f"line {i}\r\n" for i in range(100)))
    assert log_tail(log, 3) == ["line 97", "line 98", "line 99"]
    assert log_tail(log, 0) == []


def test_log_tail_reads_only_the_byte_window_and_drops_the_cut_line(tmp_path) -> None:
    log = tmp_path / "e.log"
    log.write_bytes(b"x" * 10_000 + b"\nfirst whole\n\xff\xfebad bytes\nlast")
    assert log_tail(log, 10, max_bytes=40) == ["first whole", "\ufffd\ufffdbad bytes", "last"]


def test_log_tail_of_a_missing_file_is_empty(tmp_path) -> None:
    assert log_tail(tmp_path / "none.log") == []

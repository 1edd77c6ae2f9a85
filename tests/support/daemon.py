"""A real `blazar serve` as the integration tests drive it: a free port, waiting (bounded) for a condition or for
/health, `blazar serve ARGS` in a subprocess, and stopping the daemon a home's run/daemon.json names."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx2

from tests.support import cli_zygote

WAIT_S = 30.0
# The least any wait_for waits: a wait bounds a hang, it never asserts a speed, and a machine under load (CI beside
# other jobs, scripts/flake-hunt's CPU hogs) may take minutes for what a quiet one does in seconds. A wait that
# succeeds returns as soon as its condition holds, so the floor costs a passing test nothing.
MIN_WAIT_S = 120.0
# How long a load of the real Gemma on the real engine may take on a loaded CI machine.
LOAD_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate, what: str, timeout: float = WAIT_S, proc: subprocess.Popen | None = None):
    """Poll `predicate` until it returns something true (returned), for at least MIN_WAIT_S; fail naming `what`."""
    timeout = max(timeout, MIN_WAIT_S)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the daemon exited ({proc.returncode}) while waiting for {what}:\n"
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def start_serve(home: Path, *args: str, log: Path, env: Mapping[str, str] | None = None,
                stdout: bool = False) -> subprocess.Popen[bytes] | cli_zygote.Process:
    """`blazar serve ARGS` on `home`, started (not waited for): its stderr (and stdout, with `stdout`: granian writes
    its own lines there) in the file `log`, never an unread pipe (a daemon that logs more than a pipe holds would block
    on its next line). `env` is added to this process's environment. Forked from the CLI zygote
    (tests/support/cli_zygote.py) unless BLAZAR_TEST_CLI_ZYGOTE=0."""
    environ = {**os.environ, **(env or {}), "BLAZAR_HOME": str(home)}
    log.parent.mkdir(parents=True, exist_ok=True)
    if cli_zygote.enabled():
        return cli_zygote.start(["serve", *args], env=environ, stdout=log if stdout else Path(os.devnull), stderr=log)
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "serve", *args], env=environ,
                                stdout=sink if stdout else subprocess.DEVNULL, stderr=sink)


def healthy(port: int) -> bool:
    try:
        return httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False).status_code == 200
    except httpx2.TransportError:
        return False


@contextlib.contextmanager
def serving(cli, *args: str) -> Iterator[subprocess.Popen]:
    """`blazar serve ARGS` running, with its stderr captured; stopped at the end if the test left it running (SIGTERM
    first: the daemon stops its engine children, which a SIGKILL would leave running on their own)."""
    proc = subprocess.Popen([sys.executable, "-m", "blazar.cli.main", "serve", *args], env=cli.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=WAIT_S)  # reads what it still writes, so a full pipe cannot hold it up
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=WAIT_S)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def alive(pid: int) -> bool:
    """Alive and not a zombie: a daemon a test started with Popen and never reaped has exited all the same."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def stop_home_daemon(home: Path) -> None:
    """SIGTERM to the daemon named in run/daemon.json (it stops its engines), and wait until it is gone."""
    info = home / "run" / "daemon.json"
    if not info.exists():
        return
    pid = json.loads(info.read_text())["pid"]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)

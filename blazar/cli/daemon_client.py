"""How the CLI reaches the daemon: find a live one (run/daemon.json, the lock holder, GET /health), start one in
the background for `blazar load`, and call the admin routes, turning their error JSON back into BlazarErrors.

    BlazarError
    ├── DaemonUnavailable   the daemon did not start, or stopped answering (names its log)
    └── RemoteError         the daemon refused: its message, its stable code, the exit code that code maps to
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2

from blazar import runlock
from blazar.adapters.engines.process import log_tail
from blazar.credentials import read_admin_token
from blazar.daemon_file import DaemonInfo, read_daemon_file
from blazar.errors import (
    DaemonRunning,
    DaemonUnavailable,
    RemoteError,
)
from blazar.paths import Paths

START_TIMEOUT_S = 30.0
HEALTH_TIMEOUT_S = 2.0
# Stop waits for each engine's grace period; a load waits for the engine to turn healthy (load_timeout_s), and
# possibly for evictions first: no read deadline there, Ctrl-C ends the wait.
CALL_TIMEOUT_S = 60.0

def daemon_log(paths: Paths) -> Path:
    return paths.log / "daemon.log"


def verify_of(info: DaemonInfo) -> ssl.SSLContext | bool:
    """What https to this daemon is verified against: its own certificate (tls_cert, often self-signed)."""
    return ssl.create_default_context(cafile=info.ca_file) if info.ca_file else True


def healthy(url: str, *, timeout_s: float = HEALTH_TIMEOUT_S, verify: ssl.SSLContext | bool = True) -> bool:
    try:
        # trust_env=False: a proxy from the environment must never sit between the CLI and a loopback daemon.
        r = httpx2.get(f"{url}/health", timeout=timeout_s, trust_env=False, verify=verify)
    except httpx2.TransportError:
        return False
    return r.status_code == 200


def find_daemon(paths: Paths) -> DaemonInfo | None:
    """The daemon serving this home, if one is up and answering."""
    # NOTE: daemon.json first: `runlock.holder` briefly takes the lock itself when nobody holds it, and a daemon
    # starting at that instant would believe another one runs. The file exists only while a daemon holds the lock.
    info = read_daemon_file(paths)
    if info is None or runlock.holder(paths.daemon_lock) != info.pid:
        return None  # none, one still starting, or a stale file left by a daemon that was killed
    return info if healthy(info.url, verify=verify_of(info)) else None


def start_daemon(paths: Paths, env: Mapping[str, str], *, timeout_s: float = START_TIMEOUT_S) -> DaemonInfo:
    """Start `blazar serve` detached (its own session, output appended to log/daemon.log) and wait until it answers.
    Another daemon winning the race to start is as good as ours."""
    log_path = daemon_log(paths)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "blazar.cli.main", "serve"], env=dict(env), stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout_s
    while True:
        info = find_daemon(paths)
        if info is not None:
            return info
        code = proc.poll()
        if code is not None and code != DaemonRunning.exit_code:
            raise DaemonUnavailable(f"the daemon exited with code {code} before it answered; "
                                    f"{log_path} ends with:\n" + "\n".join(log_tail(log_path, 15)))
        if time.monotonic() >= deadline:
            raise DaemonUnavailable(f"the daemon (pid {proc.pid}) did not answer within {timeout_s:.0f} s and is left "
                                    f"running; {log_path} ends with:\n" + "\n".join(log_tail(log_path, 15)))
        time.sleep(0.1)


def auth_headers(paths: Paths | None = None) -> dict[str, str]:
    """The CLI's admin credential (run/admin.token, readable by the home's owner only) as a Bearer header; none when
    no daemon wrote one. `paths` defaults to this environment's home."""
    token = read_admin_token(paths or Paths.from_env(os.environ))
    return {"Authorization": f"Bearer {token}"} if token else {}


class AdminClient:
    """The admin routes (/api/blazar/...) of one daemon, synchronously, with the CLI's admin credential."""

    def __init__(self, info: DaemonInfo, *, transport: httpx2.BaseTransport | None = None,
                 paths: Paths | None = None) -> None:
        self.url = info.url
        self._http = httpx2.Client(base_url=f"{info.url}/api/blazar", trust_env=False, transport=transport,
                                   verify=verify_of(info),
                                   timeout=httpx2.Timeout(CALL_TIMEOUT_S, connect=HEALTH_TIMEOUT_S),
                                   headers=auth_headers(paths))

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def ps(self) -> dict[str, Any]:
        return self._call("GET", "ps")

    def load(self, model: str, *, keep_alive: str | None = None, pin: bool | None = None,
             ctx: int | None = None, sessions: bool | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model}
        for key, value in (("keep_alive", keep_alive), ("pin", pin), ("ctx", ctx), ("sessions", sessions)):
            if value is not None:
                body[key] = value
        timeout = httpx2.Timeout(CALL_TIMEOUT_S, connect=HEALTH_TIMEOUT_S, read=None)
        return self._call("POST", "load", body, timeout=timeout)

    def stop(self, model: str) -> list[str]:
        return list(self._call("POST", "stop", {"model": model})["stopped"])

    def reset(self, model: str) -> bool:
        return bool(self._call("POST", "reset", {"model": model})["reset"])

    # `owner`: whose session (`{"key": NAME}` or `{"group": NAME}`; none: the machine owner's).
    def session_save(self, name: str, owner: dict[str, str] | None = None) -> dict[str, Any]:
        return self._call("POST", f"sessions/{quote(name, safe='')}/save", {}, params=owner)

    def session_restore(self, name: str, model: str | None = None,
                        owner: dict[str, str] | None = None) -> dict[str, Any]:
        timeout = httpx2.Timeout(CALL_TIMEOUT_S, connect=HEALTH_TIMEOUT_S, read=None)  # it may load the model
        return self._call("POST", f"sessions/{quote(name, safe='')}/restore", {"model": model} if model else {},
                          timeout=timeout, params=owner)

    def session_rm(self, name: str, owner: dict[str, str] | None = None) -> dict[str, Any]:
        return self._call("DELETE", f"sessions/{quote(name, safe='')}", params=owner)

    def sync(self) -> int:
        """Make the daemon fold what was just appended (a key created, rotated, revoked): it counts from now on."""
        return int(self._call("POST", "sync", {})["seq"])

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
              timeout: httpx2.Timeout | None = None, params: dict[str, str] | None = None) -> Any:
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = timeout
        if params:
            kwargs["params"] = params
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx2.TransportError as e:
            raise DaemonUnavailable(f"the daemon at {self.url} did not answer: {e}") from None
        if r.is_success:
            return r.json()
        try:
            err = r.json()["error"]
            message, code = str(err["message"]), str(err.get("code") or "error")
        except (ValueError, KeyError, TypeError):
            message, code = f"the daemon answered {r.status_code}: {r.text[:300]}", "error"
        raise RemoteError(message, code=code, status=r.status_code)


def tell_daemon(paths: Paths) -> None:
    """Make a running daemon fold what this command just recorded (a key, a model's settings, a config change), so
    it counts from the very next request (the daemon would find it within its poll interval anyway)."""
    from blazar.cli.common import err

    info = find_daemon(paths)
    if info is None:
        return
    try:
        with AdminClient(info, paths=paths) as client:
            client.sync()
    except (DaemonUnavailable, RemoteError) as e:
        err.print(f"warning: the daemon at {info.url} was not told at once ({e.message}); it folds the change within "
                  "a second", markup=False, emoji=False)


def daemon_or_start(paths: Paths) -> DaemonInfo:
    """The running daemon, or one started in the background (as `blazar load` and `blazar run` do), said on stderr."""
    from blazar.cli.common import err

    info = find_daemon(paths)
    if info is None:
        err.print(f"no daemon is running: starting one in the background (its log: {daemon_log(paths)})",
                  markup=False, emoji=False)
        info = start_daemon(paths, os.environ)
        err.print(f"daemon started on {info.url} (pid {info.pid})", markup=False, emoji=False)
    return info

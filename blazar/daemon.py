"""The daemon (`blazar serve`): holds the daemon lock, starts the supervisor, and serves the HTTP app with granian
embedded in this event loop (one worker: this process owns the log writer and the engine children). `run/daemon.json`
says where it listens while it does. SIGTERM or SIGINT: stop accepting, let requests in flight finish (at most
stop_grace_s), stop the engine children, return 0. The caller owns `app` and closes it after.

    BlazarError
    ├── DaemonRunning   another daemon holds this home's lock (names its pid and address)
    └── PortInUse       something else listens on host:port (exit code 8)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from granian.constants import Interfaces
from granian.log import LogLevels
from granian.server.embed import Server

from blazar import runlock
from blazar.adapters.engines.client import EngineClient
from blazar.api.app import create_app
from blazar.bootstrap import Blazar
from blazar.credentials import remove_admin_token, write_admin_token
from blazar.errors import BlazarError, DaemonRunning
from blazar.handlers.admission import Admission
from blazar.handlers.gateway import Gateway
from blazar.handlers.instances import Supervisor
from blazar.paths import Paths

log = logging.getLogger("blazar.daemon")


class PortInUse(BlazarError):
    code = "port_in_use"
    exit_code = 8


@dataclass(frozen=True)
class DaemonInfo:
    """The content of run/daemon.json: written once the listener is bound, removed on exit."""

    pid: int
    host: str
    port: int
    started: float

    @property
    def url(self) -> str:
        # A wildcard bind is reached on loopback; an IPv6 literal needs brackets.
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


def daemon_file(paths: Paths) -> Path:
    return paths.run / "daemon.json"


def read_daemon_file(paths: Paths) -> DaemonInfo | None:
    """What the last daemon wrote; None when there is no file or it cannot be read (a daemon mid-write never
    leaves a torn file: it is replaced atomically)."""
    try:
        raw = orjson.loads(daemon_file(paths).read_bytes())
        return DaemonInfo(pid=int(raw["pid"]), host=str(raw["host"]), port=int(raw["port"]),
                          started=float(raw["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_daemon_file(paths: Paths, info: DaemonInfo) -> None:
    target = daemon_file(paths)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(asdict(info)))
    os.replace(tmp, target)


def _listening(paths: Paths, info: DaemonInfo, callback: Callable[[DaemonInfo], None] | None) -> None:
    _write_daemon_file(paths, info)
    log.info("listening on %s (pid %d)", info.url, info.pid)
    if callback is not None:
        callback(info)


def check_port(host: str, port: int) -> None:
    """Refuse early, with a clear message, when host:port is taken.

    NOTE: granian binds with SO_REUSEPORT, so a second listener on a taken port would *succeed* and share the
    traffic with whoever holds it. A plain bind (SO_REUSEADDR only) fails in that case, which is what we want.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(f"{host}:{port} is already in use by another program: stop it, or serve on another "
                                "port with `blazar serve --port N` (or `blazar config set port N`)") from None
            raise BlazarError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _gateway(app: Blazar, supervisor: Supervisor) -> Gateway:
    """The request pipeline the API dialects share, with admission limits from the settings."""
    settings = app.settings()
    admission = Admission(queue_depth=settings.queue_depth, global_cap=settings.max_concurrent_requests,
                          wait_timeout_s=settings.queue_timeout_s)
    return Gateway(app, supervisor, admission, EngineClient())


def _refuse_second(paths: Paths) -> DaemonRunning:
    pid = runlock.holder(paths.daemon_lock)
    info = read_daemon_file(paths)
    where = f" at {info.url}" if info is not None and info.pid == pid else ""
    who = f"pid {pid}" if pid and pid > 0 else "another process"
    return DaemonRunning(f"a Blazar daemon is already running for {paths.data_dir} ({who}{where}); "
                         "stop it first (SIGTERM), or use it")


async def serve(app: Blazar, *, host: str, port: int, supervisor_factory: Callable[[Blazar], Any] = Supervisor,
                on_listening: Callable[[DaemonInfo], None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code (0 after a clean stop). `on_listening` is called once the
    socket is bound (the CLI says so)."""
    paths = app.paths
    code = 0
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(runlock.hold(paths.daemon_lock))
        except BlockingIOError:
            raise _refuse_second(paths) from None
        check_port(host, port)
        supervisor = supervisor_factory(app)
        gateway = _gateway(app, supervisor) if isinstance(supervisor, Supervisor) else None
        admin_token = write_admin_token(paths)  # the CLI's credential once keys are on; removed at exit
        held.callback(remove_admin_token, paths, admin_token)
        server = Server(target=create_app(app, supervisor, gateway, admin_token=admin_token), address=host, port=port,
                        interface=Interfaces.ASGI, websockets=False, log_level=LogLevels.error)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        info = DaemonInfo(pid=os.getpid(), host=host, port=port, started=app.clock.now())
        # Granian calls startup hooks once the socket is bound and listening, just before its worker starts.
        server.on_startup(lambda: _listening(paths, info, on_listening))
        try:
            await supervisor.start()
            # Other processes append too (`blazar pull`, `import`, `config set`, `engine use`): fold them as they land.
            app.runner.follow()
            if not stop.is_set():  # a signal during reconcile: stop before serving at all
                code = await _serve_until_stopped(server, stop, supervisor, grace_s=app.settings().stop_grace_s,
                                                  url=info.url)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await supervisor.close()
            if gateway is not None:
                await gateway.client.aclose()
            daemon_file(paths).unlink(missing_ok=True)
    return code


async def _serve_until_stopped(server: Server, stop: asyncio.Event, supervisor: Any, *, grace_s: float,
                               url: str) -> int:
    serving = asyncio.create_task(server.serve(), name="blazar-http")
    stopping = asyncio.create_task(stop.wait(), name="blazar-stop-signal")
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            try:
                serving.result()
            except RuntimeError as e:
                # The port was taken between check_port and granian's bind (another daemon of another home).
                if "Address already in use" in str(e):
                    raise PortInUse(f"{url} is already in use by another program") from None
                raise
            log.error("the HTTP server stopped on its own")
            return 1
        log.info("stopping: no new connections; requests in flight have %g s to finish", grace_s)
        server.stop()
        try:
            await asyncio.wait_for(asyncio.shield(serving), grace_s)
        except TimeoutError:
            # Loads still waiting on an engine: stopping the engines ends them (with an error), so the server exits.
            log.warning("requests still in flight after %g s: stopping the engines under them", grace_s)
            await supervisor.close()
            await serving
        return 1 if server.interrupt_children else 0
    finally:
        stopping.cancel()
        if not serving.done():  # cancelled from outside: never leave the listener behind
            server.stop()
            await asyncio.wait({serving}, timeout=max(grace_s, 1.0))
            serving.cancel()

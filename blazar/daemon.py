"""The daemon (`blazar serve`): holds the daemon lock, starts the supervisor, and serves the HTTP app with granian
embedded in this event loop (one worker: this process owns the log writer and the engine children). `run/daemon.json`
says where it listens while it does. SIGTERM or SIGINT: stop accepting, let requests in flight finish (at most
stop_grace_s), stop the engine children, return 0. The caller owns `app` and closes it after.

    BlazarError
    ├── DaemonRunning   another daemon holds this home's lock (names its pid and address)
    ├── PortInUse       something else listens on host:port (exit code 8)
    └── UnsafeBind      a bind wider than loopback while no API key exists (exit code 9)
        └── UnsafeNodeUrl   a node URL that is plain http off this machine, without --insecure-cluster (exit code 9)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import resource
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from granian.constants import HTTPModes, Interfaces, SSLProtocols
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server.embed import Server

from blazar import runlock
from blazar.addresses import is_loopback
from blazar.api.app import create_app
from blazar.api.disconnect import QuietHangUps
from blazar.api.incoming import IncomingBodies
from blazar.bootstrap import Services
from blazar.cluster.nodes import NodeKeeper, check_node_url, node_url
from blazar.config import Settings
from blazar.context import Blazar
from blazar.credentials import remove_admin_token, write_admin_token
from blazar.daemon_file import DaemonInfo, daemon_file, read_daemon_file, write_daemon_file
from blazar.errors import BlazarError, DaemonRunning, PortInUse, UnsafeBind
from blazar.instances.preload import preload
from blazar.paths import Paths
from blazar.projections.keys import auth_on

log = logging.getLogger("blazar.daemon")






# File descriptors the daemon asks for (soft limit raised up to the hard one): each client connection holds one.
WANTED_NOFILE = 65536


def check_bind(host: str, *, keys_on: bool, insecure_no_auth: bool) -> str | None:
    """Refuse a bind wider than loopback while no key exists; returns the warning to give when it was forced."""
    if is_loopback(host) or keys_on:
        return None
    if not insecure_no_auth:
        raise UnsafeBind(f"refusing to listen on {host}: it is wider than loopback and no API key exists, so anyone "
                         "who can reach it could run, pull and delete models. Create one first (`blazar keys create "
                         "NAME --admin`), or pass --insecure-no-auth to serve it open anyway")
    return (f"serving {host} with no API key (--insecure-no-auth): anyone who can reach this address can run, pull "
            "and delete models")


def tls_files(cert: str, key: str) -> tuple[Path, Path] | None:
    """The PEM pair to serve https with (both or neither); a missing or unreadable file is refused before binding."""
    if not cert and not key:
        return None
    if not cert or not key:
        raise BlazarError("tls_cert and tls_key go together: set both (`blazar config set server.tls_cert FILE` and "
                          "`blazar config set server.tls_key FILE`), or neither")
    pair = (Path(cert).expanduser(), Path(key).expanduser())
    for p in pair:
        try:
            head = p.read_bytes()[:4096]
        except OSError as e:
            raise BlazarError(f"cannot read the TLS file {p}: {e.strerror or e}") from None
        if b"-----BEGIN" not in head:
            raise BlazarError(f"the TLS file {p} is not PEM (no -----BEGIN line)")
    return pair


def incoming_bodies(target: Any, settings: Settings) -> QuietHangUps:
    """The app behind the request-body limits. Each connection holds one of granian's `max_connections` permits
    until it closes, so bodies still arriving may hold at most half of them: fast requests always find one. Outside
    them, a client's hang-up ends quietly (blazar/api/disconnect.py)."""
    server = settings.server
    return QuietHangUps(IncomingBodies(target, idle_s=server.body_idle_timeout_s, total_s=server.body_timeout_s,
                                       limit=max(1, min(server.max_incoming_bodies, server.max_connections // 2))))


def freeze_startup_heap() -> None:
    """Move what start-up made (the modules, the app, the projections' state so far) out of the collector's reach:
    it lives as long as the daemon. A full collection then scans only what serving made since: on this project's
    machine about 65 ms came down to a few, a pause that otherwise lands on whichever request is streaming
    (`bench/overhead.py --only cpu` caught it in its per-chunk figure)."""
    gc.collect()
    gc.freeze()


def raise_nofile() -> None:
    """Idle client connections must not run the daemon out of descriptors before granian's limits apply."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = WANTED_NOFILE if hard == resource.RLIM_INFINITY else min(hard, WANTED_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _listening(paths: Paths, info: DaemonInfo, callback: Callable[[DaemonInfo], None] | None) -> None:
    write_daemon_file(paths, info)
    log.info("listening on %s (pid %d)", info.bound, info.pid)
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
                                "port with `blazar serve --port N` (or `blazar config set server.port N`)") from None
            raise BlazarError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _refuse_second(paths: Paths) -> DaemonRunning:
    pid = runlock.holder(paths.daemon_lock)
    info = read_daemon_file(paths)
    where = f" at {info.url}" if info is not None and info.pid == pid else ""
    who = f"pid {pid}" if pid and pid > 0 else "another process"
    return DaemonRunning(f"a Blazar daemon is already running for {paths.data_dir} ({who}{where}); "
                         "stop it first (SIGTERM), or use it")


async def serve(app: Blazar, services: Services, *, host: str, port: int,
                on_listening: Callable[[DaemonInfo], None] | None = None, insecure_no_auth: bool = False,
                insecure_cluster: bool = False) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code (0 after a clean stop). `on_listening` is called once the
    socket is bound (the CLI says so). A bind wider than loopback needs a key, or `insecure_no_auth`; a node URL
    that is plain http off this machine needs `insecure_cluster`. `services` come from `bootstrap.build_services`;
    they are closed on the way out."""
    paths = app.paths
    code = 0
    settings = app.settings()
    warning = check_bind(host, keys_on=auth_on(app.runner.state("keys")), insecure_no_auth=insecure_no_auth)
    if warning:
        log.warning("%s", warning)
    tls = tls_files(settings.server.tls_cert, settings.server.tls_key)
    scheme = "https" if tls else "http"
    if app.node:  # before anything binds or joins: a refused node leaves no trace in the cluster
        warning = check_node_url(node_url(paths, app.env, port=port, scheme=scheme), insecure_cluster=insecure_cluster)
        if warning:
            log.warning("%s", warning)
    raise_nofile()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(runlock.hold(paths.daemon_lock))
        except BlockingIOError:
            raise _refuse_second(paths) from None
        check_port(host, port)
        supervisor, gateway = services.supervisor, services.gateway
        admin_token = write_admin_token(paths)  # the CLI's credential once keys are on; removed at exit
        held.callback(remove_admin_token, paths, admin_token)
        target = incoming_bodies(create_app(app, supervisor, gateway, admin_token=admin_token, bind_host=host,
                                            scheme=scheme), settings)
        # NOTE: granian serves at most `backpressure` connections at once and holds the rest in the backlog; its
        # default (the backlog, 128) let 128 idle sockets starve everyone. Idle keep-alive connections and slow
        # headers are closed after idle_timeout_s (hyper's header read timeout covers both); slow bodies meet
        # IncomingBodies (blazar/api/incoming.py). HTTP/1 only: in "auto" mode granian sniffs for an HTTP/2 preface
        # with no deadline, so a socket that never sent a byte stayed open. WebSockets: /v1/realtime alone
        # (blazar/api/realtime.py); any other path's upgrade is refused by falcon (no `on_websocket`).
        idle_ms = int(settings.server.idle_timeout_s * 1000)
        server = Server(target=target, address=host, port=port, interface=Interfaces.ASGI, websockets=True,
                        http=HTTPModes.http1,
                        log_level=LogLevels.error, backlog=settings.server.backlog,
                        backpressure=settings.server.max_connections,
                        http1_settings=HTTP1Settings(header_read_timeout=idle_ms),
                        ssl_cert=tls[0] if tls else None, ssl_key=tls[1] if tls else None,
                        ssl_protocol_min=SSLProtocols.tls12)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        info = DaemonInfo(pid=os.getpid(), host=host, port=port, started=app.clock.now(), scheme=scheme,
                          ca_file=str(tls[0].absolute()) if tls else None)
        # Granian calls startup hooks once the socket is bound and listening, just before its worker starts.
        server.on_startup(lambda: _listening(paths, info, on_listening))
        keeper = _node_keeper(app, supervisor, port=port, scheme=scheme, insecure_cluster=insecure_cluster)
        preloading: asyncio.Task[Any] | None = None
        try:
            await supervisor.start()
            # After reconciliation, beside serving: a request for a model being preloaded waits for that load.
            preloading = asyncio.create_task(preload(app, supervisor), name="blazar-preload")
            services.start(stopping=stop)  # no batch line starts once the daemon is stopping
            # Other processes append too (`blazar pull`, `import`, `config set`, `engine use`): fold them as they land.
            app.runner.follow()
            if keeper is not None:
                await keeper.start()
            freeze_startup_heap()
            if not stop.is_set():  # a signal during reconcile: stop before serving at all
                code = await _serve_until_stopped(server, stop, supervisor, grace_s=app.settings().engine.stop_grace_s,
                                                  url=info.url)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if preloading is not None:  # the rest of the list is not loaded on the way out
                preloading.cancel()
                await asyncio.gather(preloading, return_exceptions=True)
            await services.stop_batches()
            await supervisor.close()
            if keeper is not None:
                await keeper.stop()  # after the instances' own stops: the node leaves with nothing running
            await services.close()
            daemon_file(paths).unlink(missing_ok=True)
    return code


def _node_keeper(app: Blazar, supervisor: Any, *, port: int, scheme: str,
                 insecure_cluster: bool = False) -> NodeKeeper | None:
    """The daemon's part among the gateways sharing a PostgreSQL log (None with the embedded SQLite log)."""
    if not app.node:
        return None

    def live() -> tuple[int, int]:
        rows = supervisor.ps()
        return len(rows), sum(int(r.get("in_flight") or 0) for r in rows)

    async def stop_instances() -> None:
        for model in sorted({i.model for i in supervisor.instances()}):
            await supervisor.stop(model)

    return NodeKeeper(app, url=node_url(app.paths, app.env, port=port, scheme=scheme), live=live,
                      stop_instances=stop_instances, insecure_cluster=insecure_cluster)


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

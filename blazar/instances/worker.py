"""`blazar worker`: llama.cpp's rpc-server run and supervised on this host, so that another host's llama-server can
put part of a model here (`--rpc`). Every start and stop is an event (`worker.started` with the address and the
memory it offers the planner, `worker.stopped` with why), so the planner knows which workers are up.

rpc-server has no authentication: anyone who reaches its port can make this host's devices compute and read what
they hold. So a worker binds loopback unless told `allow_network`, and says so loudly when it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

from blazar.adapters.engines import process
from blazar.adapters.engines.build import RPC_SERVER
from blazar.addresses import is_loopback, is_unspecified
from blazar.context import Blazar
from blazar.errors import WorkerError
from blazar.events.workers import WorkerStarted, WorkerStopped
from blazar.projections.residency import instances
from blazar.projections.workers import workers
from blazar.store.engine_verify import verify_for_spawn
from blazar.store.engines import ActiveEngine, active_engine

log = logging.getLogger("blazar.worker")

READY_TIMEOUT_S = 30.0
CRASH_LIMIT = 5  # crashes within CRASH_WINDOW_S: the worker gives up
CRASH_WINDOW_S = 60.0
BACKOFF_MAX_S = 10.0


async def idle_workers(app: Blazar, busy: set[str]) -> list[tuple[str, int]]:
    """(address, bytes offered) of every worker the log says is up, no instance uses (any node's, from residency, and
    those in `busy`: rpc-server serves one client at a time) and that accepts a connection now (a worker killed
    without its stop event is skipped)."""
    busy = busy | {a for i in instances(app.runner.state("residency")) for a in i.workers}
    up = [w for w in workers(app.runner.state("workers"), up_only=True) if w.address not in busy]
    reachable = await asyncio.gather(*(asyncio.to_thread(accepts, w.host, w.port) for w in up))
    return [(w.address, w.mem_bytes) for w, ok in zip(up, reachable, strict=True) if ok]


def rpc_capable(engine: ActiveEngine) -> bool:
    """Whether `engine` was built with the RPC backend: its rpc-server lies beside it. (llama-server's help lists
    --rpc in every build, so the flag alone says nothing; without the backend --rpc fails at start-up.)"""
    return (engine.binary.parent / RPC_SERVER).is_file()


def rpc_server_of(app: Blazar) -> tuple[Path, ActiveEngine]:
    """The active engine's rpc-server and the engine; WorkerError naming the build that makes one. Only an
    rpc-server the engine's install record holds is run: it is verified with the engine's files before each spawn."""
    engine = active_engine(app)
    rpc = engine.binary.parent / RPC_SERVER
    if not rpc.is_file():
        raise WorkerError(f"the active engine {engine.tag} has no rpc-server: build one with `blazar engine build "
                          "--target rpc-server` (llama.cpp's RPC backend, and llama-server able to use workers)")
    if engine.files and not any(f.path == RPC_SERVER and f.link_to is None for f in engine.files):
        raise WorkerError(f"the active engine {engine.tag} records no {RPC_SERVER}: the one in {rpc.parent} was not "
                          "installed with it, so it is not run (install or build the engine again)")
    return rpc, engine


def accepts(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at host:port now (half a second at most)."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


async def run_worker(app: Blazar, *, host: str, port: int, mem_bytes: int, name: str, stop: asyncio.Event,
                     threads: int | None = None, allow_network: bool = False,
                     say: Callable[[str], None] = lambda _line: None) -> int:
    """Run rpc-server until `stop` is set, starting it again after a crash (backoff; it gives up after CRASH_LIMIT
    crashes within CRASH_WINDOW_S). Returns the exit code for the command: 0 when stopped, 1 when it gave up."""
    if is_unspecified(host):
        raise WorkerError(f"refusing to listen on {host} (every interface): a worker binds one explicit address, "
                          "which is also the address a gateway's llama-server connects to")
    network = not is_loopback(host)
    if network and not allow_network:
        raise WorkerError(f"refusing to listen on {host}: rpc-server has no authentication, so anyone who reaches it "
                          "can run work on this host; bind 127.0.0.1 (the default), or pass --allow-network on a "
                          "network you trust")
    rpc, engine = rpc_server_of(app)
    tag = engine.tag
    log_path = app.paths.log / "workers" / f"{name.replace(':', '-').replace('/', '-')}.log"
    crashes: list[float] = []
    while not stop.is_set():
        # Verified before every start (a restart after a crash too): cached by each file's stat, so cheap.
        await asyncio.to_thread(verify_for_spawn, app.paths.engines, tag, engine.files)
        argv = [str(rpc), "-H", host, "-p", str(port), *(["-t", str(threads)] if threads else [])]
        proc = await process.spawn(argv, log_path=log_path, env=process.child_env(app.env))
        started = time.monotonic()
        if not await _ready(proc, host, port):
            code = await process.stop_process(proc, grace_s=2.0)
            tail = " | ".join(process.log_tail(log_path, 5))
            await app.record(WorkerStopped(name=name, reason="gave_up", exit_code=code,
                                           detail=f"rpc-server did not listen on {host}:{port}: {tail}"[:500]))
            raise WorkerError(f"rpc-server did not start listening on {host}:{port} (its log: {log_path}): {tail}")
        await app.record(WorkerStarted(name=name, host=host, port=port, mem_bytes=mem_bytes, pid=proc.pid,
                                       engine_tag=tag, network=network))
        say(f"worker {name} listening on {host}:{port} (pid {proc.pid}), offering {mem_bytes >> 20} MiB")
        exited = asyncio.ensure_future(proc.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        uptime = int((time.monotonic() - started) * 1000)
        if stop.is_set():
            exited.cancel()
            code = await process.stop_process(proc, grace_s=app.settings().engine.stop_grace_s)
            await app.record(WorkerStopped(name=name, reason="stopped", exit_code=code, uptime_ms=uptime))
            return 0
        code = proc.returncode
        tail = " | ".join(process.log_tail(log_path, 5))
        now = time.monotonic()
        crashes = [t for t in crashes if now - t <= CRASH_WINDOW_S] + [now]
        gave_up = len(crashes) >= CRASH_LIMIT
        await app.record(WorkerStopped(name=name, reason="gave_up" if gave_up else "crashed", exit_code=code,
                                       uptime_ms=uptime, detail=tail[:500]))
        if gave_up:
            say(f"rpc-server crashed {len(crashes)} times within {CRASH_WINDOW_S:.0f} s; giving up (log: {log_path})")
            return 1
        delay = min(BACKOFF_MAX_S, 0.5 * 2 ** (len(crashes) - 1))
        say(f"rpc-server exited with {code}; starting it again in {delay:.1f} s")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
    return 0


async def _ready(proc: asyncio.subprocess.Process, host: str, port: int) -> bool:
    """Whether rpc-server accepts connections before it exits or READY_TIMEOUT_S passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            return False
        if await asyncio.to_thread(accepts, host, port):
            return True
        await asyncio.sleep(0.1)
    return False

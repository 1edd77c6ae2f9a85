"""Engine processes as the operating system sees them: start one with its output in a log file, wait until it
answers /health, stop it (SIGTERM, grace, SIGKILL), and read /proc for pids that are not our children.

    EngineError
    ├── ProcessExited   the child exited before it was healthy (returncode; negative = killed by that signal)
    └── LoadTimeout     it was still not healthy after timeout_s (waited_s); it is left running for the caller
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import httpx2

from blazar.errors import EngineError, LoadTimeout, ProcessExited

__all__ = ["LoadTimeout", "ProcessExited"]  # raised here; the classes live in the error tree

# How long a process may take to disappear after SIGKILL before we say it will not (uninterruptible sleep).
KILL_WAIT_S = 10.0
_PROC = Path("/proc")
# The kernel's per-task flag for a task inside do_exit (include/linux/sched.h): set before its memory and files go.
_PF_EXITING = 0x4


def describe_exit(returncode: int | None) -> str:
    """'exited with code 1', 'was killed by SIGILL (exit code -4)': asyncio's returncode in words."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {returncode})"
    return f"exited with code {returncode}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now. Another process may take it before the engine binds; the engine then exits
    and the caller sees ProcessExited, which is the honest outcome of that race."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# What an engine child may see of our environment: where to find things, locale and time, and the knobs of the
# engine's own runtimes. NOTE: an allowlist, not a denylist: HF_TOKEN, API keys and whatever else a user exported
# never reach a child (it serves HTTP; a prompt-injected tool or a crash dump could leak it).
CHILD_ENV_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "TERM", "LD_LIBRARY_PATH"})
CHILD_ENV_PREFIXES = ("LC_", "CUDA_", "HIP_", "ROCR_", "HSA_", "GGML_", "LLAMA_ARG_THREADS", "OMP_", "OPENBLAS_",
                      "MKL_", "GOMP_", "KMP_", "VK_", "NVIDIA_")


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment an engine child starts with: `env` filtered through the allowlist."""
    return {k: v for k, v in env.items() if k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES)}


async def spawn(argv: list[str], *, log_path: Path, env: Mapping[str, str],
                cwd: Path | None = None) -> asyncio.subprocess.Process:
    """Start `argv` with stdout and stderr appended to `log_path` (0600) and stdin closed. `env` is the child's
    whole environment: for an engine, `child_env` of what bootstrap was given (`app.env`: nothing here reads the
    process's own). `cwd` is its working directory (None: ours). A missing or unrunnable binary is an EngineError
    naming it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # NOTE: a file, not a pipe: a child whose reader died (a killed daemon) would die of SIGPIPE on its next log line.
    # start_new_session: Ctrl-C on the daemon's terminal reaches the daemon, which stops its children in order.
    # umask 077 in the child: the slot dumps it writes (a conversation's KV cache, i.e. its prompt) are 0600.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_fd, stderr=asyncio.subprocess.STDOUT,
            env=dict(env), start_new_session=True, umask=0o077,
            cwd=cwd,
        )
    except OSError as e:
        raise EngineError(f"cannot start {argv[0]}: {e.strerror or e}") from e
    finally:
        os.close(log_fd)  # the child has its own copy


async def wait_healthy(proc: asyncio.subprocess.Process, port: int, *, timeout_s: float, host: str = "127.0.0.1",
                       interval_s: float = 0.05, path: str = "/health", socket: Path | None = None) -> float:
    """Poll GET `path` (the kind's readiness probe) until it answers 200 and return the seconds waited; on the Unix
    socket `socket` when the child listens on one (no port). ProcessExited when the child exits first; LoadTimeout
    when `timeout_s` passes (the child is left running: stopping it is the caller's decision)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + timeout_s
    exited = asyncio.ensure_future(proc.wait())
    transport = httpx2.AsyncHTTPTransport(uds=str(socket)) if socket is not None else None
    url = f"http://localhost{path}" if socket is not None else f"http://{host}:{port}{path}"
    # trust_env=False: a proxy from the environment must never sit between us and a loopback engine.
    async with httpx2.AsyncClient(trust_env=False, transport=transport) as client:
        try:
            while True:
                if exited.done():
                    raise ProcessExited(proc.returncode, pid=proc.pid, detail=describe_exit(proc.returncode))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise LoadTimeout(loop.time() - start, pid=proc.pid)
                try:
                    # 503 means loading; a refused connection means not listening yet. Both: poll again.
                    resp = await client.get(url, timeout=min(remaining, 2.0))
                    if resp.status_code == 200:
                        return loop.time() - start
                except httpx2.TransportError:
                    pass
                # Wake at once if the child exits while we wait for the next poll.
                await asyncio.wait([exited], timeout=max(0.0, min(interval_s, deadline - loop.time())))
        finally:
            if not exited.done():
                exited.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exited


async def stop_process(proc: asyncio.subprocess.Process, *, grace_s: float) -> int | None:
    """SIGTERM to the child's pid only, up to `grace_s` to exit, then SIGKILL. Returns its returncode (negative:
    the signal that ended it). An EngineError if it outlives SIGKILL by KILL_WAIT_S (a process stuck in the kernel)."""
    if proc.returncode is not None:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), timeout=grace_s)
    except TimeoutError:
        pass
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    try:
        return await asyncio.wait_for(proc.wait(), timeout=KILL_WAIT_S)
    except TimeoutError as e:
        raise EngineError(f"the engine (pid {proc.pid}) is still running {KILL_WAIT_S:.0f}s after SIGKILL") from e


def _fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (the first is the state, field 3); None when there is
    no such pid."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    return raw[raw.rindex(")") + 2:].split()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) from /proc/<pid>/stat; None when there is no such pid.
    The start time tells a process from a later one that was given the same pid."""
    fields = _fields(pid)
    return None if fields is None else (fields[0], int(fields[19]))


def pid_alive(pid: int) -> bool:
    """True while `pid` is a running process. A zombie (exited, not yet reaped by its parent) is not alive."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def pid_dying(pid: int) -> bool:
    """True when `pid` is gone, a zombie, or on its way out: a SIGKILLed child closes its port while the kernel
    still tears down its memory (a big model's, or a GPU context, takes a while), before its parent can reap it."""
    fields = _fields(pid)
    return fields is None or fields[0] in ("Z", "X") or bool(int(fields[6]) & _PF_EXITING)


def pid_cmdline(pid: int) -> list[str] | None:
    """The argv `pid` was started with; None for no such process, a zombie, or a kernel thread (empty cmdline)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if not raw:
        return None
    return [part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0")]


def rss_bytes(pid: int) -> int | None:
    """Resident memory (VmRSS) of `pid`; None when the process is gone or has none (a zombie)."""
    try:
        text = (_PROC / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            return int(value) * 1024 if unit == "kB" else int(value)
    return None


async def stop_pid(pid: int, *, grace_s: float, expect_cmdline: str | None = None, interval_s: float = 0.05) -> bool:
    """Stop a process that is not our child (an orphan found at reconcile): SIGTERM, poll /proc up to `grace_s`,
    SIGKILL, poll up to KILL_WAIT_S. True once it is gone; False when it was not running, or when its cmdline lacks
    `expect_cmdline` (the pid was recycled: never signal a stranger). Raises EngineError if it outlives SIGKILL."""
    st = _stat(pid)
    cmd = pid_cmdline(pid)
    if st is None or cmd is None or st[0] in ("Z", "X"):
        return False
    if expect_cmdline is not None and expect_cmdline not in " ".join(cmd):
        return False
    started = st[1]

    def same_process() -> bool:
        now = _stat(pid)
        return now is not None and now[1] == started and now[0] not in ("Z", "X")

    async def gone_within(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while same_process():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(interval_s)
        return True

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if not same_process():  # it exited (or its pid moved on) between our checks
            return True
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        if await gone_within(wait_s):
            return True
    raise EngineError(f"pid {pid} is still running {KILL_WAIT_S:.0f}s after SIGKILL")


def log_tail(path: Path, lines: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
    """The last `lines` lines of a log, reading at most its last `max_bytes`; [] when there is no file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return []
    text = data.decode(errors="replace")
    out = text.splitlines()
    if size > max_bytes and out:
        out = out[1:]  # the first line was cut by the byte window
    return [line.rstrip() for line in out[-lines:]] if lines > 0 else []

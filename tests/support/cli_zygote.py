"""The real `blazar` command, started faster: a zygote process imports the CLI once, then forks one child per command.

A child is a process of its own, as `python -m blazar.cli.main ARGS` would be: its own pid, environment, working
directory, standard streams and exit code, running the same `main()` to the same exit (Python's own finalization,
atexit, an uncaught exception's traceback and exit code 1). What it skips is only the import: about a second of CPU
a command on this project's 2-core machine, paid hundreds of times a run (docs/19.TESTING.md).

What is preloaded is what reads no environment when imported: the CLI and its commands' modules, never
huggingface_hub or opentelemetry (which read HF_* and OTEL_* at import, and tests set those per command); the
zygote checks this after preloading. Rich's consoles are made at import, so the zygote is started with the same
COLUMNS and NO_COLOR as every command (tests/conftest.py's Cli).

BLAZAR_TEST_CLI_ZYGOTE=0 runs every command as a plain subprocess instead.

    python -m tests.support.cli_zygote REQUEST_FD REPLY_FD   (the zygote; tests start it through `run`)
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path

# Modules that read the environment when imported; a preload that brings one in is a bug here.
ENV_AT_IMPORT = ("huggingface_hub", "opentelemetry")
# The environment the zygote (and so every console made at import) starts with, beside the test process's own.
CONSOLE_ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


# -- the zygote ---------------------------------------------------------------------------------------------------


# Beside every command's module: what `blazar serve` imports when it starts (blazar.bootstrap.build_services).
DAEMON_MODULES = ("blazar.daemon", "blazar.adapters.engines.client", "blazar.adapters.otel.target",
                  "blazar.api.batches", "blazar.cluster.remotes", "blazar.instances.kv_bank",
                  "blazar.instances.supervisor", "blazar.operations.archive_schedule", "blazar.serving.admission",
                  "blazar.serving.batches", "blazar.serving.gateway")


def _preload() -> None:
    from blazar.cli import main as cli_main

    for name in cli_main.COMMANDS:
        cli_main.load_command(name)
    for module in DAEMON_MODULES:
        importlib.import_module(module)
    leaked = [m for m in ENV_AT_IMPORT if m in sys.modules]
    if leaked:
        raise SystemExit(f"cli_zygote: preloading the CLI imported {leaked}, which read the environment at import")
    gc.freeze()  # what was preloaded is never collected: a child's collections do not touch (and copy) its pages


def _child(request: dict, fds: tuple[int, int]) -> None:
    """In the forked child: become the command, run it, and exit as the interpreter would (never returns)."""
    for fd in fds:
        os.close(fd)
    os.chdir(request["cwd"])
    opened: dict[str, int] = {}  # one file for stdout and stderr is one descriptor, as Popen(stderr=STDOUT) makes
    for target, (path, flags) in enumerate(((request["stdin"], os.O_RDONLY),
                                            (request["stdout"], os.O_WRONLY | os.O_TRUNC),
                                            (request["stderr"], os.O_WRONLY | os.O_TRUNC))):
        if target and path in opened:
            os.dup2(opened[path], target)
            continue
        fd = os.open(path, flags)
        os.dup2(fd, target)
        os.close(fd)
        opened[path] = target
    os.environ.clear()
    os.environ.update(request["env"])
    from blazar.cli import main as cli_main

    sys.argv = [cli_main.__file__, *request["args"]]
    sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
    sys.modules["__main__"] = cli_main  # click names the program from it: "python -m blazar.cli.main"
    try:
        cli_main.main()
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    _exit(code)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """What the interpreter does at exit, less tearing down ~900 modules one by one (a third of a second): wait for
    the threads that are not daemons, run the atexit functions, flush, exit."""
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own first step at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def serve(request_fd: int, reply_fd: int) -> None:
    """One command at a time: fork, say the child's pid, wait, say its exit code."""
    _preload()
    requests = os.fdopen(request_fd, "r")
    replies = os.fdopen(reply_fd, "w")
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, (request_fd, reply_fd))
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


# -- the test side ------------------------------------------------------------------------------------------------


class _Zygote:
    def __init__(self) -> None:
        request_r, self._request_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        env = {**os.environ, **CONSOLE_ENV}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.cli_zygote", str(request_r), str(reply_w)],
                                     pass_fds=(request_r, reply_w), env=env, cwd=Path(__file__).parents[2],
                                     stdin=subprocess.DEVNULL)
        os.close(request_r)
        os.close(reply_w)
        self._buffer = b""
        ready = self._read(timeout=120)
        if "ready" not in ready:
            raise RuntimeError(f"cli_zygote did not start: {ready}")

    def _read(self, timeout: float | None) -> dict:
        while b"\n" not in self._buffer:
            readable, _, _ = select.select([self._reply_r], [], [], timeout)
            if not readable:
                raise TimeoutError
            chunk = os.read(self._reply_r, 4096)
            if not chunk:
                raise RuntimeError(f"cli_zygote exited ({self.proc.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def start(self, args: list[str], env: Mapping[str, str], stdin: str, stdout: str, stderr: str) -> int:
        """Fork the command; its pid. Its exit code comes with `exit_code`, once it has exited."""
        os.write(self._request_w, (json.dumps({"args": args, "env": dict(env), "cwd": os.getcwd(), "stdin": stdin,
                                               "stdout": stdout, "stderr": stderr}) + "\n").encode())
        return int(self._read(timeout=60)["pid"])

    def exit_code(self, timeout: float | None) -> int:
        """The running command's exit code, waiting at most `timeout` s (TimeoutError) for it to exit."""
        return int(self._read(timeout=timeout)["code"])

    def run(self, args: list[str], env: Mapping[str, str], stdin: str, stdout: str, stderr: str,
            timeout: float) -> int:
        pid = self.start(args, env, stdin, stdout, stderr)
        try:
            return self.exit_code(timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            self.exit_code(60)
            raise

    def close(self) -> None:
        os.close(self._request_w)
        os.close(self._reply_r)
        self.proc.wait(timeout=30)


_IDLE: list[_Zygote] = []
_ALL: list[_Zygote] = []
_LOCK = threading.Lock()


def _closed_at_exit() -> None:
    for z in _ALL:
        with contextlib.suppress(Exception):
            z.close()


atexit.register(_closed_at_exit)


def enabled() -> bool:
    return os.environ.get("BLAZAR_TEST_CLI_ZYGOTE", "1") != "0"


def _take() -> _Zygote:
    with _LOCK:
        zygote = _IDLE.pop() if _IDLE else None
    if zygote is None:
        zygote = _Zygote()
        with _LOCK:
            _ALL.append(zygote)
    return zygote


class Process:
    """A command started with `start`, as the tests use a subprocess.Popen: pid, poll, wait, signals, returncode.
    Its zygote is its parent and waits for it; it goes back to the pool once the command's exit is read."""

    def __init__(self, zygote: _Zygote, pid: int, args: list[str]) -> None:
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None
        self.stdout = self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(TimeoutError):
                self._exited(self._zygote.exit_code(timeout=0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self._exited(self._zygote.exit_code(timeout=timeout))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
        assert self.returncode is not None
        return self.returncode

    def _exited(self, code: int) -> None:
        self.returncode = code
        with _LOCK:
            _IDLE.append(self._zygote)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(args: list[str], *, env: Mapping[str, str], stdout: Path, stderr: Path) -> Process:
    """`subprocess.Popen([python, -m, blazar.cli.main, *args], env=env, stdin=DEVNULL, stdout=..., stderr=...)` with
    its output going to files (appended from their start: give each its own), through a zygote that serves it
    alone until it exits (`blazar serve` in the tests' daemons)."""
    zygote = _take()
    for path in (stdout, stderr):
        if not path.exists():
            path.touch()
    pid = zygote.start(list(args), env, os.devnull, str(stdout), str(stderr))
    return Process(zygote, pid, [sys.executable, "-m", "blazar.cli.main", *args])


def run(args: list[str], *, env: Mapping[str, str], timeout: float, input: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([python, -m, blazar.cli.main, *args], env=env, capture_output=True, text=True, input=input,
    timeout=timeout)`, through a zygote (one per concurrent caller, kept for the next)."""
    zygote = _take()
    with tempfile.TemporaryDirectory(prefix="blazar-cli-") as d:
        stdin = os.devnull
        if input is not None:
            stdin = os.path.join(d, "stdin")
            Path(stdin).write_text(input)
        out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
        Path(out).touch()
        Path(err).touch()
        argv = [sys.executable, "-m", "blazar.cli.main", *args]
        try:
            code = zygote.run(list(args), env, stdin, out, err, timeout)
        except TimeoutError:
            with _LOCK:
                _IDLE.append(zygote)
            raise subprocess.TimeoutExpired(argv, timeout, Path(out).read_text(), Path(err).read_text()) from None
        except Exception:
            with _LOCK:
                _ALL.remove(zygote)
            raise
        with _LOCK:
            _IDLE.append(zygote)
        return subprocess.CompletedProcess(argv, code, Path(out).read_text(errors="replace"),
                                           Path(err).read_text(errors="replace"))


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))

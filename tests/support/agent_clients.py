"""Where the third-party agents the integration tests drive live: Claude Code, Codex (npm) and aider with LiteLLM
(its own virtualenv), installed pinned by scripts/install-test-clients into $BLAZAR_TEST_CLIENTS (default
~/.cache/blazar/test-clients). A test that needs one skips when it is missing, unless BLAZAR_REQUIRE_CLIENTS=1 (set
by scripts/test after installing them): then a missing client is a failure."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest


def clients_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blazar" / "test-clients"
    return Path(os.environ.get("BLAZAR_TEST_CLIENTS") or default)


def _need(path: Path, what: str) -> Path:
    if path.is_file() and os.access(path, os.X_OK):
        return path
    message = f"{what} is not installed at {path} (scripts/install-test-clients installs it)"
    if os.environ.get("BLAZAR_REQUIRE_CLIENTS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def claude_code() -> Path:
    """The `claude` CLI (@anthropic-ai/claude-code)."""
    return _need(clients_dir() / "npm" / "node_modules" / ".bin" / "claude", "Claude Code")


def codex() -> Path:
    """The `codex` CLI (@openai/codex)."""
    return _need(clients_dir() / "npm" / "node_modules" / ".bin" / "codex", "Codex")


def aider() -> Path:
    """The `aider` CLI (aider-chat)."""
    return _need(clients_dir() / "aider-venv" / "bin" / "aider", "aider")


def aider_python() -> Path:
    """The Python of aider's virtualenv, which has LiteLLM (`litellm.get_model_info`)."""
    return _need(clients_dir() / "aider-venv" / "bin" / "python", "aider's Python (LiteLLM)")


def agent_env(home: Path) -> dict[str, str]:
    """An environment for an agent CLI: a throwaway HOME and config dirs, no telemetry, no update checks, and no
    proxy settings that could send loopback traffic elsewhere."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"), "NO_PROXY": "127.0.0.1,localhost", "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DO_NOT_TRACK": "1"}


def run_agent(argv: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """An agent CLI run to its end: (exit code, stdout, stderr). Past `timeout_s` its whole process group is killed
    (the agents start helpers of their own) and the test fails with what it printed."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{Path(argv[0]).name} ran past {timeout_s:.0f}s: {out[-2000:]} {err[-3000:]}")
    return proc.returncode, out, err

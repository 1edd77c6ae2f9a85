"""Ollama clients pointed at Blazar the way their users point them at Ollama, on the real engine and the real Gemma:
LiteLLM reads the model's context from /api/show, aider (`ollama_chat/`) gets an answer knowing its context, and
Codex `--oss` passes its start-up checks (/api/version, /api/tags) to a model call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.agent_clients import agent_env, aider, aider_python, codex
from tests.support.blazar_home import read_events
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
# Codex's first request is ~10k tokens of instructions and tools: the context must hold it.
CTX = 16384
CODEX_S = 180


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
           ) -> Iterator[tuple[Path, str]]:
    home = tmp_path_factory.mktemp("ollama-clients")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": CTX}) as (port, _):
        # A base model never stops on its own: a short default answer keeps each client's turn short.
        blazar_cli(home, "model", "set", MODEL, "--param", "num_predict=16")
        yield home, f"http://127.0.0.1:{port}"


def _context(base: str) -> int:
    info = httpx2.post(f"{base}/api/show", json={"model": MODEL}, trust_env=False).json()["model_info"]
    return int(info["gemma3.context_length"])


def test_litellm_get_model_info_reads_the_context_size(served: tuple[Path, str], tmp_path: Path) -> None:
    _, base = served
    code = f"import json, litellm; print(json.dumps(litellm.get_model_info('ollama/{MODEL}')))"
    env = {**agent_env(tmp_path), "OLLAMA_API_BASE": base, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    r = subprocess.run([str(aider_python()), "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["max_input_tokens"] == info["max_tokens"] == _context(base) > 0


def test_aider_ollama_chat_answers_and_knows_the_context(served: tuple[Path, str], tmp_path: Path) -> None:
    _, base = served
    work = tmp_path / "work"
    work.mkdir()
    env = {**agent_env(tmp_path / "home"), "OLLAMA_API_BASE": base}
    r = subprocess.run([str(aider()), "--model", f"ollama_chat/{MODEL}", "--message", "Say hello.", "--yes",
                        "--no-git", "--no-auto-commits", "--no-check-update", "--no-show-release-notes",
                        "--analytics-disable", "--no-pretty", "--no-stream"],
                       env=env, cwd=work, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "of 0" not in out and "possibly exhausted" not in out, out  # the context size was read
    tokens = next(line for line in out.splitlines() if line.startswith("Tokens:"))
    assert int(tokens.split(",")[1].split()[0]) > 0, out  # "Tokens: 642 sent, 16 received."


def test_codex_oss_passes_its_start_up_checks_to_a_model_call(served: tuple[Path, str], tmp_path: Path) -> None:
    home, base = served
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "codex").mkdir()
    env = {**agent_env(tmp_path / "home"), "CODEX_HOME": str(tmp_path / "codex"),
           "CODEX_OSS_BASE_URL": f"{base}/v1"}
    # Its own session: the npm wrapper starts the native binary as a child, and a timeout must end both.
    proc = subprocess.Popen([str(codex()), "exec", "--oss", "--local-provider", "ollama", "-m", MODEL,
                             "--skip-git-repo-check", "Say hello."], env=env, cwd=work, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=CODEX_S)
    except subprocess.TimeoutExpired:  # a slow answer still shows how far Codex got
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    assert "too old" not in out and f"model: {MODEL}" in out and "provider: ollama" in out, out
    # Past /api/version and /api/tags, Codex asked the model through the Responses route: the request was received,
    # or the route refused what Codex sent with its own OpenAI-shaped 400, which Codex prints.
    asked = [e["data"] for e in read_events(home, "request.received")]
    received = any(a["route"] == "/v1/responses" and a["model"] == MODEL for a in asked)
    assert received or '"type":"invalid_request_error"' in out, out
    if proc.returncode == 0:  # the route answered within the time: Codex printed the model's reply
        assert "codex" in out.split("Say hello.", 1)[-1], out

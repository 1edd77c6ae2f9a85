"""Ollama clients pointed at Blazar the way their users point them at Ollama, on the real engine and the real Gemma:
LiteLLM reads the model's context from /api/show and aider (`ollama_chat/`) gets an answer knowing its context.
Codex `--oss` (its start-up checks, then its turn on /v1/responses, to an answer) is tests/integration/test_codex.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.agent_clients import agent_env, aider, aider_python
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
CTX = 16384


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

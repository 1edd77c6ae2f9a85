"""Codex's `--oss` mode working unchanged against Blazar, to an answer: the real Codex CLI (`@openai/codex`, `codex
exec --oss --local-provider ollama`) finds the model through Ollama's discovery routes, then sends its turn to
`/v1/responses` with every tool it offers (functions, a namespace of functions, a hosted web search), and prints the
model's reply; and those tool shapes through the openai SDK, each call coming back as the item of the tool it was
offered as. Real `blazar serve`, real llama-server, the real Gemma 3 270M."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from tests.support.agent_clients import agent_env, codex, run_agent
from tests.support.blazar_home import read_events
from tests.support.serving import serving_gemma

MODEL = "gemma"
# Codex 0.171's first turn is about 4,600 tokens with this model (its instructions, the environment, its tools' JSON
# schemas). It sends no max_output_tokens, and the demo model is a base model that never ends its turn: its variant
# holds the prompt, stops at the end of a line and is bounded by num_predict, as a Modelfile would make it.
CODEX_MODEL = "gemma-codex"
CODEX_PARAMETERS = {"num_ctx": 8192, "stop": ["\n"], "num_predict": 48, "temperature": 0}
TIMEOUT_S = 420


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[
        tuple[Path, str]]:
    home = tmp_path_factory.mktemp("codex-home")
    settings = {"ctx": 8192, "slots": 1, "queue_timeout_s": 300}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings) as (port, _):
        base = f"http://127.0.0.1:{port}"
        r = httpx2.post(f"{base}/api/create", trust_env=False, timeout=60, json={
            "model": CODEX_MODEL, "from": MODEL, "parameters": CODEX_PARAMETERS, "stream": False})
        assert r.status_code == 200, r.text
        yield home, base


def test_codex_oss_answers_through_blazar(daemon: tuple[Path, str], tmp_path: Path) -> None:
    home, base = daemon
    tags = httpx2.get(f"{base}/api/tags", trust_env=False, timeout=30).json()["models"]
    name = next(m["name"] for m in tags if m["name"].split(":")[0] == CODEX_MODEL)  # as Codex finds it listed
    user, work = tmp_path / "home", tmp_path / "work"
    (user / "codex").mkdir(parents=True)
    work.mkdir()
    env = {**agent_env(user), "CODEX_HOME": str(user / "codex"), "CODEX_OSS_BASE_URL": f"{base}/v1"}
    rc, out, err = run_agent([str(codex()), "exec", "--oss", "--local-provider", "ollama", "-m", name,
                         "--skip-git-repo-check", "The capital of France is"], cwd=work, env=env,
                              timeout_s=TIMEOUT_S)
    assert rc == 0, f"codex exited {rc}: {out[-2000:]} {err[-3000:]}"
    # What went through: Codex's turn on /v1/responses, answered 200 with the model's words, which Codex printed
    # (exec prints the last message alone on stdout; its banner and progress go to stderr).
    turns = [e for e in read_events(home, "request.received")
             if e["data"]["route"] == "/v1/responses" and e["data"]["model"] == CODEX_MODEL]
    assert turns, f"Codex's turn is not in the log: {err[-3000:]}"
    done = {e["trace_id"]: e["data"] for e in read_events(home, "request.completed")}
    answered = [done[t["trace_id"]] for t in turns if t["trace_id"] in done]
    assert answered and all(d["status"] == 200 and d["completion_tokens"] > 0 for d in answered), answered
    assert out.strip(), f"Codex printed no answer: {err[-3000:]}"


# The tool shapes Codex offers, through the openai SDK on the real engine: a forced call of a namespace's function
# and of a freeform tool comes back as the item the client offered, hosted tools are left out, and one forced is a
# 400 in OpenAI's error shape.
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "wait_agent", "description": "Wait for an agent.", "strict": False,
     "parameters": {"type": "object", "properties": {"mode": {"enum": ["all", "any"]}}, "required": ["mode"],
                    "additionalProperties": False}}]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch."}
SEARCH = {"type": "web_search", "external_web_access": False}


@pytest.mark.parametrize("stream", [False, True])
def test_codex_tool_shapes_come_back_as_their_own_items(daemon: tuple[Path, str], stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{daemon[1]}/v1", api_key="unused", max_retries=0, timeout=300)
    tools: list[Any] = [AGENTS, PATCH, SEARCH]

    def forced(choice: Any) -> Any:
        # NOTE: temperature 0 and a prompt under which the base model writes each call within the limit (under
        # others, "What is the weather in Paris?" among them, it loops inside the patch's string until the limit cuts
        # it: a call cut so is no item at all).
        kwargs: dict[str, Any] = {"model": MODEL, "input": "Apply the patch.", "tools": tools,
                                  "tool_choice": choice, "max_output_tokens": 64, "store": False,
                                  "temperature": 0}
        if not stream:
            return client.responses.create(**kwargs)
        with client.responses.stream(**kwargs) as events:
            return events.get_final_response()

    wait = forced({"type": "function", "name": "wait_agent", "namespace": "multi_agent_v1"}).output[-1]
    assert wait.type == "function_call" and (wait.name, wait.namespace) == ("wait_agent", "multi_agent_v1")
    assert json.loads(wait.arguments)["mode"] in ("all", "any")
    patch = forced({"type": "custom", "name": "apply_patch"}).output[-1]
    assert patch.type == "custom_tool_call" and patch.name == "apply_patch" and isinstance(patch.input, str)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="x", tools=tools, tool_choice={"type": "web_search_preview"})
    assert "tool_choice" in refused.value.message

"""The agents a user points at Blazar, run to their end on the demo model as Blazar ships it: no variant, no stop
words of the user's own, its template the one its probe chose (tests/support/homes.py records the probe as a first
load would). Claude Code (`claude -p`), the OpenAI Agents SDK (a forced tool, on its Chat Completions and its
Responses model) and LangChain (`bind_tools(tool_choice=NAME)` with max_tokens 60). Real `blazar serve`, real
llama-server, the real Gemma 3 270M; the clients pinned by scripts/install-test-clients and pyproject's dev extra.
The demo model is a base model: these tests assert that each run ends as it should, never the words."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.agent_clients import agent_env, claude_code
from tests.support.blazar_home import read_events
from tests.support.serving import serving_gemma

MODEL = "gemma"
QUESTION = "What is the capital of France?"
TIMEOUT_S = 900  # a hang bound: the first turn reads ~19,400 tokens on a 2-core CPU
# Each agent's first turn carries its instructions and every tool's schema (thousands of tokens): a slot of its own.
AGENT_SLOW = pytest.mark.slow(reason="an agent CLI's turn: its instructions and tools' schemas read by the engine")


class Daemon:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("shipped-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"slots": 1, "queue_timeout_s": 600},
                       template=None) as (port, _):
        yield Daemon(home, port)


def _run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run to its end, or kill its whole process group after TIMEOUT_S (the agents start helpers of their own)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv[0]} ran past {TIMEOUT_S}s: {out[-2000:]} {err[-3000:]}")
    return proc.returncode, out, err


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    user, work = tmp_path / "home", tmp_path / "work"
    user.mkdir()
    work.mkdir()
    return user, work


@AGENT_SLOW
def test_claude_code_answers_and_exits_0(daemon: Daemon, tmp_path: Path) -> None:
    user, work = _dirs(tmp_path)
    # API_TIMEOUT_MS: its first turn is about 19,400 tokens (instructions, system message, its tools' schemas), read
    # by the engine on a 2-core CPU; Claude Code's own timeout would retry it meanwhile (as a user of a slow local
    # model sets it too).
    env = {**agent_env(user), "ANTHROPIC_BASE_URL": daemon.base, "ANTHROPIC_API_KEY": "sk-local",
           "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "API_TIMEOUT_MS": str(TIMEOUT_S * 1000)}
    rc, out, err = _run([str(claude_code()), "-p", QUESTION, "--model", MODEL], cwd=work, env=env)
    assert rc == 0, f"claude exited {rc}: {out[-2000:]} {err[-2000:]}"
    assert out.strip(), err[-2000:]
    # Its turn went the whole way: the system message inside `messages`, its betas, its max_tokens of 32,000; the
    # prompt over the default context of 8192 served by an instance whose context holds it, the output bounded to
    # what that context leaves; answered 200, ended by the model (a stop, not the bound).
    ours = [e for e in read_events(daemon.home, "request.received") if e["data"]["route"] == "/v1/messages"]
    assert ours and ours[-1]["data"]["max_tokens"] == 32000
    trace = ours[-1]["trace_id"]
    grown = [e["data"] for e in read_events(daemon.home, "request.rerouted") if e["data"]["reason"] == "context_grown"]
    assert grown and "does not fit the context of 8192" in grown[0]["detail"], grown
    (bounded,) = [e["data"] for e in read_events(daemon.home, "request.bounded") if e["trace_id"] == trace]
    assert bounded["bounded_max_tokens"] == bounded["ctx_tokens"] - bounded["prompt_tokens"] < 32000
    assert bounded["ctx_tokens"] > 8192
    (done,) = [e["data"] for e in read_events(daemon.home, "request.completed") if e["trace_id"] == trace]
    assert done["status"] == 200 and 0 < done["completion_tokens"] < bounded["bounded_max_tokens"]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_agents_sdk_completes_a_run_with_a_forced_tool(daemon: Daemon, api: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # nothing leaves the machine
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=f"{daemon.base}/v1", api_key="sk-local", max_retries=0, timeout=300)
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client) if api == "chat" else \
            OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = Agent(name="weather", instructions="Use the tool.", model=model, tools=[get_weather],
                      model_settings=ModelSettings(tool_choice="required"), tool_use_behavior="stop_on_first_tool")
        return await Runner.run(agent, "What is the weather in Rome?")

    result = asyncio.run(run())
    assert len(asked) == 1 and result.final_output == f"sunny in {asked[0]}"


def test_langchain_bind_tools_with_a_named_tool_gets_a_call_within_60_tokens(daemon: Daemon) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    llm = ChatOpenAI(model=MODEL, base_url=f"{daemon.base}/v1", api_key="sk-local", max_tokens=60, max_retries=0,
                     timeout=300)
    answer = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [c["name"] for c in answer.tool_calls] == ["get_weather"], answer
    assert isinstance(answer.tool_calls[0]["args"].get("city"), str)
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    assert json.loads(json.dumps(answer.tool_calls[0]["args"]))  # plain JSON arguments

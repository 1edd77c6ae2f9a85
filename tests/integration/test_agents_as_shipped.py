"""The agents a user points at Blazar, run to their end on the demo model as Blazar ships it: no variant, no stop
words of the user's own, its template the one its probe chose (tests/support/homes.py records the probe as a first
load would). The OpenAI Agents SDK (a forced tool, on its Chat Completions and its Responses model), LangChain
(`bind_tools(tool_choice=NAME)` with max_tokens 60), Codex (`codex exec` with a custom Responses provider and with
`--oss`) and Claude Code (`claude -p`), each to its answer. Real `blazar serve`, real llama-server, the real Gemma 3
270M; the Python clients pinned by pyproject's dev extra, the agent CLIs by scripts/install-test-clients.

The agent CLIs send no temperature and no output limit: their answers end because the template the probe chose is
served greedy, as it was measured, and stopped where the next turn would begin; and where the greedy base model
falls into a loop instead (nested XML on some of Codex's prompts), the loop guard ends the answer there
(blazar/serving/loop_guard.py), so an agent gets an answer rather than an "incomplete" one at the end of the context.
Their first turns are long (Codex's about 8,800 tokens, Claude Code's about 19,300), so the model's context grows to
take them (`context_grown`): the Codex tests run before Claude Code's, on one daemon."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.agent_clients import agent_env, claude_code, codex, run_agent
from tests.support.blazar_home import read_events
from tests.support.serving import serving_gemma

MODEL = "gemma"


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


# -- the agent CLIs ------------------------------------------------------------------------------------------------

QUESTION = "What is the capital of France?"
CLI_TIMEOUT_S = 900  # Claude Code's 19,300-token first turn, on one engine thread beside another worker


def _turns_ended(daemon: Daemon, route: str, since: int) -> list[dict[str, Any]]:
    """The agent's turns on `route` after log position `since`, each as it completed: every one answered 200 and
    ended by the model (a stop), not by a limit. A turn the agent itself hung up on is allowed (Claude Code exits
    once its answer is printed, dropping a side request it no longer needs, which on a loaded machine may still be
    running); any other failure is not."""
    turns = {e["trace_id"] for e in read_events(daemon.home, "request.received")
             if e["seq"] > since and e["data"]["route"] == route and e["data"]["model"] == MODEL}
    done = [e["data"] for e in read_events(daemon.home, "request.completed") if e["trace_id"] in turns]
    failed = [e["data"] for e in read_events(daemon.home, "request.failed") if e["trace_id"] in turns]
    dropped = [f for f in failed if f["reason"] == "client_disconnected"]
    assert turns and done and failed == dropped and len(done) + len(failed) == len(turns), (done, failed)
    assert all(d["status"] == 200 and d["completion_tokens"] > 0 for d in done), done
    return done


def _last_seq(daemon: Daemon) -> int:
    return max((e["seq"] for e in read_events(daemon.home)), default=0)


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    user, work = tmp_path / "home", tmp_path / "work"
    (user / "codex").mkdir(parents=True)
    work.mkdir()
    return user, work


@pytest.mark.slow(reason="Codex's 8,800-token first turn, prompt-processed on the real engine")
@pytest.mark.parametrize("provider", ["responses", "oss"])
def test_codex_exec_prints_its_reply(daemon: Daemon, tmp_path: Path, provider: str) -> None:
    user, work = _dirs(tmp_path)
    env = {**agent_env(user), "CODEX_HOME": str(user / "codex")}
    if provider == "responses":  # a custom provider on the Responses API, as a user configures one
        (user / "codex" / "config.toml").write_text(
            f'model = "{MODEL}"\nmodel_provider = "blazar"\n[model_providers.blazar]\nname = "Blazar"\n'
            f'base_url = "{daemon.base}/v1"\nwire_api = "responses"\nenv_key = "BLAZAR_API_KEY"\n')
        argv = [str(codex()), "exec", "--skip-git-repo-check", QUESTION]
        env["BLAZAR_API_KEY"] = "sk-local"
    else:  # --oss: Codex finds the model through Ollama's discovery routes
        env["CODEX_OSS_BASE_URL"] = f"{daemon.base}/v1"
        argv = [str(codex()), "exec", "--oss", "--local-provider", "ollama", "-m", MODEL, "--skip-git-repo-check",
                QUESTION]
    since = _last_seq(daemon)
    rc, out, err = run_agent(argv, cwd=work, env=env, timeout_s=CLI_TIMEOUT_S)
    assert rc == 0, f"codex exited {rc}: {out[-2000:]} {err[-3000:]}"
    # exec prints the last message alone on stdout (its banner and progress go to stderr)
    assert out.strip(), f"Codex printed no reply: {err[-3000:]}"
    _turns_ended(daemon, "/v1/responses", since)
    assert "Incomplete response" not in err


@pytest.mark.slow(reason="Claude Code's 19,300-token first turn, prompt-processed on the real engine")
def test_claude_code_print_mode_exits_0_with_an_answer(daemon: Daemon, tmp_path: Path) -> None:
    user, work = _dirs(tmp_path)
    env = {**agent_env(user), "ANTHROPIC_BASE_URL": daemon.base, "ANTHROPIC_AUTH_TOKEN": "sk-local",
           "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL}
    since = _last_seq(daemon)
    rc, out, err = run_agent([str(claude_code()), "-p", QUESTION, "--model", MODEL], cwd=work, env=env,
                             timeout_s=CLI_TIMEOUT_S)
    assert rc == 0, f"claude exited {rc}: {out[-2000:]} {err[-2000:]}"
    assert out.strip(), f"Claude Code printed no answer: {err[-2000:]}"
    done = _turns_ended(daemon, "/v1/messages", since)
    # Ended by the model, far inside what the context left it (Claude Code asks for 32,000 tokens).
    bounded = [e["data"] for e in read_events(daemon.home, "request.bounded") if e["seq"] > since]
    assert bounded and all(d["completion_tokens"] < b["bounded_max_tokens"] for d in done for b in bounded)

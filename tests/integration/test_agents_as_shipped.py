"""The agents a user points at Blazar, run to their end on the demo model as Blazar ships it: no variant, no stop
words of the user's own, its template the one its probe chose (tests/support/homes.py records the probe as a first
load would). The OpenAI Agents SDK (a forced tool, on its Chat Completions and its Responses model) and LangChain
(`bind_tools(tool_choice=NAME)` with max_tokens 60). Real `blazar serve`, real llama-server, the real Gemma 3 270M;
the clients pinned by pyproject's dev extra. (Claude Code and Codex as shipped do not end every run yet: the issue's
note says why; their runs on variants stay in test_agent_surface.py and test_codex.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

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

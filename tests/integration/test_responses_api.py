"""The Responses API end to end: the official `openai` SDK (and the OpenAI Agents SDK's Responses model) against
`blazar serve` with the real llama-server and the real Gemma 3 270M. `/v1/responses` is served as the chat request it
translates to, so a forced tool choice and a model variant's settings apply to it; responses are stored (per key),
chained with previous_response_id, read back and deleted. The demo model is a base model: these tests assert the
protocol (shapes, ids, usage, what the log keeps), never the words."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx2
import ollama
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}
# A grammar with a short, finite answer: the base model stops by itself (status completed, not cut by a limit).
YES_NO = {"type": "json_schema", "name": "verdict", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
    "additionalProperties": False}}


class Daemon:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"
        self.key = "unused"

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=key or self.key, max_retries=0, timeout=120)

    def aclient(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base}/v1", api_key=self.key, max_retries=0, timeout=120)

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)

    def stored(self, response_id: str) -> dict[str, Any]:
        return wait_for(lambda: next((e["data"] for e in self.events("response.stored")
                                      if e["data"]["response_id"] == response_id), None),
                        f"response.stored of {response_id}", timeout=20)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("responses-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 2048, "slots": 2}) as (port, _):
        yield Daemon(home, port)


def test_a_response_is_stored_read_back_listed_and_deleted(daemon: Daemon) -> None:
    client = daemon.client()
    r = client.responses.create(model=MODEL, input="The capital of France is", instructions="Answer briefly.",
                                max_output_tokens=4, temperature=0, metadata={"run": "1"})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.instructions == "Answer briefly." and r.metadata == {"run": "1"} and r.store is True
    assert r.usage is not None and r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 4
    assert r.output[0].type == "message" and r.output_text
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage == r.usage
    items = list(client.responses.input_items.list(r.id))
    assert [(i.type, i.role) for i in items] == [("message", "user")]
    assert items[0].content[0].text == "The capital of France is"
    # The log keeps ids, sizes and tokens, never the text.
    stored = daemon.stored(r.id)
    assert stored["input_items"] == 1 and stored["output_items"] == 1 and stored["content_bytes"] > 0
    assert stored["output_tokens"] == r.usage.output_tokens and stored["input_tokens"] == r.usage.input_tokens
    assert "France" not in json.dumps(daemon.events())
    assert b"France" in _store_bytes(daemon.home)

    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert e.value.body["code"] == "not_found" and r.id in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(r.id)
    deleted = wait_for(lambda: [e for e in daemon.events("response.deleted") if e["data"]["response_id"] == r.id],
                       "response.deleted", timeout=20)
    assert deleted[0]["data"]["reason"] == "requested"
    assert b"capital of France" not in _store_bytes(daemon.home)  # nor in its WAL


def test_previous_response_id_continues_the_conversation_without_its_instructions(daemon: Daemon) -> None:
    client = daemon.client()
    first = client.responses.create(model=MODEL, input="My name is Zed.", instructions="Rule one.",
                                    max_output_tokens=3, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=3, temperature=0)
    assert second.previous_response_id == first.id and second.instructions is None
    assert second.usage is not None and first.usage is not None
    # The earlier input and output were prepended: more prompt than the new words alone.
    alone = client.responses.create(model=MODEL, input="What is my name?", max_output_tokens=3, temperature=0,
                                    store=False)
    assert alone.usage is not None and second.usage.input_tokens > alone.usage.input_tokens
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [i.type for i in items] == ["message", "message", "message"]
    assert items[0].content[0].text == "My name is Zed." and items[1].role == "assistant"
    assert items[2].content[0].text == "What is my name?"
    # Streamed, the chain goes on (the stored response is there as soon as response.completed arrives).
    with client.responses.stream(model=MODEL, input="Is that right? Answer yes or no.", previous_response_id=second.id,
                                 text={"format": YES_NO}, max_output_tokens=40, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and json.loads(final.output_text)["answer"] in ("yes", "no")
    third = client.responses.retrieve(final.id)
    assert third.previous_response_id == second.id and third.output_text == final.output_text
    assert len(list(client.responses.input_items.list(final.id))) == 5
    # store: false keeps nothing.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(alone.id)


def test_unknown_ids_are_openai_errors(daemon: Daemon) -> None:
    client = daemon.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_nosuch", max_output_tokens=1)
    assert e.value.body["code"] == "previous_response_not_found" and "resp_nosuch" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.retrieve("resp_nosuch")
    assert nf.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "x"}])
    assert bad.value.body["message"].startswith("input.0.type")


def test_a_forced_tool_choice_produces_a_function_call_item(daemon: Daemon) -> None:
    client = daemon.client()
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[TOOL],
                                    tool_choice=choice, max_output_tokens=60, temperature=0)  # type: ignore[arg-type]
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather" and r.status == "completed", r.output
        assert isinstance(json.loads(calls[0].arguments)["city"], str) and calls[0].call_id
    # Streamed: one function_call item, its arguments as deltas.
    events = list(client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[TOOL], tool_choice="required",
                                          max_output_tokens=60, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    final = events[-1].response
    assert [o.type for o in final.output] == ["function_call"] and final.output[0].name == "get_weather"
    # The tool's answer goes back as a function_call_output item, chained to the call.
    after = client.responses.create(model=MODEL, previous_response_id=final.id, max_output_tokens=3, input=[
        {"type": "function_call_output", "call_id": final.output[0].call_id, "output": "sunny, 21 C"}])
    assert after.status in ("completed", "incomplete") and after.previous_response_id == final.id


def test_a_variants_num_predict_bounds_a_response_without_max_output_tokens(daemon: Daemon) -> None:
    ollama.Client(host=daemon.base).create(model="brief", from_=MODEL, parameters={"num_predict": 5})
    r = daemon.client().responses.create(model="brief", input="Once upon a time", temperature=0)
    assert r.model == "brief" and r.usage is not None and 0 < r.usage.output_tokens <= 5
    assert r.status == "incomplete" and r.incomplete_details is not None


def test_best_of_cascades_and_sessions_apply_as_for_chat(daemon: Daemon) -> None:
    client = daemon.client()
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Is water wet? Answer yes or no.", text={"format": YES_NO}, max_output_tokens=40,
        temperature=0, extra_headers={"X-Blazar-Best-Of": "2"})  # greedy: a random seed may pad JSON to the cap
    assert raw.headers["x-blazar-best-of"].startswith("asked=2")
    best = raw.parse()
    assert best.status == "completed" and json.loads(best.output_text)["answer"] in ("yes", "no")
    assert client.responses.retrieve(best.id).output_text == best.output_text
    trace = raw.headers["x-blazar-trace-id"]
    wait_for(lambda: any(e["trace_id"] == trace for e in daemon.events("request.best_of_chosen")), "best-of chosen",
             timeout=20)
    raw = client.responses.with_raw_response.create(model=MODEL, input="Hi", max_output_tokens=2,
                                                    extra_body={"cascade": [MODEL, MODEL]})
    assert raw.headers["x-blazar-cascade"] and raw.parse().model == MODEL
    with pytest.raises(openai.BadRequestError) as e:  # as for chat: best-of only for an answer read whole
        client.responses.create(model=MODEL, input="Hi", stream=True, extra_headers={"X-Blazar-Best-Of": "2"})
    assert "X-Blazar-Best-Of" in e.value.body["message"]
    raw = client.responses.with_raw_response.create(model=MODEL, input="Hello", max_output_tokens=2,
                                                    extra_headers={"X-Blazar-Session": "resp-1"})
    trace = raw.headers["x-blazar-trace-id"]
    received = wait_for(lambda: next((e["data"] for e in daemon.events("request.received")
                                      if e["trace_id"] == trace), None), "received", timeout=20)
    assert received["session"] == "resp-1" and received["route"] == "/v1/responses"


def test_the_agents_sdk_runs_an_agent_on_the_responses_model(daemon: Daemon) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from pydantic import BaseModel

    set_tracing_disabled(True)  # nothing leaves the machine
    model = OpenAIResponsesModel(model=MODEL, openai_client=daemon.aclient())

    class Verdict(BaseModel):  # a finite answer: the base model ends it (the Agents SDK refuses a cut one)
        answer: Literal["yes", "no"]

    plain = Agent(name="plain", instructions="Answer yes or no.", model=model, output_type=Verdict,
                  model_settings=ModelSettings(max_tokens=40, temperature=0))

    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    tooled = Agent(name="tooled", instructions="Use the tool.", model=model, tools=[get_weather],
                   model_settings=ModelSettings(tool_choice="required", max_tokens=60, temperature=0),
                   tool_use_behavior="stop_on_first_tool")

    async def run() -> tuple[Any, Any, Any, list[str]]:  # one event loop: the client's connections belong to it
        streamed = Runner.run_streamed(plain, "Is grass green? Answer yes or no.")
        kinds = [e.data.type async for e in streamed.stream_events() if e.type == "raw_response_event"]
        return (await Runner.run(plain, "Is the sky blue? Answer yes or no."),
                await Runner.run(tooled, "What is the weather in Rome?"), streamed, kinds)

    answered, called, streamed, kinds = asyncio.run(run())
    assert isinstance(answered.final_output, Verdict) and isinstance(streamed.final_output, Verdict)
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert len(asked) == 1 and called.final_output == f"sunny in {asked[0]}"


def test_another_key_gets_404_for_a_keys_response(daemon: Daemon) -> None:
    # Last in this module: once a key exists, every request needs one.
    secrets = {n: json.loads(blazar_cli(daemon.home, "keys", "create", n, "--json").stdout)["secret"]
               for n in ("alice", "mallory")}
    wait_for(lambda: httpx2.get(f"{daemon.base}/v1/models", trust_env=False,
                                headers={"Authorization": f"Bearer {secrets['alice']}"}).status_code == 200,
             "keys on", timeout=20)
    alice, mallory = daemon.client(secrets["alice"]), daemon.client(secrets["mallory"])
    r = alice.responses.create(model=MODEL, input="Alice's private words", max_output_tokens=2)
    assert alice.responses.retrieve(r.id).id == r.id
    for ask in (lambda: mallory.responses.retrieve(r.id), lambda: mallory.responses.input_items.list(r.id),
                lambda: mallory.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError):
            ask()
    with pytest.raises(openai.BadRequestError):
        mallory.responses.create(model=MODEL, input="x", previous_response_id=r.id, max_output_tokens=1)
    assert daemon.stored(r.id)["tenant"] == "key:alice"
    alice.responses.delete(r.id)


def _store_bytes(home: Path) -> bytes:
    """The content store's file and its WAL and shared memory, as they are on disk."""
    return b"".join(p.read_bytes() for p in sorted(home.glob("responses.db*")))

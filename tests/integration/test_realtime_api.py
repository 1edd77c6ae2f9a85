"""The Realtime API's text sessions end to end: the official `openai` SDK's realtime client (`realtime.connect`, over
a WebSocket) against `blazar serve` with the real llama-server and Gemma 3 270M, keys on. The demo model is a base
model, so these assert the protocol (events, their order, usage, the log), never the words."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import jsonschema
import openai
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin, Subprotocol

from tests.support import sdk_daemons
from tests.support.blazar_home import read_events
from tests.support.bounds import HANG_S
from tests.support.daemon import wait_for
from tests.support.realtime_client import until
from tests.support.sdk_daemons import MODEL, OpenAIDaemon
from tests.support.serving import blazar_cli

daemon = sdk_daemons.openai_daemon  # the module-scoped real daemon


@pytest.fixture(scope="module")
def secrets(daemon: OpenAIDaemon) -> dict[str, str]:
    made = {}
    for name, args in (("talker", ()), ("narrow", ("--models", "other*"))):
        out = blazar_cli(daemon.home, "keys", "create", name, *args, "--json").stdout
        made[name] = json.loads(out)["secret"]
    return made


def client(daemon: OpenAIDaemon, secret: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{daemon.base}/v1", api_key=secret, max_retries=0, timeout=120)


def realtime_traces(home: Path) -> list[str]:
    return [e["trace_id"] for e in read_events(home, "request.received") if e["data"]["route"] == "/v1/realtime"]


async def test_a_text_session_answers_with_deltas_that_make_the_done_text_and_usage(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    async with client(daemon, secrets["talker"]).realtime.connect(model=MODEL) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.model == MODEL
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "instructions": "Answer briefly.", "max_output_tokens": 12})
        assert (await conn.recv()).type == "session.updated"
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Name a color."}]})
        assert [e.type for e in await until(conn, "conversation.item.done")] == ["conversation.item.added",
                                                                                 "conversation.item.done"]
        await conn.response.create()
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert types[0] == "response.created" and "response.output_text.delta" in types
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    text_done = next(e for e in events if e.type == "response.output_text.done")
    done = events[-1].response
    assert deltas == text_done.text and done.status == "completed"
    assert done.output[0].content[0].text == deltas
    assert done.usage.input_tokens > 0 and 0 < done.usage.output_tokens <= 12
    await asyncio.to_thread(charged_to_the_key, daemon)


def charged_to_the_key(daemon: OpenAIDaemon) -> None:
    """The response was a chat of the key's through the pipeline: in the log as the key's own request."""
    trace = realtime_traces(daemon.home)[-1]
    assert daemon.wait_trace(trace, "request.completed")[:2] == ["request.received", "request.routed"]
    completed = next(e for e in daemon.events("request.completed") if e["trace_id"] == trace)
    assert completed["actor"] == "key:talker"


async def test_response_cancel_ends_cancelled_and_leaves_no_request_running(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    async with client(daemon, secrets["talker"]).realtime.connect(model=MODEL) as conn:
        await conn.recv()
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Count from 1 to 2000: 1, 2, 3, 4, 5, 6, 7,"}]})
        await until(conn, "conversation.item.done")
        await conn.response.create(response={"max_output_tokens": 3000})
        await until(conn, "response.output_text.delta")
        await conn.response.cancel()
        done = (await until(conn, "response.done"))[-1].response
        assert done.status == "cancelled" and done.status_details.type == "cancelled"
    await asyncio.to_thread(ended_once, daemon)


def ended_once(daemon: OpenAIDaemon) -> None:
    trace = realtime_traces(daemon.home)[-1]
    # The engine request was ended, not left generating: the trace has its one terminal event, and the slot is free
    # for the next response at once.
    ends = ("request.completed", "request.failed")
    wait_for(lambda: any(t in ends for t in daemon.trace(trace)), f"the end of {trace}")
    ended = [e for e in daemon.events(*ends) if e["trace_id"] == trace]
    assert len(ended) == 1 and (ended[0]["data"].get("completion_tokens") or 0) < 3000, ended


async def test_a_key_without_scope_for_the_model_is_refused_at_connect(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    async with client(daemon, secrets["narrow"]).realtime.connect(model=MODEL) as conn:
        refused = await conn.recv()
        assert refused.type == "error" and refused.error.code == "model_not_allowed"
        with pytest.raises(ConnectionClosed) as closed:
            await conn.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_no_key_and_an_unknown_model_are_refused_with_an_error_event(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    for secret, model, code in (("sk-nonsense", MODEL, "invalid_api_key"), (secrets["talker"], "nope", None)):
        async with client(daemon, secret).realtime.connect(model=model) as conn:
            refused = await conn.recv()
            assert refused.type == "error", refused
            assert code is None or refused.error.code == code, refused.error
            with pytest.raises(ConnectionClosed):
                await conn.recv()


async def test_bad_and_audio_events_are_errors_with_their_codes_and_the_session_goes_on(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    async with client(daemon, secrets["talker"]).realtime.connect(model=MODEL) as conn:
        await conn.recv()
        await conn.input_audio_buffer.append(audio="AAAA")
        assert (await conn.recv()).error.code == "audio_not_supported"
        await conn.send({"type": "conversation.item.delete", "item_id": "item_missing"})  # type: ignore[arg-type]
        assert (await conn.recv()).error.code == "item_not_found"
        await conn.session.update(session={"type": "realtime", "temperature": 7})
        assert (await conn.recv()).error.code == "invalid_value"
        await conn.session.update(session={"type": "realtime", "instructions": "Be kind."})
        assert (await conn.recv()).type == "session.updated"


# -- part T (tools): a function call round trip through the SDK's realtime client on the real Gemma

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


async def test_a_tool_call_round_trip_a_call_item_then_its_output_continues_the_answer(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    before = len(await asyncio.to_thread(realtime_traces, daemon.home))
    async with client(daemon, secrets["talker"]).realtime.connect(model=MODEL) as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER],
                                           "tool_choice": {"type": "function", "name": "get_weather"},
                                           "max_output_tokens": 80, "temperature": 0})
        updated = await conn.recv()
        assert updated.type == "session.updated" and updated.session.tools[0].name == "get_weather"
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What is the weather in Paris?"}]})
        await until(conn, "conversation.item.done")
        await conn.response.create()
        events = await until(conn, "response.done")
        types = [e.type for e in events]
        assert types[:3] == ["response.created", "response.output_item.added", "conversation.item.added"], types
        assert types[-4:] == ["response.function_call_arguments.done", "response.output_item.done",
                              "conversation.item.done", "response.done"], types
        called = events[-1].response
        assert called.status == "completed" and len(called.output) == 1
        call = called.output[0]
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == call.arguments == events[-4].arguments
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        # The client runs the function and sends its result; the next response sees the call and the result.
        await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                  "output": '{"temperature_c": 18}'})
        added = await until(conn, "conversation.item.done")
        assert added[-1].item.type == "function_call_output" and added[-1].item.call_id == call.call_id
        await conn.response.create(response={"tool_choice": "none", "max_output_tokens": 8})
        answered = (await until(conn, "response.done"))[-1].response
    assert answered.status == "completed" and answered.output[0].type == "message"
    assert answered.usage.input_tokens > called.usage.input_tokens  # the call and its result were in the prompt
    await asyncio.to_thread(the_call_was_forced_and_made, daemon, before)


def the_call_was_forced_and_made(daemon: OpenAIDaemon, before: int) -> None:
    """In the log: the first chat's request made the forced call (the engine's grammar), the second was a chat of
    the key's as any other."""
    first, second = wait_for(lambda: (t := realtime_traces(daemon.home)[before:]) and len(t) == 2 and t,
                             "the session's two chats")
    daemon.wait_trace(second, "request.completed")  # the first ended before the second began
    completed = {e["trace_id"]: e["data"] for e in daemon.events("request.completed")}
    assert completed[first]["forced_call"] == "made"
    assert completed[second].get("forced_call") is None


# -- part W (trace): each turn one `realtime.turn` in the log, `blazar why TURN`, the queue event, charging on drop --

def turn_of(daemon: OpenAIDaemon, response_id: str) -> dict[str, Any]:
    """The `realtime.turn` event of the response (group-committed: waited for)."""
    return wait_for(lambda: next((e for e in daemon.events("realtime.turn")
                                  if e["data"]["response_id"] == response_id), None), f"the turn of {response_id}")


async def ask(conn: Any, text: str, tokens: int) -> list[Any]:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})
    await until(conn, "conversation.item.done")
    await conn.response.create(response={"max_output_tokens": tokens})
    return await until(conn, "response.done")


async def test_a_response_is_one_turn_in_the_log_that_blazar_why_tells_with_its_chat(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    async with client(daemon, secrets["talker"]).realtime.connect(model=MODEL) as conn:
        session = (await conn.recv()).session
        done = (await ask(conn, "Name a fruit.", 8))[-1].response
    await asyncio.to_thread(told_by_why, daemon, done, session.id)


def told_by_why(daemon: OpenAIDaemon, done: Any, session_id: str) -> None:
    turn = turn_of(daemon, done.id)
    data = turn["data"]
    assert turn["actor"] == "key:talker" and data["session_id"] == session_id and data["status"] == "completed"
    chat = data["chat"]["trace_id"]
    assert chat in realtime_traces(daemon.home) and chat != turn["trace_id"]
    assert data["chat"]["tokens_out"] == done.usage.output_tokens and data["chat"]["first_ms"] > 0
    told = json.loads(blazar_cli(daemon.home, "why", turn["trace_id"], "--json").stdout)
    assert told["trace_id"] == turn["trace_id"] and told["route"] == "/v1/realtime"
    assert told["verdict"].startswith("completed in ") and "first token" in told["verdict"]
    assert told["turn"]["parts"]["chat"]["trace_id"] == chat and told["turn"]["parts"]["chat"]["outcome"] == "completed"
    assert chat in next(s["text"] for s in told["steps"] if s["type"] == "realtime.chat")


async def test_a_response_waiting_for_a_slot_is_told_its_place_in_the_queue(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    api = client(daemon, secrets["talker"])
    held = []
    try:
        for _ in range(sdk_daemons.SLOTS):  # every slot busy: each stream's first chunk came, and it goes on
            stream = await api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tell a long story"}], max_tokens=4000,
                stream=True, extra_body={"ignore_eos": True})
            held.append(stream)
            await anext(aiter(stream))
        async with api.realtime.connect(model=MODEL) as conn:
            await conn.recv()
            await conn.response.create(response={"max_output_tokens": 4})
            queued = (await until(conn, "blazar.response.queued"))[-1]
            assert queued.position == 1 and queued.depth >= 1  # type: ignore[attr-defined]
            for stream in held:  # the slots come free: the response is served
                await stream.close()
            held.clear()
            done = (await until(conn, "response.done"))[-1].response
        assert done.status == "completed" and queued.response_id == done.id  # type: ignore[attr-defined]
    finally:
        for stream in held:
            await stream.close()
    turn = await asyncio.to_thread(turn_of, daemon, done.id)
    assert turn["data"]["chat"]["queue_position"] == 1


async def test_a_dropped_connection_charges_the_tokens_sent_and_records_its_turn_cancelled(
        daemon: OpenAIDaemon) -> None:
    made = await asyncio.to_thread(blazar_cli, daemon.home, "keys", "create", "dropper", "--json")
    secret = json.loads(made.stdout)["secret"]
    async with client(daemon, secret).realtime.connect(model=MODEL) as conn:
        await conn.recv()
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Count from 1 to 2000: 1, 2, 3, 4, 5, 6, 7,"}]})
        await until(conn, "conversation.item.done")
        await conn.response.create(response={"max_output_tokens": 3000})
        created = (await until(conn, "response.created"))[-1].response
        for _ in range(3):
            await until(conn, "response.output_text.delta")
    # the socket closed mid-answer: the session cancels the response, its chat ends with what it had sent
    await asyncio.to_thread(charged_and_cancelled, daemon, created.id)


def charged_and_cancelled(daemon: OpenAIDaemon, response_id: str) -> None:
    turn = turn_of(daemon, response_id)
    assert turn["data"]["status"] == "cancelled" and turn["actor"] == "key:dropper"
    chat = turn["data"]["chat"]["trace_id"]
    failed = daemon.wait_trace(chat, "request.failed") and next(
        e for e in daemon.events("request.failed") if e["trace_id"] == chat)
    sent = failed["data"]["completion_tokens"]
    assert failed["actor"] == "key:dropper" and 3 <= sent < 3000
    assert json.loads(blazar_cli(daemon.home, "keys", "show", "dropper", "--json").stdout)["tokens_today"] == sent


async def test_a_browser_sends_its_key_as_a_subprotocol_from_the_console_origin(
        daemon: OpenAIDaemon, secrets: dict[str, str]) -> None:
    """As a page does (a browser cannot set headers on a WebSocket): `new WebSocket(url, ["realtime",
    "openai-insecure-api-key.KEY"])` from the daemon's own origin (the console's); answered `realtime`."""
    url = f"{daemon.base.replace('http://', 'ws://')}/v1/realtime?model={MODEL}"
    origin = cast(Origin, daemon.base)
    offered = [cast(Subprotocol, p) for p in ("realtime", f"openai-insecure-api-key.{secrets['talker']}")]
    async with asyncio.timeout(HANG_S), ws_connect(url, subprotocols=offered, origin=origin, proxy=None) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(await ws.recv())["type"] == "session.created"
    wrong = [cast(Subprotocol, p) for p in ("realtime", "openai-insecure-api-key.blz_wrong-wrong-wrong-wrong")]
    async with asyncio.timeout(HANG_S), ws_connect(url, subprotocols=wrong, origin=origin, proxy=None) as ws:
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_api_key"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008

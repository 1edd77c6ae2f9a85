"""A Responses body as the one chat Request (blazar/serving/conversations.py): the history a previous_response_id
names goes before the input, per tenant; a forced tool choice is the chat path's; the answer is rendered and kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blazar.errors import Refused
from blazar.events.responses import ResponseStored
from blazar.serving.conversations import Conversations, responses_request
from blazar.serving.request import Request
from blazar.store.responses import ResponseStore
from tests.support.gbnf import parse

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}


class FakeCall:
    def __init__(self, request: Request) -> None:
        self.request, self.model, self.name, self.trace_id = request, request.model, "gemma", "t1"
        self.emitted: list[Any] = []

    def emit(self, event: Any) -> None:
        self.emitted.append(event)


@pytest.fixture
def conversations(tmp_path: Path) -> Conversations:
    return Conversations(None, ResponseStore(tmp_path / "responses.db", lambda: 3600.0))  # type: ignore[arg-type]


def _answer(text: str) -> dict[str, Any]:
    return {"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


def test_a_response_is_kept_and_continued_by_its_tenant_only(conversations: Conversations) -> None:
    first = responses_request({"model": "m", "input": "One", "instructions": "Old."}, conversations,
                              tenant="key:alice")
    assert first.engine_path == "/v1/chat/completions" and first.forced is None and first.hooks.reply is not None
    call = FakeCall(first)
    response = first.hooks.reply(_answer("Two"), call)  # type: ignore[arg-type]
    (stored,) = call.emitted
    assert isinstance(stored, ResponseStored) and stored.response_id == response["id"]
    assert (stored.tenant, stored.input_items, stored.output_items, stored.input_tokens) == ("key:alice", 1, 1, 5)

    second = responses_request({"model": "m", "input": "Three", "previous_response_id": response["id"]},
                               conversations, tenant="key:alice")
    assert second.body is not None and second.body["messages"] == [
        {"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
        {"role": "user", "content": "Three"}]  # the earlier instructions are not carried over
    with pytest.raises(Refused) as e:
        responses_request({"model": "m", "input": "x", "previous_response_id": response["id"]}, conversations,
                          tenant="key:mallory")
    assert (e.value.http_status, e.value.reason) == (400, "previous_response_not_found")


def test_store_false_keeps_nothing(conversations: Conversations) -> None:
    request = responses_request({"model": "m", "input": "x", "store": False}, conversations, tenant=None)
    call = FakeCall(request)
    response = request.hooks.reply(_answer("y"), call)  # type: ignore[arg-type, misc]
    assert call.emitted == [] and conversations.store.get(None, response["id"]) is None


def test_a_forced_tool_choice_is_the_chat_paths_and_outranks_a_text_format(conversations: Conversations) -> None:
    request = responses_request({"model": "m", "input": "x", "tools": [TOOL], "tool_choice": "required",
                                 "text": {"format": {"type": "json_object"}}}, conversations, tenant=None)
    assert request.forced is not None and request.forced.names == ["f"]
    assert request.body is not None and request.body["tool_choice"] == "none"
    # The call's grammar, not the text format's (any object): a call to f, compact.
    assert "response_format" not in request.body
    assert parse(request.body["grammar"]).accepts('{"name":"f","arguments":{}}')

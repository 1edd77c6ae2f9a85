"""Each translating dialect's body model (what the OpenAPI document shows, and what validates a request first) names
exactly the fields its translator reads: driven with a body that records every key asked of it, the translator asks
for no field the model lacks, and every field of the model is read or is one the dialect declares it ignores. OpenAI's
bodies, which pass through to the engine, in one direction: every field Blazar reads is documented."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from pydantic import BaseModel

from blazar.api import openai as openai_api
from blazar.dialects import anthropic, ollama, responses
from blazar.dialects.anthropic_body import CountBody, MessagesBody
from blazar.dialects.errors import DialectError
from blazar.dialects.ollama_body import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest
from blazar.dialects.responses_body import ResponsesBody

HELLO = [{"role": "user", "content": "hi"}]


class Reads(dict[str, Any]):
    """A body that remembers every top-level key the translator asked for (get, [], in)."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def _fields(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


CASES: list[tuple[str, Callable[[dict[str, Any]], Any], type[BaseModel], list[dict[str, Any]], frozenset[str]]] = [
    ("anthropic messages", anthropic.to_openai, MessagesBody,
     [{"model": "m", "max_tokens": 8, "messages": HELLO}], frozenset(anthropic._IGNORED)),
    ("ollama chat", ollama.chat_request, ChatRequest, [{"model": "m", "messages": HELLO}], frozenset()),
    ("ollama generate", ollama.generate_request, GenerateRequest,
     [{"model": "m", "prompt": "hi"}, {"model": "m", "prompt": "hi", "raw": True}], frozenset()),
    ("ollama embed", ollama.embed_request, EmbedRequest, [{"model": "m", "input": "hi"}], frozenset()),
    ("ollama embeddings", ollama.embeddings_request, EmbeddingsRequest, [{"model": "m", "prompt": "hi"}],
     frozenset()),
    ("responses", responses.read, ResponsesBody, [{"model": "m", "input": "hi"}], frozenset()),
]


@pytest.mark.parametrize(("name", "translate", "model", "bodies", "ignored"), CASES, ids=[c[0] for c in CASES])
def test_the_documented_fields_are_the_fields_the_dialect_reads(
        monkeypatch: pytest.MonkeyPatch, name: str, translate: Callable[[dict[str, Any]], Any],
        model: type[BaseModel], bodies: list[dict[str, Any]], ignored: frozenset[str]) -> None:
    read: set[str] = set()
    for body in bodies:
        model.model_validate(body)  # a body the model accepts...
        for module in (anthropic, ollama, responses):  # ...read by the translator alone, not by the model too
            monkeypatch.setattr(module, "checked", lambda m, b: None)
        seen = Reads(body)
        translate(seen)
        monkeypatch.undo()
        read |= seen.read
    assert read - _fields(model) == set(), f"{name}: read but not documented"
    assert _fields(model) - read - ignored == set(), f"{name}: documented but never read (nor declared ignored)"
    assert ignored <= _fields(model), f"{name}: ignored but not documented"


def test_count_tokens_takes_a_messages_body_without_max_tokens() -> None:
    assert _fields(CountBody) == _fields(MessagesBody)
    assert CountBody.model_validate({"model": "m", "messages": HELLO}).max_tokens == 1
    assert MessagesBody.model_json_schema()["required"] == ["model", "max_tokens", "messages"]


@pytest.mark.parametrize(("translate", "body", "field"), [
    (anthropic.to_openai, {"model": "m", "max_tokens": "8", "messages": HELLO}, "max_tokens"),
    (anthropic.to_openai, {"model": "m", "max_tokens": 8, "messages": HELLO, "top_p": "x"}, "top_p"),
    (ollama.chat_request, {"model": "m", "messages": HELLO, "stream": "no"}, "stream"),
    (ollama.generate_request, {"model": "m", "prompt": 5}, "prompt"),
    (ollama.embed_request, {"model": "m", "input": [1, 2]}, "input"),
    (responses.read, {"model": "m", "input": "hi", "metadata": {"a": 1}}, "metadata"),
    (responses.read, {"model": "m", "input": "hi", "store": "yes"}, "store"),
])
def test_a_wrong_type_is_a_dialect_error_naming_the_field(translate: Callable[[dict[str, Any]], Any],
                                                          body: dict[str, Any], field: str) -> None:
    with pytest.raises(DialectError) as caught:
        translate(body)
    assert caught.value.message.startswith(f"{field}: "), caught.value.message


@pytest.mark.parametrize(("translate", "body"), [
    (anthropic.to_openai, {"model": "m", "max_tokens": 8, "messages": HELLO, "betas": ["x"], "anything": {"a": 1}}),
    (ollama.chat_request, {"model": "m", "messages": HELLO, "unknown": 1}),
    (responses.read, {"model": "m", "input": "hi", "reasoning": {"effort": "low"}, "user": "u"}),
])
def test_unknown_top_level_fields_are_still_accepted_and_ignored(translate: Callable[[dict[str, Any]], Any],
                                                                 body: dict[str, Any]) -> None:
    translate(body)


class _Watched:
    """A validated body that remembers which of its fields the resource used."""

    def __init__(self, body: BaseModel, used: set[str]) -> None:
        self._body, self._used = body, used

    def __getattr__(self, name: str) -> Any:
        self._used.add(name)
        return getattr(self._body, name)


@pytest.mark.parametrize(("route", "model", "body"), [
    (openai_api.ChatCompletions, "ChatBody", {"model": "m", "messages": HELLO, "tool_choice": "auto",
                                              "tools": [{"type": "function", "function": {"name": "f"}}],
                                              "response_format": {"type": "text"}}),
    (openai_api.Completions, "CompletionBody", {"model": "m", "prompt": "hi", "response_format": {"type": "text"}}),
    (openai_api.Embeddings, "EmbeddingBody", {"model": "m", "input": "hi"}),
])
def test_every_openai_field_blazar_reads_is_documented(monkeypatch: pytest.MonkeyPatch, route: type[Any], model: str,
                                                       body: dict[str, Any]) -> None:
    """OpenAI's bodies pass through to the engine, which reads what Blazar does not, so only one direction holds:
    every field the resource reads (from the body or its validated model) is one its model documents."""
    real: type[BaseModel] = getattr(openai_api, model)
    used: set[str] = set()

    class Recording:
        @staticmethod
        def model_validate(data: dict[str, Any]) -> _Watched:
            return _Watched(real.model_validate(dict(data)), used)

    monkeypatch.setattr(openai_api, model, Recording)
    seen = Reads(body)
    route(cast(Any, None)).ask(seen)
    assert seen.read | used, "nothing was read"
    assert (seen.read | used) - _fields(real) == set(), f"{model}: read but not documented"

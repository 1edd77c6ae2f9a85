"""Blazar's compact JSON-schema grammar (blazar/dialects/grammar.py) on the real engine and the real Gemma, started
directly (no Blazar around it): the engine takes each grammar, and what the model writes under it, sampled hot with
fixed seeds, is JSON that follows the schema with no whitespace outside its strings; a forced call costs fewer tokens
under it than under the engine's own conversion of the same schema."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import jsonschema
import pytest

from blazar.dialects.grammar import schema_grammar
from blazar.dialects.tools import force
from tests.support.daemon import free_port, healthy, wait_for

SEEDS = (11, 22, 33)
N_PREDICT = 64

SCHEMAS: dict[str, dict[str, Any]] = {
    "forced-call": {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                       "units": {"enum": ["metric", "imperial"]}},
                      "required": ["city"], "additionalProperties": False}},
        "required": ["name", "arguments"]},
    "all-optional": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 24}, "done": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}}},
    "enum-nested": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "object", "properties": {"w": {"type": "integer"}, "h": {"type": "integer"}},
                 "required": ["w", "h"]}}, "required": ["color", "size"]},
    "array-bounds": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    "any-of": {"anyOf": [
        {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"]},
        {"type": "object", "properties": {"error": {"type": "string", "maxLength": 30}}, "required": ["error"]}]},
    "ref-recursion": {"$defs": {"Node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/Node"},
    "extra-properties": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                         "additionalProperties": {"type": "string", "maxLength": 12}},
    "nullable-types": {"type": "object", "properties": {
        "note": {"type": ["string", "null"], "maxLength": 16}, "score": {"type": "number", "nullable": True}},
        "required": ["note", "score"]},
    "all-of-defs": {"definitions": {"Id": {"type": "object", "properties": {"id": {"type": "integer"}},
                                           "required": ["id"]}},
                    "allOf": [{"$ref": "#/definitions/Id"},
                              {"properties": {"label": {"type": "string", "maxLength": 12}}}]},
}
# What validates an answer: the schema as JSON Schema reads it (OpenAPI's `nullable` spelled as a type list).
VALIDATE = {**SCHEMAS, "nullable-types": {"type": "object", "properties": {
    "note": {"type": ["string", "null"], "maxLength": 16}, "score": {"type": ["number", "null"]}},
    "required": ["note", "score"]}}

# One JSON token: a string (any escape), a number, a literal, a punctuation mark.
_TOKEN = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"?|-?[0-9][0-9.eE+-]*|-|true|false|null|'
                    r"[{}\[\],:]|[tfn][a-z]*")


def compact_redump(text: str) -> str:
    """`text`'s JSON tokens with nothing between them (a prefix of JSON too): `text` itself when it has no
    whitespace outside its strings."""
    out, pos = [], 0
    while pos < len(text):
        if text[pos] in " \t\r\n":
            pos += 1
            continue
        m = _TOKEN.match(text, pos)
        assert m is not None, f"not JSON at {pos}: {text!r}"
        out.append(m.group())
        pos = m.end()
    return "".join(out)


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"a repeated key in {keys}"
    return dict(pairs)


@pytest.fixture(scope="module")
def engine(engine_binary: Path, gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server on the demo model, on a free loopback port: its base URL. One thread: on a machine busier than
    its cores, threads that wait on each other make every token many times slower."""
    port = free_port()
    log = tmp_path_factory.mktemp("compact-grammar") / "llama-server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(engine_binary), "-m", str(gemma_path), "--host", "127.0.0.1", "--port", str(port),
                                 "-c", "2048", "-np", "1", "-t", "1", "--no-webui"], stdout=sink, stderr=sink)
    try:
        try:
            wait_for(lambda: healthy(port), "llama-server's /health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-4000:]}") from None
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def post(engine: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx2.post(f"{engine}{path}", json=body, timeout=300, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_what_the_model_writes_under_the_compact_grammar_is_compact_json_that_follows_the_schema(
        engine: str, name: str) -> None:
    grammar = schema_grammar(SCHEMAS[name])
    finished = 0
    for seed in SEEDS:
        got = post(engine, "/completion", {"prompt": "A JSON value:\n", "grammar": grammar, "n_predict": N_PREDICT,
                                           "temperature": 1.0, "seed": seed, "cache_prompt": False})
        text = got["content"]
        assert compact_redump(text) == text, f"whitespace outside strings (seed {seed}): {text!r}"
        if got["stop_type"] != "eos":  # cut at n_predict: a compact prefix, no more to check
            continue
        finished += 1
        value = json.loads(text, object_pairs_hook=no_duplicate_keys)
        jsonschema.validate(value, VALIDATE[name])
    assert finished, f"no sample of {name} ended before {N_PREDICT} tokens"


def test_a_forced_call_costs_fewer_tokens_under_the_compact_grammar(engine: str) -> None:
    """The same forced call, the same seeds: the body Blazar sends (its grammar) against the same schema left to the
    engine's own conversion (`response_format`, what Blazar sent before)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": SCHEMAS["forced-call"]["properties"]["arguments"]}}]
    compact_tokens, padded_tokens = [], []
    for seed in (1, 2, 3, 4):
        body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": tools,
                "tool_choice": "required", "max_tokens": 200, "temperature": 1.0, "seed": seed, "cache_prompt": False}
        compact = copy.deepcopy(body)
        force(compact)
        padded = {k: v for k, v in compact.items() if k != "grammar"}
        padded["response_format"] = {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": {
            "type": "object", "properties": {"name": {"const": "get_weather"},
                                             "arguments": tools[0]["function"]["parameters"]},
            "required": ["name", "arguments"]}}}
        for sent, tokens in ((compact, compact_tokens), (padded, padded_tokens)):
            answer = post(engine, "/v1/chat/completions", sent)
            choice = answer["choices"][0]
            text = choice["message"]["content"]
            assert choice["finish_reason"] == "stop" and json.loads(text)["name"] == "get_weather", choice
            assert sent is padded or compact_redump(text) == text
            tokens.append(answer["usage"]["completion_tokens"])
    assert sum(compact_tokens) < sum(padded_tokens), (compact_tokens, padded_tokens)

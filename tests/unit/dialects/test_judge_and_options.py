"""Best-of-N's and cascades' judgement (validity first, then the mean token logprob: a schema-invalid candidate never
wins), single-flight's notion of identical and deterministic, and the X-Blazar-* request options."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from blazar.dialects.judge import judge, mean_logprob, schema_of, winner
from blazar.errors import DialectError
from blazar.serving.call import Call, Desk
from blazar.serving.flights import deterministic, flight_key
from blazar.serving.request import Request
from blazar.serving.route import Route
from tests.support.resolved import resolved

SCHEMA = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}


def answer(content: str, finish: str = "stop", logprobs: list[float] | None = None, tokens: int = 5) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content},
                              "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": "x", "logprob": lp} for lp in logprobs]}
    return {"choices": [choice], "usage": {"completion_tokens": tokens, "prompt_tokens": 3}}


def test_a_schema_invalid_candidate_never_wins_however_confident() -> None:
    bad = judge(answer('{"shade": "blue"}', logprobs=[-0.01, -0.02]), SCHEMA)
    good = judge(answer('{"colour": "blue"}', logprobs=[-3.0, -4.0]), SCHEMA)
    assert not bad.valid and "does not follow the schema" in (bad.reason or "")
    assert good.valid and good.mean_logprob == pytest.approx(-3.5)
    index, why = winner([bad, good])
    assert index == 1 and why.startswith("the only valid one")


def test_a_cut_off_answer_is_invalid_and_the_more_confident_valid_one_wins() -> None:
    cut = judge(answer('{"colour": "bl', finish="length", logprobs=[-0.1]), SCHEMA)
    assert not cut.valid and cut.reason == "cut off at max_tokens"
    a = judge(answer('{"colour": "blue"}', logprobs=[-1.0]), SCHEMA)
    b = judge(answer('{"colour": "green"}', logprobs=[-0.5]), SCHEMA)
    index, why = winner([cut, a, b])
    assert index == 2 and "the most confident" in why


def test_with_no_valid_candidate_the_most_confident_is_chosen_and_said_so() -> None:
    index, why = winner([judge(answer("x", finish="length", logprobs=[-2.0]), None),
                         judge(answer("y", finish="length", logprobs=[-1.0]), None)])
    assert index == 1 and why.startswith("no candidate was valid")


def test_schema_of_reads_response_format_and_json_object() -> None:
    assert schema_of({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}) == SCHEMA
    assert schema_of({"response_format": {"type": "json_object"}}) == {"type": "object"}
    assert schema_of({"messages": []}) is None
    assert not judge(answer("not json"), {"type": "object"}).valid


def test_tool_call_arguments_must_be_json_and_logprobs_are_averaged() -> None:
    a = answer("", finish="tool_calls")
    a["choices"][0]["message"]["tool_calls"] = [{"function": {"name": "f", "arguments": "{oops"}}]
    assert judge(a, None).reason == "a tool call's arguments are not JSON"
    assert mean_logprob({"logprobs": {"content": [{"logprob": -1}, {"logprob": -3}]}}) == -2
    assert mean_logprob({}) is None


# -- single-flight's key -----------------------------------------------------------------------------------------------

def _plan(*, session: str | None = None, best_of: int | None = None, **body: Any) -> Call:
    parsed = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    call = Call(Request(model="m", engine_path="/v1/chat/completions", body=None, stream=False,
                        path="/v1/chat/completions", parsed=parsed, session=session, best_of=best_of),
                cast(Desk, object()))  # a key is read from what was asked: nothing is recorded
    call.take_route(Route("m", resolved("m")))
    return call


def test_only_deterministic_sampling_shares() -> None:
    assert deterministic({"temperature": 0}) and deterministic({"seed": 7})
    assert not deterministic({}) and not deterministic({"temperature": 0.7}) and not deterministic({"seed": -1})
    assert not deterministic({"temperature": False})


def test_identical_means_the_same_route_model_and_body() -> None:
    a, b = _plan(temperature=0), _plan(temperature=0)
    assert flight_key(a) == flight_key(b) is not None
    assert flight_key(_plan(temperature=0, max_tokens=9)) != flight_key(a)
    assert flight_key(_plan(temperature=0.5)) is None
    with_session = _plan(temperature=0, session="s")
    best = _plan(temperature=0, best_of=2)
    assert flight_key(with_session) is None and flight_key(best) is None


def test_a_responses_request_never_shares_as_each_response_is_its_own() -> None:
    a = _plan(temperature=0)
    responses = Call(replace(a.request, path="/v1/responses"), cast(Desk, object()))
    responses.resolved = resolved("m")
    assert flight_key(a) is not None and flight_key(responses) is None


# -- the request options -----------------------------------------------------------------------------------------------

class _Req:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = {k.lower(): v for k, v in headers.items()}

    def get_header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def _options(headers: dict[str, str] | None = None, body: dict[str, Any] | None = None, *, stream: bool = False,
             chat: bool = True, dialect: str = "openai") -> Any:
    from blazar.api.request_options import request_options

    return request_options(_Req(headers or {}), body or {}, stream=stream, chat=chat,  # type: ignore[arg-type]
                           dialect=dialect)


def test_headers_win_over_body_fields_and_anthropic_reads_its_metadata() -> None:
    o = _options({"X-Blazar-Session": "chat-1", "X-Blazar-Deadline-Ms": "2500"}, {"session": "other"})
    assert (o.session, o.deadline_ms) == ("chat-1", 2500)
    assert _options(body={"metadata": {"session": "m-1"}}, dialect="anthropic").session == "m-1"
    assert _options(body={"metadata": {"session": "m-1"}}).session is None  # OpenAI's metadata is its own
    o = _options({"X-Blazar-Cascade": "small, large"})
    assert o.cascade == ("small", "large")
    assert _options(body={"best_of": 3}).best_of == 3


@pytest.mark.parametrize(("headers", "body", "words"), [
    ({"X-Blazar-Session": "has space"}, {}, "X-Blazar-Session"),
    ({"X-Blazar-Session": "a/b"}, {}, "X-Blazar-Session"),
    ({}, {"session": "x" * 129}, "session"),
    ({"X-Blazar-Deadline-Ms": "0"}, {}, "from 1 to"),
    ({"X-Blazar-Deadline-Ms": "soon"}, {}, "X-Blazar-Deadline-Ms"),
    ({"X-Blazar-Best-Of": "9"}, {}, "from 1 to 8"),
    ({}, {"best_of": True}, "best_of"),
    ({"X-Blazar-Cascade": "only-one"}, {}, "2 to 4 model names"),
    ({"X-Blazar-Best-Of": "2", "X-Blazar-Cascade": "a,b"}, {}, "cannot be combined"),
])
def test_malformed_options_are_a_400_naming_the_header_or_field(headers: dict[str, str], body: dict[str, Any],
                                                                 words: str) -> None:
    with pytest.raises(DialectError) as e:
        _options(headers, body)
    assert e.value.http_status == 400 and words in e.value.message


def test_best_of_and_cascades_only_for_whole_chat() -> None:
    with pytest.raises(DialectError, match="only for chat answered whole"):
        _options({"X-Blazar-Best-Of": "2"}, stream=True)
    with pytest.raises(DialectError, match="only for chat answered whole"):
        _options({"X-Blazar-Cascade": "a,b"}, chat=False)
    assert _options({"X-Blazar-Best-Of": "1"}, stream=True).best_of == 1  # one answer: no fan-out

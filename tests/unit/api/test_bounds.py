"""The input bounds: nesting depth, request names, durations and OpenAI roles, decided before anything is logged."""

from __future__ import annotations

import falcon
import pytest
from pydantic import ValidationError

from blazar.api.bounds import MAX_JSON_DEPTH, check_name, depth, loads
from blazar.api.openai import ChatBody
from blazar.durations import MAX_DURATION_S, keep_alive_seconds, parse_duration
from blazar.errors import DialectError


def _nested(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value] if n % 2 else {"k": value}
    return value


def test_depth_counts_lists_and_objects_without_recursion() -> None:
    assert depth(1) == 0 and depth([]) == 1 and depth({"a": [1, {"b": 2}]}) == 3
    assert depth(_nested(10_000)) > MAX_JSON_DEPTH  # no RecursionError however deep


def test_loads_refuses_deep_bodies_and_takes_the_rest() -> None:
    assert loads(b'{"a": [1, 2]}') == {"a": [1, 2]}
    for body in (b"[" * 65 + b"]" * 65, b"[" * 5000 + b"]" * 5000):  # the second is past orjson's own limit
        with pytest.raises(falcon.HTTPBadRequest) as e:
            loads(body)
        assert "nests deeper than 64" in (e.value.description or "")


@pytest.mark.parametrize("name", ["nl\n", "a b", "x" * 257, "", "tab\t", "\x00"])
def test_bad_request_names_are_refused_and_echoed_short(name: str) -> None:
    with pytest.raises(DialectError) as e:
        check_name(name)
    assert e.value.http_status == 400 and len(e.value.message) < 200


@pytest.mark.parametrize("name", ["gemma3-270m", "acme/tiny-GGUF:Q4_K_M", "x" * 256, "qwen3:8b"])
def test_good_request_names_pass(name: str) -> None:
    assert check_name(name) == name


def test_durations_are_bounded_and_negative_means_forever() -> None:
    assert parse_duration("10m") == 600
    assert keep_alive_seconds(-1) is None and keep_alive_seconds(-(2**70)) is None
    for absurd in (1e30, 1e300, 2**63 - 1, "99999999999999h", MAX_DURATION_S + 1, "9" * 100):
        with pytest.raises(ValueError):
            parse_duration(absurd)


@pytest.mark.parametrize("role", ["wizard", {}, None, 3, ["user"]])
def test_openai_roles_are_checked_and_a_non_string_is_a_400_not_a_500(role: object) -> None:
    with pytest.raises(ValidationError, match="role"):
        ChatBody.model_validate({"model": "m", "messages": [{"role": role, "content": "x"}]})


@pytest.mark.parametrize("effort", ["huge", "", 3, True])
def test_openai_reasoning_effort_is_one_of_the_documented_values(effort: object) -> None:
    with pytest.raises(ValidationError, match="reasoning_effort"):
        ChatBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                 "reasoning_effort": effort})
    assert ChatBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                    "reasoning_effort": "xhigh"}).reasoning_effort == "xhigh"

"""The context decision (blazar/serving/context_fit.py): as asked, bounded, or refused; never a truncated prompt."""

from __future__ import annotations

import pytest

from blazar.errors import Refused
from blazar.serving.context_fit import bound_body, decide_max_tokens, grown_ctx


@pytest.mark.parametrize("policy", ["bound", "refuse"])
def test_a_request_that_fits_runs_as_asked(policy: str) -> None:
    assert decide_max_tokens(100, 900, 1024, "m", policy) is None  # type: ignore[arg-type]
    assert decide_max_tokens(1000, 24, 1024, "m", policy) is None  # type: ignore[arg-type]  # exactly full
    assert decide_max_tokens(1000, None, 1024, "m", policy) is None  # type: ignore[arg-type]  # no max_tokens


def test_bound_caps_the_output_at_what_the_context_leaves() -> None:
    assert decide_max_tokens(2900, 32000, 32768, "m", "bound") == 29868
    assert decide_max_tokens(1023, 5, 1024, "m", "bound") == 1


def test_refuse_keeps_the_400_with_the_numbers() -> None:
    with pytest.raises(Refused) as e:
        decide_max_tokens(2900, 32000, 32768, "m", "refuse")
    assert (e.value.http_status, e.value.reason) == (400, "context_length_exceeded")
    assert "2900 prompt tokens + 32000 max_tokens" in e.value.message
    assert e.value.observations == {"prompt_tokens": 2900, "max_tokens": 32000, "ctx_tokens": 32768}


@pytest.mark.parametrize("policy", ["bound", "refuse"])
@pytest.mark.parametrize(("prompt", "max_tokens"), [(1024, None), (1024, 10), (5000, 1)])
def test_a_prompt_that_does_not_fit_is_refused_whatever_the_policy(policy: str, prompt: int,
                                                                   max_tokens: int | None) -> None:
    with pytest.raises(Refused) as e:
        decide_max_tokens(prompt, max_tokens, 1024, "m", policy)  # type: ignore[arg-type]
    assert (e.value.http_status, e.value.reason) == (400, "context_length_exceeded")
    assert f"prompt is {prompt} tokens" in e.value.message and "never truncated" in e.value.message


def test_the_bound_goes_in_every_limit_field_the_body_has_else_the_routes_own() -> None:
    assert bound_body({"max_tokens": 9, "max_completion_tokens": 9}, "/v1/chat/completions", 5) == {
        "max_tokens": 5, "max_completion_tokens": 5}
    assert bound_body({"n_predict": 9}, "/v1/completions", 5) == {"n_predict": 5}
    assert bound_body({}, "/v1/chat/completions", 5) == {"max_tokens": 5}
    assert bound_body({}, "/v1/responses", 5) == {"max_output_tokens": 5}


def test_a_prompt_over_the_context_grows_it_to_the_next_power_of_two_within_the_trained_context() -> None:
    # Claude Code's first turn with its tools' schemas, against the default 8192: a 32768 context holds it.
    assert grown_ctx(19_360, 8192, 32_768) == 32_768
    assert grown_ctx(9_000, 8192, 32_768) == 16_384  # 9,000 + GROWTH_ROOM fits 16,384
    assert grown_ctx(15_500, 8192, 32_768) == 32_768  # 15,500 + GROWTH_ROOM does not
    assert grown_ctx(30_000, 8192, 20_000) is None  # more than the model was trained on: the 400 stays
    assert grown_ctx(19_360, 8192, 20_000) == 20_000  # capped at the trained context, which still holds the prompt
    assert grown_ctx(19_999, 8192, 20_000) == 20_000 and grown_ctx(20_000, 8192, 20_000) is None
    assert grown_ctx(8_000, 8192, 32_768) is None  # it fits
    assert grown_ctx(9_000, 8192, None) is None  # no trained context to go by
    assert grown_ctx(18_000, 16_384, 20_000) == 20_000  # capped at the trained context, still more than asked

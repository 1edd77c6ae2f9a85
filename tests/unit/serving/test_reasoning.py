"""The thinking budget's rule (blazar/serving/reasoning.py): what each dialect's field and a model's settings make of
the engine's `thinking_budget_tokens`, and what request.completed says of it."""

from __future__ import annotations

from typing import Any

import pytest

from blazar.errors import InvalidModelSettings
from blazar.events.model_settings import ModelSettings
from blazar.events.requests import ReasoningFacts
from blazar.serving.engine_ask import EngineAsk
from blazar.serving.patch import NO_PATCH
from blazar.serving.reasoning import EFFORT_BUDGETS, EFFORTS, decide, reasoning_patch
from blazar.serving.request import Request
from blazar.store.model_settings import SettingsChange


def _request(body: dict[str, Any], path: str = "/v1/chat/completions") -> Request:
    return Request(model="m", engine_path=path, body=body, stream=False, parsed=body)


def _patch(body: dict[str, Any], settings: ModelSettings | None = None, honoured: bool = True) -> tuple[
        dict[str, Any], ReasoningFacts | None]:
    request = _request(body)
    ask = EngineAsk(request)
    ask.apply(reasoning_patch(request, ask.engine_body(), settings, honoured=honoured))
    return ask.engine_body(), ask.reasoning


def test_every_effort_has_a_budget_none_is_zero_max_is_unbounded() -> None:
    assert set(EFFORT_BUDGETS) == set(EFFORTS)
    assert EFFORT_BUDGETS["none"] == 0 and EFFORT_BUDGETS["max"] is None
    sized = [EFFORT_BUDGETS[e] for e in ("minimal", "low", "medium", "high", "xhigh")]
    assert sized == sorted(sized) and EFFORT_BUDGETS["low"] == 1024


def test_nothing_asked_and_no_model_setting_changes_nothing() -> None:
    assert reasoning_patch(_request({"messages": []}), {"messages": []}, None, honoured=True) is NO_PATCH
    assert reasoning_patch(_request({"messages": []}), {"messages": []}, ModelSettings(system="s"),
                           honoured=True) is NO_PATCH
    embed = _request({"input": "x", "reasoning_effort": "low"}, "/v1/embeddings")
    assert reasoning_patch(embed, {"reasoning_effort": "low"}, None, honoured=True) is NO_PATCH


@pytest.mark.parametrize(("body", "budget", "effort"), [
    ({"reasoning_effort": "low"}, 1024, "low"),  # OpenAI chat, Responses' reasoning.effort
    ({"reasoning_effort": "high"}, 16384, "high"),
    ({"reasoning_effort": "none"}, 0, "none"),
    ({"reasoning_effort": "max"}, None, "max"),
    ({"thinking_budget_tokens": 2048}, 2048, None),  # Anthropic's thinking.budget_tokens
    ({"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "medium"}}, 4096, "medium"),  # Ollama
    ({"chat_template_kwargs": {"enable_thinking": False}}, 0, "none"),  # Ollama think false, Anthropic disabled
])
def test_what_each_dialect_asks_becomes_the_engines_budget(body: dict[str, Any], budget: int | None,
                                                           effort: str | None) -> None:
    sent, facts = _patch({"messages": [], **body})
    assert facts == ReasoningFacts(budget=budget, effort=effort, enforced_by="engine" if budget is not None else "none")
    assert sent.get("thinking_budget_tokens") == budget


def test_a_models_budget_is_the_default_and_the_ceiling() -> None:
    capped = ModelSettings(reasoning_budget=16)
    assert _patch({"messages": []}, capped)[1] == ReasoningFacts(budget=16, enforced_by="engine")
    sent, facts = _patch({"messages": [], "thinking_budget_tokens": 1024}, capped)
    assert sent["thinking_budget_tokens"] == 16 and facts is not None and facts.budget == 16
    sent, facts = _patch({"messages": [], "reasoning_effort": "max"}, capped)
    assert sent["thinking_budget_tokens"] == 16 and facts == ReasoningFacts(budget=16, effort="max",
                                                                            enforced_by="engine")
    assert _patch({"messages": [], "thinking_budget_tokens": 8}, capped)[0]["thinking_budget_tokens"] == 8
    assert _patch({"messages": [], "reasoning_effort": "none"}, capped)[0]["thinking_budget_tokens"] == 0


def test_a_models_effort_applies_where_the_request_names_none_and_is_told_to_the_template() -> None:
    sent, facts = _patch({"messages": []}, ModelSettings(reasoning_effort="minimal"))
    assert sent["reasoning_effort"] == "minimal" and sent["thinking_budget_tokens"] == 256
    assert facts == ReasoningFacts(budget=256, effort="minimal", enforced_by="engine")
    sent, _ = _patch({"messages": [], "reasoning_effort": "high"}, ModelSettings(reasoning_effort="minimal"))
    assert sent["reasoning_effort"] == "high" and sent["thinking_budget_tokens"] == 16384


def test_an_engine_without_the_budget_is_recorded_as_enforcing_nothing_and_not_sent_ours() -> None:
    assert decide(64, None, None, honoured=False) == ReasoningFacts(budget=64, enforced_by="none")
    # Anthropic's translation put the field there (the client sent `thinking`): an engine that takes none loses it.
    translated = {"messages": [], "thinking_budget_tokens": 2048}
    request = Request(model="m", engine_path="/v1/chat/completions", body=translated, stream=False,
                      parsed={"messages": [], "thinking": {"type": "enabled", "budget_tokens": 2048}})
    ask = EngineAsk(request)
    ask.apply(reasoning_patch(request, ask.engine_body(), None, honoured=False))
    assert "thinking_budget_tokens" not in ask.engine_body()
    assert ask.reasoning == ReasoningFacts(budget=2048, enforced_by="none")
    # An OpenAI client's own field goes to the engine as it sent it.
    sent, facts = _patch({"messages": [], "thinking_budget_tokens": 32}, honoured=False)
    assert sent["thinking_budget_tokens"] == 32 and facts == ReasoningFacts(budget=32, enforced_by="none")


def test_model_set_validates_and_clears_the_reasoning_settings() -> None:
    settings, changed = SettingsChange(reasoning_budget=24, reasoning_effort="low").applied_to(None)
    assert (settings.reasoning_budget, settings.reasoning_effort) == (24, "low")
    assert changed == ["reasoning_budget", "reasoning_effort"] and not settings.is_empty()
    cleared, changed = SettingsChange(clear_reasoning=True).applied_to(settings)
    assert cleared.is_empty() and changed == ["reasoning_budget", "reasoning_effort"]
    with pytest.raises(InvalidModelSettings, match="reasoning effort: expected one of"):
        SettingsChange(reasoning_effort="huge").applied_to(None)
    with pytest.raises(InvalidModelSettings, match="reasoning budget: expected 0 to"):
        SettingsChange(reasoning_budget=-1).applied_to(None)


def test_a_build_without_the_per_request_field_is_held_to_its_load_flag_and_says_so() -> None:
    model = ModelSettings(reasoning_budget=64)
    # What the request asked differs: the load flag's budget is the one in force, the request's recorded beside it.
    assert decide(16, None, model, honoured=False, load_budget=64) == ReasoningFacts(
        budget=64, enforced_by="load_flag", requested=16)
    assert decide(None, "none", model, honoured=False, load_budget=64) == ReasoningFacts(
        budget=64, effort="none", enforced_by="load_flag", requested=0)
    # Nothing asked, or the same budget: the load flag held it, nothing was ignored.
    assert decide(None, None, model, honoured=False, load_budget=64) == ReasoningFacts(budget=64,
                                                                                       enforced_by="load_flag")
    assert decide(64, None, model, honoured=False, load_budget=64) == ReasoningFacts(budget=64,
                                                                                     enforced_by="load_flag")
    # A build that takes the request's own field: the load flag changes nothing about the request.
    assert decide(16, None, model, honoured=True, load_budget=64) == ReasoningFacts(budget=16, enforced_by="engine")
    # The request is not sent a field the engine ignores, and the answer's headers tell the client.
    request = _request({"messages": [], "thinking_budget_tokens": 16})
    ask = EngineAsk(request)
    ask.apply(reasoning_patch(request, ask.engine_body(), model, honoured=False, load_budget=64))
    assert ask.reasoning == ReasoningFacts(budget=64, enforced_by="load_flag", requested=16)
    assert ask.headers() == {"x-blazar-ignored": "thinking_budget (this engine build holds every request to its load "
                                                 "flag's 64 tokens)"}
    quiet = EngineAsk(_request({"messages": []}))
    quiet.apply(reasoning_patch(quiet._request, quiet.engine_body(), model, honoured=False, load_budget=64))
    assert quiet.reasoning == ReasoningFacts(budget=64, enforced_by="load_flag") and quiet.headers() == {}

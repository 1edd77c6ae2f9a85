"""A chat request's thinking budget, decided once routed (blazar/serving/routing.py): what the dialect asked (the
engine body's `thinking_budget_tokens` from Anthropic's `thinking.budget_tokens`, or `reasoning_effort` from
OpenAI's chat and Responses and Ollama's `think` level) and the model's settings (`blazar model set
--reasoning-budget/--reasoning-effort`) give one budget in tokens, sent to the engine as `thinking_budget_tokens`,
which llama-server enforces (it closes the thinking section at the budget and the answer follows). A `Patch` carries
it, and its `ReasoningFacts` go into `request.completed`. Pure.

The rule:
1. The effort is the request's, else the model's. The budget is the request's own (`thinking_budget_tokens`), else its
   effort's (`EFFORT_BUDGETS`), else the model's `reasoning_budget`, else the model's effort's.
2. A model's `reasoning_budget` is also a ceiling: a request asking for more gets the model's (NOTE: an operator's
   bound on a model's thinking, e.g. for a small model that would think past any useful length; a request cannot
   raise it).
3. Thinking turned off (`reasoning_effort: none`, Ollama `think: false`, Anthropic `disabled`) is a budget of 0.
4. The engine honours the budget when its build has `--reasoning-budget` (the same change gave llama-server the
   per-request field); otherwise (an older build, a remote API) the field is not sent (unless the client sent it
   itself), and the budget is recorded as enforced by nobody.
5. Except where the instance was started with the model's budget as its load flag (`--reasoning-budget N`,
   blazar/adapters/engines/reasoning_flags.py) on a build without the per-request field: the load flag's budget is
   the one in force (`enforced_by: load_flag`), and a request that asked another has it recorded as `requested` and
   is told (`x-blazar-ignored: thinking_budget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from blazar.events.model_settings import ModelSettings
from blazar.events.requests import REASONING_EFFORTS, ReasoningEffort, ReasoningFacts, effort_of
from blazar.serving.patch import NO_PATCH, Patch
from blazar.serving.request import Request

CHAT = "/v1/chat/completions"
EFFORTS = REASONING_EFFORTS
# Thinking tokens per effort (None: unbounded). NOTE: one table for every dialect, close to what Anthropic's docs
# give as typical budgets (1,024 the least, 16k for hard problems); "max" is the model's own judgement, unbounded.
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384,
                                         "xhigh": 32768, "max": None}
BUDGET_FIELD = "thinking_budget_tokens"  # llama-server's per-request budget (it also reads reasoning_budget_tokens)
_ALSO = ("reasoning_budget_tokens",)


def _asked_effort(body: Mapping[str, Any]) -> ReasoningEffort | None:
    """The effort the engine body asks: OpenAI's field, or the template's kwargs (Ollama's think levels), "none"
    where the thinking is turned off."""
    kwargs = body.get("chat_template_kwargs")
    kwargs = kwargs if isinstance(kwargs, Mapping) else {}
    if kwargs.get("enable_thinking") is False:
        return "none"
    for value in (body.get("reasoning_effort"), kwargs.get("reasoning_effort")):
        if (effort := effort_of(value)) is not None:
            return effort
    return None


def _asked_budget(body: Mapping[str, Any]) -> int | None:
    for name in (BUDGET_FIELD, *_ALSO):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def decide(asked_budget: int | None, asked_effort: ReasoningEffort | None, settings: ModelSettings | None, *,
           honoured: bool, load_budget: int | None = None) -> ReasoningFacts | None:
    """The request's budget and effort by the module's rule; None when neither the request nor the model says
    anything about thinking. `load_budget`: the instance's --reasoning-budget (None: started without it)."""
    model_budget = settings.reasoning_budget if settings is not None else None
    model_effort = settings.reasoning_effort if settings is not None else None
    effort = asked_effort or model_effort
    if asked_budget is None and effort is None and model_budget is None:
        return None
    if effort == "none":
        budget: int | None = 0
    elif asked_budget is not None:
        budget = asked_budget
    elif asked_effort is not None:
        budget = EFFORT_BUDGETS[asked_effort]
    elif model_budget is not None:
        budget = model_budget
    else:
        budget = EFFORT_BUDGETS[model_effort] if model_effort is not None else None
    if model_budget is not None and (budget is None or budget > model_budget):
        budget = model_budget
    if not honoured and load_budget is not None:
        return ReasoningFacts(budget=load_budget, effort=effort, enforced_by="load_flag",
                              requested=budget if budget != load_budget else None)
    enforced: Literal["engine", "none"] = "engine" if honoured and budget is not None else "none"
    return ReasoningFacts(budget=budget, effort=effort, enforced_by=enforced)


def reasoning_patch(request: Request, body: Mapping[str, Any], settings: ModelSettings | None, *,
                    honoured: bool, load_budget: int | None = None) -> Patch:
    """What the request's thinking asks of the engine (see the module's docstring): its budget as
    `thinking_budget_tokens` and, where only the model names one, its effort as `reasoning_effort`."""
    if request.embeddings or request.engine_path != CHAT:
        return NO_PATCH
    asked_effort = _asked_effort(body)
    facts = decide(_asked_budget(body), asked_effort, settings, honoured=honoured, load_budget=load_budget)
    if facts is None:
        return NO_PATCH
    fields: dict[str, Any] = {}
    if facts.budget is not None and honoured:
        fields[BUDGET_FIELD] = facts.budget
        fields.update({name: facts.budget for name in _ALSO if name in body})
    if asked_effort is None and facts.effort is not None:
        fields["reasoning_effort"] = facts.effort  # the model's: llama-server hands it to the template
    # NOTE: an engine that takes no budget (a remote API, an older build) is not sent the field a dialect put there
    # (an OpenAI upstream refuses unknown fields); a client's own field goes as it sent it.
    drop = () if honoured else (BUDGET_FIELD, *_ALSO)
    return Patch(fields=fields, reasoning=facts, drop=drop)

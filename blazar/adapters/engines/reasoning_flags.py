"""What a build does with a thinking budget: llama-server's load flag `--reasoning-budget N` (every request's budget
where it asks none) and, from the build that brought the budget sampler, the per-request `thinking_budget_tokens`.
A model's budget (`blazar model set --reasoning-budget N`) goes on its instance's argv wherever the build takes it,
so that a build without the per-request field still holds its thinking (blazar/serving/reasoning.py says so on a
request that asked another budget)."""

from __future__ import annotations

from blazar.adapters.engines.llama_server import Capabilities
from blazar.errors import EngineIncompatible
from blazar.events.model_settings import MAX_REASONING_BUDGET

_FLAG = ("--reasoning-budget",)
# NOTE: the request's `thinking_budget_tokens` is read (tools/server/server-common.cpp, falling back to the load flag)
# by the builds whose budget sampler also brought `--reasoning-budget-message`: a build without it holds every request
# to its load flag. The flag's help tells an earlier build apart: its --reasoning-budget took -1 (unbounded) or 0 alone
# ("currently only one of: -1 ..., or 0 to disable thinking").
_PER_REQUEST = ("--reasoning-budget-message",)
_ZERO_ONLY = "only one of"


def per_request_budget(caps: Capabilities) -> bool:
    """Whether the build holds a request to its own `thinking_budget_tokens`."""
    return caps.has(*_FLAG) and caps.has(*_PER_REQUEST)


def load_budget(caps: Capabilities, budget: int | None) -> int | None:
    """The budget the load flag can carry for a model's `budget`: None where the model has none, the build lacks the
    flag, or the build's flag takes only 0 and the model's budget is more. EngineIncompatible for a value no build
    takes (the settings bound it; the log is not trusted)."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= MAX_REASONING_BUDGET:
        raise EngineIncompatible(f"--reasoning-budget {budget!r}", f"a model's thinking budget is 0 to "
                                 f"{MAX_REASONING_BUDGET} tokens; blazar model set MODEL --reasoning-budget N")
    spec = caps.spec(*_FLAG)
    if spec is None or (budget > 0 and _ZERO_ONLY in " ".join(spec.help.split())):
        return None
    return budget


def reasoning_flags(caps: Capabilities, budget: int | None) -> list[str]:
    """`--reasoning-budget N` for a model's budget where the build takes it (see `load_budget`); [] otherwise."""
    held = load_budget(caps, budget)
    return [] if held is None else [_FLAG[0], str(held)]

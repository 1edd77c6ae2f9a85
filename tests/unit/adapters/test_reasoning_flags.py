"""A model's thinking budget on its instance's argv (blazar/adapters/engines/reasoning_flags.py): `--reasoning-budget
N` where the build lists it, what a build before the budget sampler can take, and the load shape it makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.adapters.engines.llama_server import Capabilities, parse_help
from blazar.adapters.engines.reasoning_flags import load_budget, per_request_budget, reasoning_flags
from blazar.errors import EngineIncompatible
from blazar.events.model_settings import MAX_REASONING_BUDGET, ModelSettings
from blazar.instances.live import ResolvedModel
from tests.support.catalog import META

HELP = (Path(__file__).resolve().parents[2] / "fixtures" / "llama_server" / "help.txt").read_text()


def _without(*flags: str) -> Capabilities:
    return parse_help("\n".join(line for line in HELP.splitlines() if not any(f in line for f in flags)))


def test_the_models_budget_goes_on_the_argv_of_a_build_that_lists_the_flag() -> None:
    caps = parse_help(HELP)
    assert per_request_budget(caps)
    assert reasoning_flags(caps, None) == []
    assert reasoning_flags(caps, 512) == ["--reasoning-budget", "512"]
    assert reasoning_flags(caps, 0) == ["--reasoning-budget", "0"]
    assert load_budget(caps, 512) == 512


def test_a_build_without_the_request_field_still_takes_the_flag_and_an_earlier_one_takes_zero_alone() -> None:
    sampler = _without("--reasoning-budget-message")  # the load flag, no request's own budget
    assert not per_request_budget(sampler)
    assert reasoning_flags(sampler, 512) == ["--reasoning-budget", "512"]
    zero_only = parse_help(HELP.replace(
        "token budget for thinking: -1 for unrestricted, 0 for immediate end,\n",
        "controls the amount of thinking allowed; currently only one of: -1 for\n").replace(
        "N>0 for token budget (default: -1)", "unrestricted thinking budget, or 0 to disable thinking (default: -1)"))
    zero_only = zero_only.model_copy(update={"flags": tuple(f for f in zero_only.flags
                                                            if "--reasoning-budget-message" not in f.names)})
    assert not per_request_budget(zero_only)
    assert reasoning_flags(zero_only, 0) == ["--reasoning-budget", "0"]
    assert reasoning_flags(zero_only, 512) == [] and load_budget(zero_only, 512) is None  # it took -1 or 0 alone
    none = _without("--reasoning-budget")
    assert not per_request_budget(none) and reasoning_flags(none, 0) == [] and load_budget(none, 64) is None


@pytest.mark.parametrize("bad", [-1, MAX_REASONING_BUDGET + 1, True, "64"])
def test_a_budget_no_build_takes_is_refused_naming_the_flag(bad: object) -> None:
    with pytest.raises(EngineIncompatible, match="--reasoning-budget"):
        reasoning_flags(parse_help(HELP), bad)  # type: ignore[arg-type]


def test_a_budget_change_is_another_load_shape() -> None:
    def shape(settings: ModelSettings | None) -> str:
        return ResolvedModel(name="gemma", path=Path("/store/gemma.gguf"), metadata=META, settings=settings).template

    assert shape(None) == shape(ModelSettings(reasoning_effort="low")) == ""
    assert shape(ModelSettings(reasoning_budget=64)) == "+think:64"
    assert shape(ModelSettings(reasoning_budget=64)) != shape(ModelSettings(reasoning_budget=128))

"""The template probe's measure and choice (blazar/instances/template_probe.py), against a stand-in for the engine's
/completion route that answers as a base model would: it runs on in one template and ends its turn in another."""

from __future__ import annotations

from typing import Any

import pytest

from blazar.errors import EngineUnreachable, TemplateProbeFailed
from blazar.events.models import TemplateTrial
from blazar.instances.template_probe import MAX_TOKENS, PROMPTS, choose, measure
from blazar.store.turn_formats import CHATML, GEMMA, TRANSCRIPT


class Completion:
    """/completion as llama-server answers it: Gemma's turns run to the limit, ChatML's end at once with no text,
    the transcript's end with a few words."""

    def __init__(self, status: int = 200, fail: bool = False) -> None:
        self.asked: list[dict[str, Any]] = []
        self.status, self.fail = status, fail

    async def post_json(self, base_url: str, path: str, payload: dict[str, Any], *, api_key: str | None = None,
                        timeout_s: float = 0) -> tuple[int, Any]:
        assert (base_url, path, api_key) == ("http://127.0.0.1:1", "/completion", "k")
        if self.fail:
            raise EngineUnreachable("refused")
        self.asked.append(payload)
        prompt = payload["prompt"]
        if prompt.startswith("<start_of_turn>"):
            return self.status, {"content": "Say hi again and again", "stop_type": "limit", "tokens_predicted": 16}
        if prompt.startswith("<|im_start|>"):
            return self.status, {"content": "", "stop_type": "word", "tokens_predicted": 6}
        return self.status, {"content": " Hello there.", "stop_type": "word", "tokens_predicted": 4}


async def test_each_candidate_gets_every_prompt_raw_greedy_and_bounded() -> None:
    engine = Completion()
    trials = await measure(engine, "http://127.0.0.1:1", "k", [GEMMA, CHATML, TRANSCRIPT])  # type: ignore[arg-type]
    assert trials == [TemplateTrial(template="gemma", ended=0, answered=0, tokens=16 * len(PROMPTS)),
                      TemplateTrial(template="chatml", ended=len(PROMPTS), answered=0, tokens=6 * len(PROMPTS)),
                      TemplateTrial(template="transcript", ended=len(PROMPTS), answered=len(PROMPTS),
                                    tokens=4 * len(PROMPTS))]
    assert len(engine.asked) == 3 * len(PROMPTS)
    first = engine.asked[2 * len(PROMPTS)]
    assert first["prompt"] == f"User: {PROMPTS[0]}\nAssistant:" and first["stop"] == list(TRANSCRIPT.stops)
    assert all(a["n_predict"] == MAX_TOKENS and a["temperature"] == 0 and a["cache_prompt"] is False
               for a in engine.asked)
    assert choose(trials) == "transcript"


@pytest.mark.parametrize("engine", [Completion(status=404), Completion(fail=True)])
async def test_an_engine_that_does_not_answer_as_completion_does_fails_the_probe(engine: Completion) -> None:
    with pytest.raises(TemplateProbeFailed):
        await measure(engine, "http://127.0.0.1:1", "k", [GEMMA])  # type: ignore[arg-type]


def test_answers_then_endings_then_fewer_tokens_then_the_candidates_order() -> None:
    def t(name: str, ended: int, answered: int, tokens: int) -> TemplateTrial:
        return TemplateTrial(template=name, ended=ended, answered=answered, tokens=tokens)

    assert choose([t("gemma", 5, 1, 30), t("chatml", 2, 2, 60)]) == "chatml"  # ended with text counts first
    assert choose([t("gemma", 3, 2, 30), t("chatml", 5, 2, 60)]) == "chatml"
    assert choose([t("gemma", 5, 2, 60), t("chatml", 5, 2, 30)]) == "chatml"
    assert choose([t("gemma", 0, 0, 80), t("chatml", 0, 0, 80)]) == "gemma"  # nothing ends: the first stays

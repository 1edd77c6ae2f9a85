"""What a model or an instance changes in one request, as a value: a model's settings and its template's defaults
(blazar/serving/model_defaults.py), its LoRA adapters (blazar/serving/lora.py), its thinking budget
(blazar/serving/reasoning.py), a slot's placement each make a `Patch`,
and the call's `EngineAsk` applies it (blazar/serving/engine_ask.py) in one place instead of each writing into the
call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.events.requests import ReasoningFacts


@dataclass(frozen=True, slots=True)
class Patch:
    fields: Mapping[str, Any] = field(default_factory=dict)  # set in the engine's body
    max_tokens: int | None = None  # the output's limit, where the request set none
    ctx: int | None = None  # the context per slot, where the request asked for none
    loop_guarded: bool = False  # the streamed answer is stopped where it loops (blazar/serving/loop_guard.py)
    reasoning: ReasoningFacts | None = None  # the thinking's budget, as decided (blazar/serving/reasoning.py)
    drop: tuple[str, ...] = ()  # fields of ours this engine does not take (a client's own are left as sent)

    def __bool__(self) -> bool:
        return (bool(self.fields) or self.max_tokens is not None or self.ctx is not None or self.loop_guarded
                or self.reasoning is not None or bool(self.drop))


NO_PATCH = Patch()

"""The argv flags of a model's LoRA adapters: `--lora FILE` for each, in the model's order (the engine numbers them
0, 1, ... in that order: a request's `lora: [{"id": i, "scale": s}]`), and `--lora-init-without-apply`, so that
nothing applies unless a request asks. Built only from flags the binary lists: a build without them cannot serve
the model as it is set (EngineIncompatible, naming the flag)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from blazar.adapters.engines.llama_server import Capabilities
from blazar.errors import EngineIncompatible

_LORA = ("--lora",)
_UNAPPLIED = ("--lora-init-without-apply",)


def lora_flags(caps: Capabilities, adapters: Sequence[Path]) -> list[str]:
    """`--lora A --lora B ... --lora-init-without-apply` for `adapters` (already confined to the store); [] for none."""
    if not adapters:
        return []
    for names, why in ((_LORA, "the model's LoRA adapters"),
                       (_UNAPPLIED, "LoRA adapters loaded unapplied (a request applies its own)")):
        if caps.spec(*names) is None:
            raise EngineIncompatible(names[0], why)
    argv: list[str] = []
    for path in adapters:
        argv += [_LORA[0], str(path)]
    return [*argv, _UNAPPLIED[0]]

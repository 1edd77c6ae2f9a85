"""What a reader of another tool's store found: one model, with everything Blazar can carry over from that tool
(its name, weights, projector, adapters, template, system prompt, parameters) and what it cannot, in words.

Readers only read: they never write, and they name files inside the store they were pointed at. The importer
(blazar/store/foreign/importer.py) decides what is new and records each model as its own `model.imported`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ForeignTool = Literal["ollama", "lmstudio", "hf-cache", "llama-cpp"]


@dataclass(frozen=True)
class ForeignAdapter:
    """A LoRA adapter the tool applies with the model (Ollama's ADAPTER): its GGUF file and the name to add it as."""

    name: str
    path: Path


@dataclass(frozen=True)
class ForeignModel:
    tool: ForeignTool
    name: str  # the name to serve it under (Ollama's `name:tag` as `ollama list` shows it)
    source: str  # where it was found, for the event and the table: a manifest's or a file's path
    weights: tuple[Path, ...]  # the GGUF, or every part of a split GGUF in order
    projector: Path | None = None  # a multimodal projector (mmproj) the tool loads with it
    adapters: tuple[ForeignAdapter, ...] = ()
    template: str | None = None  # Jinja text to serve it with; None: the GGUF's own (or the architecture's)
    system: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()  # (name, value) as Ollama spells them; store/model_settings.py reads
    carried: tuple[str, ...] = ()  # what is carried over, in words ("template", "system", "num_ctx=8192", ...)
    not_carried: tuple[str, ...] = ()  # what cannot be, each with its reason

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.weights)


@dataclass(frozen=True)
class Skipped:
    """Something in the store that looks like a model but cannot be carried over (a split model missing a part, a
    snapshot whose file points outside the cache, a download still in progress), with the reason in words."""

    tool: ForeignTool
    source: str
    reason: str

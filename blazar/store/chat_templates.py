"""Which chat template a model is served with, and whether it chats at all: decided from its GGUF header and its
settings, read by the engine flags (blazar/instances/spawn.py), `blazar show`, /api/show and `blazar run`.

The order: a template set for the model (`blazar model set`, the registry, /api/create) wins; else the GGUF's own
(`tokenizer.chat_template`); else the one its template probe chose (blazar/instances/template_probe.py: on its first
load, of the templates Blazar ships, the one the model ends its turn in); else, before the probe, the template of the
GGUF's architecture, where Blazar knows one; else llama-server's own fallback, ChatML.

Architecture templates are Jinja texts, not llama-server's built-in names: a built-in name only runs with Jinja off,
and llama-server then refuses any request with tools ("tools param requires --jinja flag").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from blazar.events.model_settings import ModelSettings
from blazar.events.models import ModelMetadata
from blazar.store.turn_formats import CHATML, GEMMA, KNOWN, TRANSCRIPT, TurnFormat, by_text

TemplateSource = Literal["settings", "gguf", "probe", "architecture", "fallback"]

# The sampling the template probe measures at (greedy). A model served with the probe's choice is a model without a
# chat template of its own, mostly a base model, and ending its turn is what was measured, at this sampling only: a
# chat request that sets no temperature gets it (the request's own value, or one set for the model, wins). At the
# engine's default (0.8) the demo model's answer to Claude Code's first turn ran from 18 tokens to past 8 minutes.
PROBED_SAMPLING: Mapping[str, float] = MappingProxyType({"temperature": 0.0})

# `general.architecture` -> the template its models are trained on. Only architectures whose every model shares one
# turn format: `llama`, for one, covers Llama 2, Llama 3, Mistral and more, and is left out.
ARCHITECTURE_TEMPLATES: dict[str, TurnFormat] = {"gemma": GEMMA, "gemma2": GEMMA, "gemma3": GEMMA, "gemma3n": GEMMA}

# Words in a GGUF's `general.name` that say the model was tuned to follow instructions (converters put the
# fine-tune in the name: "Gemma 3 270m It", "Qwen2.5 0.5B Instruct").
_TUNED = frozenset({"it", "instruct", "chat", "sft", "dpo", "rlhf", "orpo", "assistant"})


@dataclass(frozen=True, slots=True)
class ServedTemplate:
    """The template an instance of the model gets: its kind and text (None: the engine decides), and why."""

    source: TemplateSource
    kind: Literal["builtin", "jinja"] | None = None
    template: str | None = None
    name: str | None = None  # a shipped template's name ("gemma", "chatml", "transcript")

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings the gateway adds to a chat request: a shipped template's end-of-turn marker and next
        turns' openers (blazar/store/turn_formats.py); none for the GGUF's own or a template of the user's."""
        known = KNOWN.get(self.name or "") if self.source in ("probe", "architecture") else by_text(self.template)
        return known.stops if known is not None else ()

    @property
    def sampling(self) -> dict[str, float]:
        """The defaults the gateway adds to a chat request that sets none of them: the probe's sampling for the
        probe's choice (PROBED_SAMPLING); none otherwise. A dict of its own: an instance's state is copied whole
        (`dataclasses.asdict` deep-copies, and a read-only mapping cannot be copied)."""
        return dict(PROBED_SAMPLING) if self.source == "probe" else {}

    @property
    def guards_loops(self) -> bool:
        """Whether a streamed chat answer is stopped where it loops (blazar/serving/loop_guard.py): the probe's
        choice only, served greedy, where a base model that misses its turn's end can repeat itself to the end of
        its context."""
        return self.source == "probe"

    def describe(self) -> str:
        """One line for `blazar show`: the template and its source."""
        if self.source == "settings":
            known = by_text(self.template)
            what = (f"{known.name} (Blazar's)" if known is not None else f"built-in {self.template}"
                    if self.kind == "builtin" else f"Jinja, {len(self.template or '')} characters")
            return f"{what} (set for this model)"
        if self.source == "gguf":
            return "the GGUF's own"
        if self.source == "probe":
            return (f"{self.name} (chosen by its template probe: the GGUF has none; served greedy unless a request "
                    "or the model's parameters set a temperature)")
        if self.source == "architecture":
            return f"{self.name} (by architecture: the GGUF has none; probed on its first load)"
        return "ChatML (llama-server's fallback: the GGUF has none; probed on its first load)"


def served_template(metadata: ModelMetadata, settings: ModelSettings | None, probed: str | None = None
                    ) -> ServedTemplate:
    """`probed`: the template the model's probe chose (`StoredModel.template_probe`), if it ran."""
    if settings is not None and settings.template is not None:
        return ServedTemplate("settings", settings.template_kind, settings.template)
    if metadata.chat_template:
        return ServedTemplate("gguf")
    if probed is not None and (chosen := KNOWN.get(probed)) is not None:
        return ServedTemplate("probe", "jinja", chosen.jinja, chosen.name)
    known = ARCHITECTURE_TEMPLATES.get(metadata.architecture)
    if known is not None:
        return ServedTemplate("architecture", "jinja", known.jinja, known.name)
    return ServedTemplate("fallback")


def served_settings(metadata: ModelMetadata, settings: ModelSettings | None, probed: str | None = None, *,
                    jinja_files: bool = True) -> ModelSettings | None:
    """The settings an instance starts with: the model's own, with the probed or the architecture's template where
    neither they nor the GGUF carry one (and the engine takes a template file: else it keeps its own fallback)."""
    served = served_template(metadata, settings, probed)
    if served.source not in ("probe", "architecture") or not jinja_files:
        return settings
    base = settings or ModelSettings()
    return base.model_copy(update={"template_kind": served.kind, "template": served.template})


def probe_candidates(metadata: ModelMetadata, settings: ModelSettings | None) -> list[TurnFormat]:
    """The templates a probe tries, in order of preference (a tie goes to the earlier, and the first is the one the
    probed instance starts with): the architecture's own, ChatML, the plain transcript. [] when nothing is to be
    probed: a template set for the model or in the GGUF, or an embedding model."""
    if (settings is not None and settings.template is not None) or metadata.chat_template \
            or metadata.embedding_model:
        return []
    first = ARCHITECTURE_TEMPLATES.get(metadata.architecture)
    rest = [f for f in (CHATML, TRANSCRIPT) if f is not first]
    return [first, *rest] if first is not None else rest


def completion_only(metadata: ModelMetadata) -> bool:
    """A base model, one that continues text rather than answers: its GGUF has no chat template and its name does
    not say it was tuned for instructions or chat. (An embedding model is neither.)"""
    if metadata.chat_template or metadata.embedding_model:
        return False
    words = set(re.split(r"[^a-z0-9]+", (metadata.name or "").lower()))
    return not words & _TUNED


def capabilities(metadata: ModelMetadata, modalities: Sequence[str] = ()) -> list[str]:
    """What `blazar show`, /api/show and /v1/models list: "completion" (continues text), "chat" (answers turns),
    "embedding"; then what its projector lets it take in ("vision", "audio": `StoredModel.projector.modalities`)."""
    if metadata.embedding_model:
        return ["embedding"]
    text = ["completion"] + ([] if completion_only(metadata) else ["chat"])
    return text + [m for m in ("vision", "audio") if m in modalities]

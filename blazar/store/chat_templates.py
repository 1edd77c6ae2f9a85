"""Which chat template a model is served with, and whether it chats at all: decided from its GGUF header and its
settings, read by the engine flags (blazar/instances/spawn.py), `blazar show`, /api/show and `blazar run`.

The order: a template set for the model (`blazar model set`, the registry, /api/create) wins; else the GGUF's own
(`tokenizer.chat_template`); else the template of the GGUF's architecture, where Blazar knows one; else llama-server's
own fallback, ChatML, which most models were not trained on (their answers then carry `<|im_end|>` as text).

Architecture templates are Jinja texts, not llama-server's built-in names: a built-in name only runs with Jinja off,
and llama-server then refuses any request with tools ("tools param requires --jinja flag").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from blazar.events.model_settings import ModelSettings
from blazar.events.models import ModelMetadata

TemplateSource = Literal["settings", "gguf", "architecture", "fallback"]

# Gemma's turns (every Gemma generation): `<start_of_turn>user` / `<start_of_turn>model`, each closed by
# `<end_of_turn>`; no system role, so a system message opens the first user turn. The engine adds the BOS token.
_GEMMA = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\\n' }}"
    "{%- if loop.first and system -%}{{ system + '\\n\\n' }}{%- endif -%}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
# `general.architecture` → (the template's name as `blazar show` says it, its Jinja text). Only architectures whose
# every model shares one turn format: `llama`, for one, covers Llama 2, Llama 3, Mistral and more, and is left out.
ARCHITECTURE_TEMPLATES: dict[str, tuple[str, str]] = {
    "gemma": ("gemma", _GEMMA), "gemma2": ("gemma", _GEMMA), "gemma3": ("gemma", _GEMMA),
    "gemma3n": ("gemma", _GEMMA),
}

# Words in a GGUF's `general.name` that say the model was tuned to follow instructions (converters put the
# fine-tune in the name: "Gemma 3 270m It", "Qwen2.5 0.5B Instruct").
_TUNED = frozenset({"it", "instruct", "chat", "sft", "dpo", "rlhf", "orpo", "assistant"})


@dataclass(frozen=True, slots=True)
class ServedTemplate:
    """The template an instance of the model gets: its kind and text (None: the engine decides), and why."""

    source: TemplateSource
    kind: Literal["builtin", "jinja"] | None = None
    template: str | None = None
    name: str | None = None  # the architecture template's name ("gemma")

    def describe(self) -> str:
        """One line for `blazar show`: the template and its source."""
        if self.source == "settings":
            what = f"built-in {self.template}" if self.kind == "builtin" else \
                f"Jinja, {len(self.template or '')} characters"
            return f"{what} (set for this model)"
        if self.source == "gguf":
            return "the GGUF's own"
        if self.source == "architecture":
            return f"{self.name} (by architecture: the GGUF has none)"
        return "ChatML (llama-server's fallback: the GGUF has none and its architecture has no known template)"


def served_template(metadata: ModelMetadata, settings: ModelSettings | None) -> ServedTemplate:
    if settings is not None and settings.template is not None:
        return ServedTemplate("settings", settings.template_kind, settings.template)
    if metadata.chat_template:
        return ServedTemplate("gguf")
    known = ARCHITECTURE_TEMPLATES.get(metadata.architecture)
    if known is not None:
        name, text = known
        return ServedTemplate("architecture", "jinja", text, name)
    return ServedTemplate("fallback")


def served_settings(metadata: ModelMetadata, settings: ModelSettings | None, *, jinja_files: bool = True
                    ) -> ModelSettings | None:
    """The settings an instance starts with: the model's own, with the architecture's template where neither they
    nor the GGUF carry one (and the engine takes a template file: else it keeps its own fallback)."""
    served = served_template(metadata, settings)
    if served.source != "architecture" or not jinja_files:
        return settings
    base = settings or ModelSettings()
    return base.model_copy(update={"template_kind": served.kind, "template": served.template})


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

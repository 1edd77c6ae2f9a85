"""Events about how a model is served: its chat template, system prompt and default parameters (`blazar model set`),
and variants, new names for a stored model's bytes with settings of their own (Ollama's `/api/create`).

`ModelSettings` is the whole set as it stands after the change: the catalog keeps the latest, so a fold never has to
merge partial updates.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.base import Event, NodeLocal
from blazar.events.bounds import NAME, PARAMETERS_BYTES, SYSTEM_BYTES, TEMPLATE_BYTES, WORD, Bound, entries, items
from blazar.events.requests import ReasoningEffort
from blazar.events.types import register

# A default parameter's value: a number, or (for `stop`) the list of stop strings.
ParameterValue = int | float | list[str]
MAX_REASONING_BUDGET = 1 << 20  # thinking tokens: far beyond any context


class ModelSettings(BaseModel):
    """What the gateway and the engine apply to every request for a model (a request's own fields win)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # "builtin": `template` is a llama.cpp template name (`--chat-template gemma`); "jinja": a Jinja text
    # (`--jinja --chat-template-file`). None: the GGUF's own template.
    template_kind: Literal["builtin", "jinja"] | None = None
    template: Annotated[str | None, Bound(TEMPLATE_BYTES)] = None
    system: Annotated[str | None, Bound(SYSTEM_BYTES)] = None  # the first system message of a request that has none
    # Ollama's names (temperature, top_k, num_ctx, num_predict, stop, ...), already validated.
    parameters: Annotated[dict[str, ParameterValue], Bound(PARAMETERS_BYTES)] = Field(default_factory=dict)
    # Serve rerank requests in rerank mode (llama-server --reranking) though the GGUF has no rerank head (pooling
    # type rank): its scores then mean nothing, but the whole path runs (how the tests drive the demo model).
    rerank: bool = False
    # LoRA adapters (the model's own, by name) applied at these scales when a request names none (Ollama's ADAPTER).
    lora: Annotated[dict[str, float], entries(8, NAME, 24)] = Field(default_factory=dict)
    # Thinking tokens a request may spend: the default where it asks for no budget, and the most it gets where it
    # asks for more (`blazar model set --reasoning-budget`; 0: the thinking ends at once). None: no bound of its own.
    reasoning_budget: Annotated[int | None, Field(ge=0, le=MAX_REASONING_BUDGET)] = None
    reasoning_effort: ReasoningEffort | None = None  # the effort where a request asks for none
    # The response cache for its deterministic requests (docs/8.GATEWAY.md): "exact" on, "semantic" on with similar
    # prompts' answers too, "off" off, None: no say (a
    # key's setting or the request's X-Blazar-Cache decides).
    cache: Literal["exact", "semantic", "off"] | None = None

    def is_empty(self) -> bool:
        return (self.template is None and self.system is None and not self.parameters and not self.rerank
                and not self.lora and self.reasoning_budget is None and self.reasoning_effort is None
                and self.cache is None)


@register
class ModelConfigured(Event):
    """`name`'s settings are now `settings` (the whole set). `changed` names what this change touched. The audit
    leaves out the system prompt's text."""

    TYPE = "model.configured"
    AUDIT = True

    name: str
    settings: ModelSettings
    # "template", "system", "parameters.temperature", ...
    changed: Annotated[list[str], items(40, WORD)] = Field(default_factory=list)
    source: Literal["cli", "api", "registry"] = "cli"

    def stream_key(self) -> str:
        return f"model:{self.name}"

    def audit_details(self) -> dict[str, object]:
        # NOTE: a system prompt may be private: the audit trail says it changed, not what it says.
        return {"name": self.name, "changed": self.changed, "source": self.source,
                "template_kind": self.settings.template_kind}


@register
class ModelVariantCreated(NodeLocal):
    """`name` is a new model whose bytes are `base`'s (the same file: nothing copied) with `settings` of its own."""

    TYPE = "model.variant_created"
    AUDIT = True

    name: str
    base: str  # a model's own name (not an alias) when the variant was made
    settings: ModelSettings

    def stream_key(self) -> str:
        return f"model:{self.name}"

    def audit_details(self) -> dict[str, object]:
        return {"name": self.name, "base": self.base, "template_kind": self.settings.template_kind,
                "parameters": sorted(self.settings.parameters)}

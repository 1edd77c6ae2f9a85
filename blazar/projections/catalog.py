"""The `catalog` projection: the models in the store (name, file, sha256, metadata, serving settings), their
variants (another name for a model's file, with settings of its own) and the state of pulls.

An import or variant whose paths could lead out of the models directory (blazar/confine.py) becomes no model: it is
kept under `refused`, which `blazar doctor` reports."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from blazar.confine import untrusted
from blazar.errors import PullFailReason
from blazar.events.base import Recorded
from blazar.events.lora import LoraAdded, LoraMetadata, LoraRemoved
from blazar.events.model_settings import ModelConfigured, ModelSettings, ModelVariantCreated
from blazar.events.models import (
    ModelAliased,
    ModelAliasRemoved,
    ModelImported,
    ModelKind,
    ModelMetadata,
    ModelPullCompleted,
    ModelPullFailed,
    ModelPullStarted,
    ModelRemoved,
    ModelTemplateProbed,
    ShardFile,
    TemplateTrial,
)
from blazar.events.projectors import ModelProjectorRemoved, ModelProjectorSet, ProjectorMetadata
from blazar.projections.base import Projection, RefusedEvent


@dataclass(frozen=True, slots=True)
class Projector:
    """A model's multimodal projector (llama.cpp's --mmproj file)."""

    path: str  # relative to the store's models directory: mmproj/<sha256>.gguf
    sha256: str
    bytes: int
    metadata: ProjectorMetadata
    seq: int  # the model.projector_set event
    source: str = ""
    source_kind: str = "file"
    linked: bool = False  # its file is a hardlink (not a copy)

    @property
    def modalities(self) -> tuple[str, ...]:
        """What the projector lets the model take in: ("vision",), ("audio",) or both."""
        return tuple(self.metadata.modalities)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes, "source": self.source,
                "seq": self.seq, "modalities": list(self.modalities),
                "metadata": self.metadata.model_dump(mode="json")}


@dataclass(frozen=True, slots=True)
class Lora:
    """One of a model's LoRA adapters (llama.cpp's --lora file). Its id on the engine is its place in the model's
    list (the order of the --lora flags)."""

    name: str
    path: str  # relative to the store's models directory: lora/<sha256>.gguf
    sha256: str
    bytes: int
    metadata: LoraMetadata
    seq: int  # the lora.added event
    source: str = ""
    linked: bool = False  # its file is a hardlink (not a copy)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "bytes": self.bytes,
                "source": self.source, "seq": self.seq, "metadata": self.metadata.model_dump(mode="json")}


@dataclass(frozen=True, slots=True)
class TemplateProbe:
    """The template probe of a model's file (model.template_probed): the template chosen and each one's numbers."""

    chosen: str
    trials: tuple[TemplateTrial, ...]
    prompts: int
    max_tokens: int
    engine_tag: str
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "prompts": self.prompts, "max_tokens": self.max_tokens,
                "engine_tag": self.engine_tag, "seq": self.seq,
                "trials": [t.model_dump(mode="json") for t in self.trials]}


@dataclass(frozen=True, slots=True)
class StoredModel:
    """A model in the store: the catalog's entry, as the request path and the supervisor read it. Frozen: an event
    that changes it (settings, a projector, an adapter, a probe) replaces it."""

    name: str
    file: str  # relative to the store's models directory
    sha256: str
    bytes: int
    metadata: ModelMetadata
    seq: int  # the event that made it (model.imported, model.variant_created)
    source: str = ""  # where it came from: a local path, a hub target, a python package
    added_ts: float = 0.0
    parts: tuple[ShardFile, ...] = ()  # a split model's parts, in order; () for one file
    base: str | None = None  # a variant: the model it was made from; None for a model of its own
    source_kind: str = "file"
    linked: bool = False  # its file is a hardlink (not a copy)
    configured: ModelSettings | None = None  # its settings as last set, even when empty; None: never set
    settings_seq: int | None = None  # the event that set them
    projector: Projector | None = None  # its vision/audio projector (--mmproj); None: text only
    kind: ModelKind = "llama-server"  # what runs it: llama-server (a GGUF), whisper or piper (a directory of files)
    loras: tuple[Lora, ...] = ()  # its LoRA adapters, in the order they were added (their ids on the engine)
    template_probe: TemplateProbe | None = None  # its file's template probe (a GGUF without a template), if run

    @property
    def settings(self) -> ModelSettings | None:
        """Its template, system prompt and default parameters; None when none are set."""
        return None if self.configured is None or self.configured.is_empty() else self.configured

    @property
    def gguf(self) -> bool:
        """Its file is a GGUF (its metadata is a GGUF header's): only a llama-server model's is."""
        return self.kind == "llama-server"

    @property
    def shards(self) -> tuple[str, ...]:
        """A split model's parts (relative to the models directory); () for one file."""
        return tuple(p.path for p in self.parts)

    @property
    def files(self) -> tuple[str, ...]:
        """What the model occupies in the store: its parts, or its one file."""
        return self.shards or (self.file,)

    def to_json(self) -> dict[str, Any]:
        """The catalog's record of the model, as `blazar list --json` and `blazar show --json` print it."""
        out: dict[str, Any] = {
            "name": self.name, "path": self.file, "bytes": self.bytes, "sha256": self.sha256, "source": self.source,
            "source_kind": self.source_kind, "linked": self.linked, "added_ts": self.added_ts, "seq": self.seq,
            "metadata": self.metadata.model_dump(mode="json"),
            "shards": [p.model_dump(mode="json") for p in self.parts], "kind": self.kind,
        }
        if self.base is not None:
            out["base"] = self.base
        if self.configured is not None:
            out["settings"] = self.configured.model_dump(mode="json")
            out["settings_seq"] = self.settings_seq
        if self.projector is not None:
            out["projector"] = self.projector.to_json()
        if self.loras:
            out["loras"] = [a.to_json() for a in self.loras]
        if self.template_probe is not None:
            out["template_probe"] = self.template_probe.to_json()
        return out


@dataclass(frozen=True, slots=True)
class Pull:
    """The latest pull of a model's name: running, or how it ended (a failure may come with no start)."""

    target: str
    status: Literal["running", "completed", "failed"]
    seq: int | None = None  # its model.pull_started
    started_ts: float | None = None
    total_bytes: int | None = None
    ended_ts: float | None = None
    bytes: int | None = None  # completed: the file's size
    duration_ms: int | None = None
    reason: PullFailReason | None = None  # failed: why, and what is kept for a resume
    detail: str | None = None
    partial_bytes: int | None = None


@dataclass(slots=True)
class CatalogState:
    """The `catalog` projection's state; `stored`, `models`, `aliases` and the other readers below answer what needs
    more than a field (a name resolved through `:latest` or an alias)."""

    models: dict[str, StoredModel] = field(default_factory=dict)
    pulls: dict[str, Pull] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> the model's own name
    refused: list[RefusedEvent] = field(default_factory=list)
    # A GGUF's template probe by its sha256: every model with that file is served by its choice.
    probes: dict[str, TemplateProbe] = field(default_factory=dict)


class CatalogProjection(Projection[CatalogState]):
    node_local = True
    name = "catalog"
    state_type = CatalogState
    version = 11  # 9: a model's reasoning budget and effort; 10: its response cache setting (ModelSettings.cache);
    # 11: "semantic" among those settings
    types = frozenset({
        ModelTemplateProbed.TYPE,
        ModelImported.TYPE, ModelRemoved.TYPE, ModelPullStarted.TYPE, ModelPullCompleted.TYPE, ModelPullFailed.TYPE,
        ModelAliased.TYPE, ModelAliasRemoved.TYPE, ModelConfigured.TYPE, ModelVariantCreated.TYPE,
        ModelProjectorSet.TYPE, ModelProjectorRemoved.TYPE, LoraAdded.TYPE, LoraRemoved.TYPE,
    })

    def initial(self) -> CatalogState:
        return CatalogState()

    def apply(self, state: CatalogState, rec: Recorded) -> CatalogState:
        ev = rec.event
        if isinstance(ev, ModelImported | ModelVariantCreated | ModelProjectorSet | LoraAdded) and (
                problems := untrusted(ev)):
            state.refused.append(RefusedEvent.of(rec, problems))
        elif isinstance(ev, ModelImported):
            state.models[ev.name] = StoredModel(
                name=ev.name, file=ev.path, sha256=ev.sha256, bytes=ev.bytes, metadata=ev.metadata, seq=rec.seq,
                source=ev.source, added_ts=rec.ts, parts=tuple(ev.shards), source_kind=ev.source_kind,
                linked=ev.linked, kind=ev.kind, template_probe=state.probes.get(ev.sha256) if ev.sha256 else None)
        elif isinstance(ev, ModelRemoved):
            state.models.pop(ev.name, None)
            # An alias never outlives its model.
            for alias in [a for a, t in state.aliases.items() if t == ev.name]:
                del state.aliases[alias]
        elif isinstance(ev, ModelVariantCreated):
            base = state.models.get(ev.base)
            if base is not None:  # the handler checked it; a log that says otherwise leaves no half entry
                # The base's file facts, projector and adapters (its file is shared, content-addressed), with a name,
                # history and settings of its own; it outlives its base (the file stays while either does).
                state.models[ev.name] = dataclasses.replace(
                    base, name=ev.name, base=ev.base, added_ts=rec.ts, seq=rec.seq, configured=ev.settings,
                    settings_seq=rec.seq)
        elif isinstance(ev, ModelConfigured):
            entry = state.models.get(ev.name)
            if entry is not None:
                state.models[ev.name] = dataclasses.replace(entry, configured=ev.settings, settings_seq=rec.seq)
        elif isinstance(ev, ModelProjectorSet | ModelProjectorRemoved):
            _apply_projector(state, ev, rec.seq)
        elif isinstance(ev, LoraAdded | LoraRemoved):
            _apply_lora(state, ev, rec.seq)
        elif isinstance(ev, ModelAliased):
            state.aliases[ev.alias] = ev.target
        elif isinstance(ev, ModelAliasRemoved):
            state.aliases.pop(ev.alias, None)
        elif isinstance(ev, ModelPullStarted | ModelPullCompleted | ModelPullFailed):
            _apply_pull(state, ev, rec)
        elif isinstance(ev, ModelTemplateProbed):
            _apply_probe(state, ev, rec.seq)
        return state


def _apply_pull(state: CatalogState, ev: ModelPullStarted | ModelPullCompleted | ModelPullFailed,
                rec: Recorded) -> None:
    if isinstance(ev, ModelPullStarted):
        state.pulls[ev.name] = Pull(target=ev.target, status="running", seq=rec.seq, started_ts=rec.ts,
                                    total_bytes=ev.total_bytes)
        return
    # The start (if any) is kept beside the outcome.
    pull = state.pulls.get(ev.name) or Pull(target=ev.target, status="running")
    if isinstance(ev, ModelPullCompleted):
        state.pulls[ev.name] = dataclasses.replace(pull, status="completed", ended_ts=rec.ts, bytes=ev.bytes,
                                                   duration_ms=ev.duration_ms)
    else:
        state.pulls[ev.name] = dataclasses.replace(pull, status="failed", ended_ts=rec.ts, reason=ev.reason,
                                                   detail=ev.detail, partial_bytes=ev.partial_bytes)


def _apply_probe(state: CatalogState, ev: ModelTemplateProbed, seq: int) -> None:
    # By the file: every model with it (a variant, another name, one imported later) is served by the choice.
    probe = state.probes[ev.sha256] = TemplateProbe(
        chosen=ev.chosen, trials=tuple(ev.trials), prompts=ev.prompts, max_tokens=ev.max_tokens,
        engine_tag=ev.engine_tag, seq=seq)
    for name, m in state.models.items():
        if m.sha256 == ev.sha256:
            state.models[name] = dataclasses.replace(m, template_probe=probe)


def _apply_projector(state: CatalogState, ev: ModelProjectorSet | ModelProjectorRemoved, seq: int) -> None:
    entry = state.models.get(ev.name)
    if entry is None:
        return
    projector = None if isinstance(ev, ModelProjectorRemoved) else Projector(
        path=ev.path, sha256=ev.sha256, bytes=ev.bytes, metadata=ev.metadata, seq=seq, source=ev.source,
        source_kind=ev.source_kind, linked=ev.linked)
    state.models[ev.name] = dataclasses.replace(entry, projector=projector)


def _apply_lora(state: CatalogState, ev: LoraAdded | LoraRemoved, seq: int) -> None:
    entry = state.models.get(ev.model)
    if entry is None:
        return
    kept = tuple(a for a in entry.loras if a.name != ev.name)
    if isinstance(ev, LoraAdded):
        kept += (Lora(name=ev.name, path=ev.path, sha256=ev.sha256, bytes=ev.bytes, metadata=ev.metadata, seq=seq,
                      source=ev.source, linked=ev.linked),)
    state.models[ev.model] = dataclasses.replace(entry, loras=kept)


# -- readers -----------------------------------------------------------------------------------------------------------

def _find(state: CatalogState, name: str) -> StoredModel | None:
    """A model by exact name, by `name` meaning `name:latest` (Ollama's convention), or by an alias of either."""
    by_name, targets = state.models, state.aliases
    for candidate in (name, f"{name}:latest") if ":" not in name else (name,):
        hit = by_name.get(candidate) or by_name.get(targets.get(candidate, ""))
        if hit is not None:
            return hit
    return None


def stored(state: CatalogState, name: str) -> StoredModel | None:
    """The model `name` resolves to (exact, `:latest` or an alias), or None."""
    return _find(state, name)


def models(state: CatalogState) -> list[StoredModel]:
    """Every model in the store, by name."""
    return [state.models[n] for n in sorted(state.models)]


def settings_of(state: CatalogState, name: str) -> ModelSettings | None:
    """The settings of the model `name` resolves to (exact, `:latest` or an alias); None when it has none."""
    entry = _find(state, name)
    return None if entry is None else entry.settings


def ever_configured(state: CatalogState, name: str) -> bool:
    """`name` (a model's own name) has had its settings set at least once, even if they are empty now."""
    entry = state.models.get(name)
    return entry is not None and entry.settings_seq is not None


def sharing_files(state: CatalogState, name: str) -> list[str]:
    """The other models (variants, or the base of one) whose entry names the same file as `name`'s."""
    entry = state.models.get(name)
    if entry is None:
        return []
    return sorted(n for n, m in state.models.items() if n != name and m.file == entry.file)


def lora_users(state: CatalogState, path: str) -> list[str]:
    """Every model (variants included) with an adapter stored as the file `path`: it stays while any names it."""
    return sorted(n for n, m in state.models.items() if any(a.path == path for a in m.loras))


def projector_users(state: CatalogState, path: str) -> list[str]:
    """Every model (variants included) whose projector is the file `path`: it stays while any of them names it."""
    return sorted(n for n, m in state.models.items() if m.projector is not None and m.projector.path == path)


def is_model(state: CatalogState, name: str) -> bool:
    """`name` is a model's own name (not an alias, not `name:latest`)."""
    return name in state.models


def aliases(state: CatalogState) -> dict[str, str]:
    """Every alias with the model's name it stands for (a copy)."""
    return dict(state.aliases)


def alias_target(state: CatalogState, alias: str) -> str | None:
    """The model `alias` names, or None when it is no alias."""
    return state.aliases.get(alias)


def refusals(state: CatalogState) -> list[RefusedEvent]:
    """The imports and variants this projection would not trust (a path could lead out of the store), by seq."""
    return list(state.refused)

"""The `catalog` projection: the models in the store (name, file, sha256, metadata, serving settings), their
variants (another name for a model's file, with settings of its own) and the state of pulls.

An import or variant whose paths could lead out of the models directory (blazar/confine.py) becomes no model: it is
kept under `refused`, which `blazar doctor` reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blazar.confine import refused, untrusted
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
from blazar.projections.base import Projection, RefusedEvent, State, TypedState, refused_events


class CatalogState(TypedState):
    """The `catalog` projection's state, read through `stored`, `models`, `aliases` and the other readers below."""

    __slots__ = ()


class CatalogProjection(Projection[State]):
    node_local = True
    name = "catalog"
    state_type = CatalogState
    version = 7
    types = frozenset({
        ModelTemplateProbed.TYPE,
        ModelImported.TYPE, ModelRemoved.TYPE, ModelPullStarted.TYPE, ModelPullCompleted.TYPE, ModelPullFailed.TYPE,
        ModelAliased.TYPE, ModelAliasRemoved.TYPE, ModelConfigured.TYPE, ModelVariantCreated.TYPE,
        ModelProjectorSet.TYPE, ModelProjectorRemoved.TYPE, LoraAdded.TYPE, LoraRemoved.TYPE,
    })

    def initial(self) -> State:
        # probes: a GGUF's template probe by its sha256 (every model with that file is served by its choice)
        return {"models": {}, "pulls": {}, "aliases": {}, "refused": [], "probes": {}}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        if isinstance(ev, ModelImported | ModelVariantCreated | ModelProjectorSet) and (problems := untrusted(ev)):
            state["refused"].append(refused(rec, problems, name=ev.name))
        elif isinstance(ev, LoraAdded) and (problems := untrusted(ev)):
            state["refused"].append(refused(rec, problems, name=ev.model))
        elif isinstance(ev, ModelImported):
            state["models"][ev.name] = {
                "name": ev.name, "path": ev.path, "bytes": ev.bytes, "sha256": ev.sha256, "source": ev.source,
                "source_kind": ev.source_kind, "linked": ev.linked, "added_ts": rec.ts, "seq": rec.seq,
                "metadata": ev.metadata.model_dump(mode="json"),
                "shards": [sh.model_dump(mode="json") for sh in ev.shards], "kind": ev.kind,
            }
        elif isinstance(ev, ModelRemoved):
            state["models"].pop(ev.name, None)
            # An alias never outlives its model.
            for alias in [a for a, t in state["aliases"].items() if t == ev.name]:
                del state["aliases"][alias]
        elif isinstance(ev, ModelVariantCreated):
            base = state["models"].get(ev.base)
            if base is not None:  # the handler checked it; a log that says otherwise leaves no half entry
                # The variant's own copy of the file facts: it outlives its base (the file stays while either does).
                state["models"][ev.name] = {
                    **{k: base[k] for k in ("path", "bytes", "sha256", "source", "source_kind", "linked", "metadata",
                                            "shards")},
                    # A variant sees what its base sees: the same projector (its file is shared, content-addressed).
                    **{k: base[k] for k in ("projector", "loras") if k in base},
                    "kind": base.get("kind", "llama-server"),
                    "name": ev.name, "base": ev.base, "added_ts": rec.ts, "seq": rec.seq,
                    "settings": ev.settings.model_dump(mode="json"), "settings_seq": rec.seq,
                }
        elif isinstance(ev, ModelConfigured):
            entry = state["models"].get(ev.name)
            if entry is not None:
                entry["settings"] = ev.settings.model_dump(mode="json")
                entry["settings_seq"] = rec.seq
        elif isinstance(ev, ModelProjectorSet | ModelProjectorRemoved):
            _apply_projector(state, ev, rec.seq)
        elif isinstance(ev, LoraAdded | LoraRemoved):
            _apply_lora(state, ev, rec.seq)
        elif isinstance(ev, ModelAliased | ModelAliasRemoved):
            _apply_alias(state, ev)
        elif isinstance(ev, ModelPullStarted | ModelPullCompleted | ModelPullFailed):
            _apply_pull(state, ev, rec)
        elif isinstance(ev, ModelTemplateProbed):
            _apply_probe(state, ev, rec.seq)
        return state


def _apply_pull(state: State, ev: ModelPullStarted | ModelPullCompleted | ModelPullFailed, rec: Recorded) -> None:
    if isinstance(ev, ModelPullStarted):
        state["pulls"][ev.name] = {"target": ev.target, "status": "running", "started_ts": rec.ts,
                                   "total_bytes": ev.total_bytes, "seq": rec.seq}
        return
    pull = state["pulls"].setdefault(ev.name, {"target": ev.target})
    if isinstance(ev, ModelPullCompleted):
        pull.update(status="completed", ended_ts=rec.ts, bytes=ev.bytes, duration_ms=ev.duration_ms)
    else:
        pull.update(status="failed", ended_ts=rec.ts, reason=ev.reason, detail=ev.detail,
                    partial_bytes=ev.partial_bytes)


def _apply_alias(state: State, ev: ModelAliased | ModelAliasRemoved) -> None:
    if isinstance(ev, ModelAliased):
        state["aliases"][ev.alias] = ev.target
    else:
        state["aliases"].pop(ev.alias, None)


def _apply_probe(state: State, ev: ModelTemplateProbed, seq: int) -> None:
    # By the file: every model with it (a variant, another name) is served by the choice.
    state.setdefault("probes", {})[ev.sha256] = {
        "chosen": ev.chosen, "seq": seq, "engine_tag": ev.engine_tag, "prompts": ev.prompts,
        "max_tokens": ev.max_tokens, "trials": [t.model_dump(mode="json") for t in ev.trials]}


def _apply_projector(state: State, ev: ModelProjectorSet | ModelProjectorRemoved, seq: int) -> None:
    entry = state["models"].get(ev.name)
    if entry is None:
        return
    if isinstance(ev, ModelProjectorRemoved):
        entry.pop("projector", None)
        return
    entry["projector"] = {"path": ev.path, "bytes": ev.bytes, "sha256": ev.sha256, "source": ev.source,
                          "source_kind": ev.source_kind, "linked": ev.linked, "seq": seq,
                          "metadata": ev.metadata.model_dump(mode="json")}


def _apply_lora(state: State, ev: LoraAdded | LoraRemoved, seq: int) -> None:
    entry = state["models"].get(ev.model)
    if entry is None:
        return
    # A new list each time: a variant made earlier holds its own copy of the base's list, never this one.
    kept = [a for a in entry.get("loras", []) if a["name"] != ev.name]
    if isinstance(ev, LoraAdded):
        kept.append({"name": ev.name, "path": ev.path, "bytes": ev.bytes, "sha256": ev.sha256, "source": ev.source,
                     "linked": ev.linked, "seq": seq, "metadata": ev.metadata.model_dump(mode="json")})
    entry["loras"] = kept


def _find(state: State, name: str) -> dict[str, Any] | None:
    """A model by exact name, by `name` meaning `name:latest` (Ollama's convention), or by an alias of either."""
    by_name: dict[str, dict[str, Any]] = state["models"]
    targets: dict[str, str] = state.get("aliases", {})
    for candidate in (name, f"{name}:latest") if ":" not in name else (name,):
        hit = by_name.get(candidate) or by_name.get(targets.get(candidate, ""))
        if hit is not None:
            return hit
    return None


@dataclass(frozen=True)
class Projector:
    """A model's multimodal projector (llama.cpp's --mmproj file), typed."""

    path: str  # relative to the store's models directory: mmproj/<sha256>.gguf
    sha256: str
    bytes: int
    metadata: ProjectorMetadata
    seq: int  # the model.projector_set event
    source: str = ""

    @property
    def modalities(self) -> tuple[str, ...]:
        """What the projector lets the model take in: ("vision",), ("audio",) or both."""
        return tuple(self.metadata.modalities)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes, "source": self.source,
                "seq": self.seq, "modalities": list(self.modalities),
                "metadata": self.metadata.model_dump(mode="json")}


@dataclass(frozen=True)
class Lora:
    """One of a model's LoRA adapters (llama.cpp's --lora file), typed. Its id on the engine is its place in the
    model's list (the order of the --lora flags)."""

    name: str
    path: str  # relative to the store's models directory: lora/<sha256>.gguf
    sha256: str
    bytes: int
    metadata: LoraMetadata
    seq: int  # the lora.added event
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "bytes": self.bytes,
                "source": self.source, "seq": self.seq, "metadata": self.metadata.model_dump(mode="json")}


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class StoredModel:
    """A model in the store, typed: what the request path and the supervisor read instead of the state's dicts."""

    name: str
    file: str  # relative to the store's models directory
    sha256: str
    bytes: int
    metadata: ModelMetadata
    seq: int
    source: str = ""  # where it came from: a local path, a hub target, a python package
    added_ts: float = 0.0
    parts: tuple[ShardFile, ...] = ()  # a split model's parts, in order; () for one file
    settings: ModelSettings | None = None  # its template, system prompt and default parameters; None: none set
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


# Validating a GGUF summary (and a split model's parts) costs more than the lookup: once per imported version (its
# seq), not per request. The cached entry keeps the state's own metadata dict and is used only for that very dict:
# another state (a replay, a test's fold) with the same seq validates its own. An entry's file facts never change
# after the event that made it (a configure changes its settings alone).
_METADATA: dict[int, tuple[dict[str, Any], ModelMetadata, tuple[ShardFile, ...]]] = {}
_METADATA_KEEP = 512


def stored(state: CatalogState, name: str) -> StoredModel | None:
    """The model `name` resolves to (exact, `:latest` or an alias), or None."""
    entry = _find(state._raw, name)
    return None if entry is None else _typed(entry, state._raw.get("probes") or {})


def _probe(probes: dict[str, Any], sha256: str) -> TemplateProbe | None:
    raw = probes.get(sha256) if sha256 else None
    if raw is None:
        return None
    trials = tuple(TemplateTrial.model_validate(t) for t in raw["trials"])
    return TemplateProbe(chosen=str(raw["chosen"]), trials=trials, prompts=int(raw["prompts"]),
                         max_tokens=int(raw["max_tokens"]), engine_tag=str(raw["engine_tag"]), seq=int(raw["seq"]))


def _typed(entry: dict[str, Any], probes: dict[str, Any]) -> StoredModel:
    seq = int(entry.get("seq") or 0)
    raw = entry["metadata"]
    cached = _METADATA.get(seq) if seq else None
    if cached is not None and cached[0] is raw:
        meta, parts = cached[1], cached[2]
    else:
        meta = ModelMetadata.model_validate(raw)
        parts = tuple(ShardFile.model_validate(sh) for sh in entry.get("shards") or ())
        if seq:
            if len(_METADATA) >= _METADATA_KEEP:
                _METADATA.clear()
            _METADATA[seq] = (raw, meta, parts)
    configured = _settings(entry)
    settings_seq = entry.get("settings_seq")
    return StoredModel(name=str(entry["name"]), file=str(entry["path"]), sha256=str(entry.get("sha256") or ""),
                       bytes=int(entry.get("bytes") or 0), metadata=meta, seq=seq,
                       source=str(entry.get("source") or ""), added_ts=float(entry.get("added_ts") or 0.0),
                       parts=parts,
                       settings=None if configured is None or configured.is_empty() else configured,
                       base=entry.get("base"), source_kind=str(entry.get("source_kind") or "file"),
                       linked=bool(entry.get("linked")), configured=configured,
                       settings_seq=None if settings_seq is None else int(settings_seq),
                       projector=_projector(entry), kind=entry.get("kind") or "llama-server",
                       loras=tuple(_lora(raw) for raw in entry.get("loras") or ()),
                       template_probe=_probe(probes, str(entry.get("sha256") or "")))


# Like the metadata: validated once per projector event (its seq), not per request.
_PROJECTORS: dict[int, tuple[dict[str, Any], Projector]] = {}


def _projector(entry: dict[str, Any]) -> Projector | None:
    raw = entry.get("projector")
    if raw is None:
        return None
    seq = int(raw.get("seq") or 0)
    cached = _PROJECTORS.get(seq) if seq else None
    if cached is not None and cached[0] is raw:
        return cached[1]
    typed = Projector(path=str(raw["path"]), sha256=str(raw.get("sha256") or ""), bytes=int(raw.get("bytes") or 0),
                      metadata=ProjectorMetadata.model_validate(raw["metadata"]), seq=seq,
                      source=str(raw.get("source") or ""))
    if seq:
        if len(_PROJECTORS) >= _METADATA_KEEP:
            _PROJECTORS.clear()
        _PROJECTORS[seq] = (raw, typed)
    return typed


# Like the metadata: validated once per lora.added event (its seq), not per request.
_LORAS: dict[int, tuple[dict[str, Any], Lora]] = {}


def _lora(raw: dict[str, Any]) -> Lora:
    seq = int(raw.get("seq") or 0)
    cached = _LORAS.get(seq) if seq else None
    if cached is not None and cached[0] is raw:
        return cached[1]
    typed = Lora(name=str(raw["name"]), path=str(raw["path"]), sha256=str(raw.get("sha256") or ""),
                 bytes=int(raw.get("bytes") or 0), metadata=LoraMetadata.model_validate(raw["metadata"]), seq=seq,
                 source=str(raw.get("source") or ""))
    if seq:
        if len(_LORAS) >= _METADATA_KEEP:
            _LORAS.clear()
        _LORAS[seq] = (raw, typed)
    return typed


def lora_users(state: CatalogState, path: str) -> list[str]:
    """Every model (variants included) with an adapter stored as the file `path`: it stays while any names it."""
    by_name: dict[str, dict[str, Any]] = state._raw["models"]
    return sorted(n for n, m in by_name.items() if any(a.get("path") == path for a in m.get("loras") or ()))


def projector_users(state: CatalogState, path: str) -> list[str]:
    """Every model (variants included) whose projector is the file `path`: it stays while any of them names it."""
    by_name: dict[str, dict[str, Any]] = state._raw["models"]
    return sorted(n for n, m in by_name.items() if (m.get("projector") or {}).get("path") == path)


# Like the metadata: validated once per change of settings (its seq), not per request.
_SETTINGS: dict[int, tuple[dict[str, Any], ModelSettings]] = {}


def _settings(entry: dict[str, Any]) -> ModelSettings | None:
    """The settings as recorded (empty ones too), or None when they were never set."""
    raw = entry.get("settings")
    if raw is None:
        return None
    seq = int(entry.get("settings_seq") or 0)
    cached = _SETTINGS.get(seq) if seq else None
    if cached is not None and cached[0] is raw:
        return cached[1]
    typed = ModelSettings.model_validate(raw)
    if seq:
        if len(_SETTINGS) >= _METADATA_KEEP:
            _SETTINGS.clear()
        _SETTINGS[seq] = (raw, typed)
    return typed


def settings_of(state: CatalogState, name: str) -> ModelSettings | None:
    """The settings of the model `name` resolves to (exact, `:latest` or an alias); None when it has none."""
    entry = _find(state._raw, name)
    typed = None if entry is None else _settings(entry)
    return None if typed is None or typed.is_empty() else typed


def ever_configured(state: CatalogState, name: str) -> bool:
    """`name` (a model's own name) has had its settings set at least once, even if they are empty now."""
    entry = state._raw["models"].get(name)
    return entry is not None and "settings_seq" in entry


def sharing_files(state: CatalogState, name: str) -> list[str]:
    """The other models (variants, or the base of one) whose entry names the same file as `name`'s."""
    by_name: dict[str, dict[str, Any]] = state._raw["models"]
    entry = by_name.get(name)
    if entry is None:
        return []
    return sorted(n for n, m in by_name.items() if n != name and m["path"] == entry["path"])


def models(state: CatalogState) -> list[StoredModel]:
    """Every model in the store, by name."""
    by_name = state._raw["models"]
    probes = state._raw.get("probes") or {}
    return [_typed(by_name[n], probes) for n in sorted(by_name)]


def is_model(state: CatalogState, name: str) -> bool:
    """`name` is a model's own name (not an alias, not `name:latest`)."""
    return name in state._raw["models"]


def aliases(state: CatalogState) -> dict[str, str]:
    """Every alias with the model's name it stands for (a copy)."""
    return dict(state._raw.get("aliases", {}))


def alias_target(state: CatalogState, alias: str) -> str | None:
    """The model `alias` names, or None when it is no alias."""
    target = state._raw.get("aliases", {}).get(alias)
    return None if target is None else str(target)


def refusals(state: CatalogState) -> list[RefusedEvent]:
    """The imports and variants this projection would not trust (a path could lead out of the store), by seq."""
    return refused_events(state._raw.get("refused", []))

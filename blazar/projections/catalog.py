"""The `catalog` projection: the models in the store (name, file, sha256, metadata, serving settings), their
variants (another name for a model's file, with settings of its own) and the state of pulls.

An import or variant whose paths could lead out of the models directory (blazar/confine.py) becomes no model: it is
kept under `refused`, which `blazar doctor` reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blazar.confine import refused, untrusted
from blazar.events.base import Recorded
from blazar.events.model_settings import ModelConfigured, ModelSettings, ModelVariantCreated
from blazar.events.models import (
    ModelAliased,
    ModelAliasRemoved,
    ModelImported,
    ModelMetadata,
    ModelPullCompleted,
    ModelPullFailed,
    ModelPullStarted,
    ModelRemoved,
)
from blazar.projections.base import Projection, State


class CatalogProjection(Projection):
    node_local = True
    name = "catalog"
    version = 4
    types = frozenset({
        ModelImported.TYPE, ModelRemoved.TYPE, ModelPullStarted.TYPE, ModelPullCompleted.TYPE, ModelPullFailed.TYPE,
        ModelAliased.TYPE, ModelAliasRemoved.TYPE, ModelConfigured.TYPE, ModelVariantCreated.TYPE,
    })

    def initial(self) -> State:
        return {"models": {}, "pulls": {}, "aliases": {}, "refused": []}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        if isinstance(ev, ModelImported | ModelVariantCreated) and (problems := untrusted(ev)):
            state["refused"].append(refused(rec, problems, name=ev.name))
        elif isinstance(ev, ModelImported):
            state["models"][ev.name] = {
                "name": ev.name, "path": ev.path, "bytes": ev.bytes, "sha256": ev.sha256, "source": ev.source,
                "source_kind": ev.source_kind, "linked": ev.linked, "added_ts": rec.ts, "seq": rec.seq,
                "metadata": ev.metadata.model_dump(mode="json"),
                "shards": [sh.model_dump(mode="json") for sh in ev.shards],
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
                    "name": ev.name, "base": ev.base, "added_ts": rec.ts, "seq": rec.seq,
                    "settings": ev.settings.model_dump(mode="json"), "settings_seq": rec.seq,
                }
        elif isinstance(ev, ModelConfigured):
            entry = state["models"].get(ev.name)
            if entry is not None:
                entry["settings"] = ev.settings.model_dump(mode="json")
                entry["settings_seq"] = rec.seq
        elif isinstance(ev, ModelAliased):
            state["aliases"][ev.alias] = ev.target
        elif isinstance(ev, ModelAliasRemoved):
            state["aliases"].pop(ev.alias, None)
        elif isinstance(ev, ModelPullStarted):
            state["pulls"][ev.name] = {"target": ev.target, "status": "running", "started_ts": rec.ts,
                                       "total_bytes": ev.total_bytes, "seq": rec.seq}
        elif isinstance(ev, ModelPullCompleted):
            pull = state["pulls"].setdefault(ev.name, {"target": ev.target})
            pull.update(status="completed", ended_ts=rec.ts, bytes=ev.bytes, duration_ms=ev.duration_ms)
        elif isinstance(ev, ModelPullFailed):
            pull = state["pulls"].setdefault(ev.name, {"target": ev.target})
            pull.update(status="failed", ended_ts=rec.ts, reason=ev.reason, detail=ev.detail,
                        partial_bytes=ev.partial_bytes)
        return state


def find(state: State, name: str) -> dict[str, Any] | None:
    """A model by exact name, by `name` meaning `name:latest` (Ollama's convention), or by an alias of either."""
    by_name = state["models"]
    targets = state.get("aliases", {})
    for candidate in (name, f"{name}:latest") if ":" not in name else (name,):
        hit = by_name.get(candidate) or by_name.get(targets.get(candidate, ""))
        if hit is not None:
            return hit
    return None


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
    shards: tuple[str, ...] = ()  # a split model's parts (relative to the models directory); () for one file
    settings: ModelSettings | None = None  # its template, system prompt and default parameters; None: none set
    base: str | None = None  # a variant: the model it was made from; None for a model of its own

    @property
    def files(self) -> tuple[str, ...]:
        """What the model occupies in the store: its parts, or its one file."""
        return self.shards or (self.file,)


# Validating a GGUF summary costs more than the lookup: once per imported version (its seq), not per request. The
# cached entry keeps the state's own metadata dict and is used only for that very dict: another state (a replay, a
# test's fold) with the same seq validates its own.
_METADATA: dict[int, tuple[dict[str, Any], ModelMetadata]] = {}
_METADATA_KEEP = 512


def stored(state: State, name: str) -> StoredModel | None:
    """`find`, typed: the model `name` resolves to (exact, `:latest` or an alias), or None."""
    entry = find(state, name)
    return None if entry is None else _typed(entry)


def _typed(entry: dict[str, Any]) -> StoredModel:
    seq = int(entry.get("seq") or 0)
    raw = entry["metadata"]
    cached = _METADATA.get(seq) if seq else None
    if cached is not None and cached[0] is raw:
        meta = cached[1]
    else:
        meta = ModelMetadata.model_validate(raw)
        if seq:
            if len(_METADATA) >= _METADATA_KEEP:
                _METADATA.clear()
            _METADATA[seq] = (raw, meta)
    return StoredModel(name=str(entry["name"]), file=str(entry["path"]), sha256=str(entry.get("sha256") or ""),
                       bytes=int(entry.get("bytes") or 0), metadata=meta, seq=seq,
                       source=str(entry.get("source") or ""), added_ts=float(entry.get("added_ts") or 0.0),
                       shards=tuple(str(s["path"]) for s in entry.get("shards") or ()),
                       settings=_settings(entry), base=entry.get("base"))


# Like the metadata: validated once per change of settings (its seq), not per request.
_SETTINGS: dict[int, tuple[dict[str, Any], ModelSettings]] = {}


def _settings(entry: dict[str, Any]) -> ModelSettings | None:
    raw = entry.get("settings")
    if raw is None:
        return None
    seq = int(entry.get("settings_seq") or 0)
    cached = _SETTINGS.get(seq) if seq else None
    if cached is not None and cached[0] is raw:
        typed = cached[1]
    else:
        typed = ModelSettings.model_validate(raw)
        if seq:
            if len(_SETTINGS) >= _METADATA_KEEP:
                _SETTINGS.clear()
            _SETTINGS[seq] = (raw, typed)
    return None if typed.is_empty() else typed


def settings_of(state: State, name: str) -> ModelSettings | None:
    """The settings of the model `name` resolves to (exact, `:latest` or an alias); None when it has none."""
    entry = find(state, name)
    return None if entry is None else _settings(entry)


def ever_configured(state: State, name: str) -> bool:
    """`name` (a model's own name) has had its settings set at least once, even if they are empty now."""
    entry = state["models"].get(name)
    return entry is not None and "settings_seq" in entry


def sharing_files(state: State, name: str) -> list[str]:
    """The other models (variants, or the base of one) whose entry names the same file as `name`'s."""
    entry = state["models"].get(name)
    if entry is None:
        return []
    return sorted(n for n, m in state["models"].items() if n != name and m["path"] == entry["path"])


def models(state: State) -> list[StoredModel]:
    """Every model in the store, by name."""
    return [_typed(state["models"][n]) for n in sorted(state["models"])]


def is_model(state: State, name: str) -> bool:
    """`name` is a model's own name (not an alias, not `name:latest`)."""
    return name in state["models"]


def aliases(state: State) -> dict[str, str]:
    """Every alias with the model's name it stands for (a copy)."""
    return dict(state.get("aliases", {}))


def alias_target(state: State, alias: str) -> str | None:
    """The model `alias` names, or None when it is no alias."""
    target = state.get("aliases", {}).get(alias)
    return None if target is None else str(target)

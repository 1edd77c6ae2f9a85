"""The `catalog` projection: the models in the store (name, file, sha256, metadata) and the state of pulls."""

from __future__ import annotations

from dataclasses import dataclass

from blazar.events.base import Recorded
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
    name = "catalog"
    version = 2
    types = frozenset({
        ModelImported.TYPE, ModelRemoved.TYPE, ModelPullStarted.TYPE, ModelPullCompleted.TYPE, ModelPullFailed.TYPE,
        ModelAliased.TYPE, ModelAliasRemoved.TYPE,
    })

    def initial(self) -> State:
        return {"models": {}, "pulls": {}, "aliases": {}}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        if isinstance(ev, ModelImported):
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


def find(state: State, name: str) -> dict | None:
    """A model by exact name, by `name` meaning `name:latest` (Ollama's convention), or by an alias of either."""
    models = state["models"]
    aliases = state.get("aliases", {})
    for candidate in (name, f"{name}:latest") if ":" not in name else (name,):
        hit = models.get(candidate) or models.get(aliases.get(candidate, ""))
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


# Validating a GGUF summary costs more than the lookup: once per imported version (its seq), not per request.
_METADATA: dict[int, ModelMetadata] = {}
_METADATA_KEEP = 512


def stored(state: State, name: str) -> StoredModel | None:
    """`find`, typed: the model `name` resolves to (exact, `:latest` or an alias), or None."""
    entry = find(state, name)
    if entry is None:
        return None
    seq = int(entry.get("seq") or 0)
    meta = _METADATA.get(seq) if seq else None
    if meta is None:
        meta = ModelMetadata.model_validate(entry["metadata"])
        if seq:
            if len(_METADATA) >= _METADATA_KEEP:
                _METADATA.clear()
            _METADATA[seq] = meta
    return StoredModel(name=str(entry["name"]), file=str(entry["path"]), sha256=str(entry.get("sha256") or ""),
                       bytes=int(entry.get("bytes") or 0), metadata=meta, seq=seq)

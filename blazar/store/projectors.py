"""Projectors in the model store (llama.cpp's `--mmproj` files): set beside a model, replaced, removed; each as an
event (`model.projector_set`, `model.projector_removed`), the file verified by sha256 like a model's.

A projector file is stored content-addressed, `mmproj/<sha256>.gguf` under the models directory: two models (or a
model and its variants) that name the same bytes share one file, which goes when the last model naming it does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

from blazar.adapters.mmproj_inspect import inspect_projector
from blazar.confine import PROJECTOR_DIR, inside
from blazar.context import Blazar
from blazar.errors import InvalidModelSettings, ModelFileError, ModelNotFound
from blazar.events.base import Recorded
from blazar.events.models import ModelMetadata
from blazar.events.projectors import ModelProjectorRemoved, ModelProjectorSet, ProjectorMetadata
from blazar.projections.catalog import projector_users, stored
from blazar.store.models import import_model, store_by_digest, unlink_counting
from blazar.store.placement import Placed


def projector_info(meta: ProjectorMetadata) -> dict[str, Any]:
    """Ollama's `projector_info` for /api/show: the projector's header keys, as Ollama lists a vision model's."""
    info: dict[str, Any] = {"general.architecture": "clip", "clip.has_vision_encoder": "vision" in meta.modalities,
                            "clip.has_audio_encoder": "audio" in meta.modalities}
    if meta.projector_type:
        info["clip.projector_type"] = meta.projector_type
    for prefix, enc in (("vision", meta.vision), ("audio", meta.audio)):
        if enc is None:
            continue
        for key, value in (("embedding_length", enc.embedding_length), ("block_count", enc.block_count),
                           ("feed_forward_length", enc.feed_forward_length),
                           ("attention.head_count", enc.head_count), ("projection_dim", enc.projection_dim),
                           ("image_size", enc.image_size), ("patch_size", enc.patch_size),
                           ("num_mel_bins", enc.mel_bins)):
            if value is not None:
                info[f"clip.{prefix}.{key}"] = value
    return info


def check_pairing(model: str, metadata: ModelMetadata, projector: ProjectorMetadata, source: str) -> None:
    """A projector whose output width is not the model's embedding width would fail the load (llama.cpp checks it
    after reading both files): refused here, at import, naming both widths."""
    width = metadata.embedding_length
    outs = {e.projection_dim for e in (projector.vision, projector.audio) if e is not None and e.projection_dim}
    if width and outs and width not in outs:
        raise ModelFileError(f"{source}: the projector projects to {', '.join(map(str, sorted(outs)))} wide, but "
                             f"{model}'s embedding width is {width}: it belongs to another model "
                             "(llama-server refuses to load them together)")


def store_projector(src: Path, models_dir: Path, expected_sha256: str | None) -> tuple[str, Placed, str, int]:
    """`src` stored as `mmproj/<sha256>.gguf` (store_by_digest)."""
    return store_by_digest(src, models_dir, PROJECTOR_DIR, expected_sha256)


async def set_projector(app: Blazar, name: str, src: Path, *, source: str | None = None,
                        source_kind: Literal["file", "hub"] = "file", expected_sha256: str | None = None,
                        metadata: ProjectorMetadata | None = None) -> Recorded:
    """Serve model `name` with the projector `src` (validated, paired with the model, stored, hashed): records
    `model.projector_set`, after `model.projector_removed` of the one it replaces. The next load passes --mmproj; a
    running instance started without it serves no image (it is another load shape)."""
    catalog = app.runner.state("catalog")
    entry = stored(catalog, name)
    if entry is None:
        raise ModelNotFound(f"no model named {name!r} in the store (see: blazar list)")
    if not entry.gguf:
        raise InvalidModelSettings(f"{entry.name} is a {entry.kind} model: only a GGUF model (served by llama-server) "
                                   "takes a projector")
    if metadata is None:
        metadata = await asyncio.to_thread(inspect_projector, src)
    check_pairing(entry.name, entry.metadata, metadata, str(src))
    rel, placed, digest, size = await asyncio.to_thread(store_projector, src, app.paths.models, expected_sha256)
    try:
        old = entry.projector
        if old is not None and old.path != rel:
            await _drop(app, entry.name, old.path)
        (rec,) = await app.record(ModelProjectorSet(
            name=entry.name, path=rel, source=source or str(src), source_kind=source_kind, bytes=size, sha256=digest,
            linked=placed == "hardlink", metadata=metadata))
    except BaseException:
        if not projector_users(app.runner.state("catalog"), rel):
            await asyncio.to_thread(unlink_counting, app.paths.models / rel)
        raise
    return rec


async def remove_projector(app: Blazar, name: str) -> Recorded:
    """Serve model `name` without its projector again (`blazar model set NAME --no-mmproj`)."""
    entry = stored(app.runner.state("catalog"), name)
    if entry is None:
        raise ModelNotFound(f"no model named {name!r} in the store (see: blazar list)")
    if entry.projector is None:
        raise InvalidModelSettings(f"{entry.name} has no projector to remove")
    return await _drop(app, entry.name, entry.projector.path)


async def _drop(app: Blazar, name: str, path: str) -> Recorded:
    """Record that `name` no longer has the projector `path`; delete the file when no other model names it.
    NOTE: the path is proved inside the store before anything is removed: a refusal removes nothing."""
    others = [m for m in projector_users(app.runner.state("catalog"), path) if m != name]
    target = None if others else inside(app.paths.models, path, what=f"model.projector_set of {name}")
    (rec,) = await app.record(ModelProjectorRemoved(name=name, path=path, file_deleted=target is not None))
    if target is not None:
        await asyncio.to_thread(unlink_counting, target)
    return rec


async def release_with_model(app: Blazar, name: str) -> None:
    """Before model `name` leaves the store: its projector goes with it (recorded; the file deleted when no other
    model, a variant say, still names it)."""
    entry = stored(app.runner.state("catalog"), name)
    if entry is not None and entry.projector is not None and entry.name == name:
        await _drop(app, name, entry.projector.path)


async def import_with_projector(app: Blazar, src: Path, name: str, mmproj: Path) -> tuple[Recorded, Recorded]:
    """`blazar import FILE --mmproj PROJ`: both files checked (each header, and that they pair) before either
    enters the store; then the model's `model.imported` and its `model.projector_set`."""
    from blazar.adapters.gguf_inspect import inspect_gguf

    meta = await asyncio.to_thread(inspect_gguf, src)
    proj = await asyncio.to_thread(inspect_projector, mmproj)
    check_pairing(name, meta, proj, str(mmproj))
    imported = await import_model(app, src, name, metadata=meta)
    return imported, await set_projector(app, name, mmproj, metadata=proj)

"""LoRA adapters in the model store (llama.cpp's `--lora` files): added beside a model under a name, removed; each as
an event (`lora.added`, `lora.removed`), the file verified by sha256 like a model's.

An adapter file is stored content-addressed, `lora/<sha256>.gguf` under the models directory: two models (a model and
its variants, say) that name the same bytes share one file, which goes when the last model naming it does. A model
loads with every adapter it has (`--lora`, unapplied); a request applies the ones it names (blazar/serving/lora.py).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from blazar.adapters.lora_inspect import inspect_lora
from blazar.confine import LORA_DIR, inside
from blazar.context import Blazar
from blazar.errors import InvalidModelSettings, ModelExists, ModelFileError, ModelNotFound
from blazar.events.base import Recorded
from blazar.events.lora import LoraAdded, LoraMetadata, LoraRemoved
from blazar.projections.catalog import StoredModel, lora_users, stored
from blazar.store.models import store_by_digest, unlink_counting
from blazar.store.placement import Placed

# An adapter's name: what a request's `lora: [{"name": ...}]` and a Modelfile's ADAPTER say.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise InvalidModelSettings(f"adapter name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (starting with "
                                   "a letter or digit)")


def check_pairing(model: StoredModel, meta: LoraMetadata, source: str) -> None:
    """An adapter for another architecture would fail the load (llama.cpp compares them): refused here, naming
    both."""
    arch = model.metadata.architecture
    if arch and meta.architecture != arch:
        raise ModelFileError(f"{source}: the adapter is for {meta.architecture!r} models, but {model.name} is a "
                             f"{arch!r} model: it belongs to another model")


def store_lora(src: Path, models_dir: Path, expected_sha256: str | None) -> tuple[str, Placed, str, int]:
    """`src` stored as `lora/<sha256>.gguf` (store_by_digest)."""
    return store_by_digest(src, models_dir, LORA_DIR, expected_sha256)


async def add_lora(app: Blazar, model: str, src: Path, name: str, *, expected_sha256: str | None = None) -> Recorded:
    """Give model `model` the adapter `src` under `name` (validated, paired with the model, stored, hashed):
    records `lora.added`. The model's next load carries it; a running instance started without it is another load
    shape and gives way to one that has it."""
    check_name(name)
    entry = stored(app.runner.state("catalog"), model)
    if entry is None:
        raise ModelNotFound(f"no model named {model!r} in the store (see: blazar list)")
    if not entry.gguf:
        raise InvalidModelSettings(f"{entry.name} is a {entry.kind} model: only a GGUF model (served by llama-server) "
                                   "takes a LoRA adapter")
    if any(a.name == name for a in entry.loras):
        raise ModelExists(f"{entry.name} already has an adapter named {name!r} (blazar lora rm {entry.name} {name} "
                          "first)")
    meta = await asyncio.to_thread(inspect_lora, src)
    check_pairing(entry, meta, str(src))
    rel, placed, digest, size = await asyncio.to_thread(store_lora, src, app.paths.models, expected_sha256)
    try:
        (rec,) = await app.record(LoraAdded(model=entry.name, name=name, path=rel, source=str(src), sha256=digest,
                                            bytes=size, linked=placed == "hardlink", metadata=meta))
    except BaseException:
        if not lora_users(app.runner.state("catalog"), rel):
            await asyncio.to_thread(unlink_counting, app.paths.models / rel)
        raise
    return rec


async def remove_lora(app: Blazar, model: str, name: str) -> Recorded:
    """Take the adapter `name` from model `model` (`blazar lora rm`)."""
    entry = stored(app.runner.state("catalog"), model)
    if entry is None:
        raise ModelNotFound(f"no model named {model!r} in the store (see: blazar list)")
    found = next((a for a in entry.loras if a.name == name), None)
    if found is None:
        have = ", ".join(a.name for a in entry.loras) or "none"
        raise ModelNotFound(f"{entry.name} has no adapter named {name!r} (it has: {have})")
    return await _drop(app, entry.name, name, found.path)


async def _drop(app: Blazar, model: str, name: str, path: str) -> Recorded:
    """Record that `model` no longer has the adapter `name`; delete its file when no other model names it.
    NOTE: the path is proved inside the store before anything is removed: a refusal removes nothing."""
    others = [m for m in lora_users(app.runner.state("catalog"), path) if m != model]
    target = None if others else inside(app.paths.models, path, what=f"lora.added {name} of {model}")
    (rec,) = await app.record(LoraRemoved(model=model, name=name, path=path, file_deleted=target is not None))
    if target is not None:
        await asyncio.to_thread(unlink_counting, target)
    return rec


async def release_with_model(app: Blazar, name: str) -> None:
    """Before model `name` leaves the store: its adapters go with it (each recorded; a file deleted when no other
    model, a variant say, still names it)."""
    entry = stored(app.runner.state("catalog"), name)
    if entry is not None and entry.name == name:
        for a in entry.loras:
            await _drop(app, name, a.name, a.path)

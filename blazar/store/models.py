"""Model store commands: import a GGUF, a whisper model directory or a piper voice (validated, hardlinked, reflinked or
copied, hashed) and remove one.

Nothing is recorded and nothing is left in the store unless the whole import succeeded: the file is placed
under a temporary name, and only renamed into place once it is inspected and hashed; if recording fails, the
file is removed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import secrets
import shutil
from pathlib import Path

from blazar.adapters.gguf_inspect import inspect_gguf, inspect_split
from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import InvalidModelName, ModelExists, ModelFileError, ModelInUse, ModelNotFound
from blazar.events.base import Recorded
from blazar.events.models import (
    ModelAliased,
    ModelAliasRemoved,
    ModelImported,
    ModelMetadata,
    ModelRemoved,
    ShardFile,
    SourceKind,
)
from blazar.projections.catalog import alias_target, is_model, models, sharing_files, stored
from blazar.projections.residency import instances_of
from blazar.store.kinds import Found, detect, directory_digest
from blazar.store.placement import Placed, place_file

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(:[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # fullmatch: "$" would let a trailing newline in
        raise InvalidModelName(
            f"invalid model name {_shown(name)}: use letters, digits, '.', '_' and '-', optionally with a ':tag' "
            "(for example gemma3-270m or gemma3:270m-q4)"
        )
    return name


def _shown(name: object) -> str:
    text = str(name)
    return repr(text if len(text) <= 64 else f"{text[:64]}…({len(text.encode())} bytes)")


def store_filename(name: str) -> str:
    """The file name a model gets in the store: its name, with the tag separator made filesystem-safe."""
    return name.replace(":", "--") + ".gguf"


def slot_dir(data_dir: Path, name: str) -> Path:
    """Where an instance of model `name` saves and restores its slots (llama-server's --slot-save-path): one
    directory per model, so a later instance of it finds what an earlier one saved (the KV bank)."""
    return data_dir / "slots" / store_filename(name).removesuffix(".gguf")


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def store_file(src: Path, models_dir: Path, filename: str,
               expected_sha256: str | None) -> tuple[Path, Placed, str, int]:
    """Put `src` into the store as `filename`: placed (store/placement.py) under a temporary name, hashed, then
    renamed.

    Returns (dest, how it was placed, sha256, size). On any failure nothing is left in the store.
    """
    models_dir.mkdir(parents=True, exist_ok=True)
    dest = models_dir / filename
    tmp = models_dir / f".{filename}.{os.getpid()}.importing"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        placed = place_file(src, tmp)
        digest = sha256_file(tmp)
        if expected_sha256 is not None and digest != expected_sha256:
            raise ModelFileError(f"{src}: sha256 {digest} does not match the expected {expected_sha256}")
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return dest, placed, digest, dest.stat().st_size


def store_by_digest(src: Path, models_dir: Path, subdir: str,
                    expected_sha256: str | None) -> tuple[str, Placed, str, int]:
    """Put `src` into the store as `<subdir>/<sha256>.gguf` (projectors, LoRA adapters: files shared by every model
    that names the same bytes): linked or copied under a temporary name, hashed (and compared with
    `expected_sha256`, when given), then renamed, or dropped when those very bytes are stored already. Returns (path
    relative to `models_dir`, how it was placed, sha256, size). On any failure nothing is left in the store."""
    where = models_dir / subdir
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".{os.getpid()}.{secrets.token_hex(4)}.importing"
    try:
        placed = place_file(src, tmp)
        digest = sha256_file(tmp)
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise ModelFileError(f"{src}: sha256 {digest} does not match the expected {expected_sha256}")
        dest = where / f"{digest}.gguf"
        if dest.exists() and sha256_file(dest) == digest:
            tmp.unlink()  # another model's: the same bytes, one file
        else:
            os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return f"{subdir}/{digest}.gguf", placed, digest, dest.stat().st_size


def store_split(srcs: list[Path], models_dir: Path, dirname: str) -> tuple[list[ShardFile], Placed]:
    """Put every part of a split model into `models_dir/dirname/` under its own name (llama-server finds the
    other parts beside the first by name). All or nothing, like `store_file`. How they were placed: the weakest
    way any part was (one copied part: "copy")."""
    final = models_dir / dirname
    staging = models_dir / f".{dirname}.{os.getpid()}.importing"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        shards: list[ShardFile] = []
        ways: set[Placed] = set()
        for src in srcs:
            _, placed, digest, size = store_file(src, staging, src.name, None)
            ways.add(placed)
            shards.append(ShardFile(path=f"{dirname}/{src.name}", bytes=size, sha256=digest))
        if final.exists():
            shutil.rmtree(final)  # a leftover the catalog does not know (it was checked for the name)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return shards, _weakest(ways)


def _weakest(ways: set[Placed]) -> Placed:
    return "copy" if "copy" in ways else "reflink" if "reflink" in ways else "hardlink"


async def import_model(
    app: Blazar,
    src: Path | list[Path],
    name: str,
    *,
    source: str | None = None,
    source_kind: SourceKind = "file",
    expected_sha256: str | None = None,
    metadata: ModelMetadata | None = None,
) -> Recorded:
    """Validate `src` as GGUF (or every part of a split model), or as a whisper model directory or a piper voice
    (store/kinds.py tells them by their files), place it in the store as `name`, and record `model.imported` with its
    kind. Nothing is recorded and nothing is left in the store when any step fails. `expected_sha256`: a GGUF's
    sha256; a directory model's files are checked by the caller (each has its own)."""
    check_name(name)
    catalog = app.runner.state("catalog")
    if stored(catalog, name) is not None:
        raise ModelExists(f"a model named {name!r} is already in the store (remove it first: blazar rm {name})")
    parts = src if isinstance(src, list) else [src]
    found = await asyncio.to_thread(detect, parts[0]) if len(parts) == 1 else None
    # "a:b" and "a--b" are both stored as a--b: the file (or split directory) of another model is never replaced.
    top = store_filename(name) if len(parts) == 1 and found is None else store_filename(name)[: -len(".gguf")]
    owner = next((m.name for m in models(catalog) if Path(m.file).parts[0] == top), None)
    if owner is not None:
        raise ModelExists(f"the name {name!r} would be stored as {top}, which belongs to the model {owner!r}; "
                          "pick another name")
    if found is not None:
        return await _import_directory_model(app, found, name, top, source=source or str(parts[0]),
                                             source_kind=source_kind)
    # File work runs in a thread: hashing a multi-GB file must not stall a daemon's event loop.
    if metadata is None:
        metadata = await (asyncio.to_thread(inspect_gguf, parts[0]) if len(parts) == 1
                          else asyncio.to_thread(inspect_split, parts))
    assert metadata is not None  # given, or inspected just above
    shards: list[ShardFile] = []
    if len(parts) == 1:
        dest, how, digest, size = await asyncio.to_thread(
            store_file, parts[0], app.paths.models, store_filename(name), expected_sha256
        )
        rel, placed = dest.name, [dest]
    else:
        dirname = store_filename(name)[: -len(".gguf")]
        shards, how = await asyncio.to_thread(store_split, parts, app.paths.models, dirname)
        rel, digest, size = shards[0].path, shards[0].sha256, sum(s.bytes for s in shards)
        placed = [app.paths.models / dirname]
    event = ModelImported(
        name=name, path=rel, source=source or str(parts[0]), source_kind=source_kind,
        bytes=size, sha256=digest, linked=how == "hardlink", placed=how, metadata=metadata, shards=shards,
    )
    try:
        (rec,) = await app.record(event)
    except BaseException:
        for p in placed:
            await asyncio.to_thread(_remove_path, p)
        raise
    return rec


async def _import_directory_model(app: Blazar, found: Found, name: str, dirname: str, *, source: str,
                                  source_kind: SourceKind) -> Recorded:
    """A whisper model or piper voice: its files linked (or copied) into `models/<dirname>/`, each hashed, the
    directory digest as the model's sha256 (store/kinds.py)."""
    shards, placed = await asyncio.to_thread(store_split, list(found.files), app.paths.models, dirname)
    event = ModelImported(name=name, path=shards[0].path, source=source, source_kind=source_kind,
                          bytes=sum(s.bytes for s in shards), sha256=directory_digest(shards),
                          linked=placed == "hardlink", placed=placed, metadata=found.metadata, shards=shards,
                          kind=found.kind)
    try:
        (rec,) = await app.record(event)
    except BaseException:
        await asyncio.to_thread(_remove_path, app.paths.models / dirname)
        raise
    return rec


def _remove_path(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def unlink_counting(path: Path) -> bool:
    """Unlink `path`; True when that freed the data (it was the file's last link)."""
    try:
        last = path.stat().st_nlink == 1
        path.unlink()
    except FileNotFoundError:
        return False
    return last


async def remove_model(app: Blazar, name: str) -> Recorded:
    """Remove `name` from the store. The file's data is freed only when this was its last link. An alias is only
    an alias: removing it leaves its model alone; a variant (or the base of one) leaves the file to the others."""
    catalog = app.runner.state("catalog")
    if not is_model(catalog, name) and alias_target(catalog, name) is not None:
        return await unalias_model(app, name)
    entry = stored(catalog, name)
    if entry is None:
        raise ModelNotFound(f"no model named {name!r} in the store (see: blazar list)")
    await app.runner.catch_up()  # a daemon may have loaded it since this process started
    loaded = instances_of(app.runner.state("residency"), entry.name)
    if loaded:
        pids = ", ".join(str(i.pid) for i in loaded)
        raise ModelInUse(f"{entry.name} is loaded (engine pid {pids}); stop it first: blazar stop {entry.name}")
    if entry.projector is not None:
        from blazar.store.projectors import release_with_model  # it builds on this module's file helpers

        await release_with_model(app, entry.name)
    if entry.loras:
        from blazar.store.lora import release_with_model as release_loras  # it builds on this module's file helpers

        await release_loras(app, entry.name)
    if sharing_files(catalog, entry.name):
        # A variant and its base name one file: it stays while any of them does (the last one removed frees it).
        deleted = False
    else:
        # NOTE: every path is proved inside the store before anything is removed: a refusal removes nothing.
        what = f"{'model.variant_created' if entry.base else 'model.imported'} (seq {entry.seq}) of {entry.name}"
        files = [inside(app.paths.models, f, what=what) for f in entry.files]
        shard_dir = inside(app.paths.models, Path(entry.files[0]).parent, what=what) if len(files) > 1 else None
        deleted = all([await asyncio.to_thread(unlink_counting, f) for f in files])
        if shard_dir is not None:
            await asyncio.to_thread(_remove_path, shard_dir)
    (rec,) = await app.record(ModelRemoved(name=entry.name, path=entry.file, file_deleted=deleted))
    return rec


async def alias_model(app: Blazar, alias: str, target: str) -> Recorded:
    """Let `alias` name the model `target` (`blazar alias`): a new name, not a copy. Re-pointing an alias is allowed;
    an alias that is a model's own name is not."""
    check_name(alias)
    catalog = app.runner.state("catalog")
    entry = stored(catalog, target)
    if entry is None:
        raise ModelNotFound(f"no model named {target!r} in the store (see: blazar list)")
    if is_model(catalog, alias):
        raise ModelExists(f"{alias!r} is a model's own name; choose another alias")
    (rec,) = await app.record(ModelAliased(alias=alias, target=entry.name))
    return rec


async def unalias_model(app: Blazar, alias: str) -> Recorded:
    target = alias_target(app.runner.state("catalog"), alias)
    if target is None:
        raise ModelNotFound(f"no alias named {alias!r} (blazar alias lists them)")
    (rec,) = await app.record(ModelAliasRemoved(alias=alias, target=target))
    return rec

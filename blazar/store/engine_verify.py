"""An engine checked against its install record right before a child of it is spawned (llama-server for a load or
the /ready probe, rpc-server for `blazar worker`): every recorded file is where the record says, inside the home's
engines directory, with its recorded size and sha256, and every soname link points where it did.

Hashing 100 MB per spawn would cost a load a second, so each file's verdict is kept with the file's (device, inode,
size, mtime_ns, ctime_ns) and reused while they are the same. ctime is there because mtime can be set back by anyone
who can write the file; ctime cannot (short of the system clock). As in git's "racily clean" index entries, a verdict
is kept only once the file's times are RACY_S old: the kernel stamps times from a coarse clock, so a file changed
within the same tick as the hash would otherwise keep a stamp that no longer matches its bytes.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path

from blazar.confine import inside
from blazar.errors import EngineVerifyFailed, OutsideHome
from blazar.events.engines import EngineFile

_Stamp = tuple[int, int, int, int, int]
# (path, recorded sha256) -> (the file's stamp when hashed, the problem found then or None). Bounded: an engine has a
# handful of files, a home a handful of engines.
_VERDICTS: dict[tuple[str, str], tuple[_Stamp, str | None]] = {}
_KEEP = 1024
RACY_S = 2.0


def _now_ns() -> int:
    return time.time_ns()


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _regular(path: Path, f: EngineFile) -> str | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{f.path}: missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{f.path}: not a regular file"
    if st.st_size != f.bytes:
        return f"{f.path}: {st.st_size} bytes, expected {f.bytes}"
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    key = (str(path), f.sha256)
    seen = _VERDICTS.get(key)
    if seen is not None and seen[0] == stamp:
        return seen[1]
    # The stamp is taken before the hash: a write during the hash changes it, so the next spawn hashes again.
    problem = None if _sha256(path) == f.sha256 else f"{f.path}: sha256 differs from the install record"
    if _now_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_S * 1e9:
        if len(_VERDICTS) >= _KEEP:
            _VERDICTS.clear()
        _VERDICTS[key] = (stamp, problem)
    return problem


def _link(path: Path, f: EngineFile) -> str | None:
    if not path.is_symlink():
        return f"{f.path}: missing" if not path.exists() else f"{f.path}: not a link"
    if (target := os.readlink(path)) != f.link_to:
        return f"{f.path}: links to {target}, expected {f.link_to}"
    return None


def spawn_problems(engines_dir: Path, tag: str, files: Sequence[EngineFile]) -> list[str]:
    """Every way engine `tag`'s directory differs from its install record, one line per file ([]: it may run)."""
    problems = []
    what = f"engine.installed of {tag}"
    for f in files:
        try:
            path = inside(engines_dir, Path(tag) / f.path, what=what)  # symlinks followed: a link's target too
        except OutsideHome as e:
            problems.append(f"{f.path}: {e.message}")
            continue
        problem = _link(path, f) if f.link_to else _regular(path, f)
        if problem is not None:
            problems.append(problem)
    return problems


def verify_for_spawn(engines_dir: Path, tag: str, files: Sequence[EngineFile]) -> None:
    """EngineVerifyFailed naming each file of engine `tag` that differs from its install record. An engine with no
    recorded files (one a test hands the supervisor directly, never one from the store) has nothing to verify."""
    problems = spawn_problems(engines_dir, tag, files)
    if problems:
        raise EngineVerifyFailed(tag, problems)

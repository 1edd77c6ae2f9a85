"""A full disk, told apart from the other ways a write fails: the free space of the filesystem under a path
(os.statvfs), whether an exception was caused by no space, and the `DiskFull` error that names the filesystem, what
it has free and what the write needs. The log raises it for an append or checkpoint that found no room; the CLI turns
any command's no-space failure into it (one line, no traceback); `doctor` and `/ready` use it to say "disk full"
where they would otherwise say "log damaged" or nothing at all.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from blazar.errors import DiskFull

# NOTE: what Blazar asks to have free before its log can be written again. SQLite's WAL grows by up to 1000 pages
# (4 MiB) between checkpoints and its shared-memory index needs 32 KiB; config.toml, checkpoints and run files take
# a little more. Less than this free under the log's directory is what turns an SQLite "disk I/O error" into
# "disk full" (SQLite reports an index or WAL it cannot grow as an I/O error, not as SQLITE_FULL).
LOG_HEADROOM_BYTES = 16 << 20

_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_IOERR = 10
_SQLITE_FULL = 13


@dataclass(frozen=True)
class Space:
    """The filesystem holding `path`: where it is mounted, what an unprivileged writer may still use, its size."""

    path: Path
    mount: Path
    free_bytes: int
    total_bytes: int

    @property
    def low(self) -> bool:
        """Less free than a write to the log needs."""
        return self.free_bytes < LOG_HEADROOM_BYTES

    def describe(self) -> str:
        return f"{size(self.free_bytes)} free of {size(self.total_bytes)} on the filesystem mounted at {self.mount}"


def size(n: int) -> str:
    """Bytes as people read them: 0 B, 812 KiB, 16.0 MiB, 1.2 GiB."""
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.0f} KiB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.1f} GiB"


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mount_point(path: Path) -> Path:
    """The directory `path`'s filesystem is mounted at: the highest ancestor on the same device."""
    path = _existing(path).resolve()
    dev = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == dev:
        path = path.parent
    return path


def space(path: Path) -> Space:
    """The free space of the filesystem holding `path` (or its nearest existing ancestor)."""
    where = _existing(path)
    st = os.statvfs(where)
    return Space(path=path, mount=mount_point(where), free_bytes=st.f_bavail * st.f_frsize,
                 total_bytes=st.f_blocks * st.f_frsize)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, what caused it and what it happened during, and a SQLAlchemy error's driver error (`orig`)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for nxt in (e.__cause__, e.__context__, getattr(e, "orig", None)):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def no_space(exc: BaseException, where: Path) -> bool:
    """Whether `exc` (or what caused it) is a write that found no room: ENOSPC or EDQUOT, SQLite's SQLITE_FULL, or
    an SQLite I/O error while the filesystem holding `where` has less than LOG_HEADROOM_BYTES free."""
    for e in _causes(exc):
        if isinstance(e, DiskFull):
            return True
        if isinstance(e, OSError) and e.errno in _NO_SPACE_ERRNOS:
            return True
        if isinstance(e, sqlite3.Error):
            primary = (getattr(e, "sqlite_errorcode", None) or 0) & 0xFF
            if primary == _SQLITE_FULL:
                return True
            if primary == _SQLITE_IOERR and space(where).low:
                return True
    return False


def disk_full(where: Path, *, writing: str, needed_bytes: int = LOG_HEADROOM_BYTES) -> DiskFull:
    """The one-line error for a write of `writing` under `where` that found no room."""
    s = space(where)
    return DiskFull(f"no space left on the disk holding {where} ({s.describe()}): writing {writing} needs at least "
                    f"{size(needed_bytes)} free there. Free space on {s.mount} and run it again",
                    mount=str(s.mount), free_bytes=s.free_bytes, needed_bytes=needed_bytes, writing=writing)


def explain(exc: BaseException, where: Path, *, writing: str) -> DiskFull | None:
    """`exc` as a DiskFull when no space caused it, else None. A failed file write names its own file (and its
    filesystem); otherwise the write is `writing`, under `where`."""
    for e in _causes(exc):
        if isinstance(e, DiskFull):
            return e
    if not no_space(exc, where):
        return None
    for e in _causes(exc):
        if isinstance(e, OSError) and e.errno in _NO_SPACE_ERRNOS and e.filename:
            file = Path(os.fsdecode(e.filename))
            return disk_full(file.parent, writing=str(file))
    return disk_full(where, writing=writing)

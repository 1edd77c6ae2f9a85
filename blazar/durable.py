"""Files that must survive a crash: fsync of a file or a directory, a write that lands whole or not at all, and the
sha256 a file is checked by. Shared by snapshots and archive segments."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHUNK = 1 << 20


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: so the names renamed into it are on disk too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all: a temporary file beside it, fsynced, renamed over it, the directory
    fsynced."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()

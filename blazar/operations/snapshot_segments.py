"""The archive segments in a snapshot: taken along with the log's copy (each file the copy's archived ranges name,
checked against the sha256 its `log.archived` event pinned), and put in place by a restore (staged and checked
before the log is swapped in, then moved into the home's archive directory; whatever stood there and the restored
log does not name is kept aside in `replaced-<stamp>/`, never deleted).

`blazar.operations.snapshot_verify.check_segment_files` is the check a restore makes first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from blazar.durable import file_sha256, fsync_path
from blazar.errors import SnapshotError
from blazar.events.segment import SUFFIXES, valid_stem
from blazar.operations.snapshot_verify import (
    ARCHIVE_DIR,
    CHUNK,
    SegmentFile,
    VerifiedSnapshot,
    named_segments,
)

_FILE_MODE = 0o600
_DIR_MODE = 0o700


def copy_segments(db_copy: Path, archive: Path | None, staging: Path) -> list[SegmentFile]:
    """Copy into `staging/archive/` every segment file the log in `db_copy` names; refused when one is missing or
    is not the file the log recorded (a snapshot never carries a segment that would not verify)."""
    named = named_segments(db_copy)
    if not named:
        return []
    if archive is None:
        raise SnapshotError("the log names archived segments but this home has no archive directory")
    target = staging / ARCHIVE_DIR
    target.mkdir(mode=_DIR_MODE)
    files = []
    for seg in named:
        for file_name, recorded in seg.files():
            src = archive / file_name
            if not src.is_file():
                raise SnapshotError(f"cannot take a snapshot: archive segment {seg.name} (seq {seg.first_seq}.."
                                    f"{seg.last_seq}) is missing: no {src}")
            size, sha = copy_file(src, target / file_name)
            if sha != recorded:
                raise SnapshotError(f"cannot take a snapshot: {src} is not the file the log recorded for segment "
                                    f"{seg.name} (run `blazar audit verify --archive`)")
            files.append(SegmentFile(name=file_name, bytes=size, sha256=sha))
    fsync_path(target)
    return files


def stage_segments(verified: VerifiedSnapshot, archive: Path, stamp: str) -> Path | None:
    """Copy the snapshot's segment files into a hidden directory inside `archive`, each checked again as it is
    copied; returns it (None when the snapshot has none). Nothing the home reads changes yet."""
    files = verified.manifest.segments
    if not files:
        return None
    archive.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    staged = archive / f".restore-{stamp}-{os.getpid()}"
    staged.mkdir(mode=_DIR_MODE)
    try:
        for f in files:
            _, sha = copy_file(verified.directory / ARCHIVE_DIR / f.name, staged / f.name)
            if sha != f.sha256:
                raise SnapshotError(f"{verified.directory / ARCHIVE_DIR / f.name} changed while it was being "
                                    "restored; nothing was replaced")
        fsync_path(staged)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return staged


def settle_segments(archive: Path, staged: Path | None, stamp: str) -> list[str]:
    """Move the staged segment files into `archive` (the log naming them is already in place). A segment file there
    that the restored log does not name, or names with other content, goes to `replaced-<stamp>/` (it may belong
    to the replaced log, which is kept too). Returns the names moved aside."""
    wanted = {p.name: p for p in staged.iterdir()} if staged is not None else {}
    stems = {n.split(".", 1)[0] for n in wanted}
    aside = archive / f"replaced-{stamp}"
    moved = []
    for path in _segment_files(archive):
        stem = path.name.split(".", 1)[0]
        same = path.name in wanted and file_sha256(path) == file_sha256(wanted[path.name])
        index_kept = path.name.endswith(".index") and stem in stems and all(
            (archive / n).is_file() and file_sha256(archive / n) == file_sha256(wanted[n])
            for n in wanted if n.split(".", 1)[0] == stem)
        if same or index_kept:
            continue
        aside.mkdir(mode=_DIR_MODE, exist_ok=True)
        os.replace(path, aside / path.name)
        moved.append(path.name)
    for name, src in wanted.items():
        os.replace(src, archive / name)
    if staged is not None:
        staged.rmdir()
    if archive.is_dir():
        fsync_path(archive)
    return sorted(moved)


def _segment_files(archive: Path) -> list[Path]:
    if not archive.is_dir():
        return []
    found = []
    for path in sorted(archive.iterdir()):
        for suffix in SUFFIXES:
            if path.is_file() and path.name.endswith(suffix) and valid_stem(path.name[: -len(suffix)]):
                found.append(path)
    return found


def copy_file(src: Path, dst: Path) -> tuple[int, str]:
    """Copy `src` to a new file `dst` (never over one), 0600 and fsynced; returns (bytes, sha256) of what was
    copied."""
    digest, size = hashlib.sha256(), 0
    with src.open("rb") as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        with os.fdopen(fd, "wb") as fout:
            while chunk := fin.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
    return size, digest.hexdigest()


def discard(staged: Path | None) -> None:
    if staged is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(staged)

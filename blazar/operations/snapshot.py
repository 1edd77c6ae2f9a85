"""Backup and restore of the log. `take_snapshot` copies it online (the store's `snapshot_into`: SQLite's
`VACUUM INTO`, or one consistent read of a database) with a manifest and records `snapshot.taken`;
`restore_snapshot` verifies a snapshot, swaps it in for the log (keeping the replaced one), rebuilds the projections
and records `snapshot.restored`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from blazar import __version__
from blazar import config as settings
from blazar.clock import Clock, SystemClock
from blazar.cluster.nodes import node_name
from blazar.context import Blazar
from blazar.diskspace import LOG_HEADROOM_BYTES, disk_full, no_space, space
from blazar.durable import fsync_path, write_atomically
from blazar.errors import ConfigError, DaemonRunning, SnapshotError
from blazar.events.base import Recorded
from blazar.events.location import LogLocation, PostgresUrl, SqliteFile
from blazar.events.system import SnapshotRestored, SnapshotTaken
from blazar.logdb import archive_location, log_location, open_log
from blazar.operations.log_copy import sqlite_archived, sqlite_rows
from blazar.operations.snapshot_segments import copy_segments, discard, settle_segments, stage_segments
from blazar.operations.snapshot_verify import (
    CHUNK,
    DB_FILE,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    Manifest,
    VerifiedSnapshot,
    check_model_files,
    inspect_log,
    list_model_files,
    sha256_file,
    verify_snapshot,
)
from blazar.paths import Paths
from blazar.projections import all_projections
from blazar.projections.checkpoints import drop_checkpoints
from blazar.projections.runner import ProjectionRunner
from blazar.runlock import holder

# Files SQLite keeps beside a database; stale ones must never meet the restored file (a leftover -wal would be
# replayed into it).
_SIDECARS = ("-wal", "-shm", "-journal")
# What a restore writes (the log, the replaced log kept beside it, config.toml) is the owner's alone, like every file
# of a bootstrapped process (bootstrap.PRIVATE_UMASK): a restore runs without one.
_PRIVATE_UMASK = 0o077
_FILE_MODE = 0o600


@dataclass(frozen=True, slots=True)
class Taken:
    path: Path
    manifest: Manifest
    seq: int  # the snapshot.taken event in the live log


@dataclass(frozen=True, slots=True)
class Restored:
    snapshot: Path
    recorded: Recorded  # the snapshot.restored event
    config_rewritten: bool
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        ev = self.recorded.event
        assert isinstance(ev, SnapshotRestored)
        return {"snapshot": str(self.snapshot), "seq": self.recorded.seq, "seq_last": ev.seq_last,
                "previous_seq_last": ev.previous_seq_last, "previous_kept_at": ev.previous_kept_at,
                "forced": ev.forced, "config_rewritten": self.config_rewritten, "warnings": self.warnings}


def utc_stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")


# -- taking a snapshot ---------------------------------------------------------------------------------------


async def take_snapshot(app: Blazar, dest: Path | None = None) -> Taken:
    """Write a snapshot directory (default <data>/snapshots/blazar-<stamp>-seq<N>); record snapshot.taken."""
    now = app.clock.now()
    # What the copy takes (at most the SQLite file and its WAL) and the room recording it needs.
    needed = app.log.snapshot_bytes() + LOG_HEADROOM_BYTES
    dest, staging = _staging(dest, app.paths.snapshots, needed)
    parent = staging.parent
    try:
        await app.log.snapshot_into(staging / DB_FILE)
        archive = app.log.archive.root if app.log.archive is not None else None
        manifest = await asyncio.to_thread(_write_snapshot, app.paths, staging, now, archive)
        final = dest or parent / f"blazar-{utc_stamp(now)}-seq{manifest.seq_last}"
        _rename_into(staging, final)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, Exception) and no_space(exc, parent):
            raise disk_full(parent, writing=f"a snapshot in {parent}", needed_bytes=needed) from exc
        raise
    taken = SnapshotTaken(path=str(final), seq_last=manifest.seq_last, event_count=manifest.event_count,
                          db_sha256=manifest.db_sha256, model_files=len(manifest.models))
    (rec,) = await app.record(taken)
    return Taken(final, manifest, rec.seq)


def _refuse_unless_room(parent: Path, needed: int) -> None:
    """Refuse before copying anything when the snapshot's disk has less free than the copy needs."""
    if space(parent).free_bytes < needed:
        raise disk_full(parent, writing=f"a snapshot in {parent}", needed_bytes=needed)


def _staging(dest: Path | None, default_parent: Path, needed: int) -> tuple[Path | None, Path]:
    """(the absolute destination, a new hidden directory beside it to build the snapshot in); refused when its disk
    has less than `needed` bytes free."""
    if dest is not None:
        dest = dest.absolute()
        _refuse_unless_empty(dest)
    parent = dest.parent if dest is not None else default_parent
    _refuse_unless_room(parent, needed)
    parent.mkdir(parents=True, exist_ok=True)
    # Built under a hidden name and renamed into place: a snapshot directory is either complete or absent.
    return dest, Path(tempfile.mkdtemp(prefix=".blazar-snapshot-", suffix=".partial", dir=parent))


def _refuse_unless_empty(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise SnapshotError(f"{dest} exists and is not an empty directory; choose a new path")


def _rename_into(staging: Path, final: Path) -> None:
    _refuse_unless_empty(final)
    try:
        os.replace(staging, final)  # onto a missing or empty directory only: rename(2) refuses a full one
    except OSError as exc:
        raise SnapshotError(f"cannot move the snapshot to {final}: {exc.strerror}") from None
    fsync_path(final.parent)


def _write_snapshot(paths: Paths, staging: Path, now: float, archive: Path | None) -> Manifest:
    """The manifest of the log's copy in `staging` (its file synced, then checked as a restore will), with the
    archive segments its log names copied beside it."""
    copy = staging / DB_FILE
    fsync_path(copy)
    size, sha = sha256_file(copy)
    facts = inspect_log(copy)  # the copy passes the checks a restore will make, or no snapshot is written
    segments = copy_segments(copy, archive, staging)
    manifest = Manifest(
        format=FORMAT, format_version=FORMAT_VERSION, created_at=_iso(now), blazar_version=__version__,
        schema_revision=facts.schema_revision, seq_first=facts.seq_first, seq_last=facts.seq_last,
        event_count=facts.event_count, counts_by_type=facts.counts_by_type, db_file=DB_FILE, db_bytes=size,
        db_sha256=sha, models=list_model_files(paths.models), segments=segments,
    )
    body = orjson.dumps(manifest.to_json(), option=orjson.OPT_INDENT_2) + b"\n"
    write_atomically(staging / MANIFEST, body)
    return manifest


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- restoring one -------------------------------------------------------------------------------------------


async def restore_snapshot(
    paths: Paths, source: Path, *, actor: str, env: Mapping[str, str], force: bool = False,
    clock: Clock | None = None,
) -> Restored:
    """Verify `source`, swap it in for the log, rebuild projections, record snapshot.restored.

    NOTE: works from `paths`, never from a bootstrapped app: the current log may be the damaged thing being
    replaced. Nothing is touched until the snapshot is verified and no daemon holds the lock (or `force`).
    """
    os.umask(_PRIVATE_UMASK)
    verified = await asyncio.to_thread(verify_snapshot, source)
    pid = holder(paths.daemon_lock)
    who = "pid unknown" if pid == -1 else f"pid {pid}"
    if pid is not None and not force:
        raise DaemonRunning(f"a Blazar daemon ({who}) is running; stop it or pass --force")
    clock = clock or SystemClock()
    warnings = check_model_files(paths.models, verified.manifest.models)
    if pid is not None:
        warnings.append(f"restored under a running daemon ({who}): restart it so it reads the restored log")
    paths.ensure()
    location = log_location(paths, env)
    stamp = utc_stamp(clock.now())
    archive = archive_location(paths, env)
    # The segments are staged (and checked) first: a failure there leaves the home as it was.
    staged = await asyncio.to_thread(stage_segments, verified, archive, stamp)
    try:
        match location:
            case PostgresUrl():
                previous_seq, kept = await _swap_in_database(paths, location, verified, stamp)
            case SqliteFile():  # always this home's file (paths.db): there is no other place it could be
                previous_seq, kept = await asyncio.to_thread(_swap_in, paths, verified, stamp)
    except BaseException:
        discard(staged)
        raise
    aside = await asyncio.to_thread(settle_segments, archive, staged, stamp)
    if aside:
        warnings.append(f"{len(aside)} archive segment file(s) the restored log does not name were kept in "
                        f"{archive / f'replaced-{stamp}'}")
    app = await _open_restored(paths, location, clock, actor, env)
    try:
        rewritten = _align_config(app)
        event = SnapshotRestored(
            path=str(verified.directory), manifest_sha256=verified.manifest_sha256,
            seq_last=verified.manifest.seq_last, previous_seq_last=previous_seq,
            previous_kept_at=str(kept) if kept else None, forced=pid is not None, config_rewritten=rewritten,
        )
        (rec,) = await app.record(event)
        warnings.extend(f"projection halted: {s.halted}" for s in app.runner.status() if s.halted)
    finally:
        await app.close()
    return Restored(verified.directory, rec, rewritten, warnings)


def _swap_in(paths: Paths, verified: VerifiedSnapshot, stamp: str) -> tuple[int, Path | None]:
    """Replace blazar.db with the snapshot's copy in one rename; returns (previous last seq, its copy)."""
    tmp = paths.data_dir / f".{DB_FILE}.restore-{stamp}-{os.getpid()}.tmp"
    try:
        if _copy_file(verified.db, tmp) != verified.manifest.db_sha256:
            raise SnapshotError(f"{verified.db} changed while it was being restored; nothing was replaced")
        previous_seq, kept = _keep_current(paths.db, stamp) if paths.db.exists() else (0, None)
        for suffix in _SIDECARS:
            paths.db.with_name(paths.db.name + suffix).unlink(missing_ok=True)
        os.replace(tmp, paths.db)
        fsync_path(paths.data_dir)
    finally:
        tmp.unlink(missing_ok=True)
    return previous_seq, kept


async def _swap_in_database(paths: Paths, url: PostgresUrl, verified: VerifiedSnapshot,
                            stamp: str) -> tuple[int, Path | None]:
    """Replace a database log with the snapshot's events in one transaction; the replaced log is kept first, as a
    SQLite log file beside where the embedded one would be (the snapshot format's own file)."""
    from blazar.events.log_pg import PgEventLog  # only for a database URL: asyncpg is imported then

    log = await PgEventLog.open(url)
    try:
        previous = await log.last_seq()
        kept = None
        if previous:
            kept = _unused(paths.db.with_name(f"{paths.db.name}.replaced-{stamp}-seq{previous}"))
            await log.snapshot_into(kept)
            kept.chmod(_FILE_MODE)
        archived = await asyncio.to_thread(sqlite_archived, verified.db)
        await log.copy_in(sqlite_rows(verified.db), replace=True, archived=archived)
    finally:
        await log.close()
    return previous, kept


def _keep_current(db: Path, stamp: str) -> tuple[int, Path]:
    """Copy the current log aside (never lose it), with writers held off while the copy is made."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        previous = _checkpoint_and_lock(conn)
        label = f"seq{previous}" if previous is not None else "unreadable"
        kept = _unused(db.with_name(f"{db.name}.replaced-{stamp}-{label}"))
        _copy_file(db, kept)
        for suffix in ("-wal", "-journal"):  # whatever the checkpoint could not fold in travels with the copy
            side = db.with_name(db.name + suffix)
            if side.exists() and side.stat().st_size > 0:
                _copy_file(side, kept.with_name(kept.name + suffix))
    finally:
        conn.close()
    return previous or 0, kept


def _checkpoint_and_lock(conn: sqlite3.Connection) -> int | None:
    """Fold the WAL into the main file and take the write lock; the last seq, or None when unreadable."""
    with contextlib.suppress(sqlite3.DatabaseError):  # a damaged log may refuse; it is then copied as it is
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with contextlib.suppress(sqlite3.DatabaseError):  # damaged, or busy past the timeout: copy regardless
        conn.execute("BEGIN IMMEDIATE")
    try:
        return conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
    except sqlite3.DatabaseError:
        return None


def _unused(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


async def _open_restored(paths: Paths, location: LogLocation, clock: Clock, actor: str,
                         env: Mapping[str, str]) -> Blazar:
    """Open the restored log (migrating an older schema) with every projection rebuilt from its events."""
    log = await open_log(location, clock=clock, archive=archive_location(paths, env))
    try:
        await drop_checkpoints(log)  # they describe the snapshot's time; folding from scratch proves the log
        # On a shared log the restoring home is a node: its node-local checkpoints are its own.
        node = node_name(paths, env) if location.shared else ""
        runner = ProjectionRunner(log, all_projections(), node=node)
        await runner.start(use_checkpoints=False)
        await runner.checkpoint()
    except BaseException:
        await log.close()
        raise
    return Blazar(paths=paths, log=log, runner=runner, clock=clock, actor=actor,
                  folded_at_start=runner.folded_at_start, node=node)


def _align_config(app: Blazar) -> bool:
    """Make config.toml say what the restored log says (the old file is kept as config.toml.bak).

    NOTE: without this the next start would record the newer config.toml as hand edits (`config.changed`,
    source "file"), and the restored state would silently drift from the snapshot's.
    """
    wanted = {k: v for k, v in app.overrides().items() if k in settings.FIELDS and k not in settings.LOCAL_KEYS}
    path = app.paths.config_file
    with settings.locked(path):
        try:
            current = settings.read_file_raw(path)
        except ConfigError:
            current = None  # unreadable TOML: replaced, and kept as .bak
        # NOTE: where this home's log lives is this home's, never the snapshot's (it may name another database).
        for key in settings.LOCAL_KEYS:
            if current and key in current:
                wanted[key] = current[key]
        if current == wanted:  # a missing file reads as {}: nothing to write when the log has no overrides
            return False
        settings.write_file(path, wanted)
    return True


# -- files ---------------------------------------------------------------------------------------------------


def _copy_file(src: Path, dst: Path) -> str:
    """Copy `src` to a new file `dst` (never over an existing one), 0600 and fsynced; returns the bytes' sha256."""
    digest = hashlib.sha256()
    with src.open("rb") as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        os.fchmod(fd, _FILE_MODE)  # whatever the umask
        with os.fdopen(fd, "wb") as fout:
            while chunk := fin.read(CHUNK):
                digest.update(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
    return digest.hexdigest()

"""Checking a snapshot before a restore trusts it: the manifest, the copy's bytes, and the log inside it (which
must decode, and name no path that could lead out of the home: blazar/confine.py).

Only reads (nothing is written next to the snapshot, not even -wal/-shm); every failure is a SnapshotError
naming what is wrong. `take_snapshot` uses the same helpers to describe the copy it writes.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from blazar.confine import describe, untrusted
from blazar.errors import LogError, SnapshotError
from blazar.events import migrate  # importing the package registers every event type decode must know
from blazar.events.archive import LogArchived
from blazar.events.segment import valid_stem
from blazar.events.types import decode

# What a snapshot carries of each segment: its data and its manifest (the index is derived, rebuilt when missing).
SEGMENT_SUFFIXES: Final = (".jsonl.gz", ".manifest.json")

FORMAT: Final = "blazar-snapshot"
FORMAT_VERSION: Final = 1
MANIFEST = "manifest.json"
DB_FILE = "blazar.db"
ARCHIVE_DIR = "archive"  # the snapshot's copies of the archive segments the log names (data and manifest files)
CHUNK = 1 << 20
MANIFEST_MAX_BYTES = 64 << 20  # far above any real manifest; a bigger file is not one
_EVENT_COLUMNS = {"seq", "ts", "type", "v", "stream", "trace_id", "actor", "cause", "data"}
_SHA256 = r"^[0-9a-f]{64}$"
_NAMED_AT_MOST = 5  # untrusted events named in a refusal; the count says how many more


class ModelFile(BaseModel):
    """A file of the model store as it was when the snapshot was taken (not copied into the snapshot)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)

    @field_validator("path")
    @classmethod
    def _inside_models(cls, value: str) -> str:
        p = PurePosixPath(value)
        if not value or p.is_absolute() or ".." in p.parts:
            raise ValueError("must be a relative path inside the models directory")
        return value


class SegmentFile(BaseModel):
    """A file of an archive segment the log names, copied into the snapshot's archive/ directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # a bare `<stem>.jsonl.gz` or `<stem>.manifest.json`, never a path
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)

    @field_validator("name")
    @classmethod
    def _segment_file(cls, value: str) -> str:
        if segment_stem(value) is None:
            raise ValueError("must be an archive segment's data or manifest file name")
        return value


def segment_stem(file_name: str) -> str | None:
    """The segment stem of a snapshot's segment file name (data or manifest), or None when it is not one."""
    for suffix in SEGMENT_SUFFIXES:
        if file_name.endswith(suffix) and valid_stem(file_name[: -len(suffix)]):
            return file_name[: -len(suffix)]
    return None


class Manifest(BaseModel):
    """manifest.json: what the copy holds, so a restore can check it before trusting it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["blazar-snapshot"]
    format_version: Literal[1]
    created_at: str
    blazar_version: str
    schema_revision: str
    seq_first: int = Field(ge=0)  # 0 (with seq_last 0) for an empty log
    seq_last: int = Field(ge=0)
    event_count: int = Field(ge=0)
    counts_by_type: dict[str, int]
    db_file: str
    db_bytes: int = Field(ge=0)
    db_sha256: str = Field(pattern=_SHA256)
    models: list[ModelFile]
    segments: list[SegmentFile] = []  # every segment file the log's archived ranges name (none: nothing archived)

    def to_json(self) -> dict[str, object]:
        """The manifest as written: `segments` only when there are some, so a snapshot of a log with nothing
        archived stays readable by a Blazar from before segments."""
        return self.model_dump(mode="json", exclude=None if self.segments else {"segments"})

    @field_validator("db_file")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # NOTE: a name, not a path: a manifest must never point a restore at a file outside its snapshot.
        if not value or value in (".", "..") or "/" in value or "\\" in value:
            raise ValueError("must be a file name inside the snapshot directory")
        return value


@dataclass(frozen=True, slots=True)
class LogFacts:
    """What a copy of the log holds, read from the copy itself."""

    schema_revision: str
    event_count: int
    seq_first: int
    seq_last: int
    counts_by_type: dict[str, int]


@dataclass(frozen=True, slots=True)
class VerifiedSnapshot:
    directory: Path
    manifest_path: Path
    manifest: Manifest
    manifest_sha256: str
    db: Path


# -- files ---------------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def list_model_files(models_dir: Path) -> list[ModelFile]:
    """Every regular file under the model store (symlinks are not followed), sorted by path."""
    found: list[ModelFile] = []
    if not models_dir.is_dir():
        return found
    for root, dirs, files in os.walk(models_dir):
        dirs.sort()
        for name in files:
            full = Path(root) / name
            if not stat.S_ISREG(full.lstat().st_mode):
                continue
            size, sha = sha256_file(full)
            found.append(ModelFile(path=full.relative_to(models_dir).as_posix(), bytes=size, sha256=sha))
    return sorted(found, key=lambda m: m.path)


def check_model_files(models_dir: Path, listed: list[ModelFile]) -> list[str]:
    """Warnings for model files the manifest lists that the current store lacks or holds at another size."""
    warnings = []
    for m in listed:
        try:
            size = (models_dir / m.path).stat().st_size
        except FileNotFoundError:
            warnings.append(f"model file {m.path} is missing from {models_dir}")
            continue
        if size != m.bytes:
            warnings.append(f"model file {m.path} is {size} bytes, the snapshot recorded {m.bytes}")
    return warnings


# -- the log inside ------------------------------------------------------------------------------------------


def open_readonly(db: Path) -> sqlite3.Connection:
    # immutable=1: SQLite takes no locks and creates no -wal/-shm, so the snapshot directory stays as it was.
    return sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro&immutable=1", uri=True)


def known_revisions() -> set[str]:
    """Every schema revision this code's migrations know (a restore can migrate any of them to the head)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(migrate.migrations_dir()))
    return {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}


def inspect_log(db: Path) -> LogFacts:
    """Read and check a copy of the log: SQLite integrity, Blazar schema, gap-free seqs, every row decodes."""
    try:
        conn = open_readonly(db)
    except sqlite3.Error as exc:
        raise SnapshotError(f"{db} cannot be opened as SQLite: {exc}") from None
    try:
        return _inspect(conn, db)
    except sqlite3.DatabaseError as exc:
        raise SnapshotError(f"{db} is not a readable SQLite database: {exc}") from None
    finally:
        conn.close()


def _inspect(conn: sqlite3.Connection, db: Path) -> LogFacts:
    report = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
    if report != ["ok"]:
        # SQLite heads its report with "*** in database main ***"; the lines after it say what is wrong.
        lines = [line for text in report for line in text.splitlines() if not line.startswith("***")]
        raise SnapshotError(f"{db} fails SQLite's integrity check: {'; '.join(lines)}")
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "events" not in tables:
        raise SnapshotError(f"{db} is not a Blazar log: it has no events table")
    columns = {row[1] for row in conn.execute("PRAGMA table_info(events)")}
    if missing := sorted(_EVENT_COLUMNS - columns):
        raise SnapshotError(f"{db} is not a Blazar log: its events table lacks {missing}")
    revision = _revision(conn, tables, db)
    count, first, last = conn.execute(
        "SELECT COUNT(*), COALESCE(MIN(seq), 0), COALESCE(MAX(seq), 0) FROM events"
    ).fetchone()
    _no_gap_outside_archived(conn, tables, db, count, first, last)
    counts = dict(conn.execute("SELECT type, COUNT(*) FROM events GROUP BY type ORDER BY type").fetchall())
    _decode_all(conn)
    return LogFacts(revision, count, first, last, counts)


def _no_gap_outside_archived(conn: sqlite3.Connection, tables: set[str], db: Path, count: int, first: int,
                             last: int) -> None:
    """Seqs run from 1 without a gap, except where archived ranges say the rows left for a segment (the ranges run
    from seq 1 on, each after the one before, so they cover 1..their last seq)."""
    if not count or (first == 1 and last == count):
        return
    covered = 0
    if "archived" in tables:
        ranges = conn.execute("SELECT first_seq, last_seq FROM archived ORDER BY segment").fetchall()
        expected = 1
        for lo, hi in ranges:
            if lo != expected:
                raise SnapshotError(f"{db}: the archived ranges do not follow one another (seq {lo} where "
                                    f"{expected} was due)")
            expected, covered = hi + 1, hi
    # A gap is a seq missing beyond the archived ranges: the live rows after them must run on without one.
    above = conn.execute("SELECT COUNT(*), COALESCE(MIN(seq), 0), COALESCE(MAX(seq), 0) FROM events WHERE seq > ?",
                         (covered,)).fetchone()
    n, lo, hi = above
    if n and (lo != covered + 1 or hi - lo + 1 != n):
        covers = f", archived ranges cover 1..{covered}" if covered else ""
        raise SnapshotError(f"{db}: the log has a gap ({count} events between seq {first} and {last}{covers})")


def _revision(conn: sqlite3.Connection, tables: set[str], db: Path) -> str:
    row = None
    if "alembic_version" in tables:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    if row is None:
        raise SnapshotError(f"{db} is not a Blazar log: it has no schema revision")
    revision = row[0]
    if revision != migrate.SCHEMA_HEAD and revision not in known_revisions():
        raise SnapshotError(f"{db} is at schema revision {revision!r}, which this Blazar does not know "
                            "(written by a newer version?)")
    return revision


def _decode_all(conn: sqlite3.Connection) -> None:
    # Every row must become a typed event: a log the projections cannot fold is not a log to restore.
    # NOTE: and no event may name a path that leads out of the home (an engine binary elsewhere, a model file to
    # unlink by `rm`): the restore is refused whole, naming them, rather than restored with those entries ignored.
    bad: list[str] = []
    try:
        for seq, type_name, v, data in conn.execute("SELECT seq, type, v, data FROM events ORDER BY seq"):
            problems = untrusted(decode(seq, type_name, v, data))
            if problems:
                bad.append(describe(seq, type_name, problems))
    except LogError as exc:
        raise SnapshotError(f"the log in the snapshot does not decode: {exc.message}") from None
    if bad:
        more = f" (and {len(bad) - _NAMED_AT_MOST} more)" if len(bad) > _NAMED_AT_MOST else ""
        raise SnapshotError(f"the log names paths outside the home, which Blazar never trusts: "
                            f"{' | '.join(bad[:_NAMED_AT_MOST])}{more}; a snapshot holding them is never restored")


# -- the whole snapshot --------------------------------------------------------------------------------------


def load_manifest(source: Path) -> tuple[Path, bytes, Manifest]:
    """(manifest path, its bytes, the parsed manifest) for a snapshot directory or its manifest.json."""
    source = source.absolute()  # the path is recorded in snapshot.restored: it must mean the same thing later
    if not source.exists():
        raise SnapshotError(f"no snapshot at {source}")
    path = source / MANIFEST if source.is_dir() else source
    if not path.is_file():
        raise SnapshotError(f"not a Blazar snapshot: {source} has no {MANIFEST}")
    if path.stat().st_size > MANIFEST_MAX_BYTES:
        raise SnapshotError(f"not a Blazar snapshot: {path} is far too big to be a manifest")
    raw = path.read_bytes()
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise SnapshotError(f"not a Blazar snapshot: {path} is not a JSON manifest") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError(f"not a Blazar snapshot: {path} is not a {FORMAT} manifest")
    if doc.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{path}: snapshot format version {doc.get('format_version')!r} is not supported "
                            f"(this Blazar reads version {FORMAT_VERSION})")
    try:
        return path, raw, Manifest.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise SnapshotError(f"damaged manifest {path}: {where}: {first['msg']}") from None


def verify_snapshot(source: Path) -> VerifiedSnapshot:
    """Check a snapshot end to end; returns it verified or raises SnapshotError. Writes nothing."""
    manifest_path, raw, manifest = load_manifest(source)
    db = manifest_path.parent / manifest.db_file
    if not db.is_file():
        raise SnapshotError(f"damaged snapshot: {db} is missing")
    size, sha = sha256_file(db)
    if size != manifest.db_bytes:
        raise SnapshotError(f"damaged snapshot: {db} is {size} bytes, the manifest says {manifest.db_bytes} "
                            "(truncated or altered)")
    if sha != manifest.db_sha256:
        raise SnapshotError(f"damaged snapshot: the sha256 of {db} does not match the manifest")
    facts = inspect_log(db)
    claimed = LogFacts(manifest.schema_revision, manifest.event_count, manifest.seq_first, manifest.seq_last,
                       manifest.counts_by_type)
    diffs = [
        f"{name} is {getattr(facts, name)!r}, the manifest says {getattr(claimed, name)!r}"
        for name in LogFacts.__slots__
        if getattr(facts, name) != getattr(claimed, name)
    ]
    if diffs:
        raise SnapshotError(f"{db} does not match its manifest: {'; '.join(diffs)}")
    check_segment_files(manifest_path.parent, manifest, db)
    manifest_sha256 = hashlib.sha256(raw).hexdigest()
    return VerifiedSnapshot(manifest_path.parent, manifest_path, manifest, manifest_sha256, db)


# -- the archive segments ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NamedSegment:
    """A segment the log in a copy names: its `archived` row, with the sha256s its `log.archived` event pinned."""

    name: str
    first_seq: int
    last_seq: int
    sha256: str
    manifest_sha256: str

    def files(self) -> tuple[tuple[str, str], ...]:
        """(file name, the sha256 the log recorded for it) of each file a snapshot carries."""
        return ((f"{self.name}.jsonl.gz", self.sha256), (f"{self.name}.manifest.json", self.manifest_sha256))

    def missing(self, detail: str) -> SnapshotError:
        return SnapshotError(f"damaged snapshot: archive segment {self.name} (seq {self.first_seq}..{self.last_seq}) "
                             f"is missing: {detail}")


def named_segments(db: Path) -> list[NamedSegment]:
    """Every segment the log in `db` names, oldest first; refused when its `archived` table and its `log.archived`
    events disagree (or a name is not a bare segment stem)."""
    conn = open_readonly(db)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "archived" not in tables:
            return []
        rows = conn.execute("SELECT name, first_seq, last_seq, sha256 FROM archived ORDER BY segment").fetchall()
        pinned: dict[str, LogArchived] = {}
        for seq, type_name, v, data in conn.execute(
                "SELECT seq, type, v, data FROM events WHERE type = ? ORDER BY seq", (LogArchived.TYPE,)):
            event = decode(seq, type_name, v, data)
            assert isinstance(event, LogArchived)
            pinned[event.name] = event
    finally:
        conn.close()
    found = []
    for name, lo, hi, sha in rows:
        ev = pinned.get(name)
        if not valid_stem(name) or ev is None or ev.sha256 != sha:
            raise SnapshotError(f"{db}: archived segment {name!r} is not the one a log.archived event records")
        found.append(NamedSegment(name, lo, hi, sha, ev.manifest_sha256))
    return found


def check_segment_files(directory: Path, manifest: Manifest, db: Path) -> None:
    """Each segment the copy's log names is in the snapshot, as the manifest lists it and as `log.archived`
    recorded it; the manifest lists no other."""
    listed = {f.name: f for f in manifest.segments}
    named = named_segments(db)
    for seg in named:
        for file_name, recorded in seg.files():
            entry = listed.get(file_name)
            if entry is None:
                raise seg.missing(f"the snapshot's manifest does not list {file_name}")
            path = directory / ARCHIVE_DIR / file_name
            if not path.is_file():
                raise seg.missing(f"no {path}")
            size, sha = sha256_file(path)
            if (size, sha) != (entry.bytes, entry.sha256):
                raise SnapshotError(f"damaged snapshot: {path} does not match the manifest (truncated or altered)")
            if sha != recorded:
                raise SnapshotError(f"damaged snapshot: {path} is not the file the log recorded for segment "
                                    f"{seg.name} (its sha256 differs from the one log.archived pinned)")
    extra = sorted(set(listed) - {f for seg in named for f, _ in seg.files()})
    if extra:
        raise SnapshotError(f"damaged snapshot: the manifest lists segment files the log does not name: "
                            f"{', '.join(extra)}")

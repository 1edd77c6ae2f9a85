"""The log's retention, checked once the log is open: the live log's and the archive's share of their disks
(`log_disk_share`), every archived range's segment present and unaltered, and no segment files left over.

A missing or altered segment is a warning, not a failure: the live log is whole and serving goes on, but the
reads that reach into that range (`why`, `events`, `state --at`, the audit export) stop there with the segment
named. Leftover files are what an archive run left when it stopped before its commit (or what one under way is
writing): the next run removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from blazar.context import Blazar
from blazar.diskspace import size, space
from blazar.durable import file_sha256
from blazar.errors import SegmentBroken, SegmentMissing
from blazar.events.location import SqliteFile
from blazar.events.segment import Manifest
from blazar.events.segment_store import ArchivedRange, SegmentStore
from blazar.logdb import live_bytes
from blazar.operations.doctor.report import Check, ok

_RECOVER = ("put the segment's files back from a copy (a snapshot holds them), or accept that `blazar why`, `events` "
            "and `audit export` stop at its range")


async def archive_checks(app: Blazar, *, quick: bool = False) -> list[Check]:
    """`log.disk_share`, `log.segments` and `log.archive_orphans`."""
    ranges = await app.log.archived_ranges()
    store = app.log.archive
    checks = [await disk_share(app, store)]
    if store is None:
        return checks
    checks.append(await asyncio.to_thread(segments, store, ranges, quick=quick))
    checks.append(await asyncio.to_thread(orphans, store, ranges))
    return checks


async def disk_share(app: Blazar, store: SegmentStore | None) -> Check:
    """Warn when the live log, or the archive, takes more than `log_disk_share` of the filesystem it is on."""
    share = app.settings().retention.log_disk_share
    seen: list[str] = []
    over: list[str] = []
    if isinstance(app.log.location, SqliteFile):
        parts = [("the live log", app.log.location.path.parent, await live_bytes(app.log))]
    else:
        parts = []
        seen.append("the live log is in PostgreSQL (its disk is the server's: see `blazar log status`)")
    if store is not None:
        parts.append(("the archive", store.root, await asyncio.to_thread(_files_bytes, store)))
    for what, where, used in parts:
        room = await asyncio.to_thread(space, where)
        frac = used / room.total_bytes if room.total_bytes else 0.0
        line = f"{what} {size(used)} is {frac:.1%} of {size(room.total_bytes)} on {room.mount}"
        (over if frac > share else seen).append(line)
    if over:
        return Check("log", "disk_share", "warn",
                     "; ".join(over + seen) + f" (retention.log_disk_share is {share:.0%})",
                     fix="archive sooner (`blazar config set retention.request_retention 7d`, then `blazar log "
                         "archive`), move the archive to a larger disk (retention.archive_dir), or raise "
                         "retention.log_disk_share")
    return ok("log", "disk_share", "; ".join(seen) + f" (within retention.log_disk_share, {share:.0%})")


def _files_bytes(store: SegmentStore) -> int:
    total = 0
    for p in store.files():
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def segments(store: SegmentStore, ranges: list[ArchivedRange], *, quick: bool = False) -> Check:
    """Each archived range's segment: its files present and its data file's sha256 the one the log recorded
    (`quick`: its size the manifest's instead of hashing it)."""
    if not ranges:
        return ok("log", "segments", f"nothing archived yet (archive directory {store.root})")
    bad: list[str] = []
    for rng in ranges:
        try:
            if quick:
                _sized(store, rng)
            else:
                _hashed(store, rng)
        except (SegmentMissing, SegmentBroken) as e:
            bad.append(e.message)
    events = sum(r.count for r in ranges)
    how = "present, sizes match their manifests (--quick)" if quick else "present, sha256 as the log recorded"
    if not bad:
        return ok("log", "segments", f"{len(ranges)} segment(s) of {events} archived events: {how}")
    return Check("log", "segments", "warn", f"{len(bad)} of {len(ranges)} segment(s) unusable: " + "; ".join(bad[:3])
                 + (f"; and {len(bad) - 3} more" if len(bad) > 3 else ""), fix=_RECOVER)


def _hashed(store: SegmentStore, rng: ArchivedRange) -> None:
    """The manifest describes the range the log recorded, and the data file's sha256 is the one it recorded."""
    store.manifest(rng)  # the files present, the manifest matching the range
    if file_sha256(store.path(rng.name, ".jsonl.gz")) != rng.sha256:
        raise SegmentBroken(rng.name, None, "the data file's sha256 differs from the one the log recorded: it was "
                            "altered (run `blazar audit verify --archive` for the first bad line)")


def _sized(store: SegmentStore, rng: ArchivedRange) -> None:
    data = store.path(rng.name, ".jsonl.gz")
    mpath = store.path(rng.name, ".manifest.json")
    for p in (data, mpath):
        if not p.is_file():
            raise SegmentMissing(rng.name, rng.first_seq, rng.last_seq, f"no {p}")
    manifest = Manifest.decode(rng.name, mpath.read_bytes())
    if manifest.sha256 != rng.sha256 or data.stat().st_size != manifest.size:
        raise SegmentBroken(rng.name, None, "its data file or manifest is not the one the log recorded: it was "
                            "altered (run `blazar doctor` without --quick, or `blazar audit verify`)")


def orphans(store: SegmentStore, ranges: list[ArchivedRange]) -> Check:
    found: list[Path] = store.orphans({r.name for r in ranges})
    if not found:
        return ok("log", "archive_orphans", f"no leftover files in {store.root}")
    names = ", ".join(p.name for p in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return Check("log", "archive_orphans", "warn", f"{len(found)} file(s) in {store.root} that no archived range "
                 f"names: {names} (left by an archive run that stopped before its commit, unless one is under way)",
                 fix="the next archive run removes them (`blazar log archive`, or the daemon's schedule); or delete "
                     "them by hand while no run is under way")

"""A home whose log has archived segments (request events moved out by the real archiver), what the CLI reads of it,
and helpers that alter a segment file the way an attacker or a bad disk would: decompress, change lines, recompress."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TYPE_CHECKING

from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.events.archive import LogArchived
from blazar.operations.archive import archive
from blazar.paths import Paths
from tests.contract.workload import aliased, received

if TYPE_CHECKING:
    from tests.conftest import Cli


async def seed_archived(paths: Paths, clock: FakeClock, *, segments: int = 3, per: int = 4) -> list[LogArchived]:
    """`segments * per` request events (with control events among them, which stay live), all archived into
    `segments` segments of `per` events; the home is closed again."""
    app = await bootstrap(paths=paths, clock=clock, actor="test:pytest")
    try:
        for i in range(segments * per):
            await app.log.append(received("old", i), actor="gateway", trace_id=f"old-{i:04d}")
            if i % 3 == 0:
                await app.log.append(aliased("ctl", i), actor="cli")
            clock.advance(1)
        run = await archive(app.log, cutoff=clock.now() + 1, now=clock.now(), segment_events=per)
    finally:
        await app.close()
    assert [s.count for s in run.segments] == [per] * segments
    return run.segments


def reads(cli: Cli) -> dict[str, object]:
    """What the CLI reads of a home `seed_archived` made: one archived trace, `why` on it and on a prefix, every
    request event: the same before and after a snapshot, a restore or a copy."""
    return {"trace": cli("events", "--trace", "old-0005", "--json").json_lines(),
            "why": cli("why", "old-0005", "--json").json(),
            "prefix": cli("why", "old-0009", "--json").json()["trace_id"],
            "all": [e for e in cli("events", "--json").json_lines() if e["type"].startswith("request.")]}


def segment_lines(path: Path) -> list[bytes]:
    return gzip.decompress(path.read_bytes()).splitlines(keepends=True)


def write_segment_lines(path: Path, lines: list[bytes], *, level: int = 6) -> None:
    """One gzip member holding `lines` (a valid gzip file: the walk reads it; its sha256 is another)."""
    path.write_bytes(gzip.compress(b"".join(lines), compresslevel=level, mtime=0))

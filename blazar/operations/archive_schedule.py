"""Archive runs as the CLI and the daemon make them: `archive_now` (one run, its failure recorded, the projections
checkpointed after it) and `archive_loop` (the daemon's schedule: every `archive_every_s`, never while
`request_retention` is 0).

The checkpoint after a run is what keeps start-up off the segments: every projection's state is stored at a seq past
the archived range, so a restart folds only the live tail. A run that found another under way (`ArchiveBusy`) is
not a failure and records nothing; any other error records `log.archive_failed` (the reason, the cutoff, the
segments the run committed before it stopped) and is raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from blazar.context import Blazar
from blazar.errors import ArchiveBusy, BlazarError
from blazar.events.archive import LogArchiveFailed, archivable_types
from blazar.operations.archive import ACTOR, SEGMENT_EVENTS, ArchiveRun, archive, cutoff_seq

log = logging.getLogger("blazar.archive")

# The first scheduled run comes this long after the daemon starts (or after archive_every_s, if sooner): a daemon
# restarted more often than archive_every_s still archives.
FIRST_RUN_S = 60.0
# The schedule waits until a full segment's worth is due, or until the oldest due event is this much past the
# cutoff (at most a day; a tenth of the retention when that is shorter): an hourly run at one request a second would
# otherwise write 8,760 small segments a year instead of about 1,600 full ones. `blazar log archive` never waits.
SLACK_MAX_S = 86_400.0
SLACK_SHARE = 0.1


async def archive_now(app: Blazar, *, cutoff: float, actor: str) -> ArchiveRun:
    """One archive run of everything archivable recorded before `cutoff`, then a checkpoint of every projection."""
    before = len(await app.log.archived_ranges())
    try:
        run = await archive(app.log, cutoff=cutoff, now=app.clock.now(), actor=actor)
    except ArchiveBusy:
        raise
    except (BlazarError, OSError) as e:
        reason = e.message if isinstance(e, BlazarError) else f"{type(e).__name__}: {e}"
        try:
            done = len(await app.log.archived_ranges()) - before  # committed by this run before it stopped
            await app.log.append(LogArchiveFailed(reason=reason, cutoff=cutoff, segments=done), actor=actor)
        except (BlazarError, OSError) as again:  # a full disk may refuse the record too: the error still stands
            log.error("log.archive_failed not recorded (%s)", again)
        raise
    if run.segments:
        last = max(app.log.last_appended, await app.log.last_seq())
        if app.runner.seq < last:
            await app.runner.catch_up()
        await app.runner.checkpoint()
    return run


async def scheduled_run(app: Blazar, *, actor: str = ACTOR) -> ArchiveRun | None:
    """The schedule's run now: None while `request_retention` is 0 (nothing is ever archived) or another run holds
    the archive; failures are recorded (by `archive_now`) and logged, never raised."""
    retention = app.settings().retention_s()
    if retention <= 0:
        return None
    cutoff = app.clock.now() - retention
    ranges = await app.log.archived_ranges()
    after = ranges[-1].last_seq if ranges else 0
    top = await cutoff_seq(app.log, cutoff)
    if top <= after:
        return ArchiveRun(cutoff=cutoff)  # nothing new before the cutoff: no run, no archive directory made
    due, oldest = await _due(app, after, top)
    if due < SEGMENT_EVENTS and (oldest is None or oldest > cutoff - min(SLACK_MAX_S, SLACK_SHARE * retention)):
        return ArchiveRun(cutoff=cutoff)  # not yet a segment's worth, and nothing long overdue
    try:
        run = await archive_now(app, cutoff=cutoff, actor=actor)
    except ArchiveBusy as e:
        log.info("scheduled archive run skipped: %s", e.message)
        return None
    except (BlazarError, OSError) as e:
        log.error("scheduled archive run failed (recorded as log.archive_failed): %s",
                  e.message if isinstance(e, BlazarError) else e)
        return None
    if run.segments:
        log.info("archived %d events into %d segment(s), %d bytes", run.events, len(run.segments), run.bytes)
    return run


async def _due(app: Blazar, after: int, top: int) -> tuple[int, float | None]:
    """How many archivable events lie in (after, top], and when the oldest of them was recorded."""
    types = archivable_types()
    marks = ", ".join("?" * len(types))
    sql = f"SELECT COUNT(*), MIN(ts) FROM events WHERE seq > ? AND seq <= ? AND type IN ({marks})"
    rows = await app.log._fetch(sql, (after, top, *types))
    return int(rows[0][0]), (None if rows[0][1] is None else float(rows[0][1]))


async def archive_loop(app: Blazar) -> None:
    """The daemon's archiver, beside serving (its own task; the segment files are written in threads): a run every
    `archive_every_s` (a changed setting counts within a second). A failed round never ends the loop."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    def first() -> float:
        return min(FIRST_RUN_S, app.settings().retention.archive_every_s)

    def every() -> float:
        return app.settings().retention.archive_every_s

    interval = first
    while True:
        await _until(loop, started, interval)
        interval = every
        started = loop.time()
        try:
            await scheduled_run(app)
        except Exception:  # the loop outlives any one round
            log.exception("scheduled archive run")


async def _until(loop: asyncio.AbstractEventLoop, since: float, interval: Callable[[], float]) -> None:
    """Sleep until `interval()` after `since`, asking again every second (a change counts)."""
    for _ in range(int(interval()) + 2):  # bounded: at most the interval, a second at a time
        left = interval() - (loop.time() - since)
        if left <= 0:
            return
        await asyncio.sleep(min(1.0, left))

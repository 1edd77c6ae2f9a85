"""Every check in order: those that read files before the log is opened (the log's own health, the machine),
then those that read what the projections know (engines, models, checkpoints, the port in the settings)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from blazar.adapters.engines.build import cache_root
from blazar.context import Blazar
from blazar.errors import ArchiveError, InvalidLogLocation
from blazar.events.location import PostgresUrl, SqliteFile
from blazar.logdb import log_location
from blazar.operations.doctor import engine, gpu, machine, store, trust
from blazar.operations.doctor.archive import archive_checks
from blazar.operations.doctor.logdb import log_checks
from blazar.operations.doctor.orphans import orphans
from blazar.operations.doctor.report import Check, ok
from blazar.operations.doctor.service import service
from blazar.paths import Paths

# Origins of a projection's start (ProjectionRunner) that mean its stored checkpoint could not be used.
_BAD_CHECKPOINT = ("rebuilt: checkpoint corrupt", "rebuilt: checkpoint belongs to another history")


async def before_open(paths: Paths, env: Mapping[str, str], *, loose_modes: list[str], now: float,
                      quick: bool = False) -> list[Check]:
    """What can be seen without opening the log (opening migrates it and tightens the home's modes)."""
    seen = machine.see_daemon(paths)
    log = await _log_health(paths, env, now=now, quick=quick)
    return [
        *log,
        machine.disk("home", paths.data_dir),
        machine.disk("cache", cache_root(env)),
        machine.file_modes(loose_modes),
        machine.config_file(paths.config_file),
        machine.daemon_file(paths, seen),
        orphans(paths.engines, seen.holder if seen.live else None, paths.models),
        service(paths, env),
    ]


async def _log_health(paths: Paths, env: Mapping[str, str], *, now: float, quick: bool) -> list[Check]:
    """The log's own checks, for the store its location names (a location that cannot be read is the failure)."""
    try:
        location = log_location(paths, env)
    except InvalidLogLocation as e:
        return [Check("log", "database", "fail", e.message, fix="correct database_url / BLAZAR_DATABASE_URL")]
    match location:
        case PostgresUrl():
            from blazar.operations.doctor import logdb_pg

            return await logdb_pg.log_checks(location, now=now)
        case SqliteFile(db):
            return log_checks(db, now=now, quick=quick)


def safe_to_open(checks: list[Check]) -> bool:
    """The log is opened (and so migrated) only when it is readable in place, whole and at the schema head."""
    return not any(c.area == "log" and (c.status == "fail" or (c.name in ("schema", "integrity") and c.status != "ok"))
                   for c in checks)


def disk_full(checks: list[Check]) -> bool:
    """The log was not opened because the disk under it is full (not because it is damaged)."""
    return any(c.id == "log.integrity" and c.status == "warn" for c in checks)


def checkpoints(app: Blazar) -> Check:
    statuses = app.runner.status()
    halted = [s for s in statuses if s.halted]
    if halted:
        return Check("log", "projections", "fail", "; ".join(f"{s.name} halted at seq {s.seq}: {s.halted}"
                                                            for s in halted),
                     fix=f"blazar events --json | less (the event after seq {halted[0].seq}); report it")
    bad = [s for s in statuses if s.origin.startswith(_BAD_CHECKPOINT)]
    if bad:
        return Check("log", "checkpoints", "warn", "; ".join(f"{s.name}: {s.origin}" for s in bad)
                     + " (each was folded from the log instead)",
                     fix="nothing to repair by hand: a fresh checkpoint replaces it as events accrue")
    used = sum(1 for s in statuses if s.origin.startswith("checkpoint at"))
    return ok("log", "checkpoints", f"{len(statuses)} projection(s) caught up; {used} from a valid checkpoint "
              "(sha256 and anchor checked)")


async def with_log(app: Blazar, *, quick: bool) -> list[Check]:
    """What the projections know, checked against the files and the machine."""
    settings = app.settings()
    seen = machine.see_daemon(app.paths)
    stored = await asyncio.to_thread(store.model_files, app.paths.models, app.runner.state("catalog"), quick=quick)
    checks = [checkpoints(app), *await archive_checks(app, quick=quick), trust.untrusted_paths(app),
              machine.port(settings.server.host, settings.server.port, seen), *stored,
              await asyncio.to_thread(trust.kv_bank, app), engine.active_engine(app)]
    files = await asyncio.to_thread(engine.files, app)
    for found in (files, engine.cpu(app, engine.cpu_flags()), await engine.smoke(app)):
        if found is not None:
            checks.append(found)
    return checks + await gpu.gpu_checks(app)


async def after_fix(app: Blazar) -> list[Check]:
    """The checks of what the log knows that `--fix` repairs, looked at again (the others run before the log opens)."""
    return [await asyncio.to_thread(trust.kv_bank, app)]


def not_opened(*, disk_full: bool = False) -> list[Check]:
    """Stand-ins for the checks that need the log, when it is not safe to open (or cannot be, on a full disk)."""
    if disk_full:
        why, fix = "not checked: the disk under the log is full (see log.integrity)", "free space first"
    else:
        why, fix = "not checked: the log is not safe to open (see the log checks above)", "fix the log first"
    return [Check("engine", "active", "warn", why, fix=fix),
            Check("store", "integrity", "warn", why, fix=fix)]


def segments_unreadable(error: ArchiveError) -> list[Check]:
    """When start-up could not fold the log: it had to read an archived range (no checkpoint past it) whose segment
    is missing or altered."""
    return [Check("log", "segments", "fail", f"the projections cannot be rebuilt: {error.message}",
                  fix="put the segment's files back from a copy (a snapshot holds them); every later read of that "
                      "range fails the same way"),
            *not_opened()]

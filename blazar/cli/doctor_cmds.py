"""`blazar doctor [--json] [--fix] [--quick]`: run the checks, print them (a table on a terminal, plain lines when
piped, one JSON object with --json), make the safe fixes with --fix, and exit 0 (ok), 1 (a warning) or 2 (a failure)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from blazar.bootstrap import paths_from_env
from blazar.cli.common import err, opened, out, print_json, run
from blazar.errors import ArchiveError
from blazar.events.base import Recorded
from blazar.operations.doctor import checks
from blazar.operations.doctor.fix import apply_fixes
from blazar.operations.doctor.report import Check, exit_code, overall
from blazar.operations.doctor.store import QUICK_HASH_BYTES
from blazar.paths import Paths
from blazar.queries.file_modes import loose_modes

_AREAS = ("engine", "store", "log", "machine")
_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


async def _before_open(paths: Paths, *, quick: bool) -> list[Check]:
    return await checks.before_open(paths, os.environ, loose_modes=loose_modes(paths), now=time.time(), quick=quick)


async def _check_all(paths: Paths, *, quick: bool) -> list[Check]:
    found = await _before_open(paths, quick=quick)
    if not checks.safe_to_open(found):
        return found + checks.not_opened(disk_full=checks.disk_full(found))
    try:
        async with opened(reconcile_config=False) as app:
            return found + await checks.with_log(app, quick=quick)
    except ArchiveError as e:  # start-up had to read a segment (no checkpoint past it) that is missing or altered
        return found + checks.segments_unreadable(e)


async def _fix(paths: Paths, found: list[Check], *, quick: bool) -> tuple[list[Check], list[Recorded]]:
    """Apply the fixes, then look again at the checks that proposed them (all of them run before the log opens)."""
    if not any(c.actions for c in found):
        return found, []
    if not checks.safe_to_open(found):
        err.print("--fix: nothing done: the log is not safe to open, so no fix could be recorded (fix the log first)")
        return found, []
    async with opened(reconcile_config=False) as app:
        fixed = await apply_fixes(app, found)
        again = {c.id: c for c in await checks.after_fix(app)}
    again |= {c.id: c for c in await _before_open(paths, quick=quick)}
    return [again.get(c.id, c) if c.actions else c for c in found], fixed


def _render(found: list[Check], fixed: list[Recorded]) -> None:
    if sys.stdout.isatty():
        table = Table(show_lines=False)
        for col in ("status", "check", "observation", "fix"):
            table.add_column(col, overflow="fold")
        for c in found:
            table.add_row(Text(c.status, style=_STYLE[c.status]), c.id, c.observation, c.fix or "")
        out.print(table)
    else:
        for c in found:
            out.print(Text(f"{c.status:<4}  {c.id:<22}  {c.observation}"))
            if c.fix:
                out.print(Text(f"{'':<4}  {'':<22}  fix: {c.fix}"))
    for rec in fixed:
        d = rec.event.model_dump()
        verb = "removed" if d["action"] == "removed_file" else f"stopped pid {d['pid']}"
        out.print(Text(f"fixed: {verb} {d['target']} ({d['detail']}; recorded as seq {rec.seq})"))
    counts = {s: sum(1 for c in found if c.status == s) for s in ("ok", "warn", "fail")}
    out.print(Text(f"{overall(found)}: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail",
                   style=_STYLE[overall(found)]))


def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: status, exit_code, checks (each with "
                                 "check, area, name, status, observation, fix, fixable) and fixed (what --fix did)."),
    fix: bool = typer.Option(False, "--fix", help="Make the safe repairs, each recorded as a doctor.fixed event: "
                             "remove a stale run/daemon.json (with its admin token and lock), stop orphan engine "
                             "processes of this home (SIGTERM, then SIGKILL) and remove KV-bank saves no event "
                             "records (left by a daemon stopped during a save). Never touches models or the log "
                             "otherwise; the other problems are left to the fix each check names."),
    quick: bool = typer.Option(False, "--quick", help="Check every model file's size, but hash only a random sample "
                               f"(files in random order up to {QUICK_HASH_BYTES >> 30} GiB read, at least one) "
                               "instead of every file; and check the log with PRAGMA quick_check (no index "
                               "verification) instead of integrity_check."),
) -> None:
    """Check this home: the engine (active, files verify, runs on this CPU: its build options against the CPU flags
    and a smoke test), the model store (files match their sha256 and size; nothing unrecorded, nothing missing), the
    log (integrity, seq whole with the archived ranges counted, append-only triggers, checkpoints, schema at head,
    the live log's and the archive's share of their disks, every archive segment present and unaltered, no leftover
    segment files) and the machine (disk free,
    file modes, the port, a stale run/daemon.json, orphan engine processes, config.toml, the clock). Each check is
    ok, warn or fail, with what it saw and the command that fixes it. Exit code: 0 all ok, 1 a warning, 2 a
    failure."""
    paths = paths_from_env()
    found = run(_check_all(paths, quick=quick))
    fixed: list[Recorded] = []
    if fix:
        found, fixed = run(_fix(paths, found, quick=quick))
    found.sort(key=lambda c: _AREAS.index(c.area))  # stable: each area's checks keep their order
    if as_json:
        info: dict[str, Any] = {
            "status": overall(found), "exit_code": exit_code(found), "checks": [c.to_json() for c in found],
            "fixed": [{"seq": r.seq, "type": r.type, **r.event.model_dump(mode="json")} for r in fixed]}
        print_json(info)
    else:
        _render(found, fixed)
    raise typer.Exit(exit_code(found))

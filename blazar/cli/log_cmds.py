"""`blazar log status` (what the live log and the archive hold, and what a run would move) and `blazar log archive`
(one archive run now, in this process: the archive's run lock and the one-transaction commit make that safe beside a
running daemon, which is told to fold the result at once)."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from blazar.bootstrap import paths_from_env
from blazar.cli.common import JSON_OPTION, fmt_ts, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.diskspace import explain, size
from blazar.durations import parse_duration
from blazar.errors import ArchiveBusy, ArchiveError
from blazar.operations.archive_schedule import archive_now
from blazar.queries.log_status import Retention, log_status

app = typer.Typer(help="The log's retention: what the live log and the archive hold; archive request history now.",
                  no_args_is_help=True)


@app.command()
def status(
    days: int = typer.Option(14, "--days", min=1, max=3660, help="Count the live log's events by type for this "
                             "many most recent days."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The live log (size on disk, events, per day and type, growth per day, the oldest event), the retention in
    force and what a run would archive now, and the archive (segments, their seq and time ranges, sizes, leftover
    files)."""

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            s = app_.settings()
            policy = Retention(request_retention=s.retention.request_retention, retention_s=s.retention_s(),
                               archive_every_s=s.retention.archive_every_s)
            return await log_status(app_.log, policy, now=app_.clock.now(), days=days)

    info = run(go())
    if as_json:
        print_json(info)
        return
    _render_status(info)


def _render_status(info: dict[str, Any]) -> None:
    live, ret, arch, growth = info["live"], info["retention"], info["archive"], info["growth"]
    oldest = live["oldest"]
    seqs = f", seq {live['first_seq']}..{live['last_seq']}" if live["events"] else ""
    out.print(f"[bold]live log[/bold] ({info['backend']}, {escape(info['location'])}): {size(live['bytes'])}, "
              f"{live['events']} events{seqs}")
    if oldest:
        out.print(f"  oldest event: seq {oldest['seq']} at {fmt_ts(oldest['ts'])} ({oldest['type']})")
    arch_oldest = live["oldest_archivable"]
    if arch_oldest:
        out.print(f"  oldest archivable event: seq {arch_oldest['seq']} at {fmt_ts(arch_oldest['ts'])} "
                  f"({arch_oldest['type']})")
    if growth["events_per_day"] is not None:
        out.print(f"  growth: {growth['events_per_day']:.0f} events/day, about {size(int(growth['bytes_per_day']))}"
                  f"/day (last {growth['span_days']:.1f} days; {growth['bytes_per_event']:.0f} B/event on disk)")
    if ret["retention_s"] > 0:
        out.print(f"[bold]retention[/bold]: request_retention {ret['request_retention']} (cutoff "
                  f"{fmt_ts(ret['cutoff'])}, seq {ret['cutoff_seq']}); a run now archives {ret['archivable_now']} "
                  f"events; the daemon runs every {ret['archive_every_s']:g} s")
    else:
        out.print("[bold]retention[/bold]: request_retention 0: everything stays live, nothing is archived")
    if ret["last_archived_at"] is not None:
        out.print(f"  last archived: {fmt_ts(ret['last_archived_at'])}")
    out.print(f"[bold]archive[/bold] ({escape(str(arch['dir']))}): {arch['count']} segment(s), {arch['events']} "
              f"events, {size(arch['bytes'])}")
    if arch["segments"]:
        table = Table("segment", "seq", "events", "bytes", "from (UTC)", "to (UTC)", box=None, header_style="bold")
        for seg in arch["segments"]:
            table.add_row(seg["name"] + (" [red](missing)[/red]" if seg["missing"] else ""),
                          f"{seg['first_seq']}..{seg['last_seq']}", str(seg["count"]),
                          size(seg["bytes"]) if seg["bytes"] is not None else "-", fmt_ts(seg["ts_min"]),
                          fmt_ts(seg["ts_max"]))
        out.print(table)
    if arch["orphans"]:
        out.print(f"  [yellow]{len(arch['orphans'])} leftover file(s)[/yellow] ({size(arch['orphan_bytes'])}) no "
                  "segment names: " + escape(", ".join(arch["orphans"])) + " (the next run removes them)")
    if info["days"]:
        table = Table("day (UTC)", "events", "by type", box=None, header_style="bold")
        for day in info["days"]:
            types = ", ".join(f"{t} {n}" for t, n in sorted(day["types"].items(), key=lambda kv: -kv[1]))
            table.add_row(day["day"], str(day["events"]), types)
        out.print(table)
    if info["types"]:
        table = Table("type", "live", "archived", box=None, header_style="bold")
        for type_name, n in info["types"].items():
            table.add_row(type_name, str(n["live"]), str(n["archived"]))
        out.print(table)


def _older_than(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--older-than") from None
    if seconds <= 0:
        raise typer.BadParameter("must be more than 0 (like 30d, 12h or 3600): 0 would archive what is being "
                                 "recorded now", param_hint="--older-than")
    return seconds


@app.command("archive")
def archive_cmd(
    older_than: str | None = typer.Option(None, "--older-than", help="Archive request history recorded longer ago "
                                          "than this (30d, 12h, 3600); default: the request_retention setting."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Move request traces and node heartbeats older than the retention out of the live log into verified archive
    segments now (the daemon also does this every archive_every_s). Control events stay live. Each segment is
    recorded as log.archived; a failure as log.archive_failed (exit 5). The projections are checkpointed after, so
    start-up never reads the segments."""
    seconds = _older_than(older_than)

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            setting = app_.settings().retention.request_retention
            retention = seconds if seconds is not None else app_.settings().retention_s()
            if retention <= 0:
                return {"skipped": "request_retention is 0: everything stays live (pass --older-than to archive "
                                   "anyway)", "retention": setting, "older_than_s": None, "cutoff": None,
                        "segments": [], "events": 0, "bytes": 0, "orphans_removed": 0}
            cutoff = app_.clock.now() - retention
            try:
                done = await archive_now(app_, cutoff=cutoff, actor=app_.actor)
            except ArchiveBusy as e:
                raise ArchiveBusy(f"another archive run is under way (the daemon's schedule, or another `blazar log "
                                  f"archive`): nothing done; try again once it ends ({e.message})") from None
            except ArchiveError as e:
                raise ArchiveError(f"archiving failed (recorded as log.archive_failed): {e.message}") from None
            except OSError as e:
                where = app_.log.archive.root if app_.log.archive is not None else app_.paths.data_dir
                raise explain(e, where, writing="archive segments") or ArchiveError(
                    f"archiving failed (recorded as log.archive_failed): {e}") from None
            return {"skipped": None, "retention": setting, "older_than_s": retention, **done.to_json()}

    result = run(go())
    if result["segments"]:
        tell_daemon(paths_from_env())  # a running daemon folds the log.archived events at once
    if as_json:
        print_json(result)
        return
    if result["skipped"]:
        out.print(f"nothing archived: {result['skipped']}", markup=False)
        return
    for seg in result["segments"]:
        out.print(f"archived {seg['name']}: seq {seg['first_seq']}..{seg['last_seq']}, {seg['count']} events, "
                  f"{size(seg['bytes'])}", markup=False)
    if result["orphans_removed"]:
        out.print(f"removed {result['orphans_removed']} leftover file(s) of an earlier run", markup=False)
    if result["segments"]:
        out.print(f"moved {result['events']} events into {len(result['segments'])} segment(s), "
                  f"{size(result['bytes'])}; projections checkpointed", markup=False)
    else:
        out.print(f"nothing to archive: no request history recorded before {fmt_ts(result['cutoff'])} is left in the "
                  "live log", markup=False)

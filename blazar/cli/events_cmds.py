"""`blazar events` (read and tail the log) and `blazar state` (projections now or at a past point)."""

from __future__ import annotations

import contextlib
import time
from typing import TypedDict

import orjson
import typer
from rich.table import Table

from blazar.cli.common import JSON_OPTION, fmt_ts, opened, out, print_json, print_json_line, run, time_option
from blazar.events.base import Recorded
from blazar.queries.state import current_state, state_at


class _Filters(TypedDict):
    """The keyword filters `EventLog.read` and `EventLog.follow` share."""

    types: list[str] | None
    stream: str | None
    trace_id: str | None
    since: float | None
    until: float | None


def _summary(rec: Recorded, width: int = 80) -> str:
    text = orjson.dumps(rec.event.model_dump(mode="json")).decode()
    return text if len(text) <= width else text[: width - 1] + "…"


def events(
    type_: list[str] | None = typer.Option(None, "--type", "-t", help="Only these event types (repeatable)."),
    stream: str | None = typer.Option(None, "--stream", "-s", help="Only this stream, e.g. config:log_level."),
    trace: str | None = typer.Option(None, "--trace", help="Only events of this trace id."),
    since: str | None = typer.Option(None, "--since", help="From this time (ISO 8601, unix seconds, or an age: 15m)."),
    until: str | None = typer.Option(None, "--until", help="Up to this time (same forms as --since)."),
    after: int = typer.Option(0, "--after", help="Only events with a seq above this."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="At most this many events."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events as they are appended."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Read the event log, oldest first; --follow tails it. --json prints one JSON object per line."""
    now = time.time()
    filters = _Filters(
        types=type_ or None,
        stream=stream,
        trace_id=trace,
        since=time_option(since, now=now),
        until=time_option(until, now=now),
    )

    async def go() -> None:
        async with opened() as app:
            if follow:
                with contextlib.suppress(KeyboardInterrupt):
                    async for rec in app.log.follow(after=after, **filters):
                        _emit(rec, as_json)
                return
            rows = [rec async for rec in app.log.read(after=after, limit=limit, **filters)]
            if as_json:
                for rec in rows:
                    print_json_line(rec.to_json())
                return
            table = Table("seq", "time (UTC)", "type", "stream", "actor", "data", box=None, header_style="bold")
            for rec in rows:
                table.add_row(str(rec.seq), fmt_ts(rec.ts), rec.type, rec.stream, rec.actor, _summary(rec))
            out.print(table if rows else "no events match")

    with contextlib.suppress(KeyboardInterrupt):
        run(go())


def _emit(rec: Recorded, as_json: bool) -> None:
    if as_json:
        print_json_line(rec.to_json())
    else:
        out.print(f"{rec.seq:>8}  {fmt_ts(rec.ts)}  {rec.type:<22} {rec.stream:<24} {_summary(rec)}")


def state(
    at: str | None = typer.Option(
        None, "--at", help="Replay up to this point: a seq (e.g. 1200) or a time (ISO 8601, unix seconds, age)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show every projection (config, audit, stats, catalog, calibration, residency, engines, traces, metrics,
    keys) as of now, or at a past seq or time."""

    async def go() -> dict:
        async with opened() as app:
            if at is None:
                return current_state(app.runner)
            seq = int(at) if at.isdigit() and int(at) < 1_000_000_000 else None
            if seq is None:
                ts = time_option(at, now=app.clock.now())
                assert ts is not None
                seq = await app.log.seq_at_time(ts)
            return await state_at(app.log, seq=seq)

    result = run(go())
    if as_json:
        print_json(result)
        return
    out.print(f"[bold]state as of seq {result['seq']}[/bold]")
    for name, view in result["projections"].items():
        out.print(f"\n[bold]{name}[/bold]")
        out.print_json(orjson.dumps(view).decode())

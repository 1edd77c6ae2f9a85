"""`blazar why [TRACE]`: the story of one request from the log (blazar/queries/why.py), by default the last one
that failed or was rejected; `blazar why --clients`: the clients whose prompts break the prefix cache
(blazar/queries/prefix_clients.py)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from blazar.cli.common import JSON_OPTION, fmt_ts, opened, out, print_json, run
from blazar.queries.prefix_clients import FLAG_STREAK, client_rows
from blazar.queries.traces import last_failed
from blazar.queries.why import MIN_PREFIX, Explanation, resolve_trace
from blazar.queries.why_turn import TurnExplanation, load_story

_NONE = "no request has failed or been rejected: give a trace id (the x-blazar-trace-id response header)"


def why(
    trace: Annotated[str | None, typer.Argument(help=f"A trace id, or its first {MIN_PREFIX} or more characters "
                                                "(default: the last failed or rejected request).")] = None,
    clients: Annotated[bool, typer.Option(
        "--clients", help=f"Instead: the clients (key and program) whose chat turns break the prefix cache, flagged "
                          f"where their last {FLAG_STREAK} turns or more all did.")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Explain one request: each decision on its way (queue, admission, load, evictions, prefix cache, tokens) with
    its numbers, and a one-line verdict. A realtime turn's trace: its timeline (VAD, transcription, first token, first
    audio) with each internal request's trace and verdict."""
    if clients:
        if trace is not None:
            raise typer.BadParameter("--clients lists clients: give it no trace", param_hint="--clients")
        _clients(as_json)
        return

    async def go() -> Explanation | TurnExplanation | None:
        async with opened() as app:
            trace_id = trace.strip() if trace else last_failed(app)
            if trace_id is None:
                return None
            trace_id = await resolve_trace(app.log, trace_id)
            return await load_story(app.log, trace_id)

    result = run(go())
    if result is None:
        if as_json:
            print_json(None)
        else:
            out.print(_NONE)
        return
    if as_json:
        print_json(result.to_json())
        return
    out.print(Text.assemble(("trace ", "bold"), (result.trace_id, "bold"), f"  {fmt_ts(result.received_ts)}"))
    head = " ".join(p for p in (result.dialect, result.route, result.model) if p)
    if result.actor:
        head += f"  by {result.actor}"
    if head:
        out.print(Text(head))
    table = Table("+TIME", "EVENT", "WHAT HAPPENED", box=None, header_style="bold")
    for step in result.steps:
        table.add_row(_offset(step.offset_ms), step.type, Text(step.text))
    out.print(table)
    style = {"completed": "green", "in_progress": "yellow"}.get(result.outcome, "red")
    out.print(Text.assemble(("verdict: ", "bold"), (result.verdict, style)))
    if result.posture is not None:
        out.print(Text.assemble(("posture: ", "bold"), result.posture.text()))


def _clients(as_json: bool) -> None:
    async def go() -> list[dict]:
        async with opened() as app:
            return client_rows(app.runner.state("prefix"))

    rows = run(go())
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no chat turn has been compared with a previous one yet")
        return
    table = Table("CLIENT", "FLAGGED", "IN A ROW", "BROKE", "TURNS", "LAST CHANGED AT", "PREFILLED AGAIN", "TRACE",
                  box=None, header_style="bold")
    for r in rows:
        who = r["actor"] + (f" ({r['agent']})" if r["agent"] else "")
        table.add_row(who, Text("yes", "red") if r["flagged"] else "no", str(r["streak"]), str(r["breaks"]),
                      str(r["turns"]), r["changed"] or "-",
                      f"{r['reprocessed_tokens']:,} tokens, {r['prefill_ms'] / 1000:.1f} s" if r["breaks"] else "-",
                      r["break_trace_id"] or "-")
    out.print(table)


def _offset(ms: float) -> str:
    return f"{ms:+.0f} ms" if abs(ms) < 10_000 else f"{ms / 1000:+.1f} s"

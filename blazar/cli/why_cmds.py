"""`blazar why [TRACE]`: the story of one request from the log (blazar/queries/why.py), by default the last one
that failed or was rejected."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from blazar.cli.common import JSON_OPTION, fmt_ts, opened, out, print_json, run
from blazar.queries.traces import last_failed
from blazar.queries.why import MIN_PREFIX, Explanation, explain, load_trace, resolve_trace

_NONE = "no request has failed or been rejected: give a trace id (the x-blazar-trace-id response header)"


def why(
    trace: Annotated[str | None, typer.Argument(help=f"A trace id, or its first {MIN_PREFIX} or more characters "
                                                "(default: the last failed or rejected request).")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Explain one request: each decision on its way (queue, admission, load, evictions, tokens) with its numbers,
    and a one-line verdict."""

    async def go() -> Explanation | None:
        async with opened() as app:
            trace_id = trace.strip() if trace else last_failed(app)
            if trace_id is None:
                return None
            trace_id = await resolve_trace(app.log, trace_id)
            return explain(await load_trace(app.log, trace_id))

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


def _offset(ms: float) -> str:
    return f"{ms:+.0f} ms" if abs(ms) < 10_000 else f"{ms / 1000:+.1f} s"

"""`blazar node list`: the gateways sharing this home's log (on PostgreSQL): name, URL, up or down (and why), when
each was last heard from, what each has loaded and what its own store holds (where each model is)."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from blazar.cli.common import JSON_OPTION, fmt_ts, opened, out, print_json, run
from blazar.queries.nodes import where

app = typer.Typer(help="Nodes: the gateways sharing one log on PostgreSQL.", no_args_is_help=True)
_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


@app.command("list")
def list_(as_json: bool = JSON_OPTION) -> None:
    """Every node the log knows: its URL, up or down (and why), when it was last heard from, the models it has
    loaded and those in its own store."""

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            return await where(app_)

    answer = run(go())
    me, rows = answer["this_node"], answer["nodes"]
    if as_json:
        print_json(answer)
        return
    if not rows:
        out.print("no nodes: nodes are the gateways sharing a log on PostgreSQL (log.database_url); with the embedded "
                  "SQLite log there is one gateway", **_VERBATIM)
        return
    table = Table("NODE", "URL", "STATE", "LAST SEEN", "LOADED", "STORE", box=None, header_style="bold")
    for r in rows:
        state = "up" if r["up"] else f"down ({r['down_reason']}" + (f", noticed by {r['noticed_by']})"
                                                                      if r["noticed_by"] else ")")
        table.add_row(r["name"] + (" (this one)" if r["name"] == me else ""), r["url"], state,
                      fmt_ts(r["last_seen_ts"]), ", ".join(r["loaded"]) or "-", ", ".join(r["models"]) or "-")
    out.print(table)

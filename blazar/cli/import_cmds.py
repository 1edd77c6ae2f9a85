"""`blazar import --from TOOL [DIR] [--dry-run] [--only NAME]`: the table of what another tool's store holds and what
becomes of each model (blazar/store/foreign/importer.py decides and does it). Like `import FILE`, it writes the log
directly, with or without a daemon, and tells a running one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from blazar.cli.common import err, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.cli.model_cmds import _human
from blazar.store.foreign.found import ForeignTool
from blazar.store.foreign.importer import DESCRIBED, TOOLS, Discovery, Row, default_root, discover, plan
from blazar.store.foreign.importer import run as import_rows

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def import_from(tool: str, where: Path | None, *, dry_run: bool, only: list[str], as_json: bool) -> None:
    if tool not in TOOLS:
        raise typer.BadParameter(f"{tool!r}: expected one of {', '.join(TOOLS)}", param_hint="--from")
    chosen: ForeignTool = tool
    root = where.absolute() if where is not None else default_root(chosen, os.environ)

    async def go() -> tuple[Discovery, list[Row], Any]:
        async with opened() as app:
            found = await asyncio.to_thread(discover, chosen, root)
            rows = await asyncio.to_thread(plan, app.runner.state("catalog"), found.found, only)
            if not dry_run:
                rows = await import_rows(app, rows)
            return found, rows, app.paths

    found, rows, paths = run(go())
    if any(r.outcome == "imported" for r in rows):
        tell_daemon(paths)  # a running daemon serves them from the very next request
    failed = [r for r in rows if r.outcome == "failed" or r.action in ("refused", "name-taken")]
    if as_json:
        print_json({"tool": tool, "root": str(found.root), "dry_run": dry_run, "models": [r.to_json() for r in rows],
                    "skipped": [{"source": s.source, "reason": s.reason} for s in found.skipped],
                    "imported": sum(r.outcome == "imported" for r in rows),
                    "present": sum(r.action == "present" for r in rows), "failed": len(failed)})
    else:
        _show(found, rows, dry_run)
    if failed and not dry_run:
        raise typer.Exit(1)


def _action(row: Row, dry_run: bool) -> str:
    if row.outcome == "imported":
        return "imported"
    if row.outcome == "failed":
        return f"failed: {row.reason}"
    if row.action == "import":
        return "would import" if dry_run else "import"
    return {"present": "present", "name-taken": "name taken", "refused": "refused"}[row.action] + f": {row.reason}"


def _show(found: Discovery, rows: list[Row], dry_run: bool) -> None:
    where = f"{DESCRIBED[found.tool]} at {found.root}"
    if not rows and not found.skipped:
        out.print(f"no models found in {where}", **_VERBATIM)
        return
    out.print(f"{len(rows)} models in {where}" + (" (dry run: nothing written)" if dry_run else ""), **_VERBATIM)
    table = Table("name", "size", "carried", "not carried", "action", "placed", box=None, header_style="bold")
    for r in rows:
        table.add_row(r.name, _human(r.bytes), ", ".join(r.carried) or "-", "; ".join(r.not_carried) or "-",
                      _action(r, dry_run), r.placed or "-")
    if rows:
        out.print(table, **_VERBATIM)
    for s in found.skipped:
        err.print(f"skipped {s.source}: {s.reason}", **_VERBATIM)
    if not dry_run:
        done = sum(r.outcome == "imported" for r in rows)
        present = sum(r.action == "present" for r in rows)
        out.print(f"imported {done}, already present {present}, not imported {len(rows) - done - present}",
                  **_VERBATIM)

"""`blazar db status|upgrade`: the log database's schema revision, size and contents."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from blazar.bootstrap import paths_from_env
from blazar.cli.common import JSON_OPTION, out, print_json
from blazar.events import migrate

app = typer.Typer(help="The log database: schema status and upgrades.", no_args_is_help=True)


def _contents(db: Path) -> dict[str, Any]:
    if not db.exists():
        return {"events": 0, "seq_first": None, "seq_last": None, "bytes": 0, "journal_mode": None}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        has = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='events'").fetchone()
        count, first, last = conn.execute("SELECT COUNT(*), MIN(seq), MAX(seq) FROM events").fetchone() if has else (
            0, None, None)
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    wal = db.with_name(db.name + "-wal")
    size = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return {"events": count, "seq_first": first, "seq_last": last, "bytes": size, "journal_mode": mode}


@app.command()
def status(as_json: bool = JSON_OPTION) -> None:
    """Show the schema revision, pending migrations, and what the log holds (does not migrate)."""
    paths = paths_from_env()
    st = migrate.status(paths.db)
    info = {"path": str(paths.db), "current": st.current, "head": st.head, "pending": st.pending,
            "up_to_date": st.up_to_date, **_contents(paths.db)}
    if as_json:
        print_json(info)
        return
    table = Table(show_header=False, box=None)
    for k, v in info.items():
        table.add_row(f"[bold]{k}[/bold]", str(v))
    out.print(table)


@app.command()
def upgrade() -> None:
    """Apply pending schema migrations (Blazar also does this at start-up)."""
    paths = paths_from_env()
    paths.ensure()
    before = migrate.upgrade(paths.db)
    if before.up_to_date:
        out.print(f"{paths.db}: already at {before.head}")
    else:
        out.print(f"{paths.db}: {before.current or 'new'} -> {before.head} ({', '.join(before.pending)})")

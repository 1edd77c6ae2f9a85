"""`blazar audit export|verify`: the compliance export of the audit trail and its tamper check.

Both mirror `blazar.queries.audit`; export reads the log, verify reads only the file it is given (or, with
`--archive`, the archive segments the log names: `blazar.queries.archive_verify`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from blazar.bootstrap import open_log_only
from blazar.cli.common import err, opened, out, print_json, run, time_option
from blazar.errors import AuditChainBroken
from blazar.queries.archive_verify import ArchiveReport, verify_archive
from blazar.queries.audit import ChainSummary, export_audit, export_to_file, verify_file

app = typer.Typer(
    help="Export the audit trail as hash-chained JSONL (who, what, when, outcome; never content); verify it.",
    no_args_is_help=True,
)

SinceOption = Annotated[
    str | None, typer.Option("--since", help="From this time (ISO 8601, unix seconds, or an age: 15m).")
]
UntilOption = Annotated[str | None, typer.Option("--until", help="Up to this time (same forms as --since).")]
OutOption = Annotated[
    Path | None,
    typer.Option("--out", "-o", dir_okay=False, help="Write to this file (atomically) instead of stdout."),
]
FileArgument = Annotated[
    Path | None,
    typer.Argument(exists=True, dir_okay=False, readable=True, help="A file written by `audit export`."),
]
ArchiveOption = Annotated[
    bool, typer.Option("--archive", help="Verify every archive segment the log names instead of an export file.")
]
VerifyJsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


@app.command()
def export(since: SinceOption = None, until: UntilOption = None, out_file: OutOption = None) -> None:
    """Write the audit trail as JSONL: a header line, then one line per audit-relevant event in seq order.

    Each line carries `prev`, the hash of the line before it, and `hash`: sha256 of its own canonical JSON.

    Never included: prompt or completion text. While `pii_scrub` is true, actor user names are pseudonymised.
    """
    now = time.time()
    window = {"since": time_option(since, now=now), "until": time_option(until, now=now)}

    async def go() -> ChainSummary:
        async with opened() as app_:
            scrub, at = app_.settings().telemetry.pii_scrub, app_.clock.now()
            if out_file is not None:
                return await export_to_file(app_.log, out_file, pii_scrub=scrub, now=at, **window)
            summary = await export_audit(app_.log, sys.stdout.buffer, pii_scrub=scrub, now=at, **window)
            sys.stdout.buffer.flush()
            return summary

    summary = run(go())
    if out_file is not None:
        err.print(f"wrote {escape(str(out_file))}: {summary.describe()}", soft_wrap=True)


@app.command()
def verify(file: FileArgument = None, archive: ArchiveOption = False, as_json: VerifyJsonOption = False) -> None:
    """Check FILE's hash chain: exit 0 when intact, else exit 5 naming the first bad line.

    Detects an edited line, a dropped, inserted or reordered line, and a tail cut short of the header's count.

    With --archive (no FILE): every archive segment the live log names, against what `log.archived` recorded:
    each file present, its sha256 and its manifest's, every line's hash and link (the first bad line named by its
    number inside the segment), its count and head, and its link to the segment before it. Exit 5 when any is
    missing or broken.
    """
    if archive == (file is not None):
        raise typer.BadParameter("give either FILE (an audit export) or --archive (the log's archive segments)",
                                 param_hint="FILE")
    if archive:
        _verify_archive(as_json)
        return
    assert file is not None
    try:
        summary = verify_file(file)
    except AuditChainBroken as exc:
        if as_json:
            print_json({"ok": False, "file": str(file), "line": exc.line, "error": exc.message})
        err.print(f"[bold red]error:[/bold red] {escape(str(file))}: {escape(exc.message)}", soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        print_json(summary.to_json())
    else:
        out.print(f"ok: {summary.describe()}")


def _verify_archive(as_json: bool) -> None:
    async def go() -> ArchiveReport:
        # The bare log: a fold at start-up would stop on the very damage this looks for.
        log = await open_log_only()
        try:
            return await verify_archive(log)
        finally:
            await log.close()

    report = run(go())
    if as_json:
        print_json(report.to_json())
    for seg in report.segments:
        if seg.error is not None:
            err.print(f"[bold red]error:[/bold red] {escape(seg.error.message)}", soft_wrap=True)
    first = report.first_error
    if first is not None:
        raise typer.Exit(first.exit_code)
    if not as_json:
        where = f" in {escape(report.archive_dir)}" if report.archive_dir else ""
        out.print(f"ok: {escape(report.describe())}{where}", soft_wrap=True)

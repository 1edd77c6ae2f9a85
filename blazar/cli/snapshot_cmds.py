"""`blazar snapshot` (a consistent copy of the log plus a manifest, also while the daemon runs) and
`blazar restore` (verify a snapshot, then swap it in for the log, keeping the replaced one)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from blazar.bootstrap import default_actor, paths_from_env
from blazar.cli.common import JSON_OPTION, err, opened, out, print_json, run
from blazar.operations.snapshot import Taken, restore_snapshot, take_snapshot


def snapshot(
    path: Annotated[Path | None, typer.Argument(
        help="A new (or empty) directory to write to. Default: <data>/snapshots/blazar-<UTC time>-seq<N>.",
    )] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Back up the log: a consistent copy (safe while the daemon runs) plus manifest.json with checksums.

    The manifest holds the seq range, event counts, the copy's sha256, and each model file's size and sha256.
    Model files themselves are not copied. The snapshot is recorded as a snapshot.taken event.
    """

    async def go() -> Taken:
        async with opened() as app:
            return await take_snapshot(app, path)

    taken = run(go())
    m = taken.manifest
    if as_json:
        print_json({"path": str(taken.path), **m.to_json()})
        return
    out.print(f"snapshot written to {taken.path}", markup=False)
    out.print(f"  events:      {m.event_count} (seq {m.seq_first}..{m.seq_last}), schema {m.schema_revision}")
    out.print(f"  {m.db_file}:   {m.db_bytes} bytes, sha256 {m.db_sha256}", markup=False)
    out.print(f"  model files: {len(m.models)} listed with size and sha256 (not copied)")
    out.print(f"  recorded as snapshot.taken, seq {taken.seq}")


def restore(
    path: Annotated[Path, typer.Argument(help="A snapshot directory, or the manifest.json inside one.")],
    force: bool = typer.Option(
        False, "--force", help="Restore even though a Blazar daemon is running (it must be restarted after)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replace the log with a verified snapshot, rebuild every projection, and record snapshot.restored.

    Checked first: manifest, size, sha256, SQLite integrity, schema, gap-free seqs, every event decodes.
    A damaged or foreign snapshot is refused, and the current log is left untouched.
    The replaced log is kept beside it as blazar.db.replaced-<UTC time>-seq<N>; config.toml follows the log.
    """
    result = run(restore_snapshot(paths_from_env(), path, force=force, actor=default_actor(), env=os.environ))
    if as_json:
        print_json(result.to_json())
        return
    body = result.to_json()
    out.print(f"restored {body['snapshot']}: the log ends at seq {body['seq']} "
              f"(snapshot seq {body['seq_last']} + snapshot.restored)", markup=False)
    if body["previous_kept_at"]:
        out.print(f"  previous log (seq {body['previous_seq_last']}) kept at {body['previous_kept_at']}",
                  markup=False)
    if body["config_rewritten"]:
        out.print("  config.toml rewritten to the restored configuration (previous kept as config.toml.bak)")
    for warning in body["warnings"]:
        err.print(f"warning: {warning}", markup=False)

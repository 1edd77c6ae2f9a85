"""Which of the home's sensitive files and directories others can read or write: checked at start-up (a warning)
and reusable by `blazar doctor`. A cheap look at a fixed list, never a walk of the tree."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from blazar.paths import Paths


def sensitive(paths: Paths) -> list[Path]:
    """The log (and its WAL and SHM), config, run state, logs and slot dumps, and the dirs that hold them."""
    db = paths.db
    return [paths.config_dir, paths.data_dir, paths.run, paths.log, paths.data_dir / "slots", paths.snapshots,
            db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), paths.config_file,
            paths.run / "admin.token"]


def loose_modes(paths: Paths) -> list[str]:
    """`path (mode)` for each sensitive path that exists and gives group or others any access."""
    found = []
    for p in sensitive(paths):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_IMODE(st.st_mode) & 0o077:
            found.append(f"{p} ({stat.S_IMODE(st.st_mode):04o})")
    return found

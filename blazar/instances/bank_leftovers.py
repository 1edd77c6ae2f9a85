"""KV-bank saves that no event records: a daemon killed during a save (after the engine wrote the file, before
`session.saved` was committed) leaves a whole save under `slots/<model>/` that counts against no bound and that no
session can restore. Found by `blazar doctor`, removed by `blazar doctor --fix` and by the daemon at start-up
(before any instance runs, so no save is under way).

NOTE: removed, never adopted. Without its event nothing says whose session the file is (its name is a hash of the
session's name) nor what it is valid for (the identity); and keys are tenants: a save adopted into the wrong
session's namespace would hand one key another's conversation.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

from blazar.confine import BANK_DIR
from blazar.context import Blazar
from blazar.events.base import Recorded
from blazar.events.doctor import DoctorFixed
from blazar.projections.sessions import SessionsState, bank_entries

CHECK = "store.kv_bank"
WHY = "a KV-bank save no session.saved event records (a daemon stopped during the save)"
# With a daemon running, a file is a leftover only once older than any save in progress could be: the engine
# writes it within session_save_timeout_s, and its event is committed right after.
GRACE_PAST_TIMEOUT_S = 60.0


def unrecorded_saves(data_dir: Path, sessions: SessionsState, *, younger_kept_s: float | None = None,
                     now: float | None = None) -> list[Path]:
    """Regular files under the bank's model directories that no bank entry names, oldest path first. Symlinks and
    anything else that is not a plain file are never listed (never removed). `younger_kept_s`: leave out files
    modified less than that many seconds ago (a save that may still be under way)."""
    bank = data_dir / BANK_DIR
    if not bank.is_dir() or bank.is_symlink():
        return []
    recorded = {e.file for e in bank_entries(sessions)}
    now = time.time() if now is None else now
    found: list[Path] = []
    for model_dir in sorted(bank.iterdir()):
        if model_dir.is_symlink() or not model_dir.is_dir():
            continue
        for f in sorted(model_dir.iterdir()):
            if f"{BANK_DIR}/{model_dir.name}/{f.name}" in recorded:
                continue
            try:
                st = f.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if younger_kept_s is not None and now - st.st_mtime < younger_kept_s:
                continue
            found.append(f)
    return found


def grace_s(app: Blazar) -> float:
    return app.settings().sessions.session_save_timeout_s + GRACE_PAST_TIMEOUT_S


def remove(paths: list[Path], *, check: str = CHECK, why: str = WHY) -> list[DoctorFixed]:
    """Unlink each file; one `doctor.fixed` (to record) per file removed."""
    done = []
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        done.append(DoctorFixed(check=check, action="removed_file", target=str(p), detail=why))
    return done


async def remove_at_start(app: Blazar) -> list[Recorded]:
    """The daemon's start-up sweep (no instance runs yet, so no save is under way): every unrecorded save goes."""
    await app.runner.catch_up()
    found = unrecorded_saves(app.paths.data_dir, app.runner.state("sessions"))
    done = remove(found, why=f"{WHY}; removed at daemon start-up")
    return await app.record(done) if done else []

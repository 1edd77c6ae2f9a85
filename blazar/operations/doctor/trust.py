"""What the log says that Blazar would not trust, and what the KV bank holds that the log does not say.

    untrusted_paths   events whose paths lead out of the home (blazar/confine.py): the projections kept them under
                      `refused`, so no model, engine or bank entry came of them; their presence means the log was
                      written by something other than Blazar (a crafted snapshot restored by force, a hand edit)
    kv_bank           saves under slots/ that no session.saved records (a daemon killed during a save): `--fix`
                      removes them (blazar/instances/bank_leftovers.py says why they are never adopted)
"""

from __future__ import annotations

from blazar.context import Blazar
from blazar.instances import bank_leftovers
from blazar.operations.doctor.machine import see_daemon
from blazar.operations.doctor.report import Action, Check, ok
from blazar.projections import catalog, engines, sessions
from blazar.projections.base import RefusedEvent

_LISTED = 5


def refused_events(app: Blazar) -> list[RefusedEvent]:
    """Every event a projection refused to trust (the catalog, the engines, the sessions keep them), by seq."""
    found = [*catalog.refusals(app.runner.state("catalog")), *engines.refusals(app.runner.state("engines")),
             *sessions.refusals(app.runner.state("sessions"))]
    return sorted(found, key=lambda r: r.seq)


def untrusted_paths(app: Blazar) -> Check:
    refused = refused_events(app)
    if not refused:
        return ok("log", "untrusted_paths", "no event names a path outside the home")
    listing = "; ".join(f"seq {r.seq} {r.type}: {', '.join(r.paths)}" for r in refused[:_LISTED])
    more = f" (and {len(refused) - _LISTED} more)" if len(refused) > _LISTED else ""
    return Check("log", "untrusted_paths", "fail",
                 f"{len(refused)} event(s) name paths outside the home, so nothing was made of them (no model, "
                 f"engine or KV-bank entry; nothing run, opened or removed there): {listing}{more}",
                 fix=f"Blazar never wrote these: find where they came from (blazar events --json --after "
                     f"{refused[0].seq - 1}); restore a snapshot from before seq {refused[0].seq} if the "
                     "log was tampered with")


def kv_bank(app: Blazar) -> Check:
    live = see_daemon(app.paths).live
    grace = bank_leftovers.grace_s(app) if live else None
    found = bank_leftovers.unrecorded_saves(app.paths.data_dir, app.runner.state("sessions"), younger_kept_s=grace)
    if not found:
        return ok("store", "kv_bank", "every KV-bank save under slots/ is recorded")
    size = sum(p.stat().st_size for p in found if p.exists())
    listing = ", ".join(str(p) for p in found[:_LISTED]) + (f" (and {len(found) - _LISTED} more)"
                                                            if len(found) > _LISTED else "")
    actions = tuple(Action("remove_bank_file", str(p), why=bank_leftovers.WHY) for p in found)
    return Check("store", "kv_bank", "warn",
                 f"{len(found)} KV-bank save(s) ({size >> 20} MiB) that no session.saved records, left by a daemon "
                 f"stopped during a save; they count against no bound and no session can restore them: {listing}",
                 fix="blazar doctor --fix (or the next daemon start) removes them", actions=actions)

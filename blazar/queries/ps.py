"""`blazar ps`, the admin ps route and the dashboards: the loaded instances as the log says (the residency
projection's readers, blazar/projections/residency.py), and the crash circuits open now."""

from __future__ import annotations

from blazar.context import Blazar
from blazar.projections import residency
from blazar.projections.residency import PsRow, ResidentInstance

__all__ = ["PsRow", "ResidentInstance", "instance", "open_circuits", "ps_rows"]


def ps_rows(app: Blazar, *, now: float) -> list[PsRow]:
    """The rows of `blazar ps` from the log alone (no supervisor: idleness counts from each instance's ready time)."""
    return residency.ps_rows(app.runner.state("residency"), now=now)


def open_circuits(app: Blazar, *, now: float) -> dict[str, float]:
    """Models whose crash circuit is open at `now`, with when it closes by itself."""
    return residency.open_circuits(app.runner.state("residency"), now=now)


def instance(app: Blazar, instance_id: str) -> ResidentInstance | None:
    """The loaded instance `instance_id`, or None."""
    return residency.instance(app.runner.state("residency"), instance_id)

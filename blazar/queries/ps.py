"""`blazar ps` and the admin ps route: the rows are the residency projection's readers (blazar/projections/
residency.py), re-exported here for the CLI."""

from __future__ import annotations

from blazar.projections.residency import open_circuits, ps_rows

__all__ = ["open_circuits", "ps_rows"]

"""The memory planner: pure functions from GGUF metadata and devices to a fit plan (no I/O, no clock).

Formulas and the provenance of every constant: docs/10.SCIENTIFIC.md.
"""

from blazar.fit.coreside import CoresidePlan, coreside
from blazar.fit.devices import Device, budget_bytes, reserve_bytes
from blazar.fit.planner import FitPlan, FitRequest, plan

__all__ = ["CoresidePlan", "Device", "FitPlan", "FitRequest", "budget_bytes", "coreside", "plan", "reserve_bytes"]

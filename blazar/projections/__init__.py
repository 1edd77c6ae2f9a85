"""WHAT IS TRUE NOW: pure folds over the log, and the runner that keeps them current."""

from blazar.projections.audit import AuditProjection
from blazar.projections.base import Projection, State, fold
from blazar.projections.config import ConfigProjection
from blazar.projections.stats import StatsProjection


def all_projections() -> list[Projection]:
    """A fresh instance of every projection, in a stable order."""
    return [ConfigProjection(), AuditProjection(), StatsProjection()]


__all__ = ["AuditProjection", "ConfigProjection", "Projection", "State", "StatsProjection", "all_projections", "fold"]

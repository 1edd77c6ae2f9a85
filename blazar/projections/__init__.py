"""WHAT IS TRUE NOW: pure folds over the log, and the runner that keeps them current."""

from typing import Any

from blazar.projections.audit import AuditProjection
from blazar.projections.base import Projection, fold
from blazar.projections.batches import BatchesProjection
from blazar.projections.calibration import CalibrationProjection
from blazar.projections.catalog import CatalogProjection
from blazar.projections.config import ConfigProjection
from blazar.projections.engines import EnginesProjection
from blazar.projections.keys import KeysProjection
from blazar.projections.metrics import MetricsProjection
from blazar.projections.nodes import NodesProjection
from blazar.projections.prefix import PrefixProjection
from blazar.projections.profiles import ProfilesProjection
from blazar.projections.realtime import RealtimeProjection
from blazar.projections.remotes import RemotesProjection
from blazar.projections.residency import ResidencyProjection
from blazar.projections.sessions import SessionsProjection
from blazar.projections.stats import StatsProjection
from blazar.projections.traces import TracesProjection
from blazar.projections.workers import WorkersProjection


def all_projections() -> list[Projection[Any]]:
    """A fresh instance of every projection, in a stable order."""
    return [ConfigProjection(), AuditProjection(), StatsProjection(), CatalogProjection(), CalibrationProjection(),
            ResidencyProjection(), EnginesProjection(), TracesProjection(), MetricsProjection(),
            KeysProjection(), SessionsProjection(), RemotesProjection(), WorkersProjection(),
            NodesProjection(), BatchesProjection(), ProfilesProjection(), PrefixProjection(), RealtimeProjection()]


__all__ = [
    "AuditProjection",
    "BatchesProjection",
    "CalibrationProjection",
    "CatalogProjection",
    "ConfigProjection",
    "EnginesProjection", "KeysProjection",
    "MetricsProjection", "NodesProjection", "PrefixProjection", "ProfilesProjection", "Projection",
    "RealtimeProjection", "RemotesProjection",
    "ResidencyProjection",
    "SessionsProjection", "State",
    "StatsProjection",
    "TracesProjection", "WorkersProjection", "all_projections", "fold"]

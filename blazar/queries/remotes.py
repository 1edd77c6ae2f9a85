"""The remote engines as the api reads them (the models they serve appear in the model lists)."""

from __future__ import annotations

from blazar.context import Blazar
from blazar.projections import remotes as projection
from blazar.projections.remotes import Remote

__all__ = ["Remote", "remotes"]


def remotes(app: Blazar) -> list[Remote]:
    """Every registered remote, by name."""
    return projection.remotes(app.runner.state("remotes"))

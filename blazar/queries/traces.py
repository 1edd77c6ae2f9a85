"""The recent requests as the api reads them: whether a trace id is one the log summarises, and the latest request
that failed or was rejected (what `why last` explains)."""

from __future__ import annotations

from blazar.context import Blazar
from blazar.projections import traces


def known(app: Blazar, trace_id: str) -> bool:
    """`trace_id` is one of the newest requests the traces projection summarises."""
    return traces.known(app.runner.state("traces"), trace_id)


def last_failed(app: Blazar) -> str | None:
    """The trace id of the latest failed or rejected request, or None."""
    return app.runner.state("traces").last_failed

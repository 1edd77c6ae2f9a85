"""The metric families Blazar exposes, as plain data: one list, two encodings. `/metrics` writes it as Prometheus text
(blazar/queries/metrics.py builds it from the projections); the OTLP metrics export turns it into OpenTelemetry
instruments (blazar/adapters/otel/metrics.py). A family added to the list is therefore in both.

NOTE: values are copied out of the projections when the list is built (a histogram's counts are updated in place
by its fold), so a list may cross to the export's thread while the event loop folds on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Buckets:
    """One histogram series: counts per bucket, not cumulative (`counts[i]` counts values in
    (bounds[i-1], bounds[i]]; the last, one more than the bounds, counts those above the last bound), sum and count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int


@dataclass(slots=True)
class Family:
    """A family and its samples: `samples` for counters and gauges, `series` for histograms. A family with none is
    still announced (dashboards and alerts can name it before it has a value)."""

    name: str
    kind: Kind
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)
    series: list[tuple[Labels, Buckets]] = field(default_factory=list)

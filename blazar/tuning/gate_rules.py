"""The engine gate's decisions, pure: which models it measures, in what order the two builds run, and whether the
candidate build is too slow. blazar/tuning/gate.py measures and records around them.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from blazar.events.tuning import GateModel

MAX_MODELS = 2
Side = Literal["active", "candidate"]
Source = Literal["setting", "pinned", "requests", "none"]


@dataclass(frozen=True)
class Selection:
    """The models the gate measures, where they came from, and a note for what was left out or why none."""

    models: tuple[str, ...]
    source: Source
    note: str = ""


def select_models(*, configured: Sequence[str], pinned: Sequence[str], requests: Mapping[str, int],
                  servable: Collection[str], limit: int = MAX_MODELS) -> Selection:
    """The `engine_gate_models` setting when it names any; else the pinned (or keep-alive forever) models loaded;
    else the most requested (completed requests, most first, ties by name). Only models the store can serve with
    llama-server count; at most `limit`."""
    skipped = [m for m in configured if m not in servable]
    note = f"not in the store (skipped): {', '.join(skipped)}" if skipped else ""
    sources: tuple[tuple[Source, Sequence[str]], ...] = (("setting", configured), ("pinned", pinned))
    for source, names in sources:
        chosen = _unique(m for m in names if m in servable)
        if chosen:
            return Selection(tuple(chosen[:limit]), source, note)
    ranked = sorted(((n, m) for m, n in requests.items() if n > 0 and m in servable), key=lambda p: (-p[0], p[1]))
    if ranked:
        return Selection(tuple(m for _n, m in ranked[:limit]), "requests", note)
    why = "no model is pinned or has been requested yet: nothing to compare, so the gate passes"
    return Selection((), "none", f"{note}; {why}" if note else why)


def _unique(names: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for m in names:
        if m not in seen:
            seen.append(m)
    return seen


def schedule(runs: int) -> list[Side]:
    """The order of the measurements: the builds alternate, and every other round starts with the candidate (A B,
    B A, A B, ...), so that a machine slowly getting busier or quieter weighs on both alike."""
    order: list[Side] = []
    for i in range(runs):
        order += ["active", "candidate"] if i % 2 == 0 else ["candidate", "active"]
    return order


@dataclass(frozen=True)
class Run:
    """One measurement of one build: decode tokens/s per stream, and its bench.recorded."""

    decode_tps: float
    bench_id: str | None = None


def _median_run(runs: Sequence[Run]) -> Run:
    """The run at the median rate (the lower middle of an even count): its bench id names a real measurement."""
    ordered = sorted(runs, key=lambda r: r.decode_tps)
    return ordered[(len(ordered) - 1) // 2]


def compare(model: str, active: Sequence[Run], candidate: Sequence[Run]) -> GateModel:
    """A model's verdict numbers: the median rate of each build and their ratio (candidate / active)."""
    if not active or not candidate:
        raise ValueError("each build needs at least one run")
    a_tps = statistics.median(r.decode_tps for r in active)
    c_tps = statistics.median(r.decode_tps for r in candidate)
    ratio = c_tps / a_tps if a_tps > 0 else (1.0 if c_tps <= 0 else float("inf"))
    return GateModel(model=model, active_decode_tps=round(a_tps, 2), candidate_decode_tps=round(c_tps, 2),
                     ratio=round(ratio, 4) if ratio != float("inf") else 1e9,
                     active_bench_id=_median_run(active).bench_id, candidate_bench_id=_median_run(candidate).bench_id)


def decide(models: Sequence[GateModel], threshold: float) -> tuple[bool, str]:
    """Passed unless some model decodes more than `threshold` slower on the candidate; the detail names each one."""
    floor = 1.0 - threshold
    slow = [m for m in models if m.ratio < floor]
    if slow:
        return False, "; ".join(f"{m.model} decodes {1 - m.ratio:.0%} slower ({m.candidate_decode_tps:.1f} vs "
                                f"{m.active_decode_tps:.1f} t/s)" for m in slow) + f": more than {threshold:.0%}"
    if not models:
        return True, ""
    return True, f"within {threshold:.0%} of the active build on {', '.join(m.model for m in models)}"


def table(models: Sequence[GateModel]) -> list[str]:
    """The numbers as a plain-text table (the CLI's progress, and the refusal's message)."""
    head = ("model", "active t/s", "candidate t/s", "ratio")
    rows = [(m.model, f"{m.active_decode_tps:.1f}", f"{m.candidate_decode_tps:.1f}", f"{m.ratio:.2f}")
            for m in models]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(4)]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in (head, *rows)]

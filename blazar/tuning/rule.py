"""The rule `blazar tune` adopts a posture by, and its pruning test. Pure: numbers in, a decision out.

RULE: the candidate with the best mean decode t/s over the workload mix wins, provided no workload runs below
FLOOR x the defaults' and it beats the defaults' mean by at least MIN_GAIN (a smaller gain is noise on a shared
machine, and a profile that changes nothing measurable is not worth its restart). Only candidates that passed their
guard compete. PRUNE: after the short first pass, a candidate whose mean is below PRUNE_BELOW x the defaults' is
not measured further.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from blazar.events.tuning import BenchRecorded

FLOOR = 0.97
MIN_GAIN = 1.03
PRUNE_BELOW = 0.85

RULE_TEXT = (f"best mean decode t/s over the workloads, at least {MIN_GAIN:.2f}x the defaults' mean, "
             f"with no workload below {FLOOR:.2f}x the defaults'")


@dataclass(frozen=True)
class Standing:
    """A measured candidate as the rule sees it: decode t/s per workload, and whether its guard passed."""

    label: str
    decode_tps: Mapping[str, float]
    guard_passed: bool = True


@dataclass(frozen=True)
class Decision:
    winner: str | None  # a label, or None: the defaults stay
    reasons: dict[str, str]  # label -> why it lost (absent for the winner)
    summary: str  # the rule with its numbers


def mean(values: Mapping[str, float]) -> float:
    return sum(values.values()) / len(values) if values else 0.0


def decode_by_workload(bench: BenchRecorded) -> dict[str, float]:
    """Decode t/s per stream at concurrency 1, by workload (what the rule compares)."""
    return {r.workload: r.decode_tps_stream for r in bench.results if r.concurrency == 1}


def ratios(baseline: Mapping[str, float], tps: Mapping[str, float]) -> dict[str, float]:
    """Each workload's decode t/s over the defaults' (workloads the defaults did not measure are left out)."""
    return {w: (tps[w] / b if b > 0 else 0.0) for w, b in baseline.items() if w in tps}


def prune(baseline: Mapping[str, float], tps: Mapping[str, float]) -> str | None:
    """Why a candidate stops after the first pass, or None to keep measuring it."""
    base, mine = mean(baseline), mean(tps)
    if base > 0 and mine < PRUNE_BELOW * base:
        return f"first pass {mine:.1f} t/s is {mine / base:.2f}x the defaults' {base:.1f} (< {PRUNE_BELOW:.2f})"
    return None


def decide(baseline: Mapping[str, float], candidates: Sequence[Standing]) -> Decision:
    """Apply RULE. Ties go to the earlier candidate (the order they were tried)."""
    base = mean(baseline)
    reasons: dict[str, str] = {}
    best: tuple[float, Standing] | None = None
    for c in candidates:
        r = ratios(baseline, c.decode_tps)
        m = mean(c.decode_tps)
        if not c.guard_passed:
            reasons[c.label] = "failed its guard"
            continue
        if set(r) != set(baseline):
            reasons[c.label] = "not measured on every workload"
            continue
        low = {w: x for w, x in r.items() if x < FLOOR}
        if low:
            w, x = min(low.items(), key=lambda kv: kv[1])
            reasons[c.label] = f"{w} at {x:.2f}x the defaults (< {FLOOR:.2f})"
            continue
        if base <= 0 or m < MIN_GAIN * base:
            reasons[c.label] = f"mean {m:.1f} t/s is {m / base if base else 0:.2f}x the defaults' (< {MIN_GAIN:.2f})"
            continue
        if best is None or m > best[0]:
            if best is not None:
                reasons[best[1].label] = f"mean {best[0]:.1f} t/s, below {c.label}'s {m:.1f}"
            best = (m, c)
        else:
            reasons[c.label] = f"mean {m:.1f} t/s, below {best[1].label}'s {best[0]:.1f}"
    if best is None:
        return Decision(None, reasons, f"{RULE_TEXT}: the defaults ({base:.1f} t/s) win")
    m, c = best
    worst = min(ratios(baseline, c.decode_tps).values())
    return Decision(c.label, reasons, f"{RULE_TEXT}: {c.label} at {m:.1f} t/s = {m / base:.2f}x the defaults' "
                                      f"{base:.1f} (lowest workload {worst:.2f}x)")

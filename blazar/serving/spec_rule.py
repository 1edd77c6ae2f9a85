"""The speculation governor's rule, pure: one window's numbers for one speculative instance in, speculation on or off
(and why) out. The governor (blazar/serving/spec_governor.py) gathers the numbers and records each switch as
`spec.switched`; requests read the verdict (admit.py).

The rule, in order:
1. Saturation: in at least half of the window's samples more requests wanted the instance than it has slots (in
   flight + queued > slots): speculation off. Drafting makes each step of every busy slot longer, and with a queue
   the throughput of the whole instance is what counts. Back on after a window with no saturated sample.
2. Low acceptance: at least `min_drafted` tokens drafted in the window and fewer than `min_acceptance` of them
   accepted: off (the verification work is mostly wasted). Nothing can be measured while it is off, so it is
   re-probed: back on after `reprobe_s`, doubled after each probe that still found acceptance low (at most 16x);
   a probe that finds acceptance at or above the threshold resets the wait.
A window with too little drafting to judge (an idle instance, short answers) changes nothing. NOTE: llama-server adds a
request's drafted and accepted tokens (and its generation time) to its /metrics counters when the request ends, so a
window judges the requests that ended in it; saturation is read from admission's demand instead, as it happens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

MAX_BACKOFF_DOUBLINGS = 4  # a re-probe waits at most 16x reprobe_s


@dataclass(frozen=True, slots=True)
class SpecRule:
    """The thresholds (settings spec_*)."""

    window_s: float = 10.0
    min_acceptance: float = 0.4
    min_drafted: int = 32
    reprobe_s: float = 60.0


@dataclass(frozen=True, slots=True)
class SpecWindow:
    """What one window saw: the engine's counters' growth over it, and the demand sampled during it."""

    duration_s: float
    drafted: int  # spec_decode_num_draft_tokens_total grew by this much
    accepted: int  # spec_decode_num_accepted_tokens_total
    predicted: int  # tokens_predicted_total
    predicted_s: float  # tokens_predicted_seconds_total (summed over slots)
    samples: int  # demand samples taken in the window
    saturated: int  # ... of which had more requests than slots
    peak_demand: int  # the most requests (in flight + queued) seen at once
    slots: int

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted > 0 else None

    @property
    def decode_tps(self) -> float | None:
        return self.predicted / self.predicted_s if self.predicted_s > 0 else None


OffReason = Literal["saturation", "acceptance"]


@dataclass(frozen=True, slots=True)
class SpecState:
    """One instance's verdict and what the rule remembers between windows."""

    enabled: bool = True
    off_reason: OffReason | None = None
    off_since: float = 0.0  # monotonic seconds
    probing: bool = False  # back on to measure acceptance again
    failed_probes: int = 0
    reason: str = ""  # the last switch's reason, as recorded


@dataclass(frozen=True, slots=True)
class Switch:
    enabled: bool
    reason: str


def decide_spec(state: SpecState, window: SpecWindow, rule: SpecRule, now: float) -> tuple[SpecState, Switch | None]:
    """The state after `window` (ending at monotonic `now`), and the switch to record if the verdict changed."""
    saturated = window.samples > 0 and window.saturated * 2 >= window.samples
    acceptance = window.acceptance
    judged = window.drafted >= rule.min_drafted and acceptance is not None
    if state.enabled:
        if saturated:
            reason = (f"{_n(window.peak_demand, 'request')} for {_n(window.slots, 'slot')} "
                      f"({window.saturated}/{window.samples} samples saturated)")
            return _off(state, "saturation", reason, now, failed=state.failed_probes), Switch(False, reason)
        if judged and acceptance is not None and acceptance < rule.min_acceptance:
            reason = f"acceptance {acceptance:.2f} < {rule.min_acceptance:.2f} ({window.accepted}/{window.drafted})"
            failed = state.failed_probes + 1 if state.probing else 0
            return _off(state, "acceptance", reason, now, failed=failed), Switch(False, reason)
        if state.probing and judged:
            return replace(state, probing=False, failed_probes=0), None
        return state, None
    if window.saturated > 0:
        return state, None  # stays off (hysteresis; and a re-probe under saturation would lose either way)
    if state.off_reason == "saturation":
        reason = f"saturation gone (at most {_n(window.peak_demand, 'request')} for {_n(window.slots, 'slot')})"
        return _on(state, reason, probing=False), Switch(True, reason)
    wait = rule.reprobe_s * 2 ** min(state.failed_probes, MAX_BACKOFF_DOUBLINGS)
    if now - state.off_since >= wait:
        reason = f"re-probe after {now - state.off_since:.0f} s off for low acceptance"
        return _on(state, reason, probing=True), Switch(True, reason)
    return state, None


def _n(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _off(state: SpecState, why: OffReason, reason: str, now: float, *, failed: int) -> SpecState:
    return replace(state, enabled=False, off_reason=why, off_since=now, probing=False, failed_probes=failed,
                   reason=reason)


def _on(state: SpecState, reason: str, *, probing: bool) -> SpecState:
    return replace(state, enabled=True, off_reason=None, probing=probing, reason=reason)

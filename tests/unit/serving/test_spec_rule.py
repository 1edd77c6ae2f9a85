"""The speculation governor's rule (blazar/serving/spec_rule.py): window numbers in, on/off and the reason out."""

from __future__ import annotations

import pytest

from blazar.serving.spec_rule import SpecRule, SpecState, SpecWindow, decide_spec

RULE = SpecRule(window_s=10, min_acceptance=0.4, min_drafted=32, reprobe_s=60)


def window(drafted: int = 0, accepted: int = 0, samples: int = 5, saturated: int = 0, peak: int = 1,
           slots: int = 2) -> SpecWindow:
    return SpecWindow(duration_s=10, drafted=drafted, accepted=accepted, predicted=100, predicted_s=2.0,
                      samples=samples, saturated=saturated, peak_demand=peak, slots=slots)


ON = SpecState()
OFF_SATURATED = SpecState(enabled=False, off_reason="saturation", off_since=100.0)
OFF_LOW = SpecState(enabled=False, off_reason="acceptance", off_since=100.0)


@pytest.mark.parametrize(("state", "w", "now", "enabled", "switched", "reason"), [
    # on: saturation in at least half the samples turns it off, whatever the acceptance
    (ON, window(drafted=100, accepted=90, saturated=3, peak=5), 110, False, True, "5 requests for 2 slots"),
    (ON, window(saturated=2, peak=3), 110, True, False, None),  # 2 of 5 samples: not sustained
    # on: low acceptance over enough drafting turns it off
    (ON, window(drafted=100, accepted=30), 110, False, True, "acceptance 0.30 < 0.40"),
    (ON, window(drafted=20, accepted=0), 110, True, False, None),  # too little drafting to judge
    (ON, window(drafted=100, accepted=40), 110, True, False, None),  # at the threshold: stays on
    (ON, window(samples=0), 110, True, False, None),  # nothing seen
    # off for saturation: back on after a window without any saturated sample, stays off otherwise
    (OFF_SATURATED, window(saturated=0, peak=2), 110, True, True, "saturation gone"),
    (OFF_SATURATED, window(saturated=1, peak=3), 110, False, False, None),
    # off for low acceptance: a re-probe once reprobe_s has passed, not before, never under saturation
    (OFF_LOW, window(), 150, False, False, None),
    (OFF_LOW, window(), 160, True, True, "re-probe after 60 s"),
    (OFF_LOW, window(saturated=5, peak=6), 200, False, False, None),
])
def test_the_rule(state: SpecState, w: SpecWindow, now: float, enabled: bool, switched: bool,
                  reason: str | None) -> None:
    after, switch = decide_spec(state, w, RULE, now)
    assert after.enabled is enabled
    assert (switch is not None) is switched
    if switch is not None:
        assert switch.enabled is enabled
        assert reason is not None and reason in switch.reason
        assert after.reason == switch.reason


def test_a_failed_probe_doubles_the_wait_and_a_good_one_resets_it() -> None:
    state, switch = decide_spec(OFF_LOW, window(), RULE, 160)
    assert switch is not None and state.probing
    state, switch = decide_spec(state, window(drafted=64, accepted=6), RULE, 170)  # still low: off, wait x2
    assert switch is not None and not switch.enabled and state.failed_probes == 1
    assert decide_spec(state, window(), RULE, 170 + 119)[1] is None
    state, switch = decide_spec(state, window(), RULE, 170 + 120)
    assert switch is not None and switch.enabled and state.probing
    state, switch = decide_spec(state, window(drafted=64, accepted=60), RULE, 300)  # recovered: no switch recorded
    assert switch is None and state.enabled and not state.probing and state.failed_probes == 0


def test_the_wait_between_failed_probes_is_capped() -> None:
    state = SpecState(enabled=False, off_reason="acceptance", off_since=0.0, failed_probes=10)
    assert decide_spec(state, window(), RULE, 16 * 60 - 1)[1] is None
    assert decide_spec(state, window(), RULE, 16 * 60)[1] is not None


def test_the_window_numbers() -> None:
    w = window(drafted=80, accepted=60)
    assert w.acceptance == 0.75 and w.decode_tps == 50.0
    assert window().acceptance is None

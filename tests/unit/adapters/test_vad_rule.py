"""The server_vad turn rule over speech probabilities: when a turn starts and stops, and the positions reported."""

from __future__ import annotations

import pytest

from blazar.adapters.vad_rule import (
    ServerVad,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnRule,
    server_vad,
)
from blazar.errors import DialectError

W = 32  # ms per window


def _events(params: ServerVad, probs: list[float]) -> list[object]:
    rule = TurnRule(params)
    out = [rule.window(p, i * W, (i + 1) * W) for i, p in enumerate(probs)]
    return [e for e in out if e is not None]


def test_one_turn_with_padding_and_silence():
    # Silence for 20 windows (640 ms), speech for 10, silence for 30.
    probs = [0.05] * 20 + [0.9] * 10 + [0.05] * 30
    assert _events(ServerVad(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500), probs) == [
        SpeechStarted(640 - 300),
        # Silence from 960 ms; 500 ms of it is reached at the end of the window that ends at 1472 ms (16 windows).
        SpeechStopped(960 + 16 * W),
    ]


def test_padding_never_before_the_start():
    assert _events(ServerVad(prefix_padding_ms=300), [0.9]) == [SpeechStarted(0)]


def test_a_dip_between_the_thresholds_does_not_end_a_turn():
    # 0.4 is below the 0.5 to start but above the 0.35 that ends: a long dip there keeps the turn.
    probs = [0.9] * 5 + [0.4] * 40 + [0.0] * 20
    assert _events(ServerVad(silence_duration_ms=200), probs) == [SpeechStarted(0), SpeechStopped(45 * W + 7 * W)]


def test_a_short_pause_is_not_a_stop_and_speech_resets_it():
    probs = [0.9] * 5 + [0.1] * 10 + [0.9] * 5 + [0.1] * 10
    assert _events(ServerVad(silence_duration_ms=500), probs) == [SpeechStarted(0)]


def test_threshold_decides_what_starts():
    probs = [0.6] * 10
    assert _events(ServerVad(threshold=0.7), probs) == []
    assert _events(ServerVad(threshold=0.5), probs) == [SpeechStarted(0)]


def test_two_turns():
    probs = ([0.9] * 5 + [0.0] * 10) * 2
    events = _events(ServerVad(prefix_padding_ms=0, silence_duration_ms=200), probs)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * 2
    assert events[2] == SpeechStarted(15 * W)


@pytest.mark.parametrize("bad", [{"threshold": 1.5}, {"prefix_padding_ms": -1}, {"silence_duration_ms": -5}])
def test_out_of_range_parameters_are_refused(bad):
    with pytest.raises(ValueError, match="must"):
        ServerVad(**bad)


def test_turn_detection_from_the_protocol():
    assert server_vad(None) is None
    assert server_vad({"type": "server_vad"}) == ServerVad()
    assert server_vad({"type": "server_vad", "threshold": 0.7, "prefix_padding_ms": 100, "silence_duration_ms": 900,
                       "create_response": False, "interrupt_response": False, "idle_timeout_ms": None}) == ServerVad(
        threshold=0.7, prefix_padding_ms=100, silence_duration_ms=900, create_response=False,
        interrupt_response=False)
    assert server_vad({"type": "server_vad", "threshold": 1}) == ServerVad(threshold=1.0)


@pytest.mark.parametrize(("spec", "says"), [
    ({"type": "semantic_vad"}, "'semantic_vad' is not supported here"),
    ({"type": "server_vad", "eagerness": "low"}, "no field 'eagerness'"),
    ({"type": "server_vad", "threshold": "high"}, "threshold has the wrong type"),
    ({"type": "server_vad", "silence_duration_ms": 0.5}, "silence_duration_ms has the wrong type"),
    ({"type": "server_vad", "create_response": 1}, "create_response has the wrong type"),
    ({"type": "server_vad", "silence_duration_ms": 600_000}, "silence_duration_ms must be between 0 and 60000"),
])
def test_turn_detection_refusals_say_what_is_wrong(spec, says):
    with pytest.raises(DialectError, match=says) as refused:
        server_vad(spec)
    assert refused.value.code == "invalid_turn_detection"


def test_a_rule_asked_for_pauses_tells_each_pause_then_the_resume_or_the_stop():
    # Speech 5 windows, 6 quiet (a pause after 160 ms of it), speech 3 (resumed), then quiet until the stop.
    rule = TurnRule(ServerVad(silence_duration_ms=500), pause_ms=160)
    probs = [0.9] * 5 + [0.1] * 6 + [0.9] * 3 + [0.1] * 20
    events = [e for e in (rule.window(p, i * W, (i + 1) * W) for i, p in enumerate(probs)) if e is not None]
    assert events == [SpeechStarted(0), SpeechPaused(5 * W), SpeechResumed(11 * W), SpeechPaused(14 * W),
                      SpeechStopped(14 * W + 16 * W)]


def test_no_pauses_unless_asked_and_none_as_long_as_the_silence_that_ends_the_turn():
    probs = [0.9] * 5 + [0.1] * 20
    assert not any(isinstance(e, SpeechPaused) for e in _events(ServerVad(silence_duration_ms=500), probs))
    rule = TurnRule(ServerVad(silence_duration_ms=200), pause_ms=200)
    events = [e for e in (rule.window(p, i * W, (i + 1) * W) for i, p in enumerate(probs)) if e is not None]
    assert events == [SpeechStarted(0), SpeechStopped(5 * W + 7 * W)]

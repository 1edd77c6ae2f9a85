"""`request.routed` v1 → v2: the victims a load evicted were prose ("model (instance_id, reason)") and are now
structured. A v1 payload as a v1 daemon wrote it is a golden fixture: it must decode, upcast, forever."""

from __future__ import annotations

from blazar.events.requests import Evicted, RequestRouted
from blazar.events.types import decode, encode
from tests.support.event_goldens.files import decode_golden, golden_path, load


def test_the_v1_golden_payload_upcasts_to_structured_victims() -> None:
    ev = decode_golden(load(golden_path("request.routed", 1)))
    assert isinstance(ev, RequestRouted) and ev.V == 2
    assert ev.evicted == [Evicted(model="qwen", instance_id="q1", reason="memory"),
                          Evicted(model="llama3.2:1b", instance_id="a9f3e1c2d4b5", reason="max_loaded_models")]
    assert (ev.model, ev.instance_id, ev.cold, ev.load_ms, ev.ctx_tokens) == ("gemma", "g2", True, 2100, 4096)


def test_a_v1_entry_that_does_not_parse_keeps_its_text() -> None:
    ev = decode(1, "request.routed", 1, b'{"trace_id":"t","model":"m","instance_id":"i","port":1,"cold":true,'
                                         b'"evicted":["something odd"]}')
    assert isinstance(ev, RequestRouted)
    assert ev.evicted == [Evicted(model="something odd", instance_id="", reason="unknown")]


def test_v2_round_trips() -> None:
    ev = RequestRouted(trace_id="t", model="m", instance_id="i", port=1, cold=True,
                       evicted=[Evicted(model="q", instance_id="q1", reason="memory")])
    assert decode(1, "request.routed", 2, encode(ev)) == ev

"""The speculation governor's shell (blazar/serving/spec_governor.py) over fakes: windows of the engine's counters and
admission's demand in, `spec.switched` events and per-request verdicts out; the `X-Blazar-Spec` / `options.spec`
parsing; the engine's /metrics text."""

from __future__ import annotations

from typing import Any, cast

import pytest

from blazar.adapters.engines.client import EngineClient, parse_metrics
from blazar.clock import FakeClock
from blazar.context import Blazar
from blazar.dialects.ollama import map_options
from blazar.errors import DialectError, EngineUnreachable
from blazar.events.tuning import Posture, SpecSwitched
from blazar.instances.supervisor import Instance
from blazar.serving.admission import Admission
from blazar.serving.ports import SupervisorPort
from blazar.serving.spec_governor import COUNTERS, SpecGovernor
from blazar.serving.spec_rule import SpecRule

RULE = SpecRule(window_s=1.0, min_acceptance=0.4, min_drafted=32, reprobe_s=10.0)


class _Supervisor:
    def __init__(self, instances: list[Instance]) -> None:
        self.list = instances

    def instances(self, model: str | None = None) -> list[Instance]:
        return self.list


class _Admission:
    def __init__(self) -> None:
        self.busy = self.queued = 0

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {"m": {"slots": 2, "busy": self.busy, "queued": self.queued}}


class _Engine:
    """The engine's counters, grown by the test between windows."""

    def __init__(self) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        self.up = True

    async def metrics(self, base_url: str, *, api_key: str | None = None, timeout_s: float = 0) -> dict[str, float]:
        if not self.up:
            raise EngineUnreachable("down")
        return dict(self.counters)

    def grow(self, drafted: int, accepted: int, predicted: int = 100, seconds: float = 2.0) -> None:
        c = self.counters
        c["spec_decode_num_draft_tokens_total"] += drafted
        c["spec_decode_num_accepted_tokens_total"] += accepted
        c["tokens_predicted_total"] += predicted
        c["tokens_predicted_seconds_total"] += seconds


def _instance(posture: Posture | None = Posture(spec_type="ngram-simple")) -> Instance:
    return Instance(instance_id="i-1", model="m", port=1, slots=2, ctx_tokens=1024, engine_tag="t", posture=posture)


def _governor(app: Blazar, inst: Instance) -> tuple[SpecGovernor, _Admission, _Engine]:
    admission, engine = _Admission(), _Engine()
    gov = SpecGovernor(app, cast(SupervisorPort, _Supervisor([inst])), cast(Admission, admission),
                       cast(EngineClient, engine))
    return gov, admission, engine


async def _window(gov: SpecGovernor, clock: FakeClock, ticks: int = 5) -> None:
    for _ in range(ticks):
        clock.advance(RULE.window_s / ticks + 1e-6)  # past the window despite float sums
        await gov.tick(RULE)


async def _switches(app: Blazar) -> list[SpecSwitched]:
    return [cast(SpecSwitched, r.event) async for r in app.log.read(types=["spec.switched"])]


async def test_saturation_turns_speculation_off_with_its_numbers_and_back_on_when_gone(app: Blazar,
                                                                                      clock: FakeClock) -> None:
    inst = _instance()
    gov, admission, engine = _governor(app, inst)
    await gov.tick(RULE)  # the first window's counters
    assert gov.request_spec(inst, None) == "on"
    admission.busy, admission.queued = 2, 3
    engine.grow(drafted=120, accepted=100)
    await _window(gov, clock)
    assert gov.request_spec(inst, None) == "off_governor"
    [off] = await _switches(app)
    assert (off.enabled, off.drafted, off.accepted, off.in_flight, off.slots) == (False, 120, 100, 5, 2)
    assert off.acceptance == pytest.approx(0.8333, abs=1e-3) and off.decode_tps == 50.0
    assert "5 requests for 2 slots" in off.reason
    admission.busy, admission.queued = 1, 0
    await _window(gov, clock)
    assert gov.request_spec(inst, None) == "on"
    assert [s.enabled for s in await _switches(app)] == [False, True]


async def test_low_acceptance_turns_it_off_and_a_reprobe_turns_it_back_on(app: Blazar, clock: FakeClock) -> None:
    inst = _instance()
    gov, _, engine = _governor(app, inst)
    await gov.tick(RULE)
    engine.grow(drafted=100, accepted=10)
    await _window(gov, clock)
    assert gov.request_spec(inst, None) == "off_governor"
    for _ in range(9):
        await _window(gov, clock)
    assert gov.request_spec(inst, None) == "off_governor"
    await _window(gov, clock)  # 10 s off: re-probed
    assert gov.request_spec(inst, None) == "on"
    reasons = [s.reason for s in await _switches(app)]
    assert "acceptance 0.10 < 0.40" in reasons[0] and "re-probe" in reasons[1]


async def test_the_client_may_turn_it_off_and_a_plain_instance_is_left_alone(app: Blazar) -> None:
    inst = _instance()
    gov, _, _ = _governor(app, inst)
    assert gov.request_spec(inst, "off") == "off_client"
    assert gov.request_spec(inst, "auto") == "on"
    assert gov.request_spec(_instance(None), "off") is None
    assert gov.request_spec(_instance(Posture(cache_type_k="q8_0")), None) is None


async def test_an_engine_that_does_not_answer_is_skipped_and_a_gone_instance_forgotten(app: Blazar,
                                                                                      clock: FakeClock) -> None:
    inst = _instance()
    gov, _, engine = _governor(app, inst)
    engine.up = False
    await _window(gov, clock)
    assert await _switches(app) == []
    assert "i-1" in gov.states()
    cast(_Supervisor, gov.supervisor).list = []
    await gov.tick(RULE)
    assert gov.states() == {}


# -- what a client asks ------------------------------------------------------------------------------------------------

class _Req:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = {k.lower(): v for k, v in headers.items()}

    def get_header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def _spec(headers: dict[str, str] | None = None, body: dict[str, Any] | None = None, dialect: str = "openai") -> Any:
    from blazar.api.request_options import request_options

    return request_options(_Req(headers or {}), body or {}, stream=False, chat=True,  # type: ignore[arg-type]
                           dialect=dialect).spec


@pytest.mark.parametrize(("headers", "body", "dialect", "spec"), [
    ({}, {}, "openai", None),
    ({"X-Blazar-Spec": "off"}, {}, "openai", "off"),
    ({"X-Blazar-Spec": "AUTO"}, {}, "anthropic", "auto"),
    ({}, {"options": {"spec": "off"}}, "ollama", "off"),
    ({}, {"options": {"spec": False}}, "ollama", "off"),
    ({}, {"options": {"spec": True}}, "ollama", "auto"),
    ({"X-Blazar-Spec": "auto"}, {"options": {"spec": "off"}}, "ollama", "auto"),  # the header wins
    ({}, {"options": {"spec": "off"}}, "openai", None),  # Ollama's options only
])
def test_spec_is_asked_by_header_or_ollama_options(headers: dict[str, str], body: dict[str, Any], dialect: str,
                                                   spec: str | None) -> None:
    assert _spec(headers, body, dialect) == spec


@pytest.mark.parametrize(("headers", "body", "dialect", "words"), [
    ({"X-Blazar-Spec": "maybe"}, {}, "openai", "X-Blazar-Spec: expected off or auto"),
    ({"X-Blazar-Spec": "false"}, {}, "openai", "X-Blazar-Spec"),
    ({}, {"options": {"spec": "fast"}}, "ollama", "options.spec: expected off, auto, false or true"),
    ({}, {"options": {"spec": 0}}, "ollama", "options.spec"),
])
def test_a_bad_spec_is_a_400_naming_where(headers: dict[str, str], body: dict[str, Any], dialect: str,
                                          words: str) -> None:
    with pytest.raises(DialectError) as e:
        _spec(headers, body, dialect)
    assert e.value.http_status == 400 and words in e.value.message


def test_ollama_options_take_spec_and_send_it_nowhere() -> None:
    assert map_options({"spec": "off", "temperature": 0}) == ({"temperature": 0}, None)


def test_the_engine_metrics_text_is_read_by_name() -> None:
    text = ("# HELP llamacpp:tokens_predicted_total Number\n# TYPE llamacpp:tokens_predicted_total counter\n"
            "llamacpp:tokens_predicted_total 64\nllamacpp:tokens_predicted_seconds_total 10.6704\n"
            "llamacpp:spec_decode_num_draft_tokens_total 60\n"
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\nbroken\n')
    assert parse_metrics(text) == {"tokens_predicted_total": 64.0, "tokens_predicted_seconds_total": 10.6704,
                                   "spec_decode_num_draft_tokens_total": 60.0}

"""A Call ends once: `finish` records the one terminal event and gives back everything the request held, whoever calls
it and however often; a single-flight hand-over moves the holdings and the end to the heir; the Request is never
changed on the way."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from blazar.adapters.energy import EnergyMeter, Nvml, Rapl
from blazar.adapters.engines.client import EngineResponse
from blazar.errors import AudioTooLong, DialectError, Refused
from blazar.events.base import Event
from blazar.events.requests import RequestCompleted, RequestEnergy
from blazar.instances.supervisor import Instance
from blazar.serving.admission import Ticket
from blazar.serving.call import Call, Completed, Failed, Rejected, outcome_of
from blazar.serving.energy import EnergyLedger
from blazar.serving.limits import Lease
from blazar.serving.patch import Patch
from blazar.serving.principal import Principal
from blazar.serving.request import Request
from blazar.serving.route import Route
from tests.support.resolved import resolved


@dataclass
class Desk:
    """Records what a call records and gives back."""

    events: list[tuple[str, Event]] = field(default_factory=list)
    given: list[str] = field(default_factory=list)
    turns: list[tuple[str, int | None]] = field(default_factory=list)  # each turn done: its trace, its slot then

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        self.events.append((trace_id, event))

    def release_slot(self, ticket: Ticket, *, tokens: int | None = None, charged: int | None = None) -> None:
        self.given.append(f"slot:{ticket.slot_id}:{tokens}:{charged}")

    def give_back_slot(self, ticket: Ticket) -> None:
        self.given.append(f"slot-unused:{ticket.slot_id}")

    def unhold(self, instance: Any) -> None:
        self.given.append(f"hold:{instance}")

    def release_lease(self, lease: Lease) -> None:
        self.given.append("lease")

    def charge_audio(self, key_name: str, seconds: float) -> None:
        pass

    def turn_done(self, call: Call, done: Completed) -> None:
        self.turns.append((call.trace_id, call.ticket.slot_id if call.ticket is not None else None))

    def charge(self, key_name: str, tokens: int) -> None:
        self.given.append(f"charge:{key_name}:{tokens}")

    def terminal(self) -> list[tuple[str, str]]:
        return [(t, e.TYPE) for t, e in self.events if e.TYPE in ("request.completed", "request.failed",
                                                                   "request.rejected")]


def ticket(slot: int) -> Ticket:
    return Ticket(key="m", position_when_queued=0, waited_s=0.0, busy_after=1, slots=2, slot_id=slot)


def keyed(name: str) -> Principal:
    from blazar.projections.keys import ApiKey

    return Principal(actor=f"key:{name}", admin=False, key=ApiKey(
        name=name, prefix="p" * 8, salt="00", hash="00", models=(), rpm=None, tpm=None, daily_tokens=None,
        max_concurrent=None, admin=False, expires_ts=None, revoked=False, created_ts=0.0))


def holding_call(desk: Desk, trace: str = "t1", body: dict[str, Any] | None = None) -> Call:
    request = Request(model="m", engine_path="/v1/chat/completions", body=body, stream=True, trace_id=trace,
                      principal=keyed("alice"), parsed={"model": "m", "messages": []})
    call = Call(request, desk)
    call.take_route(Route("m", resolved("m")))
    call.take_lease(cast(Lease, object()))  # a lease is opaque to the call
    call.admitted(ticket(1))
    call.holding(cast(Instance, "inst"))
    return call


def test_finish_records_one_terminal_event_and_gives_back_everything_once() -> None:
    desk = Desk()
    call = holding_call(desk)
    call.finish(Completed(200, {"prompt_tokens": 5, "completion_tokens": 7}))
    call.finish(Failed(499, "client_disconnected", "too late"))  # a second end: ignored
    assert desk.terminal() == [("t1", "request.completed")]
    assert sorted(desk.given) == sorted(["lease", "slot:1:7:12", "hold:inst", "charge:alice:12"])
    assert call.ended and isinstance(call.outcome, Completed)


def test_a_completed_turn_is_compared_while_its_slot_is_still_the_calls_and_an_ended_one_is_not() -> None:
    desk = Desk()
    holding_call(desk).finish(Completed(200, {"prompt_tokens": 5}))
    assert desk.turns == [("t1", 1)]  # the prefix watch reads the slot the turn ran on before it is given back
    desk = Desk()
    holding_call(desk).finish(Failed(502, "engine_error", "broke"))
    assert desk.turns == []


def test_a_failed_stream_charges_what_it_relayed_and_a_refusal_nothing() -> None:
    desk = Desk()
    holding_call(desk).finish(Failed(499, "client_disconnected", "gone", relayed_tokens=9))
    assert "charge:alice:9" in desk.given
    desk = Desk()
    holding_call(desk).finish(Rejected(429, "queue_full", "full"))
    assert not [g for g in desk.given if g.startswith("charge")]


@pytest.mark.parametrize(("exc", "expected"), [
    (Refused("full", reason="queue_full", http_status=429), Rejected(429, "queue_full", "full")),
    (Refused("broke", reason="engine_crashed", http_status=502), Failed(502, "engine_crashed", "broke")),
    # A load's own error code, which is no request reason: refused as load_failed, the code kept.
    (Refused("exited", reason="engine_exited", http_status=503),
     Rejected(503, "load_failed", "exited", observations={"code": "engine_exited"})),
    (KeyError("x"), Failed(500, "internal_error", "KeyError: 'x'")),
    # The content, read once the caller's checks passed: the caller's fault, refused with its code kept.
    (DialectError("not an image", code="invalid_image"),
     Rejected(400, "invalid_request", "not an image", observations={"code": "invalid_image"})),
    (AudioTooLong("longer than the limit of 10 s (max_audio_s)"),
     Rejected(400, "invalid_request", "longer than the limit of 10 s (max_audio_s)",
              observations={"code": "audio_too_long"})),
])
def test_what_raised_says_how_the_request_ended(exc: BaseException, expected: object) -> None:
    assert outcome_of(exc, Call(Request(model="m", engine_path="/v1/completions", body=None, stream=False),
                                Desk())) == expected


def test_a_hang_up_says_what_the_request_was_waiting_for() -> None:
    desk = Desk()
    call = Call(Request(model="m", engine_path="/v1/completions", body=None, stream=False), desk)
    hung = outcome_of(asyncio.CancelledError(), call)
    assert isinstance(hung, Failed) and hung.status == 499 and "model to load" in hung.detail
    call.take_route(Route("m", resolved("m"), instance=cast(Instance, object())))
    waiting = outcome_of(asyncio.CancelledError(), call)
    assert isinstance(waiting, Failed) and "for a slot" in waiting.detail


def test_a_generation_handed_over_ends_as_its_heirs() -> None:
    desk = Desk()
    leader = holding_call(desk, "lead")
    heir = Call(Request(model="m", engine_path="/v1/chat/completions", body=None, stream=True, trace_id="heir",
                        principal=keyed("bob")), desk)
    heir.take_lease(cast(Lease, object()))
    leader.hand_over(heir, "the leader went away")
    assert desk.terminal() == [("lead", "request.failed")]
    assert desk.given == ["lease"]  # the leader's lease only: the slot and hold are the heir's now
    leader.finish(Completed(200, {"completion_tokens": 3}))  # the relay ends the generation it started
    assert desk.terminal() == [("lead", "request.failed"), ("heir", "request.completed")]
    assert sorted(desk.given) == sorted(["lease", "lease", "slot:1:3:3", "hold:inst", "charge:bob:3"])
    completed = desk.events[-1][1]
    assert isinstance(completed, RequestCompleted) and completed.shared == "promoted"
    assert isinstance(leader.final(), Completed) and heir.ended


def test_the_request_is_never_changed_on_the_way() -> None:
    asked = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    request = Request(model="m", engine_path="/v1/chat/completions", body=dict(asked), stream=False)
    call = Call(request, Desk())
    before = call.ask.payload()
    call.ask.apply(Patch(fields={"id_slot": 1}))
    assert request.body == asked and orjson.loads(call.ask.payload())["id_slot"] == 1 and call.ask.payload() != before
    call.ask.drop_fields("id_slot")
    assert call.ask.payload() == before


async def test_a_task_that_ends_without_an_end_fails_its_call_unless_detached() -> None:
    class Upstream:
        is_closed = True

    desk = Desk()
    ended: Call | None = None

    async def serve(detach: bool) -> None:
        nonlocal ended
        ended = holding_call(desk, "d" if detach else "g")
        ended.guard(cast(EngineResponse, Upstream()))
        if detach:
            ended.detach()

    await asyncio.create_task(serve(False))
    await asyncio.sleep(0)
    assert desk.terminal() == [("g", "request.failed")]
    await asyncio.create_task(serve(True))
    await asyncio.sleep(0)
    assert desk.terminal() == [("g", "request.failed")]


def test_a_completed_request_records_its_energy_and_every_end_closes_its_span(tmp_path: Path) -> None:
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "max_energy_range_uj").write_text("1000000000\n")
    (zone / "energy_uj").write_text("0\n")
    desk, ledger = Desk(), EnergyLedger(EnergyMeter(rapl=Rapl(tmp_path), nvml=Nvml(_NoNvml())))
    refused = holding_call(desk, "t0")
    call = holding_call(desk, "t1")
    refused.energy, call.energy = ledger.begin(), ledger.begin()  # as the gateway does, at their arrival
    (zone / "energy_uj").write_text("4000000\n")  # 4 J, two requests in flight
    refused.finish(Rejected(429, "queue_full", "full"))
    call.finish(Completed(200, {"prompt_tokens": 5, "completion_tokens": 6}))
    done = next(e for _, e in desk.events if isinstance(e, RequestCompleted))
    assert done.energy == RequestEnergy(source="rapl", joules=2.0, machine_joules=4.0, tokens_per_joule=3.0,
                                        overlapped=2)
    assert ledger.begin().end(0).overlapped == 1  # both spans closed: the next runs alone
    unmeasured = Desk()
    quiet = holding_call(unmeasured)
    quiet.energy = EnergyLedger().begin()
    quiet.finish(Completed(200, {"completion_tokens": 1}))
    assert next(e for _, e in unmeasured.events if isinstance(e, RequestCompleted)).energy == RequestEnergy(
        source="not_measured")


class _NoNvml:
    def nvmlInit(self) -> None:
        raise RuntimeError("no NVIDIA driver")


def test_a_speech_call_ended_early_charges_the_audio_it_made_and_records_it_and_one_without_none() -> None:
    from blazar.serving.request import AudioAsked

    class AudioDesk(Desk):
        def charge_audio(self, key_name: str, seconds: float) -> None:
            self.given.append(f"audio:{key_name}:{seconds}")

    for relayed, charged in ((2.5, ["audio:alice:2.5"]), (None, [])):
        desk = AudioDesk()
        call = holding_call(desk)
        call.request = replace(call.request, audio=AudioAsked(route="speech", response_format="pcm"))
        call.finish(Failed(499, "client_disconnected", "cancelled", relayed_audio_s=relayed))
        assert [g for g in desk.given if g.startswith("audio")] == charged
        types = [e.TYPE for _, e in desk.events]
        assert types[-1] == "request.failed"
        assert ("request.audio" in types) is (relayed is not None)

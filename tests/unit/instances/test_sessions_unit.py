"""Sessions and the KV bank, by their decisions and events: the sessions projection fed events; which slot a
request takes (SessionSlots); and KvBank's placement, saves and bound against a fake engine that answers llama-server's
slot actions, in a real Blazar home."""

from __future__ import annotations

import pytest

from blazar.context import Blazar
from blazar.errors import EngineUnreachable
from blazar.events.requests import RequestPlaced
from blazar.events.sessions import SessionDropped, SessionRemoved, SessionRestored, SessionSaved
from blazar.instances.kv_bank import KvBank, bank_file_name
from blazar.instances.session_slots import SessionSlots
from blazar.projections.base import fold
from blazar.projections.sessions import (
    SessionsProjection,
    bank_entries,
    bank_entry,
    session_row,
)
from blazar.store.models import slot_dir
from tests.support.events import rec
from tests.support.kv_bank import IDENT, FakeSlotsEngine, instance


def saved(session: str, model: str = "gemma", nbytes: int = 100, tokens: int = 50) -> SessionSaved:
    return SessionSaved(session=session, model=model, instance_id="i1", slot_id=0, file=f"slots/{model}/{session}",
                        bytes=nbytes, tokens=tokens, duration_ms=3.0, identity=IDENT, reason="evicted")


def placed(session: str, kv: str, restored: int | None = None) -> RequestPlaced:
    return RequestPlaced(trace_id="t" * 32, model="gemma", instance_id="i1", slot_id=1, session=session,
                         kv=kv, reason="because", restored_tokens=restored)  # type: ignore[arg-type]


# -- the projection ----------------------------------------------------------------------------------------------------

def test_the_projection_counts_turns_by_how_they_found_the_prefix() -> None:
    state = fold(SessionsProjection(), [rec(1, placed("a", "cold")), rec(2, placed("a", "warm")),
                                        rec(3, placed("a", "restored", restored=700))])
    row = session_row(state, "a")
    assert row is not None
    assert (row.turns, row.cold, row.warm, row.restored, row.restored_tokens) == (3, 1, 1, 1, 700)
    assert (row.first_ts, row.last_ts, row.last_kv, row.instance_id, row.slot_id) == (1001.0, 1003.0, "restored",
                                                                                      "i1", 1)


def test_a_newer_save_replaces_the_older_and_the_bank_size_follows_saves_drops_and_removals() -> None:
    p = SessionsProjection()
    state = fold(p, [rec(1, saved("a", nbytes=100)), rec(2, saved("b", nbytes=30)), rec(3, saved("a", nbytes=70)),
                     rec(4, saved("a", model="qwen", nbytes=5))])
    assert state.bank_bytes == 105
    assert [(e.session, e.model, e.bytes) for e in bank_entries(state)] == [("b", "gemma", 30), ("a", "gemma", 70),
                                                                            ("a", "qwen", 5)]
    entry = bank_entry(state, "a", "gemma")
    assert entry is not None and entry.identity == IDENT and entry.saved_ts == 1003.0
    state = fold(p, [rec(5, SessionDropped(session="b", model="gemma", file="f", bytes=30, reason="bank_full"))],
                 state)
    assert state.bank_bytes == 75 and bank_entry(state, "b", "gemma") is None
    state = fold(p, [rec(6, SessionRemoved(session="a", files=["x", "y"], bytes=75))], state)
    assert state.bank_bytes == 0 and bank_entries(state) == [] and session_row(state, "a") is None
    assert (state.saves, state.drops) == (4, 1)


def test_a_session_expires_a_day_after_its_last_turn_unless_the_bank_holds_it() -> None:
    from blazar.projections.sessions import EXPIRE_S, SWEEP_S

    p = SessionsProjection()
    later = 1000.0 + EXPIRE_S + SWEEP_S  # a day after the first turns, and in a later hour (the sweep's)
    first = [rec(1, placed("old", "cold"), ts=1000.0), rec(2, placed("kept", "cold"), ts=1000.0),
             rec(3, saved("kept"), ts=1001.0), rec(4, placed("busy", "cold"), ts=1000.0)]
    state = fold(p, first)
    assert set(state.sessions) == {"old", "kept", "busy"}
    # The first event of a later hour: the idle session with nothing saved is forgotten; a saved one stays, and so
    # does one with a turn since.
    then = [rec(5, placed("busy", "warm"), ts=later)]
    state = fold(p, then, state)
    assert session_row(state, "old") is None
    assert session_row(state, "kept") is not None and session_row(state, "busy") is not None
    # Once its save is dropped, the saved one goes too; replaying the whole log gives the same state.
    last = [rec(6, SessionDropped(session="kept", model="gemma", file="f", bytes=100, reason="bank_full"),
                ts=later + 1)]
    state = fold(p, last, state)
    assert session_row(state, "kept") is None and session_row(state, "busy") is not None
    assert fold(p, first + then + last) == state


def test_a_restore_by_command_moves_the_session_to_its_slot() -> None:
    state = fold(SessionsProjection(), [rec(1, SessionRestored(session="a", model="gemma", instance_id="i9",
                                                               slot_id=2, tokens=500, duration_ms=4.0))])
    row = session_row(state, "a")
    assert row is not None and (row.instance_id, row.slot_id, row.restored_tokens, row.turns) == ("i9", 2, 500, 0)


# -- which slot --------------------------------------------------------------------------------------------------------

class Tick:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_no_session_no_picker_the_engine_chooses() -> None:
    assert SessionSlots().picker("i1", None) is None


def test_a_session_goes_back_to_its_slot_when_it_is_free() -> None:
    slots = SessionSlots(Tick())
    slots.place("i1", 2, "a")
    pick = slots.picker("i1", "a")
    assert pick is not None and pick(frozenset({0, 1, 2})) == 2
    assert slots.owner("i1", 2) == "a" and slots.where("a") == ("i1", 2) and slots.explicit("i1")


def test_other_requests_take_an_unheld_slot_then_the_least_recently_used_session_slot() -> None:
    slots = SessionSlots(Tick())
    slots.place("i1", 0, "a")
    slots.place("i1", 1, "b")
    slots.place("i1", 2, None)
    pick = slots.picker("i1", None)
    assert pick is not None and pick(frozenset({0, 1, 2})) == 2  # nobody's prefix
    assert pick(frozenset({0, 1})) == 0  # a's turn is older than b's
    slots.place("i1", 0, None)  # a loses its slot to another request
    assert slots.where("a") is None and slots.lost("a") == ("i1", 0) and slots.owned("i1") == [(1, "b")]


def test_a_session_that_moves_leaves_its_old_slot_unheld() -> None:
    slots = SessionSlots(Tick())
    slots.place("i1", 0, "a")
    slots.place("i1", 1, "a")  # slot 0 was busy: the session's newest prefix is in slot 1
    assert slots.owner("i1", 0) is None and slots.where("a") == ("i1", 1)


def test_forgetting_an_instance_or_a_session_clears_their_slots() -> None:
    slots = SessionSlots(Tick())
    slots.place("i1", 0, "a")
    slots.place("i2", 0, "b")
    slots.forget("i1")
    assert slots.where("a") is None and slots.owned("i1") == [] and slots.last_session_use("i1") is None
    slots.forget_session("b")
    assert slots.owner("i2", 0) is None and not slots.explicit("i2")


# -- KvBank against a fake engine --------------------------------------------------------------------------------------

@pytest.fixture
def engine(app: Blazar) -> FakeSlotsEngine:
    return FakeSlotsEngine(slot_dir(app.paths.data_dir, "gemma"))


@pytest.fixture
def bank(app: Blazar, engine: FakeSlotsEngine) -> KvBank:
    return KvBank(app, engine)  # type: ignore[arg-type]


async def test_an_evicted_instance_saves_each_session_slot_with_its_identity(app: Blazar, bank: KvBank,
                                                                            engine: FakeSlotsEngine) -> None:
    inst = instance()
    assert (await bank.place(inst, 0, "a")).kv == "cold"
    await bank.place(inst, 1, None)
    recs = await bank.save_instance(inst, "evicted")
    assert [r.type for r in recs] == ["session.saved"]
    ev = recs[0].event
    assert isinstance(ev, SessionSaved)
    assert (ev.session, ev.slot_id, ev.tokens, ev.bytes, ev.identity) == ("a", 0, 800, 4096, IDENT)
    assert ev.file == f"slots/gemma/{bank_file_name('a')}"
    assert engine.calls == [(0, "save", bank_file_name("a"))]


async def test_the_next_turn_on_a_new_instance_restores_when_the_identity_matches(app: Blazar, bank: KvBank,
                                                                                   engine: FakeSlotsEngine) -> None:
    await bank.place(instance("i1"), 0, "a")
    await bank.save_instance(instance("i1"), "stopped")
    bank.forget("i1")
    got = await bank.place(instance("i2"), 1, "a")
    assert (got.kv, got.restored_tokens, got.explicit) == ("restored", 800, True)
    assert engine.calls[-1] == (1, "restore", bank_file_name("a"))
    again = await bank.place(instance("i2"), 1, "a")
    assert again.kv == "warm"


async def test_a_save_of_another_shape_is_refused_and_the_turn_runs_cold(app: Blazar, bank: KvBank,
                                                                         engine: FakeSlotsEngine) -> None:
    await bank.place(instance("i1"), 0, "a")
    await bank.save_instance(instance("i1"), "stopped")
    bank.forget("i1")
    other = IDENT.model_copy(update={"ctx_tokens": 2048})
    got = await bank.place(instance("i2", identity=other), 0, "a")
    assert got.kv == "cold" and "ctx_tokens 4096 there, 2048 here" in got.reason
    assert [c[1] for c in engine.calls] == ["save"]  # no restore was tried


async def test_a_missing_bank_file_drops_its_entry(app: Blazar, bank: KvBank) -> None:
    await bank.place(instance("i1"), 0, "a")
    (recorded,) = await bank.save_instance(instance("i1"), "stopped")
    bank.forget("i1")
    (app.paths.data_dir / recorded.event.file).unlink()  # type: ignore[attr-defined]
    got = await bank.place(instance("i2"), 0, "a")
    assert got.kv == "cold" and "is gone" in got.reason
    assert bank_entry(app.runner.state("sessions"), "a", "gemma") is None


async def test_saves_that_cannot_help_or_fail_are_recorded_not_kept(app: Blazar, bank: KvBank,
                                                                    engine: FakeSlotsEngine) -> None:
    inst = instance(restorable=False)
    await bank.place(inst, 0, "a")
    (r,) = await bank.save_instance(inst, "evicted")
    assert (r.type, r.event.reason) == ("session.save_failed", "no_full_window")  # type: ignore[attr-defined]

    await bank.place(instance("i2"), 0, "b")
    engine.fail = EngineUnreachable("no answer")
    engine.fail.__cause__ = TimeoutError()
    (r,) = await bank.save_instance(instance("i2"), "evicted")
    assert r.event.reason == "timeout"  # type: ignore[attr-defined]

    engine.fail, engine.status = None, 400
    (r,) = await bank.save_instance(instance("i2"), "evicted")
    assert (r.event.reason, r.event.detail) == ("engine_error", "400: slot busy")  # type: ignore[attr-defined]

    engine.status, engine.size = 200, 3 << 20
    await _set(app, "session_save_max_mib", "2")
    (r,) = await bank.save_instance(instance("i2"), "evicted")
    assert r.event.reason == "too_large"  # type: ignore[attr-defined]
    assert not (slot_dir(app.paths.data_dir, "gemma") / bank_file_name("b")).exists()


async def test_the_bank_drops_the_oldest_saves_past_its_bound(app: Blazar, bank: KvBank,
                                                              engine: FakeSlotsEngine) -> None:
    await _set(app, "session_bank_mib", "2")
    engine.size = 900 << 10  # 0.88 MiB each: two fit in 2 MiB, three do not
    for i, name in enumerate(("a", "b", "c")):
        await bank.place(instance(f"i{i}"), 0, name)
        recs = await bank.save_instance(instance(f"i{i}"), "evicted")
    assert [r.type for r in recs] == ["session.saved", "session.dropped"]
    dropped = recs[1].event
    assert isinstance(dropped, SessionDropped) and (dropped.session, dropped.reason) == ("a", "bank_full")
    assert not (app.paths.data_dir / dropped.file).exists()
    assert app.runner.state("sessions").bank_bytes <= 2 << 20


async def test_a_bank_of_zero_saves_nothing(app: Blazar, bank: KvBank, engine: FakeSlotsEngine) -> None:
    await _set(app, "session_bank_mib", "0")
    await bank.place(instance(), 0, "a")
    assert await bank.save_instance(instance(), "shutdown") == [] and engine.calls == []


async def _set(app: Blazar, key: str, value: str) -> None:
    from blazar.operations.config import set_value

    await set_value(app, key, value)

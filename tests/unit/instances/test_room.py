"""The RoomMaker carries the placement decisions out: it evicts the victims and decides again in the room they left,
records a refusal before raising it, probes the RPC workers only when the decision turns on them, and lets the same
model's other shapes give way (or refuses for a pinned one). The real app, log and planner; a stopper that only
records what it was told to stop (the real one is tests/integration/test_supervisor.py's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from blazar.context import Blazar
from blazar.errors import DoesNotFit, ModelPinned
from blazar.fit import FitRequest, plan
from blazar.instances import room as room_module
from blazar.instances.budget import Resident, budget_devices
from blazar.instances.live import Instance, Live, LiveSet, LoadReport, ResolvedModel
from blazar.instances.room import RoomMaker
from blazar.instances.stopping import Stopper
from blazar.operations.config import set_value
from blazar.store.engines import ActiveEngine
from tests.support.fit_models import GiB, MiB, gemma3_270m, host

META = gemma3_270m()
MODEL = ResolvedModel(name="gemma", path=Path("/store/gemma.gguf"), metadata=META)


class RecordingStopper:
    """Stops nothing: notes each eviction, fills the report as the real one does, and forgets the child."""

    def __init__(self, live: LiveSet) -> None:
        self.live = live
        self.evicted: list[tuple[str, str, dict[str, Any]]] = []

    async def evict(self, lv: Live, reason: str, *, for_model: str | None = None,
                    observations: dict[str, Any] | None = None, report: LoadReport | None = None) -> None:
        self.evicted.append((lv.instance.instance_id, reason, observations or {}))
        if report is not None:
            report.evicted.append(cast(Any, lv.instance.instance_id))
        self.live.drop(lv)


def live(iid: str, *, model: str = "other", ctx: int = 4096, last_used: float = 0.0, pinned: bool = False,
         in_flight: int = 0, embeddings: bool = False, rerank: bool = False) -> Live:
    """A ready child of `model` planned at `ctx` tokens (about 353 MiB at 4096 for Gemma 3 270M)."""
    fit = plan(META, [host(20 * GiB, 24 * GiB)], FitRequest(ctx=ctx))
    inst = Instance(instance_id=iid, model=model, port=1, slots=1, ctx_tokens=ctx, engine_tag="t", load_ms=2000,
                    embeddings=embeddings, rerank=rerank)
    return Live(instance=inst, proc=cast(Any, None), plan=fit, log_path=Path("/nowhere"), started_seq=0,
                started_mono=0.0, keep_alive_s=300.0, pinned=pinned, state="ready", in_flight=in_flight,
                last_used=last_used)


@pytest.fixture
def world(app: Blazar) -> tuple[RoomMaker, LiveSet, RecordingStopper]:
    children = LiveSet()
    stopper = RecordingStopper(children)
    return RoomMaker(app, children, cast(Stopper, stopper), lambda: [host(20 * GiB, 24 * GiB)]), children, stopper


async def _events(app: Blazar, kind: str) -> list[Any]:
    return [r.event async for r in app.log.read(types=[kind])]


async def test_the_victims_go_and_the_plan_is_made_in_the_room_they_left(
        app: Blazar, world: tuple[RoomMaker, LiveSet, RecordingStopper], clock: Any) -> None:
    room, children, stopper = world
    await set_value(app, "fit.memory_limit_mib", "1000")
    now = clock.now()
    children.add(live("recent", last_used=now - 5))
    children.add(live("old", last_used=now - 600))
    report = LoadReport()
    start = await room.make_room(MODEL, None, app.settings(), report)
    assert [(iid, reason) for iid, reason, _ in stopper.evicted] == [("old", "memory")]
    assert stopper.evicted[0][2]["need_bytes"] > 0 and "old" in stopper.evicted[0][2]["why"]
    assert report.evicted == ["old"] and [lv.instance.instance_id for lv in children] == ["recent"]
    # Planned again after the eviction: in what "recent" leaves of the limit, not in what both left.
    recent = children.get("recent")
    assert recent is not None and start.via == "here" and start.fit.fits
    (budget,) = budget_devices([host(20 * GiB, 24 * GiB)], [Resident("recent", recent.charged_bytes(None))],
                               memory_limit_bytes=1000 * MiB)
    assert start.host_free_bytes == budget.free_bytes


async def test_a_refusal_is_recorded_then_raised(app: Blazar,
                                                 world: tuple[RoomMaker, LiveSet, RecordingStopper]) -> None:
    room, _, stopper = world
    await set_value(app, "fit.memory_limit_mib", "330")
    with pytest.raises(DoesNotFit, match="does not fit") as raised:
        await room.make_room(MODEL, 4096, app.settings())
    (refused,) = await _events(app, "instance.load_refused")
    assert refused.reason == "does_not_fit" and refused.model == "gemma" and refused.detail == raised.value.message
    assert refused.observations["need_bytes"] > 0 and stopper.evicted == []


async def test_a_load_that_may_not_evict_evicts_nothing_and_its_refusal_names_what_it_would_have(
        app: Blazar, world: tuple[RoomMaker, LiveSet, RecordingStopper], clock: Any) -> None:
    room, children, stopper = world
    await set_value(app, "fit.memory_limit_mib", "1000")
    children.add(live("first", model="preloaded", last_used=clock.now() - 600))
    children.add(live("second", model="asked", last_used=clock.now() - 5))
    with pytest.raises(DoesNotFit, match="a preload never evicts"):
        await room.make_room(MODEL, None, app.settings(), may_evict=False)
    assert stopper.evicted == [] and len(children) == 2
    (refused,) = await _events(app, "instance.load_refused")
    assert refused.reason == "does_not_fit" and refused.observations["would_evict"] == ["first"]


async def test_workers_are_probed_only_when_the_decision_turns_on_them(
        app: Blazar, world: tuple[RoomMaker, LiveSet, RecordingStopper], monkeypatch: pytest.MonkeyPatch) -> None:
    room, _, _ = world
    probes: list[set[str]] = []

    async def idle_workers(_app: Blazar, busy: set[str]) -> list[tuple[str, int]]:
        probes.append(busy)
        return [("127.0.0.1:50061", 300 * MiB), ("127.0.0.1:50062", 300 * MiB)]

    monkeypatch.setattr(room_module, "idle_workers", idle_workers)
    monkeypatch.setattr(room_module, "rpc_capable", lambda _engine: True)
    engine = cast(ActiveEngine, object())
    await set_value(app, "fit.memory_limit_mib", "1000")
    here = await room.make_room(MODEL, None, app.settings(), engine=engine)
    assert here.via == "here" and probes == []  # it fits: no worker was asked
    await set_value(app, "fit.memory_limit_mib", "300")
    spread = await room.make_room(MODEL, None, app.settings(), engine=engine)
    assert spread.via == "workers" and probes == [set()]
    assert {u.name for u in spread.fit.devices if u.kind == "rpc" and u.offloaded} == {"127.0.0.1:50061",
                                                                                        "127.0.0.1:50062"}


async def test_a_smaller_shape_of_the_model_gives_way_and_a_pinned_one_refuses(
        app: Blazar, world: tuple[RoomMaker, LiveSet, RecordingStopper]) -> None:
    room, children, stopper = world
    children.add(live("small", model="gemma", ctx=512))
    children.add(live("busy", model="gemma", ctx=512, in_flight=1))
    await room.reshape("gemma", 1024, False, None)
    assert stopper.evicted == [("small", "reshape", {"ctx_wanted": 1024, "ctx_had": 512, "embeddings_wanted": False})]
    children.add(live("pinned", model="gemma", ctx=1024, pinned=True))
    with pytest.raises(ModelPinned, match="blazar load gemma --unpin"):
        await room.reshape("gemma", 2048, False, None)
    (refused,) = await _events(app, "instance.load_refused")
    assert refused.reason == "no_room" and refused.observations["pinned"] == "pinned"


async def test_an_embeddings_load_takes_over_the_chat_instance_it_replaces_at_its_context(
        world: tuple[RoomMaker, LiveSet, RecordingStopper]) -> None:
    """The churn a client alternating chat at a large num_ctx with embeddings caused: the new instance keeps the
    context of the one that gave way, and serves both from then on (LiveSet.ready_for finds it for each)."""
    room, children, stopper = world
    children.add(live("chat", model="gemma", ctx=4096))
    children.add(live("ranker", model="gemma", ctx=512, rerank=True))
    assert await room.reshape("gemma", None, True, None) == (4096, True)
    assert [e[0] for e in stopper.evicted] == ["chat"]  # the rerank instance is another mode: it stays
    children.add(live("both", model="gemma", ctx=4096, embeddings=True))
    assert children.ready_for("gemma", None, embeddings=True).instance.instance_id == "both"
    assert children.ready_for("gemma", 4096).instance.instance_id == "both"
    assert children.ready_for("gemma", 8192) is None


async def test_rerank_requests_are_served_by_a_rerank_instance_only_and_nothing_else_by_one(
        world: tuple[RoomMaker, LiveSet, RecordingStopper]) -> None:
    room, children, stopper = world
    children.add(live("ranker", model="gemma", ctx=4096, rerank=True))
    assert children.ready_for("gemma", None) is None
    assert children.ready_for("gemma", None, embeddings=True) is None
    assert children.ready_for("gemma", None, rerank=True).instance.instance_id == "ranker"
    children.add(live("chat", model="gemma", ctx=4096, embeddings=True))
    assert children.ready_for("gemma", None, rerank=True).instance.instance_id == "ranker"
    assert children.ready_for("gemma", 2048).instance.instance_id == "chat"
    # A rerank load at a larger context: the smaller rerank instance gives way, the chat one stays, nothing carried.
    assert await room.reshape("gemma", 8192, False, None, rerank=True) == (8192, False)
    assert [e[0] for e in stopper.evicted] == ["ranker"]

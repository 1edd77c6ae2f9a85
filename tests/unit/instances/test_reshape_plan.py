"""Adaptive slots' plan (blazar/instances/reshape.py, RoomMaker.plan_slots): the load decider at the new -np, the
instance's own memory counted as free, nothing else evicted. The real app and planner; a ready child that is only a
record (nothing runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from blazar.context import Blazar
from blazar.fit import FitRequest, plan
from blazar.instances.live import Instance, Live, LiveSet, ResolvedModel
from blazar.instances.reshape import Reshaper
from blazar.instances.room import RoomMaker
from blazar.instances.stopping import Stopper
from blazar.instances.supervisor import Supervisor
from blazar.operations.config import set_value
from tests.support.fit_models import GiB, MiB, gemma3_270m, host

META = gemma3_270m()
MODEL = ResolvedModel(name="gemma", path=Path("/store/gemma.gguf"), metadata=META)
CTX = 2048


def _live(iid: str, model: str, slots: int = 1, *, pinned: bool = False, last_used: float = 0.0) -> Live:
    fit = plan(META, [host(20 * GiB, 24 * GiB)], FitRequest(ctx=CTX, slots=slots))
    inst = Instance(instance_id=iid, model=model, port=1, slots=slots, ctx_tokens=CTX, engine_tag="t")
    return Live(instance=inst, proc=cast(Any, None), plan=fit, log_path=Path("/nowhere"), started_seq=0,
                started_mono=0.0, keep_alive_s=300.0, pinned=pinned, state="ready", last_used=last_used)


class _Supervisor:
    """What the Reshaper reads of the supervisor: the app, the children, the room, the store's model."""

    def __init__(self, app: Blazar) -> None:
        self.app = app
        self.live = LiveSet()
        self.room = RoomMaker(app, self.live, cast(Stopper, None), lambda: [host(20 * GiB, 24 * GiB)])

    def resolve(self, model: str) -> ResolvedModel:
        return MODEL


def _bytes(slots: int) -> int:
    return plan(META, [host(20 * GiB, 24 * GiB)], FitRequest(ctx=CTX, slots=slots)).local_bytes


async def test_the_grown_shape_is_planned_with_the_instance_own_memory_counted_free(app: Blazar) -> None:
    # Room for the eight-slot shape alone, not for it beside the one-slot one it replaces.
    await set_value(app, "fit.memory_limit_mib", str((_bytes(8) + _bytes(1) // 2) // MiB))
    sup = _Supervisor(app)
    sup.live.add(_live("g", "gemma"))
    got = await Reshaper(cast(Supervisor, sup)).plan("g", 8)
    assert got is not None and got.fits, got
    assert got.planned_bytes > got.had_bytes == sup.live.by_id["g"].plan.local_bytes
    assert got.host_free_bytes >= got.planned_bytes


async def test_a_shape_that_does_not_fit_is_refused_with_the_plans_summary(app: Blazar) -> None:
    await set_value(app, "fit.memory_limit_mib", str(_bytes(2) // MiB + 1))
    sup = _Supervisor(app)
    sup.live.add(_live("g", "gemma"))
    got = await Reshaper(cast(Supervisor, sup)).plan("g", 8)
    assert got is not None and not got.fits and got.detail
    assert got.planned_bytes > 0


async def test_a_shape_that_fits_only_by_evicting_another_model_is_not_taken(app: Blazar, clock: Any) -> None:
    await set_value(app, "fit.memory_limit_mib", str((_bytes(8) + _bytes(1) // 2) // MiB))
    sup = _Supervisor(app)
    sup.live.add(_live("g", "gemma"))
    sup.live.add(_live("o", "other", last_used=clock.now() - 600))  # idle: the load decider would evict it
    got = await Reshaper(cast(Supervisor, sup)).plan("g", 8)
    assert got is not None and not got.fits and "evicted" in got.detail


async def test_a_pinned_or_gone_instance_is_not_planned(app: Blazar) -> None:
    sup = _Supervisor(app)
    sup.live.add(_live("p", "gemma", pinned=True))
    pinned = await Reshaper(cast(Supervisor, sup)).plan("p", 4)
    assert pinned is not None and not pinned.fits and "pinned" in pinned.detail
    assert await Reshaper(cast(Supervisor, sup)).plan("gone", 4) is None

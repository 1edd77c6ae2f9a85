"""The preload list (blazar/instances/preload.py): every entry loaded in the list's order through the supervisor's own
load (reason `preload`), each outcome one `instance.preload_finished` (ready, refused, not_found, failed), and nothing
an entry meets stops the ones after it. The real app and log; a loader that answers as the supervisor would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from blazar.context import Blazar
from blazar.errors import DoesNotFit, LoadFailed, ModelNotFound
from blazar.events.instances import InstancePreloadFinished
from blazar.instances.live import Instance, ResolvedModel
from blazar.instances.preload import preload
from blazar.operations.config import set_value
from tests.support.bounds import HANG_S
from tests.support.fit_models import gemma3_270m


class Loader:
    """Resolves and loads as told: `answers` maps a name to an exception to raise (else it loads)."""

    def __init__(self, answers: dict[str, BaseException]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str]] = []

    def resolve(self, model: str) -> ResolvedModel:
        if isinstance(self.answers.get(model), ModelNotFound):
            raise self.answers[model]
        return ResolvedModel(name=model, path=Path(f"/store/{model}.gguf"), metadata=gemma3_270m())

    async def ensure(self, model: ResolvedModel, *, reason: str = "request") -> Instance:
        self.asked.append((model.name, reason))
        if (exc := self.answers.get(model.name)) is not None:
            raise exc
        return Instance(instance_id=f"i-{model.name}", model=model.name, port=1, slots=1, ctx_tokens=4096,
                        engine_tag="t")


async def _finished(app: Blazar) -> list[Any]:
    return [r.event async for r in app.log.read(types=[InstancePreloadFinished.TYPE])]


async def test_each_entry_is_loaded_in_order_and_each_outcome_recorded_whatever_the_one_before_met(app: Blazar) -> None:
    await set_value(app, "engine.preload", "first, nowhere, second, big, broken, buggy")
    loader = Loader({"nowhere": ModelNotFound("no model named 'nowhere' in the store"),
                     "big": DoesNotFit("it would evict first (i-first) (max_loaded_models 1), and a preload never "
                                       "evicts"),
                     "broken": LoadFailed("the child exited with code 1 while loading"),
                     "buggy": RuntimeError("a bug")})
    await preload(app, loader)
    assert loader.asked == [("first", "preload"), ("second", "preload"), ("big", "preload"), ("broken", "preload"),
                            ("buggy", "preload")]
    got = [(e.position, e.model, e.outcome, e.instance_id, e.reason) for e in await _finished(app)]
    assert got == [(0, "first", "ready", "i-first", ""), (1, "nowhere", "not_found", None, "model_not_found"),
                   (2, "second", "ready", "i-second", ""), (3, "big", "refused", None, "insufficient_memory"),
                   (4, "broken", "failed", None, "load_failed"), (5, "buggy", "failed", None, "internal_error")]
    big = (await _finished(app))[3]
    assert big.detail.endswith("a preload never evicts")


async def test_no_list_loads_nothing_and_records_nothing(app: Blazar) -> None:
    loader = Loader({})
    assert await preload(app, loader) == [] and loader.asked == [] and await _finished(app) == []


async def test_a_daemon_stopping_mid_preload_records_no_outcome_for_the_load_it_cut(app: Blazar) -> None:
    await set_value(app, "engine.preload", "slow")
    started = asyncio.Event()

    class Slow(Loader):
        async def ensure(self, model: ResolvedModel, *, reason: str = "request") -> Instance:
            started.set()
            await asyncio.Event().wait()  # a load that never ends
            raise AssertionError("unreachable")

    task = asyncio.create_task(preload(app, Slow({})))
    await asyncio.wait_for(started.wait(), HANG_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _finished(app) == []


@pytest.mark.parametrize(("value", "error"), [
    ("a, a", "named twice: a"),
    (",".join(f"m{i}" for i in range(17)), "at most 16 models"),
])
async def test_a_bad_preload_list_is_refused_with_what_is_wrong(app: Blazar, value: str, error: str) -> None:
    from blazar.errors import ConfigError

    with pytest.raises(ConfigError, match=error):
        await set_value(app, "engine.preload", value)

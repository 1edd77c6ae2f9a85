"""Preload: the `engine.preload` list, loaded when the daemon starts (blazar/daemon.py), after reconciliation, one model
at a time in the list's order, each through the supervisor's own load with reason `preload`, which never evicts
(instances/load_decision.py: where room would need a victim, the load is refused). Each entry's outcome is one
`instance.preload_finished`: ready, refused (after the `instance.load_refused` that says why), not_found or failed.
Nothing a preload meets stops the daemon: the next entry is tried, and the daemon serves meanwhile (a request for a
model being preloaded waits for that same load, as it would for any load in progress).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from blazar.context import Blazar
from blazar.errors import (
    BlazarError,
    CircuitOpen,
    DoesNotFit,
    EngineExtraMissing,
    EngineIncompatible,
    EngineVerifyFailed,
    ModelNotFound,
    NoEngine,
)
from blazar.events.instances import InstancePreloadFinished, PreloadOutcome
from blazar.instances.live import Instance, ResolvedModel

log = logging.getLogger("blazar.supervisor")

# What a load refuses with before any child starts (instance.load_refused recorded): the rest failed on the way.
_REFUSALS = (DoesNotFit, CircuitOpen, NoEngine, EngineIncompatible, EngineVerifyFailed, EngineExtraMissing)


class Loader(Protocol):
    """The supervisor, as a preload uses it."""

    def resolve(self, model: str) -> ResolvedModel: ...
    async def ensure(self, model: ResolvedModel, *, reason: str = "request") -> Instance: ...


async def preload(app: Blazar, loader: Loader) -> list[InstancePreloadFinished]:
    """Load every model the `engine.preload` setting names, in order; returns the outcomes recorded."""
    names = app.settings().engine.preload
    if names:
        log.info("preloading %s", ", ".join(names))
    return [await preload_one(app, loader, position, name) for position, name in enumerate(names)]


async def preload_one(app: Blazar, loader: Loader, position: int, name: str) -> InstancePreloadFinished:
    """One entry: loaded (or found loaded) and recorded, whatever happened to it."""
    outcome: PreloadOutcome = "ready"
    instance_id, reason, detail = None, "", ""
    try:
        instance_id = (await loader.ensure(loader.resolve(name), reason="preload")).instance_id
    except asyncio.CancelledError:
        raise
    except ModelNotFound as e:
        outcome, reason, detail = "not_found", e.code, e.message
    except _REFUSALS as e:
        outcome, reason, detail = "refused", e.code, e.message
    except BlazarError as e:
        outcome, reason, detail = "failed", e.code, e.message
    except Exception as e:  # a bug of ours in one load: said, and the daemon goes on with the next
        log.exception("preloading %s", name)
        outcome, reason, detail = "failed", "internal_error", f"{type(e).__name__}: {e}"
    event = InstancePreloadFinished(model=name, position=position, outcome=outcome, instance_id=instance_id,
                                    reason=reason, detail=detail)
    await app.record(event)
    if outcome != "ready":
        log.warning("preload of %s: %s (%s)", name, outcome, detail)
    return event

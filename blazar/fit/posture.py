"""A tuned posture (blazar/events/tuning.py) as the fit sees it: the fields that shape memory (cache types, flash
attention, batch sizes, slots) pinned in the fit request. Pure; speculation and threads go to the argv instead
(blazar/adapters/engines/posture.py)."""

from __future__ import annotations

from blazar.events.tuning import Posture
from blazar.fit.planner import FitRequest


def with_posture(request: FitRequest, posture: Posture | None) -> FitRequest:
    """`request` with what `posture` pins; a field the posture leaves None keeps the request's own."""
    if posture is None or posture.is_default():
        return request
    pinned: dict[str, object] = {}
    if posture.cache_type_k is not None or posture.cache_type_v is not None:
        pinned["cache_type_k"] = posture.cache_type_k or "f16"
        pinned["cache_type_v"] = posture.cache_type_v or "f16"
    if posture.flash_attn is not None:
        pinned["flash_attn"] = posture.flash_attn
    if posture.n_batch is not None:
        pinned["n_batch"] = posture.n_batch
    if posture.n_ubatch is not None:
        pinned["n_ubatch"] = posture.n_ubatch
    if posture.slots is not None:
        pinned["slots"] = posture.slots
    return request.model_copy(update=pinned) if pinned else request

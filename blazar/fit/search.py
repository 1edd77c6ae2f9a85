"""Searches over the shapes of one model on one device set: largest context, most slots, most GPU layers.

Every search relies on monotonicity: more context, more slots or a wider cache type never uses less memory, and
more GPU layers never uses more host memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from blazar.events.models import ModelMetadata
from blazar.fit.devices import Device, gpus_of
from blazar.fit.kv import CTX_PAD, LayerGeom
from blazar.fit.layout import DeviceUse, Shape, price
from blazar.fit.projector import ProjectorCost

Types = tuple[str, str]


class Pricer:
    """Prices shapes that differ from `base` only in ctx per slot, slots, cache types and GPU layers."""

    def __init__(
        self, meta: ModelMetadata, geom: list[LayerGeom], devices: list[Device], base: Shape, correction: int,
        projector: ProjectorCost | None = None, projector_on_gpu: bool = True,
    ) -> None:
        self.meta, self.geom, self.devices, self.base, self.correction = meta, geom, devices, base, correction
        self.projector, self.projector_on_gpu = projector, projector_on_gpu
        self.has_gpu = bool(gpus_of(devices))
        self.full_layers = meta.block_count + 1

    def shape(self, ctx: int, slots: int, types: Types, gpu_layers: int) -> Shape:
        return replace(self.base, ctx_arg=ctx * slots, slots=slots, cache_type_k=types[0], cache_type_v=types[1],
                       gpu_layers=gpu_layers)

    def uses(self, ctx: int, slots: int, types: Types, g: int) -> list[DeviceUse]:
        return price(self.meta, self.geom, self.devices, self.shape(ctx, slots, types, g), self.correction,
                     self.projector, self.projector_on_gpu)[0]

    def fits(self, ctx: int, slots: int, types: Types, g: int, gpus_only: bool = False) -> bool:
        return all(u.free_bytes >= 0 for u in self.uses(ctx, slots, types, g) if not gpus_only or u.kind != "host")

    def host_fits(self, ctx: int, slots: int, types: Types, g: int) -> bool:
        return all(u.free_bytes >= 0 for u in self.uses(ctx, slots, types, g) if u.kind == "host")


def largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """Largest n in [lo, hi] with ok(n), for ok monotone (true, then false); None when ok(lo) is false."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def max_ctx(p: Pricer, cap: int, slots: int, types: Types, g: int) -> int | None:
    """Largest ctx per slot that fits: a multiple of CTX_PAD (llama.cpp pads to it anyway), at most `cap`."""
    if cap < CTX_PAD:
        return cap if p.fits(cap, slots, types, g) else None
    k = largest(1, cap // CTX_PAD, lambda k: p.fits(k * CTX_PAD, slots, types, g))
    return None if k is None else k * CTX_PAD


def max_slots(p: Pricer, ctx: int, types: Types, g: int, limit: int) -> int | None:
    """Most slots, each with `ctx`, that fit (at most `limit`)."""
    return largest(1, limit, lambda s: p.fits(ctx, s, types, g))


def max_gpu_layers(p: Pricer, ctx: int, slots: int, types: Types) -> int:
    """Most offloaded layers whose GPU share fits; the host is judged afterwards, since more offload only helps it."""
    if not p.has_gpu:
        return 0
    return largest(0, p.full_layers, lambda g: p.fits(ctx, slots, types, g, gpus_only=True)) or 0


def fewest_gpu_layers(p: Pricer, ctx: int, slots: int, types: Types) -> int:
    """Fewest offloaded layers with which the host fits, within what the offload devices hold: for RPC workers,
    where every layer sent away costs a network hop per token. Falls back to the most that fit (the host is then
    over budget whatever is offloaded, and the caller refuses)."""
    most = max_gpu_layers(p, ctx, slots, types)
    if not p.host_fits(ctx, slots, types, most):
        return most
    lo, hi = 0, most  # host_fits is false, then true, as layers leave the host
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if p.host_fits(ctx, slots, types, mid) else (mid + 1, hi)
    return lo

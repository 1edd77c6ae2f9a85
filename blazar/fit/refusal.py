"""Why a plan does not fit, and what would make it fit: each lever is a re-plan that was checked, not a hint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.models import ModelMetadata
from blazar.fit.ggml_types import cache_type
from blazar.fit.layout import DeviceUse
from blazar.fit.search import Pricer, Types, max_ctx, max_gpu_layers, max_slots

if TYPE_CHECKING:
    from blazar.fit.planner import FitPlan

MiB = 1 << 20
GiB = 1 << 30


class Lever(BaseModel):
    """One change that makes the plan fit, everything else unchanged. `value`: the new setting (or, for "quant",
    the largest weights size in bytes that would fit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["ctx", "slots", "cache_type", "gpu_layers", "quant"]
    value: int | str
    detail: str


class Refusal(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Literal["over_budget", "metadata_incomplete", "invalid_request"]
    detail: str
    device: str | None = None
    need_bytes: int = 0
    budget_bytes: int = 0
    levers: list[Lever] = Field(default_factory=list)


def fmt_bytes(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / MiB:.1f} MiB"


def _elem_cost(types: Types) -> float:
    k, v = cache_type(types[0]), cache_type(types[1])
    return k.type_size / k.block_size + v.type_size / v.block_size


def levers_for(
    p: Pricer, meta: ModelMetadata, ctx: int, slots: int, types: Types, g: int, cap: int, uses: list[DeviceUse]
) -> list[Lever]:
    """Every single-setting change that fits, in the order a user would reach for them."""
    out: list[Lever] = []
    m = max_ctx(p, min(cap, ctx), slots, types, g)
    if m is not None and m < ctx:
        out.append(Lever(kind="ctx", value=m, detail=f"ctx {m} per slot (from {ctx})"))
    if slots > 1:
        s = max_slots(p, ctx, types, g, slots - 1)
        if s is not None:
            out.append(Lever(kind="slots", value=s, detail=f"{s} slot(s) (from {slots})"))
    for t in ("q8_0", "q4_0"):
        cand = (t, t if p.base.flash_attn else "f16")
        if _elem_cost(cand) < _elem_cost(types) and p.fits(ctx, slots, cand, g):
            out.append(Lever(kind="cache_type", value=t, detail=f"KV cache {cand[0]}/{cand[1]}"))
            break
    if p.has_gpu:
        fewer = max_gpu_layers(p, ctx, slots, types)
        if fewer < g and p.fits(ctx, slots, types, fewer):
            out.append(Lever(kind="gpu_layers", value=fewer, detail=f"offload {fewer} layers (the rest on the CPU)"))
        else:
            more = next((n for n in range(p.full_layers, g, -1) if p.fits(ctx, slots, types, n)), None)
            if more is not None:
                out.append(Lever(kind="gpu_layers", value=more, detail=f"offload {more} layers to the GPU"))
    overflow = sum(-u.free_bytes for u in uses if u.free_bytes < 0)
    target = meta.weights_bytes - overflow
    if meta.weights_bytes and target > 0:
        now = fmt_bytes(meta.weights_bytes)
        out.append(Lever(kind="quant", value=target,
                         detail=f"a smaller quant: weights of at most {fmt_bytes(target)} (now {now})"))
    return out


def over_budget(meta: ModelMetadata, uses: list[DeviceUse], levers: list[Lever]) -> Refusal:
    """The refusal for the device furthest over its budget, with the breakdown that explains it."""
    worst = min(uses, key=lambda u: u.free_bytes)
    parts = (f"weights {fmt_bytes(worst.weights_bytes)}, KV {fmt_bytes(worst.kv_bytes)}, "
             f"compute {fmt_bytes(worst.compute_bytes)}, output {fmt_bytes(worst.output_bytes)}, "
             f"fixed {fmt_bytes(worst.fixed_bytes)}")
    if worst.correction_bytes:
        parts += f", calibration {fmt_bytes(worst.correction_bytes)}"
    detail = (f"{worst.key} needs {fmt_bytes(worst.total_bytes)} ({parts}) but its budget is "
              f"{fmt_bytes(worst.budget_bytes)}: {fmt_bytes(-worst.free_bytes)} over")
    if not levers:
        detail += "; no single change makes it fit"
    return Refusal(reason="over_budget", detail=detail, device=worst.key, need_bytes=worst.total_bytes,
                   budget_bytes=worst.budget_bytes, levers=levers)


def summary(plan: FitPlan) -> str:
    """One paragraph a person reads: the shape, where the bytes go, and (when refused) why and what to change."""
    name = plan.model or plan.architecture
    if plan.refusal is not None and plan.refusal.reason != "over_budget":
        return f"{name}: cannot plan: {plan.refusal.detail}"
    rpc = [u for u in plan.devices if u.kind == "rpc" and u.offloaded]
    where = (f"{plan.gpu_layers}/{plan.offloadable_layers} layers on GPU"
             if any(u.kind == "cuda" for u in plan.devices) else "CPU only")
    if rpc:
        where = (f"{sum(u.offloaded for u in rpc)}/{plan.offloadable_layers} layers on RPC workers ("
                 + ", ".join(f"{u.name}: {u.offloaded}" for u in rpc) + ")")
    shape = f"ctx {plan.ctx_per_slot} x {plan.slots} slot(s), KV {plan.cache_type_k}/{plan.cache_type_v}, {where}"
    devs = "; ".join(f"{u.key}{' ' + u.name if u.kind == 'rpc' else ''} {fmt_bytes(u.total_bytes)} of "
                     f"{fmt_bytes(u.budget_bytes)}" for u in plan.devices if u.total_bytes)
    if plan.fits:
        return f"{name} fits: {shape}; {devs}."
    assert plan.refusal is not None
    levers = "; ".join(lv.detail for lv in plan.refusal.levers) or "none"
    return f"{name} does not fit ({shape}): {plan.refusal.detail}. Would fit with: {levers}."

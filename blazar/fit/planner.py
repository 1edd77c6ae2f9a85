"""The memory-fit planner: the largest context and slot count that fit the devices, or a refusal with its levers.

`plan()` is pure: metadata, devices and a request in; a JSON-able `FitPlan` out. Policy (what None means) is in
FitRequest's docstring; formulas and constants in docs/10.SCIENTIFIC.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.models import ModelMetadata
from blazar.events.projectors import ProjectorMetadata
from blazar.fit.devices import Device, gpus_of
from blazar.fit.ggml_types import LADDER, cache_type, is_quantized
from blazar.fit.kv import context_shape, layer_geometry
from blazar.fit.layout import DeviceUse, Shape, layer_weights, price, projector_device
from blazar.fit.projector import decide_placement, projector_cost
from blazar.fit.refusal import Lever, Refusal, levers_for, over_budget, summary
from blazar.fit.search import Pricer, fewest_gpu_layers, max_ctx, max_gpu_layers, max_slots

# Context tried first when ctx is not pinned: layers and cache types are chosen so that at least this much fits,
# then the context grows. 4096 is llama.cpp's own floor when it shrinks a context to fit (common.h
# fit_params_min_ctx).
MIN_AUTO_CTX = 4096
# When the header has no training context, an unpinned context grows no further than this.
UNKNOWN_CTX_TRAIN_CAP = 8192
# slots=None: the most slots (each at the planned context) that fit, up to llama-server's own automatic -np.
SLOTS_AUTO_MAX = 4
# The largest slot count ever reported (llama.cpp LLAMA_MAX_SEQ).
SLOTS_MAX = 256


class FitRequest(BaseModel):
    """What the caller pins; None asks the planner to choose.

    ctx: tokens per slot. None: the largest that fits, up to ctx_train; a larger pinned value is clamped to ctx_train.
    slots: None: the most that fit at the planned ctx, up to SLOTS_AUTO_MAX (context first, then slots).
    cache types: both None walk f16 -> q8_0 -> q4_0 and stop at the first that fits (V stays f16 without flash
        attention, which llama.cpp requires for a quantised V); one None means llama.cpp's default, f16.
    gpu_layers: llama.cpp's -ngl (n_layer + 1 offloads everything, output included); None: all that fit.
    correction: bytes from calibration (measured - planned) added where most of the model lives.
    offload: "most" offloads every layer the GPUs hold (local GPUs are faster than the CPU); "fewest" offloads only
        what the host cannot hold (RPC workers: each layer away costs a network hop per token).
    projector: the model's multimodal projector (--mmproj), priced where it runs (blazar/fit/projector.py); None:
        a text-only load.
    lora_bytes: the tensor bytes of the LoRA adapters loaded with it (--lora): llama.cpp puts each adapter tensor
        beside the weight it adapts, so they are priced with the layers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ctx: int | None = Field(default=None, ge=1)
    slots: int | None = Field(default=1, ge=1, le=SLOTS_MAX)
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    n_ubatch: int = Field(default=512, ge=1)
    n_batch: int = Field(default=2048, ge=1)
    gpu_layers: int | None = Field(default=None, ge=0)
    kv_unified: bool = False  # llama-server's default once -np is given explicitly (server.cpp)
    flash_attn: bool = True
    swa_full: bool = False
    correction: int = 0
    offload: Literal["most", "fewest"] = "most"
    projector: ProjectorMetadata | None = None
    lora_bytes: int = Field(default=0, ge=0)


class FitPlan(BaseModel):
    """The planner's answer: the engine shape, per-device bytes, the search results, and a refusal when it fails."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fits: bool
    model: str | None
    architecture: str
    ctx_per_slot: int
    ctx_total: int
    engine_ctx: int  # what to pass as -c
    slots: int
    kv_unified: bool
    cache_type_k: str
    cache_type_v: str
    gpu_layers: int
    offloadable_layers: int
    n_ubatch: int
    n_batch: int
    flash_attn: bool
    swa_full: bool
    kv_bytes: int
    total_bytes: int  # every device's total, calibration included
    estimate_bytes: int  # the same before calibration: what `record_measurement` compares against
    correction_bytes: int
    devices: list[DeviceUse]
    max_ctx_at_slots: int | None  # largest ctx per slot that fits at these slots (None: not even CTX_PAD)
    max_slots_at_ctx: int | None  # largest slot count that fits at this ctx (None: not even one)
    refusal: Refusal | None = None
    notes: list[str] = Field(default_factory=list)
    summary: str = ""
    # The model's multimodal projector (--mmproj): its weights and compute buffer, the device it runs on, and
    # whether it is offloaded there (False: --no-mmproj-offload, on the host while a GPU is present).
    projector_bytes: int = 0
    projector_device: str | None = None
    projector_offload: bool = True

    @property
    def local_bytes(self) -> int:
        """What this host's own devices hold: RPC workers' shares live on their hosts, and are charged there."""
        return sum(u.total_bytes for u in self.devices if u.kind != "rpc")

    @property
    def local_estimate_bytes(self) -> int:
        return sum(u.total_bytes - u.correction_bytes for u in self.devices if u.kind != "rpc")


def _type_choices(req: FitRequest) -> list[tuple[str, str]]:
    if req.cache_type_k is None and req.cache_type_v is None:
        return [(t, t if req.flash_attn else "f16") for t in dict.fromkeys(LADDER)]
    return [(cache_type(req.cache_type_k or "f16").name, cache_type(req.cache_type_v or "f16").name)]


def with_lora_bytes(meta: ModelMetadata, lora_bytes: int) -> ModelMetadata:
    """`meta` with the adapters' tensor bytes spread over its blocks (each adapter tensor lies where the weight it
    adapts does; an even split is close enough for adapters that target every block alike)."""
    n = meta.block_count
    if n <= 0:
        return meta.model_copy(update={"input_bytes": meta.input_bytes + lora_bytes,
                                       "weights_bytes": meta.weights_bytes + lora_bytes})
    layers = [w + lora_bytes // n + (1 if i < lora_bytes % n else 0) for i, w in enumerate(layer_weights(meta))]
    return meta.model_copy(update={"layer_bytes": layers, "weights_bytes": meta.weights_bytes + lora_bytes})


def plan(meta: ModelMetadata, devices: list[Device], request: FitRequest | None = None) -> FitPlan:
    """Plan one engine instance of `meta` (with its multimodal projector, when the request names one) on `devices`;
    see FitRequest for what a None asks for."""
    req = request or FitRequest()
    notes: list[str] = []
    if req.lora_bytes:
        meta = with_lora_bytes(meta, req.lora_bytes)
        notes.append(f"LoRA adapters: {req.lora_bytes / 2**20:.1f} MiB beside the layers")
    cap = meta.ctx_train or UNKNOWN_CTX_TRAIN_CAP
    if not meta.ctx_train:
        notes.append(f"the file states no training context; an unpinned ctx is capped at {cap}")
    ctx_req = req.ctx
    if ctx_req is not None and meta.ctx_train and ctx_req > meta.ctx_train:
        notes.append(f"ctx {ctx_req} clamped to the training context {meta.ctx_train}")
        ctx_req = meta.ctx_train
    if meta.sliding_window and not meta.swa_layers:
        notes.append("sliding window without a per-layer pattern: every layer counted at full context")
    full_layers = meta.block_count + 1
    g_req = None if req.gpu_layers is None else min(req.gpu_layers, full_layers)
    if g_req and not gpus_of(devices):
        notes.append(f"gpu_layers {g_req} requested but no GPU was found: everything stays on the host")
        g_req = 0
    choices = _type_choices(req)
    if any(is_quantized(v) for _, v in choices) and not req.flash_attn:
        return _refuse_early(meta, req, choices[0], notes, "invalid_request",
                             "a quantised V cache needs flash attention (llama_context refuses it otherwise)")
    geom = layer_geometry(meta)
    if geom is None:
        return _refuse_early(meta, req, choices[0], notes, "metadata_incomplete",
                             "the header lacks the layer count, head counts or head sizes the KV size needs")
    base = Shape(0, 1, "f16", "f16", 0, req.n_ubatch, req.n_batch, req.kv_unified, req.flash_attn, req.swa_full)
    cost = projector_cost(req.projector, flash_attn=req.flash_attn) if req.projector is not None else None
    p = Pricer(meta, geom, devices, base, req.correction, cost)
    target_ctx = ctx_req if ctx_req is not None else min(MIN_AUTO_CTX, cap)
    target_slots = req.slots or 1
    types, g, ok = _pick(p, req, choices, g_req, target_ctx, target_slots)
    placement = None
    if cost is not None and p.has_gpu and projector_device(devices, True) != "host":
        # NOTE: the projector's place is decided before the context grows: at the target context, whichever place
        # keeps more of the model's layers on the GPU (the layers serve every token; the projector, each image).
        alt: tuple[Pricer, tuple[str, str], int, bool] | None = None
        if not (ok and g >= full_layers):
            p_host = Pricer(meta, geom, devices, base, req.correction, cost, projector_on_gpu=False)
            alt = (p_host, *_pick(p_host, req, choices, g_req, target_ctx, target_slots))
        placement = decide_placement(cost, gpu=projector_device(devices, True), layers_total=full_layers,
                                     on_gpu=(ok, g), on_host=None if alt is None else (alt[3], alt[2]))
        if alt is not None and not placement.on_gpu:
            p, types, g, ok = alt
        notes.append(placement.why)
    if types != choices[0]:
        notes.append(f"KV cache {choices[0][0]} does not fit; using {types[0]}/{types[1]}")

    ctx = ctx_req if ctx_req is not None else (max_ctx(p, cap, target_slots, types, g) or target_ctx)
    slots = req.slots if req.slots is not None else (max_slots(p, ctx, types, g, SLOTS_AUTO_MAX) or 1)
    shape = p.shape(ctx, slots, types, g)
    uses, kvl = price(meta, geom, devices, shape, req.correction, cost, p.projector_on_gpu)
    fits = all(u.free_bytes >= 0 for u in uses)
    refusal = None
    if not fits:
        refusal = over_budget(meta, uses, levers_for(p, meta, ctx, slots, types, g, cap, uses))
    cs = context_shape(shape.ctx_arg, slots, req.kv_unified)
    result = FitPlan(
        fits=fits, model=meta.name, architecture=meta.architecture, ctx_per_slot=cs.ctx_per_slot,
        ctx_total=cs.n_ctx, engine_ctx=shape.ctx_arg, slots=slots, kv_unified=req.kv_unified,
        cache_type_k=types[0], cache_type_v=types[1], gpu_layers=min(g, full_layers) if p.has_gpu else 0,
        offloadable_layers=full_layers, n_ubatch=req.n_ubatch, n_batch=req.n_batch, flash_attn=req.flash_attn,
        swa_full=req.swa_full, kv_bytes=kvl.total, total_bytes=sum(u.total_bytes for u in uses),
        estimate_bytes=sum(u.total_bytes - u.correction_bytes for u in uses),
        correction_bytes=req.correction, devices=uses, max_ctx_at_slots=max_ctx(p, cap, slots, types, g),
        max_slots_at_ctx=max_slots(p, ctx, types, g, SLOTS_MAX), refusal=refusal, notes=notes,
        projector_bytes=cost.total_bytes if cost is not None else 0,
        projector_device=projector_device(devices, p.projector_on_gpu) if cost is not None else None,
        projector_offload=placement is None or placement.on_gpu,
    )
    return result.model_copy(update={"summary": summary(result)})


def _pick(p: Pricer, req: FitRequest, choices: list[tuple[str, str]], g_req: int | None, ctx: int, slots: int
          ) -> tuple[tuple[str, str], int, bool]:
    """The first cache types (widest first) with which every layer is offloaded (or the pinned -ngl, or the fewest
    for RPC workers) and the plan fits at `ctx` x `slots`; else the fitting choice with the most GPU layers; else the
    first. Returns (types, gpu layers, fits)."""
    tried: list[tuple[tuple[str, str], int, bool]] = []
    fewest = req.offload == "fewest"
    search = fewest_gpu_layers if fewest else max_gpu_layers
    for types in choices:
        g = g_req if g_req is not None else search(p, ctx, slots, types)
        ok = p.fits(ctx, slots, types, g)
        tried.append((types, g, ok))
        if ok and (g_req is not None or fewest or not p.has_gpu or g == p.full_layers):
            return types, g, True
    fitting = [(t, g) for t, g, ok in tried if ok]
    if fitting:
        types, g = max(fitting, key=lambda tg: tg[1])
        return types, g, True
    return tried[0][0], tried[0][1], False


def _refuse_early(
    meta: ModelMetadata,
    req: FitRequest,
    types: tuple[str, str],
    notes: list[str],
    reason: Literal["metadata_incomplete", "invalid_request"],
    detail: str,
) -> FitPlan:
    refusal = Refusal(reason=reason, detail=detail)
    ctx = req.ctx or 0
    result = FitPlan(
        fits=False, model=meta.name, architecture=meta.architecture, ctx_per_slot=ctx, ctx_total=ctx * (req.slots or 1),
        engine_ctx=ctx * (req.slots or 1), slots=req.slots or 1, kv_unified=req.kv_unified, cache_type_k=types[0],
        cache_type_v=types[1], gpu_layers=0, offloadable_layers=meta.block_count + 1, n_ubatch=req.n_ubatch,
        n_batch=req.n_batch, flash_attn=req.flash_attn, swa_full=req.swa_full, kv_bytes=0, total_bytes=0,
        estimate_bytes=0, correction_bytes=req.correction, devices=[], max_ctx_at_slots=None, max_slots_at_ctx=None,
        refusal=refusal, notes=notes,
    )
    return result.model_copy(update={"summary": summary(result)})


__all__ = ["FitPlan", "FitRequest", "Lever", "Refusal", "plan"]

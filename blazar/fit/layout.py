"""One configuration, priced: which device holds each layer, and what every device then spends.

Placement follows llama_model::load_tensors: the last `gpu_layers` of the n_layer + 1 offloadable layers (the +1 is
the output layer) go to the GPUs, split by free memory; the input layer always stays on the host.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from blazar.events.models import ModelMetadata
from blazar.fit import buffers
from blazar.fit.devices import Device, budget_bytes, gpus_of, host_of
from blazar.fit.kv import KvLayout, LayerGeom, context_shape, kv_layout
from blazar.fit.projector import ProjectorCost


@dataclass(frozen=True, slots=True)
class Shape:
    """Everything a plan chooses: engine arguments, in llama.cpp's terms."""

    ctx_arg: int  # the value passed as -c (all slots together)
    slots: int  # -np
    cache_type_k: str
    cache_type_v: str
    gpu_layers: int  # -ngl, counting the output layer (n_layer + 1 = everything)
    n_ubatch: int = 512
    n_batch: int = 2048
    unified: bool = False
    flash_attn: bool = True
    swa_full: bool = False


class DeviceUse(BaseModel):
    """What one device spends under a plan, and what it has left (`free_bytes` < 0: over budget)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    kind: str
    name: str
    layers: int = 0
    holds_output: bool = False  # the output layer (-ngl counts it as one more layer)
    weights_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0
    fixed_bytes: int = 0
    correction_bytes: int = 0
    projector_bytes: int = 0  # the multimodal projector's weights and compute buffer, where it runs
    total_bytes: int = 0
    budget_bytes: int = 0
    free_bytes: int = 0

    @property
    def offloaded(self) -> int:
        """How many of -ngl's layers this device holds: its blocks, and the output layer when it has it."""
        return self.layers + (1 if self.holds_output else 0)


def assign_layers(n_layer: int, gpu_layers: int, gpus: list[Device]) -> list[str]:
    """Device key for layers 0..n_layer-1 and, last, the output layer (llama_model::load_tensors).

    i_gpu_start = n_layer + 1 - gpu_layers; a layer past it goes to the GPU whose cumulative share of free memory
    first exceeds (il - i_gpu_start) / gpu_layers (the default tensor split is by free memory).
    """
    n_off = min(max(gpu_layers, 0), n_layer + 1) if gpus else 0
    start = n_layer + 1 - n_off
    free = [max(g.free_bytes, 1) for g in gpus]
    cum, acc = [], 0
    for f in free:
        acc += f
        cum.append(acc / sum(free))
    out = []
    for il in range(n_layer + 1):
        if il < start:
            out.append("host")
            continue
        i = min(bisect.bisect_right(cum, (il - start) / n_off), len(gpus) - 1)
        out.append(gpus[i].key)
    return out


def layer_weights(meta: ModelMetadata) -> list[int]:
    """Bytes of each block; an even split of the block weights when the header summary has no per-block sizes."""
    n = meta.block_count
    if len(meta.layer_bytes) >= n:
        return list(meta.layer_bytes[:n])
    rest = max(0, meta.weights_bytes - meta.input_bytes - meta.output_bytes)
    return [rest // n + (1 if i < rest % n else 0) for i in range(n)]


def tied_copy_bytes(meta: ModelMetadata) -> int:
    """Bytes of token_embd that llama.cpp duplicates as the output head (TENSOR_DUPLICATED) when the file has no
    output matrix; a GPU holding the output layer then keeps its own copy.

    The inspector reports it as `tied_output_bytes`; for summaries without it, a head is taken as tied when the
    output bytes are below vocab * embd / 16 (even a 1.5-bit output matrix is larger; norms alone are far below).
    """
    if meta.tied_output_bytes:
        return meta.tied_output_bytes
    if meta.embedding_model or not meta.vocab_size or not meta.embedding_length:
        return 0
    return meta.input_bytes if meta.output_bytes < meta.vocab_size * meta.embedding_length // 16 else 0


def projector_device(devices: list[Device], on_gpu: bool) -> str:
    """Where llama.cpp runs the projector: the first local GPU (tools/mtmd/clip.cpp takes the first GPU backend,
    never an RPC worker), or the host with --no-mmproj-offload or without a GPU."""
    local = [d for d in gpus_of(devices) if d.kind == "cuda"]
    return local[0].key if on_gpu and local else host_of(devices).key


def price(
    meta: ModelMetadata, geom: list[LayerGeom], devices: list[Device], shape: Shape, correction: int = 0,
    projector: ProjectorCost | None = None, projector_on_gpu: bool = True,
) -> tuple[list[DeviceUse], KvLayout]:
    """Per-device bytes for `shape` (with the model's projector, when it has one, on the device it runs on). Pure
    arithmetic; a caller decides what fits."""
    gpus, host = gpus_of(devices), host_of(devices)
    n_layer = meta.block_count
    ctx = context_shape(shape.ctx_arg, shape.slots, shape.unified)
    n_batch = shape.n_ubatch if meta.embedding_model else shape.n_batch  # server.cpp: n_batch = n_ubatch for embeddings
    n_ubatch = min(shape.n_ubatch, n_batch)  # llama_context: n_ubatch = min(n_batch, n_ubatch)
    kvl = kv_layout(
        geom, ctx, cache_type_k=shape.cache_type_k, cache_type_v=shape.cache_type_v, n_swa=meta.sliding_window or 0,
        n_ubatch=n_ubatch, swa_full=shape.swa_full, flash_attn=shape.flash_attn,
    )
    place = assign_layers(n_layer, shape.gpu_layers, gpus)
    weights = layer_weights(meta)
    keys = [g.key for g in gpus] + [host.key]
    acc = {k: {"layers": 0, "weights": 0, "kv": 0, "compute": 0, "output": 0, "fixed": 0, "corr": 0, "proj": 0}
           for k in keys}
    widest = dict.fromkeys(keys, 0)
    for il in range(n_layer):
        a = acc[place[il]]
        a["layers"] += 1
        a["weights"] += weights[il]
        a["kv"] += kvl.per_layer[il]
        if kvl.per_layer[il]:
            cells = kvl.swa_cells if geom[il].swa and kvl.swa_cells else kvl.full_cells
            widest[place[il]] = max(widest[place[il]], cells)
    out_key = place[n_layer]
    acc[out_key]["weights"] += meta.output_bytes
    if out_key != host.key:
        acc[out_key]["weights"] += tied_copy_bytes(meta)
    acc[host.key]["weights"] += meta.input_bytes

    n_outputs_max = n_batch if meta.embedding_model else ctx.slots  # server-context.cpp server_output_limits
    n_tokens = buffers.graph_tokens(ctx.n_ctx, n_ubatch)
    n_embd, n_vocab = meta.embedding_length or 0, meta.vocab_size or 0
    for key in keys:
        a = acc[key]
        if a["layers"] or key == out_key:
            a["compute"] = buffers.compute_bytes(
                n_tokens=n_tokens, n_embd=n_embd, n_head=meta.head_count or 0, full_cells=kvl.full_cells,
                swa_cells=kvl.swa_cells, widest_cells=widest[key], flash_attn=shape.flash_attn,
                n_outputs=min(n_tokens, n_outputs_max), n_vocab=n_vocab, holds_output=key == out_key,
                n_expert_used=meta.expert_used_count or 0,
            )
            if key != host.key:
                a["fixed"] = (buffers.RPC_ENGINE_FIXED_BYTES if key.startswith("rpc:")
                              else buffers.GPU_ENGINE_FIXED_BYTES)
    h = acc[host.key]
    if not h["compute"]:
        h["compute"] = buffers.staging_bytes(
            n_tokens=n_tokens, n_embd=n_embd, full_cells=kvl.full_cells, swa_cells=kvl.swa_cells,
            flash_attn=shape.flash_attn,
        )
    h["output"] = buffers.output_bytes(
        n_vocab=n_vocab, n_embd=n_embd, n_outputs=max(n_outputs_max, ctx.slots), embeddings=meta.embedding_model
    )
    h["fixed"] = buffers.HOST_ENGINE_FIXED_BYTES
    # The measured difference is one number per model: charge it where most of the model lives.
    primary = max(gpus, key=lambda g: acc[g.key]["layers"]).key if gpus else host.key
    if acc[primary]["layers"] == 0:
        primary = host.key
    acc[primary]["corr"] = correction
    if projector is not None:
        where = projector_device(devices, projector_on_gpu)
        acc[where]["proj"] = projector.total_bytes
        if where != host.key and not acc[where]["fixed"]:
            acc[where]["fixed"] = buffers.GPU_ENGINE_FIXED_BYTES  # a GPU holding only the projector: its context

    uses = []
    for d in [*gpus, host]:
        a = acc[d.key]
        total = max(0, a["weights"] + a["kv"] + a["compute"] + a["output"] + a["fixed"] + a["corr"] + a["proj"])
        budget = budget_bytes(d)
        uses.append(DeviceUse(
            key=d.key, kind=d.kind, name=d.name, layers=a["layers"], holds_output=d.key == out_key and d.kind != "host",
            weights_bytes=a["weights"], kv_bytes=a["kv"],
            compute_bytes=a["compute"], output_bytes=a["output"], fixed_bytes=a["fixed"], correction_bytes=a["corr"],
            projector_bytes=a["proj"], total_bytes=total, budget_bytes=budget, free_bytes=budget - total,
        ))
    return uses, kvl

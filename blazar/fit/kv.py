"""KV cache bytes per layer, sized the way llama.cpp sizes it for a given context, slot count and cache types.

Every rule here is a fact read from llama.cpp (build 11434); the function named in each comment is where it lives.
"""

from __future__ import annotations

from dataclasses import dataclass

from blazar.events.models import ModelMetadata
from blazar.fit.ggml_types import kv_bytes

# src/llama-context.cpp, llama_context::llama_context: `cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)`, and the
# per-sequence context of a non-unified cache is padded to 256 again.
CTX_PAD = 256
# src/llama-kv-cache-iswa.cpp, llama_kv_cache_iswa::llama_kv_cache_iswa: "the SWA cache is always padded to 256".
SWA_PAD = 256


def pad(n: int, to: int) -> int:
    """GGML_PAD: round `n` up to a multiple of `to`."""
    return -(-n // to) * to


@dataclass(frozen=True, slots=True)
class CtxShape:
    """What llama_context makes of `-c`, `-np` and `--kv-unified`."""

    n_ctx: int  # total cells across all sequences
    n_ctx_seq: int  # cells one sequence may use (kv_size of each stream)
    n_stream: int  # separate KV streams: 1 when unified, else one per slot
    slots: int
    unified: bool

    @property
    def ctx_per_slot(self) -> int:
        """Tokens each slot is guaranteed: its own stream, or an equal share of the unified pool."""
        return self.n_ctx_seq if not self.unified else self.n_ctx // self.slots


def context_shape(n_ctx_arg: int, slots: int, unified: bool) -> CtxShape:
    """Mirror of llama_context::llama_context: pad n_ctx to 256; split it per sequence unless unified.

    Non-unified: n_ctx_seq = PAD(n_ctx / n_seq_max, 256) and n_ctx is re-derived as n_ctx_seq * n_seq_max (so
    -c 4096 -np 3 really allocates 3 x 1536 = 4608 cells).
    """
    slots = max(1, slots)
    n_ctx = pad(max(1, n_ctx_arg), CTX_PAD)
    if unified:
        return CtxShape(n_ctx, n_ctx, 1, slots, True)
    n_ctx_seq = pad(n_ctx // slots, CTX_PAD) if n_ctx >= slots else CTX_PAD
    return CtxShape(n_ctx_seq * slots, n_ctx_seq, slots, slots, False)


def swa_cells(shape: CtxShape, n_swa: int, n_ubatch: int, swa_full: bool) -> int:
    """Cells per stream of the sliding-window cache (llama_kv_cache_iswa::llama_kv_cache_iswa).

    size_swa = PAD(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256); --swa-full makes it size_base.
    """
    if swa_full:
        return shape.n_ctx_seq
    window = n_swa * (shape.slots if shape.unified else 1) + n_ubatch
    return pad(min(shape.n_ctx_seq, window), SWA_PAD)


@dataclass(frozen=True, slots=True)
class LayerGeom:
    n_head_kv: int
    k_len: int  # elements per head in K (n_embd_head_k)
    v_len: int  # elements per head in V (n_embd_head_v)
    swa: bool

    @property
    def k_row(self) -> int:  # llama_hparams::n_embd_k_gqa(il)
        return self.n_head_kv * self.k_len

    @property
    def v_row(self) -> int:  # llama_hparams::n_embd_v_gqa(il)
        return self.n_head_kv * self.v_len


def layer_geometry(meta: ModelMetadata) -> list[LayerGeom] | None:
    """Per-layer KV geometry, or None when the header lacks what the sizes need (no guessing).

    Head size: key_length / value_length, else n_embd / n_head (llama_model::load_hparams does the same).
    KV heads: the per-layer array when present (0 = a layer without attention, as hybrid models mark recurrent
    layers), else head_count_kv, else head_count (no GQA). SWA: only layers `swa_layers` marks, and only when the
    model has a window; a window with no per-layer pattern is treated as full attention (an over-count, never an
    under-count).
    """
    n_layer = meta.block_count
    if n_layer <= 0:
        return None
    head_dim = None
    if meta.embedding_length and meta.head_count and meta.embedding_length % meta.head_count == 0:
        head_dim = meta.embedding_length // meta.head_count
    k_len = meta.key_length or head_dim
    v_len = meta.value_length or head_dim
    default_kv = meta.head_count_kv if meta.head_count_kv is not None else meta.head_count
    per_layer = meta.head_count_kv_per_layer
    if per_layer is not None and len(per_layer) >= n_layer:
        kv_heads = [int(h) for h in per_layer[:n_layer]]
    elif default_kv is not None:
        kv_heads = [int(default_kv)] * n_layer
    else:
        return None
    if any(kv_heads) and (k_len is None or v_len is None):
        return None
    swa = meta.swa_layers if meta.sliding_window and meta.swa_layers else None
    return [
        LayerGeom(n_kv, k_len or 0, v_len or 0, bool(swa and il < len(swa) and swa[il]))
        for il, n_kv in enumerate(kv_heads)
    ]


@dataclass(frozen=True, slots=True)
class KvLayout:
    per_layer: list[int]  # bytes of K+V for each layer (0 for a layer without KV)
    full_cells: int  # cells per stream of the full-attention cache
    swa_cells: int  # cells per stream of the SWA cache (0 when the model has no SWA layer)
    n_stream: int

    @property
    def total(self) -> int:
        return sum(self.per_layer)


def kv_layout(
    geom: list[LayerGeom],
    shape: CtxShape,
    *,
    cache_type_k: str,
    cache_type_v: str,
    n_swa: int,
    n_ubatch: int,
    swa_full: bool = False,
    flash_attn: bool = True,
) -> KvLayout:
    """K and V bytes per layer (llama_kv_cache::llama_kv_cache).

    Each layer holds K as [n_embd_k_gqa, kv_size, n_stream] of type_k and V as [n_embd_v_gqa, kv_size, n_stream] of
    type_v; kv_size is n_ctx_seq for full layers and the SWA size for window layers. Without flash attention V is
    stored transposed and every layer's V row is padded to the widest one (n_embd_v_gqa_max, TAG_V_CACHE_VARIABLE).
    Rows are rounded up to whole blocks for quantised types.
    """
    has_swa = any(g.swa for g in geom) and n_swa > 0
    w_cells = swa_cells(shape, n_swa, n_ubatch, swa_full) if has_swa else 0
    v_max = max((g.v_row for g in geom), default=0)
    per_layer = []
    for g in geom:
        if g.n_head_kv <= 0:
            per_layer.append(0)
            continue
        cells = (w_cells if g.swa and has_swa else shape.n_ctx_seq) * shape.n_stream
        v_row = g.v_row if flash_attn else v_max
        per_layer.append(kv_bytes(cache_type_k, g.k_row) * cells + kv_bytes(cache_type_v, v_row) * cells)
    return KvLayout(per_layer, shape.n_ctx_seq, w_cells, shape.n_stream)

"""KV cache sizing: exact ggml type sizes, llama.cpp's context padding and slot split, GQA, SWA, K/V lengths."""

from __future__ import annotations

import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from blazar.fit.ggml_types import CACHE_TYPES, kv_bytes
from blazar.fit.kv import context_shape, kv_layout, layer_geometry, swa_cells
from tests.support.fit_models import MiB, gemma3_270m, transformer


@pytest.mark.parametrize("name", sorted(CACHE_TYPES))
def test_cache_type_sizes_match_gguf_quant_sizes(name: str) -> None:
    t = CACHE_TYPES[name]
    assert GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]] == (t.block_size, t.type_size)


def test_kv_bytes_rounds_up_to_whole_blocks() -> None:
    assert kv_bytes("q8_0", 64) == 68
    assert kv_bytes("q8_0", 33) == 68
    assert kv_bytes("q4_0", 32) == 18
    assert kv_bytes("f16", 3) == 6
    assert kv_bytes("f32", 0) == 0


def test_q8_0_is_exactly_34_bytes_per_32_elements() -> None:
    n = 32 * 1000
    assert kv_bytes("q8_0", n) * 32 == n * 34
    assert kv_bytes("q8_0", n) / kv_bytes("f16", n) == 17 / 32  # not the 1/2 the reference project assumed


def _total(meta, ctx: int, slots: int = 1, ck: str = "f16", cv: str = "f16", **kw) -> int:
    geom = layer_geometry(meta)
    assert geom is not None
    shape = context_shape(ctx * slots, slots, kw.pop("unified", False))
    return kv_layout(geom, shape, cache_type_k=ck, cache_type_v=cv, n_swa=meta.sliding_window or 0,
                     n_ubatch=kw.pop("n_ubatch", 512), **kw).total


def test_plain_transformer_f16_is_2_layers_kvheads_headdim_ctx_2() -> None:
    meta = transformer(n_layer=32, n_head=32, n_kv=32, n_embd=4096)
    assert _total(meta, 4096) == 2 * 32 * 32 * 128 * 4096 * 2


def test_gqa_divides_by_heads_over_kv_heads() -> None:
    mha = _total(transformer(n_kv=32), 8192)
    gqa = _total(transformer(n_kv=8), 8192)
    assert mha == 4 * gqa


def test_quantised_cache_scales_by_block_size_per_row() -> None:
    meta = transformer(n_kv=8)
    f16 = _total(meta, 8192)
    assert _total(meta, 8192, ck="q8_0", cv="q8_0") * 32 == f16 * 17
    assert _total(meta, 8192, ck="q4_0", cv="q4_0") * 32 == f16 * 9
    assert _total(meta, 8192, ck="q8_0", cv="f16") * 64 == f16 * (17 + 32)


def test_key_and_value_lengths_are_sized_separately() -> None:
    meta = transformer(n_layer=10, n_kv=4, key_length=192, value_length=128)
    assert _total(meta, 1024) == 10 * 4 * (192 + 128) * 1024 * 2


def test_per_layer_kv_heads_and_attention_free_layers() -> None:
    meta = transformer(n_layer=4, n_kv=8, head_count_kv_per_layer=[8, 0, 0, 2])
    assert _total(meta, 256) == (8 + 2) * 128 * 2 * 256 * 2


def test_ctx_is_padded_to_256_and_non_unified_split_pads_each_slot() -> None:
    # llama_context: -c 4096 -np 3 -> n_ctx_seq = PAD(1365, 256) = 1536, n_ctx = 4608 (measured: same log line)
    s = context_shape(4096, 3, unified=False)
    assert (s.n_ctx, s.n_ctx_seq, s.n_stream) == (4608, 1536, 3)
    u = context_shape(1000, 4, unified=True)
    assert (u.n_ctx, u.n_ctx_seq, u.n_stream, u.ctx_per_slot) == (1024, 1024, 1, 256)


def test_swa_layers_are_capped_at_window_plus_ubatch() -> None:
    meta = transformer(n_layer=6, n_kv=1, head=256, sliding_window=512, swa_layers=[True] * 5 + [False])
    row = 256 * 2 * 2  # K + V, f16
    assert _total(meta, 32768) == 32768 * row + 5 * 1024 * row  # PAD(min(32768, 512 + 512), 256) = 1024
    assert _total(meta, 32768, swa_full=True) == 6 * 32768 * row
    assert _total(meta, 512) == 6 * 512 * row  # min(n_ctx, window + ubatch)


def test_swa_cells_unified_multiplies_window_by_slots() -> None:
    assert swa_cells(context_shape(8192, 4, unified=True), 512, 512, False) == 2560
    assert swa_cells(context_shape(8192, 4, unified=False), 512, 512, False) == 1024


def test_window_without_layer_pattern_counts_every_layer_full() -> None:
    meta = transformer(n_layer=4, n_kv=1, head=256, sliding_window=512, swa_layers=None)
    assert _total(meta, 8192) == 4 * 8192 * 256 * 2 * 2


def test_missing_geometry_is_refused_not_guessed() -> None:
    meta = transformer(head_count_kv=None, head_count=None, key_length=None, value_length=None)
    assert layer_geometry(meta) is None


# What llama-server (build 11434, CPU) logged for gemma-3-270m: the two "KV buffer size" lines added up, in MiB.
GEMMA_KV_MEASURED = [
    # (-c, -np, unified, n_ubatch, cache type, swa_full, MiB)
    (4096, 1, False, 512, "f16", False, 27.00),
    (8192, 1, False, 512, "f16", False, 39.00),
    (32768, 1, False, 512, "f16", False, 111.00),
    (8192, 1, False, 256, "f16", False, 35.25),
    (8192, 1, False, 1024, "f16", False, 46.50),
    (8192, 1, False, 512, "q8_0", False, 12.75 + 7.96875),
    (8192, 1, False, 512, "f16", True, 144.00),
    (8192, 2, False, 512, "f16", False, 54.00),
    (8192, 4, False, 512, "f16", False, 84.00),
    (8192, 4, True, 512, "f16", False, 61.50),
    (4096, 3, False, 512, "f16", False, 58.50),
    (1000, 4, True, 512, "f16", False, 18.00),
    (300, 4, True, 512, "f16", False, 9.00),
]


@pytest.mark.parametrize(("c", "np_", "unified", "ub", "ct", "swa_full", "mib"), GEMMA_KV_MEASURED)
def test_kv_matches_llama_server_measurements_exactly(
    c: int, np_: int, unified: bool, ub: int, ct: str, swa_full: bool, mib: float
) -> None:
    meta = gemma3_270m()
    geom = layer_geometry(meta)
    assert geom is not None
    layout = kv_layout(geom, context_shape(c, np_, unified), cache_type_k=ct, cache_type_v=ct, n_swa=512,
                       n_ubatch=ub, swa_full=swa_full)
    assert layout.total == round(mib * MiB)

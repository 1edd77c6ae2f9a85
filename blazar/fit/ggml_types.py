"""Exact storage sizes of the ggml types llama.cpp accepts for its KV cache (--cache-type-k / --cache-type-v).

Source: ggml/src/ggml.c `type_traits` (blck_size, type_size) and common/arg.cpp `kv_cache_types`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GgmlType:
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block


# q8_0: fp16 scale + 32 int8; q4_0: fp16 scale + 16 bytes of nibbles; q4_1: scale and min + nibbles;
# q5_0/q5_1: as q4 plus 4 bytes of fifth bits; iq4_nl: fp16 scale + 16 bytes (non-linear 4-bit grid).
CACHE_TYPES: dict[str, GgmlType] = {
    t.name: t
    for t in (
        GgmlType("f32", 1, 4),
        GgmlType("f16", 1, 2),
        GgmlType("bf16", 1, 2),
        GgmlType("q8_0", 32, 34),
        GgmlType("q4_0", 32, 18),
        GgmlType("q4_1", 32, 20),
        GgmlType("iq4_nl", 32, 18),
        GgmlType("q5_0", 32, 22),
        GgmlType("q5_1", 32, 24),
    )
}

# The order the planner walks when no cache type is pinned and f16 does not fit.
LADDER: tuple[str, ...] = ("f16", "q8_0", "q4_0")


def cache_type(name: str) -> GgmlType:
    """The type named as llama.cpp spells it; ValueError for a type llama-server would refuse."""
    try:
        return CACHE_TYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported KV cache type {name!r}; one of: {', '.join(CACHE_TYPES)}") from None


def is_quantized(name: str) -> bool:
    return cache_type(name).block_size > 1


def kv_bytes(type_name: str, n_elements: int) -> int:
    """Bytes to store `n_elements` of `type_name`, rounded up to whole blocks (ggml_row_size for one row)."""
    if n_elements <= 0:
        return 0
    t = cache_type(type_name)
    blocks = -(-n_elements // t.block_size)
    return blocks * t.type_size

"""Model headers and devices for the planner tests, built directly (no GGUF file needed)."""

from __future__ import annotations

from blazar.events.models import ModelMetadata
from blazar.fit.devices import Device

MiB = 1 << 20
GiB = 1 << 30


def transformer(
    *, n_layer: int = 32, n_embd: int = 4096, n_head: int = 32, n_kv: int = 8, head: int | None = None,
    ctx_train: int = 32768, vocab: int = 32000, layer_bytes: int = 120 * MiB, input_bytes: int = 70 * MiB,
    output_bytes: int = 70 * MiB, **extra: object,
) -> ModelMetadata:
    """A plain (llama-like) transformer: every layer full attention, GQA n_head/n_kv."""
    head = head or n_embd // n_head
    fields: dict[str, object] = dict(
        architecture="llama", name="plain", ctx_train=ctx_train, block_count=n_layer, embedding_length=n_embd,
        head_count=n_head, head_count_kv=n_kv, key_length=head, value_length=head, vocab_size=vocab,
        layer_bytes=[layer_bytes] * n_layer, input_bytes=input_bytes, output_bytes=output_bytes,
        weights_bytes=layer_bytes * n_layer + input_bytes + output_bytes,
    )
    fields.update(extra)
    return ModelMetadata(**fields)  # type: ignore[arg-type]


def gemma3_270m() -> ModelMetadata:
    """gemma-3-270m Q4_K_M as its GGUF header reads (the model the compute constants were measured on)."""
    A, B = 3_995_648, 3_596_288  # the two block sizes: Q4_K_M mixes quant types by layer
    return ModelMetadata(
        architecture="gemma3", name="gemma-3-270m", ctx_train=32768, block_count=18, embedding_length=640,
        head_count=4, head_count_kv=1, key_length=256, value_length=256, sliding_window=512,
        swa_layers=[(i + 1) % 6 != 0 for i in range(18)], vocab_size=262144, weights_bytes=246_587_904,
        layer_bytes=[A, A, B, B, A, B, B, A, B, B, A, B, B, A, B, A, A, A], input_bytes=178_257_920, output_bytes=2_560,
        tied_output_bytes=178_257_920,
    )


def host(free: int, total: int | None = None) -> Device:
    return Device(kind="host", name="host", total_bytes=total or free, free_bytes=free)


def gpu(free: int, index: int = 0, total: int | None = None) -> Device:
    return Device(kind="cuda", index=index, name=f"GPU {index}", total_bytes=total or free, free_bytes=free)


def host_for_budget(budget: int) -> Device:
    """A host whose budget (free minus the reserve) is `budget`, to within a byte."""
    free = budget + 512 * MiB
    if free > 10 * GiB:  # past 10 GiB the reserve is 5% of the total
        free = -(-budget * 100 // 95)
    return Device(kind="host", name="host", total_bytes=free, free_bytes=free)


def gpu_for_budget(budget: int, index: int = 0) -> Device:
    """A GPU whose budget is `budget` (reserve: max(256 MiB, 3%))."""
    free = budget + 256 * MiB
    if free * 3 // 100 > 256 * MiB:
        free = -(-budget * 100 // 97)
    return Device(kind="cuda", index=index, name=f"GPU {index}", total_bytes=free, free_bytes=free)

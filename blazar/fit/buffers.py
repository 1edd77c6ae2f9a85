"""The engine's non-weight, non-KV memory: compute (graph) buffers, the output buffer and the process baseline.

Each formula lives in one function with its constants named; docs/10.SCIENTIFIC.md gives the measurements behind them.
"""

from __future__ import annotations

MiB = 1 << 20

# Activations of one graph token, in floats per embedding unit, at the peak of the worst-case (prompt) graph that
# llama_context::sched_reserve reserves. Measured on gemma-3-270m (n_embd 640, llama.cpp build 11434, CPU): the
# non-mask part of the compute buffer is 33-36 KB per token, i.e. 13-14 floats per n_embd; 16 rounds up.
ACT_FLOATS_PER_EMBD = 16
# Extra activations per routed expert (MoE): the gathered expert inputs and outputs per token. Not measured here
# (no MoE model was at hand); an estimate that the calibration projection corrects per model.
MOE_ACT_FLOATS_PER_EMBD = 4
# Process baseline not reported in any buffer line: code and libraries, vocab tables, heap, thread stacks. Measured
# on gemma-3-270m (262k vocab): RssAnon minus anonymous buffers = 29 MiB, RssFile minus the mapped model = 15 MiB.
HOST_ENGINE_FIXED_BYTES = 64 * MiB
# Per GPU an engine uses: the CUDA context, module images and cuBLAS handles (never in a "buffer size" line).
GPU_ENGINE_FIXED_BYTES = 512 * MiB
# An RPC worker holds no CUDA context: its graph allocator and the rpc-server's own buffers (measured: well under
# this with Gemma 3 270M on two loopback workers).
RPC_ENGINE_FIXED_BYTES = 64 * MiB


def graph_tokens(n_ctx: int, n_ubatch: int) -> int:
    """Tokens in the worst-case graph: min(n_ctx, n_ubatch) (llama_context::sched_reserve)."""
    return min(n_ctx, n_ubatch)


def mask_bytes(n_tokens: int, cells: int, flash_attn: bool) -> int:
    """One KQ mask input: [n_kv, n_tokens], f16 with flash attention, f32 without (llm_graph_input_attn_kv)."""
    return n_tokens * cells * (2 if flash_attn else 4)


def compute_bytes(
    *,
    n_tokens: int,
    n_embd: int,
    n_head: int,
    full_cells: int,
    swa_cells: int,
    widest_cells: int,
    flash_attn: bool,
    n_outputs: int,
    n_vocab: int,
    holds_output: bool,
    n_expert_used: int = 0,
) -> int:
    """Compute buffer of one backend that runs transformer layers.

    Graph inputs live for the whole graph, so the KQ masks of both caches add up (full and SWA: n_tokens x cells
    each; a non-unified cache sees n_ctx_seq cells and n_tokens split across streams, which is the same product).
    Without flash attention the largest attention layer also materialises KQ = n_tokens x cells x n_head in f32.
    Activations scale with n_tokens x n_embd; the logits of the graph's outputs sit on the output layer's backend.
    """
    masks = mask_bytes(n_tokens, full_cells, flash_attn) + mask_bytes(n_tokens, swa_cells, flash_attn)
    kq = 0 if flash_attn else n_tokens * widest_cells * n_head * 4
    act = n_tokens * n_embd * 4 * (ACT_FLOATS_PER_EMBD + MOE_ACT_FLOATS_PER_EMBD * n_expert_used)
    logits = n_outputs * n_vocab * 4 if holds_output else 0
    return masks + kq + act + logits


def staging_bytes(*, n_tokens: int, n_embd: int, full_cells: int, swa_cells: int, flash_attn: bool) -> int:
    """Host compute buffer when every layer runs on a GPU: the input embeddings (the token embedding stays on the
    host, llama_model::load_tensors `dev_input`) and the mask inputs before they are copied to the device."""
    masks = mask_bytes(n_tokens, full_cells, flash_attn) + mask_bytes(n_tokens, swa_cells, flash_attn)
    return n_tokens * n_embd * 4 + masks


def output_bytes(*, n_vocab: int, n_embd: int, n_outputs: int, embeddings: bool) -> int:
    """Host output buffer (llama_context::output_reserve): logits n_vocab floats per output row, plus n_embd floats
    per row when embeddings are extracted. Rows = max(n_outputs, n_seq_max); llama-server sets n_outputs_max to the
    slot count for generation and to n_batch for embeddings (server-context.cpp `server_output_limits`)."""
    return 4 * n_outputs * (n_vocab + (n_embd if embeddings else 0))

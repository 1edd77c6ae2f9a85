"""A tiny reranker GGUF written at test time: llama.cpp's `bert` architecture with pooling type rank and a
classifier head (`cls` then `cls.output`, one label), as cross-encoder rerankers (bge-reranker, ms-marco MiniLM) are
converted. The real llama-server loads it with --reranking and scores query and document pairs with it.

Random weights from a fixed seed: its scores rank nothing meaningfully, but they are the model's own (they differ by
document and are the same on every run). A WordPiece vocab of the special tokens and the lowercase letters, alone and
word-initial ("▁a"), so any lowercase English words tokenize letter by letter (anything else is [UNK])."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import PoolingType, TokenType

from blazar.adapters.engines.tiny_model import gguf_file

SEED = 20261205
N_EMBD = 64
N_HEAD = 1  # head_dim 64: a size every attention kernel supports
N_FF = 128
N_LAYER = 2
N_CTX_TRAIN = 512
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# PAD, UNK, CLS, SEP, MASK: the ids the header names below.
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab() -> tuple[list[str], list[int]]:
    tokens = [*SPECIALS, *(f"▁{c}" for c in _LETTERS), *_LETTERS]
    types = [TokenType.CONTROL, TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL]
    types += [TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    return tokens, [int(t) for t in types]


def write_tiny_reranker(path: Path) -> Path:
    """Write the model to `path` (atomically) and return the path; the bytes are the same on every call."""
    rng = np.random.default_rng(SEED)
    tokens, types = _vocab()

    def mat(rows: int, cols: int) -> np.ndarray:
        # numpy (rows, cols) is ggml ne = [cols, rows]: ggml's first dimension is the input width.
        return (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)

    def vec(n: int, value: float = 0.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    with gguf_file(path, "bert") as w:
        w.add_name("blazar-tiny-reranker")
        w.add_context_length(N_CTX_TRAIN)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(N_FF)
        w.add_head_count(N_HEAD)
        w.add_layer_norm_eps(1e-12)
        w.add_causal_attention(False)
        w.add_pooling_type(PoolingType.RANK)
        w.add_classifier_output_labels(["relevant"])
        w.add_file_type(0)  # all F32
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_type_count(2)
        w.add_pad_token_id(0)
        w.add_unk_token_id(1)
        w.add_bos_token_id(2)  # WordPiece's [CLS] is its BOS
        w.add_sep_token_id(3)
        w.add_mask_token_id(4)
        w.add_add_bos_token(True)

        w.add_tensor("token_embd.weight", mat(len(tokens), N_EMBD))
        w.add_tensor("token_types.weight", mat(2, N_EMBD))
        w.add_tensor("position_embd.weight", mat(N_CTX_TRAIN, N_EMBD))
        w.add_tensor("token_embd_norm.weight", vec(N_EMBD, 1.0))
        w.add_tensor("token_embd_norm.bias", vec(N_EMBD))
        for i in range(N_LAYER):
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                w.add_tensor(f"blk.{i}.{name}.weight", mat(N_EMBD, N_EMBD))
                w.add_tensor(f"blk.{i}.{name}.bias", vec(N_EMBD))
            w.add_tensor(f"blk.{i}.attn_output_norm.weight", vec(N_EMBD, 1.0))
            w.add_tensor(f"blk.{i}.attn_output_norm.bias", vec(N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_up.weight", mat(N_FF, N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_up.bias", vec(N_FF))
            w.add_tensor(f"blk.{i}.ffn_down.weight", mat(N_EMBD, N_FF))
            w.add_tensor(f"blk.{i}.ffn_down.bias", vec(N_EMBD))
            w.add_tensor(f"blk.{i}.layer_output_norm.weight", vec(N_EMBD, 1.0))
            w.add_tensor(f"blk.{i}.layer_output_norm.bias", vec(N_EMBD))
        # The classifier head: dense + tanh (cls), then one relevance logit (cls.output).
        w.add_tensor("cls.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor("cls.bias", vec(N_EMBD))
        w.add_tensor("cls.output.weight", mat(1, N_EMBD))
        w.add_tensor("cls.output.bias", vec(1))

    return path

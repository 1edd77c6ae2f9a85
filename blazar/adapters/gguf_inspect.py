"""GGUF inspection: a model file (or the first bytes of a remote one) summarised as `ModelMetadata`.

The model store records the summary in `model.imported`; the memory planner (blazar/fit) plans from it alone.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gguf.constants import LlamaFileType, PoolingType

from blazar.adapters.gguf_header import ArrayValue, ByteSource, GGUFHeader, KVValue, ShortRead, parse_header
from blazar.errors import HeaderIncomplete, ModelFileError
from blazar.events.models import ModelMetadata

__all__ = ["HeaderIncomplete", "header_bytes_needed_hint", "inspect_gguf", "inspect_gguf_header", "inspect_split",
           "inspect_split_headers"]

# First range request for a remote header: holds a whole header with a 256k-token vocabulary (Gemma 3: 6.2 MiB).
header_bytes_needed_hint = 8 * 1024 * 1024

# Tensors llama.cpp places with the output layer (LLM_TENSOR_LAYER_OUTPUT in src/llama-arch.cpp); every other
# tensor outside blk.N is an input tensor (token_embd, per_layer_token_embd, rope_freqs, ...).
_OUTPUT_PREFIXES = ("output.", "output_norm.", "cls.", "cls_norm.", "enc.output_norm.", "dec.output_norm.")
LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h: llama.cpp refuses a model with more


@dataclass(frozen=True)
class SwaRule:
    """How llama.cpp lays out sliding-window layers for one architecture (src/models/<arch>.cpp)."""

    period: int  # 0: every layer; n: one full-attention layer in each n (the last, or the first if dense_first)
    dense_first: bool = False
    default_window: int | None = None  # the window when the file has none; None: no window, no SWA
    fixed_window: int | None = None  # the window llama.cpp uses whatever the file says
    only_block_count: int | None = None  # SWA only in the model with this many blocks


# From load_arch_hparams in llama.cpp's src/models/*.cpp: the period passed to load_swa_pattern (a per-layer
# `{arch}.attention.sliding_window_pattern` array in the file wins, an integer there replaces the period).
# Architectures that always read the pattern array from the file (gemma4, granite_swa, mimo2, step35, ...) need
# no entry. NOTE: modern-bert is left out on purpose: it also turns its last decision layers to full attention.
_SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, default_window=4096),
    "gemma3": SwaRule(6),
    "gemma3n": SwaRule(5),
    "gemma-embedding": SwaRule(6),
    "cohere2": SwaRule(4),
    "cohere2moe": SwaRule(4, dense_first=True),
    "llama4": SwaRule(4, default_window=8192, fixed_window=8192),  # chunked attention, 8192-token chunks
    "gpt-oss": SwaRule(2),
    "olmo2": SwaRule(4),
    "exaone4": SwaRule(4, default_window=4096, only_block_count=64),
    "exaone-moe": SwaRule(4, default_window=128),
    "smallthinker": SwaRule(4, dense_first=True, fixed_window=4096),
    "afmoe": SwaRule(4),
    "plamo3": SwaRule(8),
    "mellum": SwaRule(4),
    "muse-glimmer": SwaRule(4),
    "laguna": SwaRule(4, dense_first=True),
    "deepseek4": SwaRule(0),
}
# llama.cpp ignores these files' sliding_window (phi3: "fix conversion scripts to correctly populate n_swa").
_SWA_IGNORED = frozenset({"phi3"})


def inspect_gguf(path: Path) -> ModelMetadata:
    """Summarise a local GGUF file. Raises ModelFileError naming the file for anything unreadable."""
    return _summarise(_read_file(path), str(path))


def inspect_gguf_header(prefix: bytes, total_size: int, *, source: str = "remote GGUF") -> ModelMetadata:
    """Summarise a GGUF from its first bytes and its full size (both from HTTP range requests).

    Raises HeaderIncomplete, with a lower bound on the prefix length to fetch, when `prefix` ends inside the header.
    """
    return _summarise(_read_prefix(prefix, total_size, source), source)


def inspect_split(paths: list[Path]) -> ModelMetadata:
    """Summarise a split model (`x-00001-of-00003.gguf` ...): metadata from the first part, tensors from all."""
    return _merged([_read_file(p) for p in paths], str(paths[0]))


def inspect_split_headers(parts: list[tuple[bytes, int, str]]) -> ModelMetadata:
    """The remote form of `inspect_split`: (prefix, total size, source) per part, as `inspect_gguf_header` takes."""
    return _merged([_read_prefix(*part) for part in parts], parts[0][2])


def _read_file(path: Path) -> GGUFHeader:
    source = str(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ModelFileError(f"{source}: not a regular file")
        if size == 0:
            raise ModelFileError(f"{source}: empty file (not a GGUF file)")
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = _parse(buf, size, source)
    except FileNotFoundError:
        raise ModelFileError(f"{source}: no such file") from None
    except OSError as exc:
        raise ModelFileError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except ShortRead as short:
        raise _truncated_header(source, short.needed, size) from None
    _check_data_fits(header, size, source)
    return header


def _read_prefix(prefix: bytes, total_size: int, source: str) -> GGUFHeader:
    if total_size < len(prefix):
        raise ModelFileError(f"{source}: total size {total_size} is less than the {len(prefix)} bytes fetched")
    try:
        header = _parse(prefix, len(prefix), source)
    except ShortRead as short:
        if len(prefix) == total_size or short.needed > total_size:
            raise _truncated_header(source, short.needed, total_size) from None
        raise HeaderIncomplete(short.needed, len(prefix), source) from None
    # NOTE: the tensor data is not here to check, but the file's size must still hold every tensor it declares.
    _check_data_fits(header, total_size, source)
    return header


def _merged(headers: list[GGUFHeader], source: str) -> ModelMetadata:
    first = headers[0]
    merged = GGUFHeader(first.version, first.byte_order, first.kv, [t for h in headers for t in h.tensors],
                        first.alignment, first.header_end, first.data_offset)
    return _summarise(merged, source)


def _parse(buf: ByteSource, limit: int, source: str) -> GGUFHeader:
    try:
        return parse_header(buf, limit, source)
    except (ValueError, OverflowError, RecursionError, struct.error) as exc:
        # parse_header reports what it knows; this is the net under it, so no raw error leaves this module
        raise ModelFileError(f"{source}: malformed GGUF header: {exc}") from exc


def _check_data_fits(header: GGUFHeader, size: int, source: str) -> None:
    if header.data_end > size:
        raise ModelFileError(f"{source}: truncated: tensor data ends at byte {header.data_end}, "
                             f"expected at least {header.data_end} bytes, found {size}")


def _truncated_header(source: str, needed: int, size: int) -> ModelFileError:
    return ModelFileError(f"{source}: truncated: the header runs past the end of the file, "
                          f"expected at least {needed} bytes, found {size}")


def _summarise(header: GGUFHeader, source: str) -> ModelMetadata:
    try:
        return summarise(header, source)
    except ValueError as exc:  # pydantic's ValidationError among them
        raise ModelFileError(f"{source}: metadata does not describe a model: {exc}") from exc


def summarise(header: GGUFHeader, source: str) -> ModelMetadata:
    """The metadata summary of a parsed header (pure: no I/O)."""
    kv = _Keys(header.kv, source)
    arch = kv.required_str("general.architecture")
    block_count = kv.required_int(f"{arch}.block_count")
    if not 0 < block_count <= LLAMA_MAX_LAYERS:
        raise ModelFileError(f"{source}: {arch}.block_count is {block_count}, "
                             f"llama.cpp accepts 1 to {LLAMA_MAX_LAYERS}")
    att = f"{arch}.attention"
    kv_heads = kv.int_list(f"{att}.head_count_kv")
    sliding_window, swa_layers = _swa(kv, arch, block_count)
    pooling = _pooling(kv.max_int(f"{arch}.pooling_type"))
    sizes = _tensor_bytes(header, block_count, source, embedding_model=pooling is not None)
    return ModelMetadata(
        architecture=arch,
        name=kv.str_or_none("general.name"),
        gguf_version=header.version,
        # NOTE: counted from the tensors, not general.parameter_count: the file's own word can be stale after a
        # conversion, the tensors cannot. Tied embeddings count once, as stored.
        parameter_count=sum(t.n_elements for t in header.tensors),
        file_type=_file_type(kv.max_int("general.file_type"), header),
        ctx_train=kv.max_int(f"{arch}.context_length"),
        block_count=block_count,
        embedding_length=kv.max_int(f"{arch}.embedding_length"),
        head_count=kv.max_int(f"{att}.head_count"),
        head_count_kv=max(kv_heads) if kv_heads else None,
        head_count_kv_per_layer=kv_heads if kv.is_array(f"{att}.head_count_kv") else None,
        key_length=kv.max_int(f"{att}.key_length"),
        value_length=kv.max_int(f"{att}.value_length"),
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        vocab_size=kv.max_int(f"{arch}.vocab_size") or kv.array_len("tokenizer.ggml.tokens"),
        chat_template=bool(kv.str_or_none("tokenizer.chat_template")),
        embedding_model=pooling is not None,
        pooling_type=pooling,
        expert_count=kv.max_int(f"{arch}.expert_count"),
        expert_used_count=kv.max_int(f"{arch}.expert_used_count"),
        weights_bytes=sizes.weights,
        layer_bytes=sizes.layers,
        input_bytes=sizes.input,
        output_bytes=sizes.output,
        tied_output_bytes=sizes.tied_output,
        tensor_count=len(header.tensors),
    )


class _Keys:
    """Typed reads of the key/values, with errors that name the file and the key."""

    def __init__(self, kv: dict[str, KVValue], source: str) -> None:
        self.kv = kv
        self.source = source

    def _wrong(self, key: str, expected: str) -> ModelFileError:
        return ModelFileError(f"{self.source}: metadata key {key!r} is {self.kv[key]!r}, expected {expected}")

    def required_str(self, key: str) -> str:
        value = self.str_or_none(key)
        if not value:
            raise ModelFileError(f"{self.source}: missing required metadata key {key!r}")
        return value

    def required_int(self, key: str) -> int:
        value = self.max_int(key)
        if value is None:
            raise ModelFileError(f"{self.source}: missing required metadata key {key!r}")
        return value

    def str_or_none(self, key: str) -> str | None:
        value = self.kv.get(key)
        if value is None or isinstance(value, str):
            return value
        raise self._wrong(key, "a string")

    def is_array(self, key: str) -> bool:
        return isinstance(self.kv.get(key), ArrayValue)

    def array_len(self, key: str) -> int | None:
        value = self.kv.get(key)
        return value.count if isinstance(value, ArrayValue) else None

    def int_list(self, key: str) -> list[int] | None:
        """A scalar as a one-item list, an integer array as its items; None when absent."""
        value = self.kv.get(key)
        if value is None:
            return None
        items = value.items if isinstance(value, ArrayValue) else (value,)
        if items is None or not items or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            raise self._wrong(key, "an integer or a short integer array")
        return [int(v) for v in items]

    def max_int(self, key: str) -> int | None:
        # per-layer arrays (context, heads) plan by their largest entry, as llama.cpp sizes its buffers
        values = self.int_list(key)
        return max(values) if values else None

    def bool_list(self, key: str) -> list[bool] | None:
        value = self.kv.get(key)
        if not isinstance(value, ArrayValue):
            return None
        if value.items is None:
            raise self._wrong(key, "a short boolean array")
        return [bool(v) for v in value.items]


def _file_type(raw: int | None, header: GGUFHeader) -> str | None:
    try:
        ftype = LlamaFileType(raw) if raw is not None else None
    except ValueError:
        ftype = None
    if ftype is not None and ftype != LlamaFileType.GUESSED:
        return ftype.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    # No usable general.file_type: name the type holding the most bytes among the matrices (norms and biases are
    # 1-D and stay F32 in every quantisation, as the "except 1d tensors" in llama.h says).
    matrices = [t for t in header.tensors if len(t.dims) > 1] or header.tensors
    by_type: Counter[str] = Counter()
    for t in matrices:
        by_type[t.ggml_type.name] += t.n_bytes
    return max(sorted(by_type), key=by_type.__getitem__) if by_type else None


def _pooling(raw: int | None) -> str | None:
    """The pooling name as llama-server's --pooling spells it; None when unset or NONE (a generative model)."""
    if raw is None or raw == PoolingType.NONE:
        return None
    try:
        return PoolingType(raw).name.lower()
    except ValueError:
        return str(raw)


def _swa(kv: _Keys, arch: str, block_count: int) -> tuple[int | None, list[bool] | None]:
    """(window, per-layer flags) as llama.cpp applies them; (None, None) where no layer slides."""
    window = kv.max_int(f"{arch}.attention.sliding_window")
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    from_file = _fit_layers(kv.bool_list(pattern_key), block_count)
    if arch in _SWA_IGNORED:
        return None, None
    rule = _SWA_RULES.get(arch)
    if rule is None:
        # unknown architecture: report what the file says, guess no pattern
        return (window or None), from_file
    if rule.only_block_count is not None and block_count != rule.only_block_count:
        return None, None
    if window is None:
        window = rule.default_window
    if not window:
        return None, None
    window = rule.fixed_window or window
    if from_file is not None:
        return window, from_file
    period = kv.max_int(pattern_key)  # an integer in the file replaces the architecture's period
    return window, _expand(rule.period if period is None else period, rule.dense_first, block_count)


def _expand(period: int, dense_first: bool, block_count: int) -> list[bool]:
    # llama_hparams::set_swa_pattern (src/llama-hparams.cpp)
    if period == 0:
        return [True] * block_count
    if dense_first:
        return [il % period != 0 for il in range(block_count)]
    return [il % period < period - 1 for il in range(block_count)]


def _fit_layers(flags: list[bool] | None, block_count: int) -> list[bool] | None:
    # llama.cpp's per-layer array is zero-filled past the file's entries; extra entries (MTP layers) are not blocks
    if flags is None:
        return None
    return (flags + [False] * block_count)[:block_count]


class _Bytes(NamedTuple):
    weights: int
    layers: list[int]
    input: int
    output: int
    tied_output: int


def _tensor_bytes(header: GGUFHeader, block_count: int, source: str, *, embedding_model: bool) -> _Bytes:
    """Every tensor counted exactly once: layer_bytes + input_bytes + output_bytes == weights_bytes."""
    layer_bytes = [0] * block_count
    input_bytes = output_bytes = 0
    names = {t.name: t for t in header.tensors}
    for t in header.tensors:
        block = _block_index(t.name)
        if block is not None:
            if block >= LLAMA_MAX_LAYERS:
                raise ModelFileError(f"{source}: tensor {t.name!r} is past llama.cpp's {LLAMA_MAX_LAYERS}-layer limit")
            if block >= len(layer_bytes):
                # blocks past block_count (e.g. MTP heads) keep their bytes in the sum rather than vanish
                layer_bytes.extend([0] * (block + 1 - len(layer_bytes)))
            layer_bytes[block] += t.n_bytes
        elif t.name.startswith(_OUTPUT_PREFIXES):
            output_bytes += t.n_bytes
        else:
            input_bytes += t.n_bytes
    # NOTE: a tied head is counted once, in input_bytes, where the file stores it; the copy llama.cpp makes for an
    # offloaded output layer (TENSOR_DUPLICATED in src/llama-model-loader.cpp) is reported on its own.
    embd = names.get("token_embd.weight")
    tied = "output.weight" not in names and embd is not None and not embedding_model
    tied_bytes = embd.n_bytes if tied and embd is not None else 0
    return _Bytes(sum(t.n_bytes for t in header.tensors), layer_bytes, input_bytes, output_bytes, tied_bytes)


def _block_index(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    index, _, _ = name[4:].partition(".")
    return int(index) if index.isascii() and index.isdigit() else None



"""The GGUF header, parsed from bytes: key/values, tensor infos and the byte layout, nothing more.

Used by `gguf_inspect` on a whole local file (memory-mapped) and on a remote prefix fetched by range requests.
It walks the header once with `struct`, never reads tensor data, and reports exactly where bytes ran out.

NOTE: not gguf.GGUFReader: that builds numpy views for every token string and score (10.6 s for Gemma 3's 262k
vocabulary, against 0.13 s here), needs the whole file to memory-map, and fails on a short one with raw numpy
errors. The gguf package still supplies the constants; tests check this parser against GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from blazar.errors import ModelFileError, ShortRead

SUPPORTED_VERSIONS = (2, 3)  # version 1 used 32-bit counts and predates every model we can serve
GGML_MAX_DIMS = 4

# struct codes of the fixed-size value types; STRING and ARRAY are walked
_SCALAR_CODES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
# Numeric arrays longer than this (tokenizer scores, token types) are counted, not decoded: nothing we summarise
# reads them, and per-layer arrays are far shorter (llama.cpp caps layers at 512).
DECODE_LIMIT = 4096
# The smallest a key/value entry can be (key length, value type, a one-byte value) and a tensor info (name
# length, dim count, type, offset): used to turn "ran out at byte N" into a lower bound on the whole header.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
_MAX_ARRAY_DEPTH = 8  # GGUF allows arrays of arrays; no model nests them, a hostile file could nest thousands


@dataclass(frozen=True)
class ArrayValue:
    """A GGUF array: its element type and length; `items` only for short numeric arrays."""

    item_type: GGUFValueType
    count: int
    items: tuple[int | float | bool, ...] | None = None
    # Where its elements lie in the buffer, [start, end): lets a caller hash a long array (the token list) unread.
    span: tuple[int, int] | None = field(default=None, compare=False)


KVValue = int | float | bool | str | ArrayValue
ByteSource = bytes | bytearray | mmap.mmap


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length
    ggml_type: GGMLQuantizationType
    offset: int  # relative to the start of the data section
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    byte_order: str  # "<" or ">"
    kv: dict[str, KVValue]
    tensors: list[TensorInfo]
    alignment: int
    header_end: int  # first byte after the tensor infos
    data_offset: int  # header_end rounded up to the alignment
    data_end: int = field(init=False)  # the least file size that holds every tensor

    def __post_init__(self) -> None:
        end = max((t.offset + t.n_bytes for t in self.tensors), default=0)
        object.__setattr__(self, "data_end", self.data_offset + end)




class _Cursor:
    def __init__(self, buf: ByteSource, limit: int, source: str) -> None:
        self.buf = buf
        self.limit = limit
        self.source = source
        self.pos = 0
        self.order = "<"

    def take(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(self.order + fmt)
        if self.pos + size > self.limit:
            raise ShortRead(self.pos + size)
        values = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += size
        return values

    def u32(self) -> int:
        return int(self.take("I")[0])

    def u64(self) -> int:
        return int(self.take("Q")[0])

    def raw(self, n: int) -> bytes:
        if self.pos + n > self.limit:
            raise ShortRead(self.pos + n)
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if self.pos + n > self.limit:
            raise ShortRead(self.pos + n)
        self.pos += n

    def string(self, what: str) -> str:
        at = self.pos
        data = self.raw(self.u64())
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} at byte {at} is not UTF-8") from None

    def error(self, detail: str) -> ModelFileError:
        return ModelFileError(f"{self.source}: {detail}")


def parse_header(buf: ByteSource, limit: int, source: str) -> GGUFHeader:
    """Parse the header held in `buf[:limit]`. Raises ModelFileError, or ShortRead when `limit` is too small."""
    cur = _Cursor(buf, limit, source)
    version = _read_preamble(cur)
    tensor_count, kv_count = cur.u64(), cur.u64()
    kv = _read_kv(cur, kv_count, tensor_count)
    tensors = _read_tensor_infos(cur, tensor_count)
    alignment = _alignment(cur, kv)
    header_end = cur.pos
    data_offset = -(-header_end // alignment) * alignment
    return GGUFHeader(version, cur.order, kv, tensors, alignment, header_end, data_offset)


def _read_preamble(cur: _Cursor) -> int:
    magic_bytes = cur.raw(4)
    if struct.unpack("<I", magic_bytes)[0] != GGUF_MAGIC:
        raise cur.error(f"not a GGUF file (magic {magic_bytes!r}, expected b'GGUF')")
    version = cur.u32()
    if version & 0xFFFF == 0:
        # a file written on a big-endian machine reads as 0x0N000000 here (the gguf reader's own test)
        cur.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(map(str, SUPPORTED_VERSIONS))
        raise cur.error(f"unsupported GGUF version {version} (supported: {supported})")
    return version


def _read_kv(cur: _Cursor, count: int, tensor_count: int) -> dict[str, KVValue]:
    kv: dict[str, KVValue] = {}
    for i in range(count):
        try:
            key = cur.string("a key")
            value = _read_value(cur, _value_type(cur, cur.u32(), key))
        except ShortRead as short:
            rest = (count - i - 1) * _MIN_KV_BYTES + tensor_count * _MIN_TENSOR_INFO_BYTES
            raise ShortRead(short.needed + rest) from None
        if key in kv:
            raise cur.error(f"duplicate key {key!r}")
        kv[key] = value
    return kv


def _value_type(cur: _Cursor, raw: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.error(f"key {key!r} has unknown value type {raw}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType) -> KVValue:
    code = _SCALAR_CODES.get(vtype)
    if code is not None:
        value: KVValue = cur.take(code)[0]
        return value
    if vtype == GGUFValueType.STRING:
        return cur.string("a string value")
    return _read_array(cur, depth=1)


def _read_array(cur: _Cursor, depth: int) -> ArrayValue:
    if depth > _MAX_ARRAY_DEPTH:
        raise cur.error(f"arrays nested deeper than {_MAX_ARRAY_DEPTH} at byte {cur.pos}")
    item_type = _value_type(cur, cur.u32(), "an array")
    count = cur.u64()
    start = cur.pos
    code = _SCALAR_CODES.get(item_type)
    if code is not None:
        size = struct.calcsize(code)
        if count <= DECODE_LIMIT:
            return ArrayValue(item_type, count, cur.take(f"{count}{code}"), span=(start, cur.pos))
        cur.skip(count * size)
        return ArrayValue(item_type, count, span=(start, cur.pos))
    # strings and nested arrays: walk each element, since only its own length says where the next begins
    min_item = 8 if item_type == GGUFValueType.STRING else 4 + 8
    for i in range(count):
        try:
            if item_type == GGUFValueType.STRING:
                cur.skip(cur.u64())
            else:
                _read_array(cur, depth + 1)
        except ShortRead as short:
            raise ShortRead(short.needed + (count - i - 1) * min_item) from None
    return ArrayValue(item_type, count, span=(start, cur.pos))


def _read_tensor_infos(cur: _Cursor, count: int) -> list[TensorInfo]:
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for i in range(count):
        try:
            info = _read_tensor_info(cur)
        except ShortRead as short:
            raise ShortRead(short.needed + (count - i - 1) * _MIN_TENSOR_INFO_BYTES) from None
        if info.name in names:
            raise cur.error(f"duplicate tensor {info.name!r}")
        names.add(info.name)
        tensors.append(info)
    return tensors


def _read_tensor_info(cur: _Cursor) -> TensorInfo:
    name = cur.string("a tensor name")
    n_dims = cur.u32()
    if n_dims > GGML_MAX_DIMS:
        raise cur.error(f"tensor {name!r} has {n_dims} dimensions (GGML allows at most {GGML_MAX_DIMS})")
    dims = tuple(int(d) for d in cur.take(f"{n_dims}Q"))
    raw_type = cur.u32()
    offset = cur.u64()
    try:
        ggml_type = GGMLQuantizationType(raw_type)
        block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    except (ValueError, KeyError):
        raise cur.error(f"tensor {name!r} has unknown type {raw_type}") from None
    if dims and dims[0] % block_size:
        raise cur.error(f"tensor {name!r}: row length {dims[0]} is not a multiple of the {ggml_type.name} "
                        f"block size {block_size}")
    n_elements = 1
    for d in dims:
        n_elements *= d
    return TensorInfo(name, dims, ggml_type, offset, n_elements, n_elements // block_size * type_size)


def _alignment(cur: _Cursor, kv: dict[str, KVValue]) -> int:
    value = kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    # the same rule as gguf.c: a u32 power of two
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise cur.error(f"invalid general.alignment {value!r} (must be a power of two)")
    return value

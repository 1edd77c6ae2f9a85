"""GGUF inspection: factory files summarise to exactly the metadata their geometry implies; bad files get clear
errors naming the file; a remote header prefix gives the same summary as the whole file."""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType, LlamaFileType

from blazar.adapters.gguf_header import GGUFHeader, TensorInfo, parse_header
from blazar.adapters.gguf_inspect import (
    HeaderIncomplete,
    header_bytes_needed_hint,
    inspect_gguf,
    inspect_gguf_header,
    summarise,
)
from blazar.errors import ModelFileError
from blazar.events.models import ModelMetadata
from tests.support import gguf_factory as factory

FACTORIES: dict[str, Callable[..., factory.Spec]] = {
    "plain": factory.write_plain,
    "gqa": factory.write_gqa,
    "swa": factory.write_swa,
    "moe": factory.write_moe,
    "missing_metadata": factory.write_missing_metadata,
    "embedding": factory.write_embedding,
}


def q8(n_elements: int) -> int:
    """Bytes of n Q8_0 elements: blocks of 32 in 34 bytes (an f16 scale and 32 int8)."""
    return n_elements // 32 * 34


def reference_bytes(path: Path) -> dict[str, object]:
    """Sizes as the gguf package's own reader sees them: an oracle independent of blazar's parser."""
    tensors = GGUFReader(path).tensors
    per_layer: dict[int, int] = {}
    for t in tensors:
        if t.name.startswith("blk."):
            n = int(t.name.split(".")[1])
            per_layer[n] = per_layer.get(n, 0) + int(t.n_bytes)
    return {
        "weights_bytes": sum(int(t.n_bytes) for t in tensors),
        "parameter_count": sum(int(t.n_elements) for t in tensors),
        "layer_bytes": [per_layer[n] for n in sorted(per_layer)],
        "tensor_count": len(tensors),
        "data_end": max(int(t.data_offset) + int(t.n_bytes) for t in tensors),
    }


@pytest.fixture(params=sorted(FACTORIES))
def factory_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / f"{request.param}.gguf"
    FACTORIES[request.param](path)
    return path


# --- each factory file, exactly ---------------------------------------------------------------------------------


def test_plain_model_inspects_to_exact_metadata(tmp_path: Path) -> None:
    path = tmp_path / "plain.gguf"
    factory.write_plain(path)
    embd_bytes = q8(32 * 64)
    layer = 2 * 64 * 4 + q8(4 * 64 * 64) + q8(3 * 64 * 64)  # two f32 norms, q/k/v/o, gate/up/down
    assert inspect_gguf(path) == ModelMetadata(
        architecture="llama", name="tiny", gguf_version=3,
        parameter_count=32 * 64 * 2 + 3 * (2 * 64 + 7 * 64 * 64) + 64,
        file_type="Q8_0", ctx_train=2048, block_count=3, embedding_length=64, head_count=4, head_count_kv=4,
        vocab_size=32, chat_template=True,
        weights_bytes=embd_bytes + 3 * layer + 64 * 4 + embd_bytes, layer_bytes=[layer] * 3,
        input_bytes=embd_bytes, output_bytes=64 * 4 + embd_bytes, tensor_count=1 + 3 * 9 + 2,
    )


def test_every_factory_file_agrees_with_the_gguf_reader(factory_file: Path) -> None:
    meta = inspect_gguf(factory_file)
    ref = reference_bytes(factory_file)
    assert meta.weights_bytes == ref["weights_bytes"]
    assert meta.parameter_count == ref["parameter_count"]
    assert meta.layer_bytes == ref["layer_bytes"]
    assert meta.tensor_count == ref["tensor_count"]
    assert sum(meta.layer_bytes) + meta.input_bytes + meta.output_bytes == meta.weights_bytes
    assert len(meta.layer_bytes) == meta.block_count


def test_gqa_reports_fewer_kv_heads_and_the_head_lengths(tmp_path: Path) -> None:
    factory.write_gqa(tmp_path / "gqa.gguf", kv_heads=2, key_length=32, value_length=16)
    meta = inspect_gguf(tmp_path / "gqa.gguf")
    assert (meta.head_count, meta.head_count_kv, meta.head_count_kv_per_layer) == (8, 2, None)
    assert (meta.key_length, meta.value_length) == (32, 16)


def test_per_layer_kv_heads_keep_the_array_and_report_the_largest(tmp_path: Path) -> None:
    factory.write_plain(tmp_path / "m.gguf", kv_heads=[4, 2, 1])
    meta = inspect_gguf(tmp_path / "m.gguf")
    assert meta.head_count_kv == 4
    assert meta.head_count_kv_per_layer == [4, 2, 1]


def test_geometry_follows_the_spec(tmp_path: Path) -> None:
    spec = factory.write_plain(tmp_path / "m.gguf", blocks=4, heads=2, kv_heads=1, ctx=8192, key_length=32)
    meta = inspect_gguf(tmp_path / "m.gguf")
    assert (meta.block_count, meta.head_count, meta.head_count_kv, meta.ctx_train) == (4, 2, 1, 8192)
    assert (meta.key_length, meta.value_length) == (spec.key_length, None)
    assert len(meta.layer_bytes) == 4


def test_gemma3_uses_llama_cpp_pattern_of_five_sliding_layers_then_one_full(tmp_path: Path) -> None:
    factory.write_swa(tmp_path / "swa.gguf")
    meta = inspect_gguf(tmp_path / "swa.gguf")
    assert meta.architecture == "gemma3"
    assert meta.sliding_window == 16
    assert meta.swa_layers == [True] * 5 + [False] + [True] * 2
    assert meta.chat_template is True


def test_tied_embeddings_count_once_in_input_and_report_the_copy_separately(tmp_path: Path) -> None:
    factory.write_swa(tmp_path / "swa.gguf")  # no output.weight
    meta = inspect_gguf(tmp_path / "swa.gguf")
    embd_bytes = q8(32 * 32)
    assert meta.input_bytes == embd_bytes
    assert meta.output_bytes == 32 * 4  # output_norm only
    assert meta.tied_output_bytes == embd_bytes
    factory.write_plain(tmp_path / "plain.gguf")
    assert inspect_gguf(tmp_path / "plain.gguf").tied_output_bytes == 0


def test_a_per_layer_pattern_array_in_the_file_wins(tmp_path: Path) -> None:
    pattern = [True, False, False, True, True, False, True, False]
    factory.write_swa(tmp_path / "swa.gguf", swa_pattern=pattern)
    assert inspect_gguf(tmp_path / "swa.gguf").swa_layers == pattern


def test_an_integer_pattern_in_the_file_replaces_the_period(tmp_path: Path) -> None:
    factory.write_swa(tmp_path / "swa.gguf", swa_pattern=4)
    assert inspect_gguf(tmp_path / "swa.gguf").swa_layers == [True, True, True, False] * 2


def test_gemma3_without_a_window_has_no_sliding_layers(tmp_path: Path) -> None:
    factory.write_swa(tmp_path / "swa.gguf", sliding_window=None)
    meta = inspect_gguf(tmp_path / "swa.gguf")
    assert (meta.sliding_window, meta.swa_layers) == (None, None)


def test_unknown_architecture_keeps_the_window_but_not_a_guessed_pattern(tmp_path: Path) -> None:
    factory.write_plain(tmp_path / "m.gguf", sliding_window=128)
    meta = inspect_gguf(tmp_path / "m.gguf")
    assert (meta.sliding_window, meta.swa_layers) == (128, None)


T, F = True, False


@pytest.mark.parametrize(("arch", "blocks", "window", "expected_window", "expected_layers"), [
    ("gemma2", 4, None, 4096, [T, F, T, F]),  # default window 4096, period 2
    ("gpt-oss", 4, 128, 128, [T, F, T, F]),
    ("gemma3n", 5, 512, 512, [T, T, T, T, F]),
    ("cohere2", 4, 4096, 4096, [T, T, T, F]),
    ("cohere2moe", 5, 4096, 4096, [F, T, T, T, F]),  # dense first
    ("llama4", 4, 1000, 8192, [T, T, T, F]),  # chunked attention: always 8192-token chunks
    ("llama4", 4, None, 8192, [T, T, T, F]),
    ("llama4", 4, 0, None, None),  # an explicit 0 turns chunking off
    ("exaone4", 4, 4096, None, None),  # only the 64-block model slides
    ("phi3", 2, 2048, None, None),  # llama.cpp ignores phi3's window
    ("deepseek4", 3, 128, 128, [T, T, T]),
])
def test_architecture_swa_table(tmp_path: Path, arch: str, blocks: int, window: int | None,
                                expected_window: int | None, expected_layers: list[bool] | None) -> None:
    factory.write_swa(tmp_path / "m.gguf", arch=arch, blocks=blocks, sliding_window=window)
    meta = inspect_gguf(tmp_path / "m.gguf")
    assert (meta.sliding_window, meta.swa_layers) == (expected_window, expected_layers)


def test_moe_reports_experts_and_keeps_expert_tensors_in_their_layer(tmp_path: Path) -> None:
    factory.write_moe(tmp_path / "moe.gguf")
    meta = inspect_gguf(tmp_path / "moe.gguf")
    assert (meta.expert_count, meta.expert_used_count) == (4, 2)
    router = q8(4 * 64)
    experts = 3 * q8(4 * 32 * 64)
    attention = q8(4 * 64 * 64)
    assert meta.layer_bytes == [2 * 64 * 4 + attention + router + experts] * 2


def test_missing_metadata_gives_none_and_falls_back_to_the_dominant_tensor_type(tmp_path: Path) -> None:
    factory.write_missing_metadata(tmp_path / "m.gguf")
    meta = inspect_gguf(tmp_path / "m.gguf")
    assert (meta.name, meta.ctx_train, meta.head_count_kv, meta.chat_template) == (None, None, None, False)
    assert meta.file_type == "Q8_0"
    assert meta.head_count == 4


@pytest.mark.parametrize(("file_type", "weight_type", "expected"), [
    (LlamaFileType.MOSTLY_Q4_K_M, GGMLQuantizationType.Q8_0, "Q4_K_M"),  # the file's word wins
    (LlamaFileType.ALL_F32, GGMLQuantizationType.F32, "F32"),
    (LlamaFileType.GUESSED, GGMLQuantizationType.F16, "F16"),  # "guessed" says nothing: count the bytes
    (None, GGMLQuantizationType.F16, "F16"),
])
def test_file_type_names(tmp_path: Path, file_type: LlamaFileType | None, weight_type: GGMLQuantizationType,
                         expected: str) -> None:
    factory.write_plain(tmp_path / "m.gguf", file_type=file_type, weight_type=weight_type)
    assert inspect_gguf(tmp_path / "m.gguf").file_type == expected


def test_embedding_model_reports_pooling_and_no_tied_head(tmp_path: Path) -> None:
    factory.write_embedding(tmp_path / "e.gguf")
    meta = inspect_gguf(tmp_path / "e.gguf")
    assert (meta.embedding_model, meta.pooling_type, meta.chat_template) == (True, "mean", False)
    assert meta.file_type == "F16"
    assert meta.tied_output_bytes == 0


def test_vocab_size_key_is_read_when_present(tmp_path: Path) -> None:
    factory.write_plain(tmp_path / "m.gguf", vocab_size_key=True, drop_keys=("tokenizer.ggml.tokens",))
    assert inspect_gguf(tmp_path / "m.gguf").vocab_size == 32


# --- errors -------------------------------------------------------------------------------------------------------


def patched(tmp_path: Path, offset: int, data: bytes) -> Path:
    path = tmp_path / "patched.gguf"
    factory.write_plain(path)
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))
    return path


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.gguf"
    with pytest.raises(ModelFileError, match="no such file") as err:
        inspect_gguf(path)
    assert str(path) in err.value.message
    assert err.value.code == "invalid_model_file"
    assert err.value.exit_code == 2


def test_a_directory_is_not_a_model_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not a regular file"):
        inspect_gguf(tmp_path)


def test_empty_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty file"):
        inspect_gguf(tmp_path / "empty.gguf")


def test_random_bytes_are_not_gguf(tmp_path: Path) -> None:
    (tmp_path / "noise.gguf").write_bytes(random.Random(1).randbytes(4096))
    with pytest.raises(ModelFileError, match=r"not a GGUF file \(magic"):
        inspect_gguf(tmp_path / "noise.gguf")


def test_wrong_magic_names_the_bytes_found(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"not a GGUF file \(magic b'GGML'"):
        inspect_gguf(patched(tmp_path, 0, b"GGML"))


def test_unsupported_version_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"unsupported GGUF version 7 \(supported: 2, 3\)"):
        inspect_gguf(patched(tmp_path, 4, struct.pack("<I", 7)))


def test_truncated_tensor_data_says_how_many_bytes_it_needs(tmp_path: Path) -> None:
    whole, cut = tmp_path / "whole.gguf", tmp_path / "cut.gguf"
    factory.write_plain(whole)
    factory.write_truncated(cut, cut=100)
    data_offset = GGUFReader(whole).data_offset
    expected = reference_bytes(whole)["data_end"]
    assert expected == whole.stat().st_size  # the last tensor ends the file
    found = whole.stat().st_size - 100
    with pytest.raises(ModelFileError, match=f"truncated: .* expected at least {expected} bytes, found {found}"):
        inspect_gguf(cut)
    assert data_offset < found


def test_a_file_cut_inside_the_header_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    factory.write_plain(path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ModelFileError, match="truncated: the header runs past the end of the file, "
                                             r"expected at least \d+ bytes, found 300"):
        inspect_gguf(path)


@pytest.mark.parametrize("key", ["general.architecture", "llama.block_count"])
def test_missing_required_metadata_names_the_key(tmp_path: Path, key: str) -> None:
    factory.write_plain(tmp_path / "m.gguf", drop_keys=(key,))
    with pytest.raises(ModelFileError, match=f"missing required metadata key '{key}'"):
        inspect_gguf(tmp_path / "m.gguf")


def test_a_key_of_the_wrong_type_is_named() -> None:
    header = GGUFHeader(3, "<", {"general.architecture": "llama", "llama.block_count": "three"}, [], 32, 0, 0)
    with pytest.raises(ModelFileError, match=r"metadata key 'llama\.block_count' is 'three', expected an integer"):
        summarise(header, "m.gguf")


@pytest.mark.parametrize("blocks", [0, 2**40])
def test_an_implausible_block_count_is_refused_before_any_allocation(blocks: int) -> None:
    header = GGUFHeader(3, "<", {"general.architecture": "llama", "llama.block_count": blocks}, [], 32, 0, 0)
    with pytest.raises(ModelFileError, match=f"llama.block_count is {blocks}, llama.cpp accepts 1 to 512"):
        summarise(header, "m.gguf")


def test_a_block_past_llama_cpp_limit_is_refused() -> None:
    tensor = TensorInfo("blk.600.attn_q.weight", (32,), GGMLQuantizationType.F32, 0, 32, 128)
    header = GGUFHeader(3, "<", {"general.architecture": "llama", "llama.block_count": 2}, [tensor], 32, 0, 0)
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.600\.attn_q\.weight' is past llama\.cpp's 512-layer limit"):
        summarise(header, "m.gguf")


def gguf_bytes(kv_payload: bytes, kv_count: int = 1, tensor_count: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count) + kv_payload


def gguf_string(s: str) -> bytes:
    return struct.pack("<Q", len(s)) + s.encode()


@pytest.mark.parametrize(("payload", "message"), [
    (gguf_string("k") + struct.pack("<I", 99), "key 'k' has unknown value type 99"),
    (gguf_string("k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 20, "arrays nested deeper than 8"),
    (struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<II", 4, 1), "a key at byte 24 is not UTF-8"),
])
def test_malformed_headers_get_a_clear_error(tmp_path: Path, payload: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(gguf_bytes(payload) + bytes(64))
    with pytest.raises(ModelFileError, match=message):
        inspect_gguf(path)


def test_a_huge_claimed_count_is_a_truncation_not_a_hang(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(gguf_bytes(b"", kv_count=2**62))
    with pytest.raises(ModelFileError, match="truncated"):
        inspect_gguf(path)


def test_damaged_headers_only_ever_raise_model_file_error(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    factory.write_swa(path, swa_pattern=[True, False] * 4)
    original = path.read_bytes()
    header_end = parse_header(original, len(original), "m").header_end
    rng = random.Random(7)
    for _ in range(300):
        raw = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(header_end)] = rng.randrange(256)
        path.write_bytes(bytes(raw[:rng.choice([len(raw), rng.randrange(1, len(raw))])]))
        with contextlib.suppress(ModelFileError):  # any other exception fails the test
            inspect_gguf(path)


# --- remote headers -------------------------------------------------------------------------------------------------


def test_remote_header_gives_the_same_metadata_as_the_whole_file(factory_file: Path) -> None:
    data = factory_file.read_bytes()
    header_end = parse_header(data, len(data), "f").header_end
    local = inspect_gguf(factory_file)
    assert inspect_gguf_header(data[:header_end], len(data)) == local
    assert inspect_gguf_header(data[:header_bytes_needed_hint], len(data)) == local


def test_a_short_prefix_asks_for_a_lower_bound_that_converges(factory_file: Path) -> None:
    data = factory_file.read_bytes()
    header_end = parse_header(data, len(data), "f").header_end
    have, rounds = 10, 0
    while True:
        try:
            meta = inspect_gguf_header(data[:have], len(data), source="hub:x/y")
            break
        except HeaderIncomplete as exc:
            assert isinstance(exc, ModelFileError)
            assert have < exc.needed_bytes <= header_end  # progress, and never more than the header
            assert exc.have_bytes == have
            assert "hub:x/y" in exc.message
            have, rounds = exc.needed_bytes, rounds + 1
    assert meta == inspect_gguf(factory_file)
    assert rounds >= 1


def test_a_prefix_inside_the_magic_asks_for_the_preamble(tmp_path: Path) -> None:
    factory.write_plain(tmp_path / "m.gguf")
    data = (tmp_path / "m.gguf").read_bytes()
    tensor_count, kv_count = struct.unpack_from("<QQ", data, 8)
    with pytest.raises(HeaderIncomplete) as err:
        inspect_gguf_header(data[:2], len(data))
    assert err.value.needed_bytes == 4  # the magic
    with pytest.raises(HeaderIncomplete) as err:
        inspect_gguf_header(data[:24], len(data))
    # the first key's length, then the least every other key/value and tensor info can take
    assert err.value.needed_bytes == 24 + 8 + (kv_count - 1) * 13 + tensor_count * 24


def test_remote_header_refuses_what_cannot_be_gguf(tmp_path: Path) -> None:
    factory.write_plain(tmp_path / "m.gguf")
    data = (tmp_path / "m.gguf").read_bytes()
    with pytest.raises(ModelFileError, match="not a GGUF file") as err:
        inspect_gguf_header(b"<!DOCTYPE html>" + data, len(data) + 15)
    assert not isinstance(err.value, HeaderIncomplete)
    with pytest.raises(ModelFileError, match="truncated: tensor data ends at byte"):
        inspect_gguf_header(data[:4096], len(data) - 1000)  # the claimed size cannot hold the tensors
    with pytest.raises(ModelFileError, match="truncated: the header runs past the end of the file"):
        inspect_gguf_header(data[:300], 300)  # the whole "file" is a header fragment
    with pytest.raises(ModelFileError, match="less than the"):
        inspect_gguf_header(data, 10)

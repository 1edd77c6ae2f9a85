"""GGUF inspection against the real Gemma 3 270M Q4_K_M: the numbers the memory planner will plan from."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.adapters.gguf_header import parse_header
from blazar.adapters.gguf_inspect import header_bytes_needed_hint, inspect_gguf, inspect_gguf_header
from blazar.events.models import ModelMetadata


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> ModelMetadata:
    return inspect_gguf(gemma_path)


def test_gemma3_geometry(gemma: ModelMetadata) -> None:
    assert gemma.architecture == "gemma3"
    assert gemma.name == "Gemma 3 270m"
    assert gemma.file_type == "Q4_K_M"
    assert (gemma.block_count, gemma.ctx_train, gemma.embedding_length) == (18, 32768, 640)
    assert (gemma.head_count, gemma.head_count_kv, gemma.head_count_kv_per_layer) == (4, 1, None)
    assert (gemma.key_length, gemma.value_length) == (256, 256)
    assert gemma.vocab_size == 262144
    assert (gemma.embedding_model, gemma.expert_count) == (False, None)


def test_gemma3_slides_five_layers_in_six_like_llama_cpp(gemma: ModelMetadata) -> None:
    assert gemma.sliding_window == 512
    assert gemma.swa_layers == ([True] * 5 + [False]) * 3


def test_this_gguf_carries_no_chat_template(gemma: ModelMetadata) -> None:
    # NOTE: this build of the file has no tokenizer.chat_template key (llama-server falls back to its own)
    assert gemma.chat_template is False


def test_gemma3_parameters_and_bytes(gemma: ModelMetadata, gemma_path: Path) -> None:
    assert gemma.parameter_count == 268_098_176
    assert 2.5e8 < gemma.parameter_count < 2.9e8
    assert gemma.tensor_count == 236
    size = gemma_path.stat().st_size
    with gemma_path.open("rb") as f:
        header = f.read(header_bytes_needed_hint)
    data_offset = parse_header(header, len(header), str(gemma_path)).data_offset
    assert 0 <= size - gemma.weights_bytes <= data_offset
    assert gemma.weights_bytes == 246_587_904
    assert sum(gemma.layer_bytes) + gemma.input_bytes + gemma.output_bytes == gemma.weights_bytes
    assert len(gemma.layer_bytes) == 18
    # tied embeddings: the Q8_0 token_embd (640 x 262144) is the input and, copied, the head
    assert gemma.input_bytes == gemma.tied_output_bytes == 640 * 262144 // 32 * 34
    assert gemma.output_bytes == 640 * 4  # output_norm


def test_first_range_request_is_enough_for_gemma_and_matches_the_file(gemma: ModelMetadata, gemma_path: Path) -> None:
    with gemma_path.open("rb") as f:
        prefix = f.read(header_bytes_needed_hint)
    assert inspect_gguf_header(prefix, gemma_path.stat().st_size) == gemma

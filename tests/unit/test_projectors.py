"""Projectors (llama.cpp's --mmproj files): their header read into `ProjectorMetadata`, and the catalog fed
`model.projector_set` / `model.projector_removed`: the model's `.projector`, its capabilities, a variant's, a path the
log could use to lead out of the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.adapters.mmproj_inspect import inspect_projector
from blazar.errors import ModelFileError
from blazar.events.model_settings import ModelSettings, ModelVariantCreated
from blazar.events.models import ModelMetadata, ModelRemoved
from blazar.events.projectors import EncoderShape, ModelProjectorRemoved, ModelProjectorSet, ProjectorMetadata
from blazar.projections import CatalogProjection, fold
from blazar.projections.catalog import CatalogState, projector_users, stored
from blazar.store.chat_templates import capabilities
from blazar.store.projectors import projector_info
from tests.support import gguf_factory
from tests.support.events import rec
from tests.support.tiny_mmproj import IMAGE_SIZE, PATCH_SIZE, SCALE_FACTOR, write_tiny_mmproj
from tests.unit.test_catalog import imported

VISION = ProjectorMetadata(projector_type="gemma3", modalities=["vision"], weights_bytes=242_944, tensor_count=23,
                           vision=EncoderShape(embedding_length=64, block_count=1, head_count=1, projection_dim=640,
                                               image_size=112, patch_size=14, scale_factor=2))
SHA = "cd" * 32


def projector_set(name: str, path: str = f"mmproj/{SHA}.gguf", meta: ProjectorMetadata = VISION) -> ModelProjectorSet:
    return ModelProjectorSet(name=name, path=path, source="/src/mmproj.gguf", bytes=242_944 + 1024, sha256=SHA,
                             linked=True, metadata=meta)


# -- the header ------------------------------------------------------------------------------------------------


def test_the_tiny_projector_header_says_vision_gemma3_its_geometry_and_weights(tmp_path: Path) -> None:
    path = write_tiny_mmproj(tmp_path / "mmproj.gguf")
    meta = inspect_projector(path)
    assert meta.modalities == ["vision"] and meta.projector_type == "gemma3" and meta.audio is None
    assert meta.vision is not None
    assert (meta.vision.image_size, meta.vision.patch_size, meta.vision.scale_factor) == (IMAGE_SIZE, PATCH_SIZE,
                                                                                         SCALE_FACTOR)
    assert meta.vision.projection_dim == 640 and meta.vision.embedding_length == 64
    # every tensor's bytes, and no more than the file holds (the header and alignment are the rest)
    assert 0 < meta.weights_bytes < path.stat().st_size and meta.tensor_count == 23
    assert inspect_projector(write_tiny_mmproj(tmp_path / "wide.gguf", n_embd=1152)).vision.projection_dim == 1152  # type: ignore[union-attr]


def test_a_text_model_given_as_a_projector_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    gguf_factory.write_plain(model)
    with pytest.raises(ModelFileError, match=r"not a projector .*'llama'"):
        inspect_projector(model)


def test_a_projector_that_encodes_nothing_is_refused(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "empty.gguf"
    w = GGUFWriter(path, "clip")
    w.add_string("clip.projector_type", "gemma3")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match=r"neither clip\.has_vision_encoder nor clip\.has_audio_encoder"):
        inspect_projector(path)


# -- the catalog -----------------------------------------------------------------------------------------------


def test_a_projector_set_gives_the_model_its_projector_and_vision() -> None:
    state = CatalogState(fold(CatalogProjection(), [rec(1, imported("g")), rec(2, projector_set("g"))]))
    entry = stored(state, "g")
    assert entry is not None and entry.projector is not None
    assert entry.projector.modalities == ("vision",)
    assert (entry.projector.path, entry.projector.sha256, entry.projector.seq) == (f"mmproj/{SHA}.gguf", SHA, 2)
    assert entry.to_json()["projector"]["modalities"] == ["vision"]
    assert capabilities(entry.metadata, entry.projector.modalities) == ["completion", "chat", "vision"]


def test_a_removed_projector_leaves_the_model_text_only() -> None:
    state = CatalogState(fold(CatalogProjection(), [
        rec(1, imported("g")), rec(2, projector_set("g")),
        rec(3, ModelProjectorRemoved(name="g", path=f"mmproj/{SHA}.gguf", file_deleted=True))]))
    entry = stored(state, "g")
    assert entry is not None and entry.projector is None and "projector" not in entry.to_json()
    assert capabilities(entry.metadata) == ["completion", "chat"]


def test_a_projector_for_a_model_not_in_the_store_changes_nothing() -> None:
    state = fold(CatalogProjection(), [rec(1, projector_set("ghost"))])
    assert state["models"] == {}


def test_a_variant_gets_its_bases_projector_and_both_count_as_its_users() -> None:
    state = CatalogState(fold(CatalogProjection(), [
        rec(1, imported("g")), rec(2, projector_set("g")),
        rec(3, ModelVariantCreated(name="g-terse", base="g", settings=ModelSettings(system="Be terse.")))]))
    variant = stored(state, "g-terse")
    assert variant is not None and variant.projector is not None and variant.projector.sha256 == SHA
    assert projector_users(state, f"mmproj/{SHA}.gguf") == ["g", "g-terse"]
    state = CatalogState(fold(CatalogProjection(), [rec(4, ModelRemoved(name="g", path="g.gguf", file_deleted=False))],
                              state._raw))
    assert projector_users(state, f"mmproj/{SHA}.gguf") == ["g-terse"]


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs/mmproj.gguf", "g.gguf", "mmproj/a/b.gguf", "mmproj/../x"])
def test_a_projector_path_outside_the_stores_projector_directory_is_refused(path: str) -> None:
    state = fold(CatalogProjection(), [rec(1, imported("g")), rec(2, projector_set("g", path=path))])
    assert "projector" not in state["models"]["g"]
    assert state["refused"][0]["seq"] == 2 and state["refused"][0]["type"] == "model.projector_set"


def test_an_audio_projector_lists_audio_and_an_embedding_model_stays_embedding() -> None:
    audio = ProjectorMetadata(projector_type="ultravox", modalities=["audio"], audio=EncoderShape(mel_bins=128))
    text = ModelMetadata(architecture="gemma3", name="Gemma 3 It")
    assert capabilities(text, audio.modalities) == ["completion", "chat", "audio"]
    assert capabilities(text.model_copy(update={"embedding_model": True}), ["vision"]) == ["embedding"]
    info = projector_info(audio)
    assert info["clip.has_audio_encoder"] is True and info["clip.audio.num_mel_bins"] == 128


def test_projector_info_is_ollamas_clip_keys() -> None:
    info = projector_info(VISION)
    assert info["general.architecture"] == "clip" and info["clip.has_vision_encoder"] is True
    assert info["clip.projector_type"] == "gemma3" and info["clip.vision.image_size"] == 112
    assert info["clip.vision.projection_dim"] == 640

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
from blazar.projections.catalog import projector_users, stored
from blazar.store.chat_templates import capabilities
from blazar.store.projectors import projector_info
from tests.support import gguf_factory
from tests.support.catalog import imported
from tests.support.events import rec
from tests.support.tiny_mmproj import IMAGE_SIZE, PATCH_SIZE, SCALE_FACTOR, write_tiny_mmproj

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
    state = fold(CatalogProjection(), [rec(1, imported("g")), rec(2, projector_set("g"))])
    entry = stored(state, "g")
    assert entry is not None and entry.projector is not None
    assert entry.projector.modalities == ("vision",)
    assert (entry.projector.path, entry.projector.sha256, entry.projector.seq) == (f"mmproj/{SHA}.gguf", SHA, 2)
    assert entry.to_json()["projector"]["modalities"] == ["vision"]
    assert capabilities(entry.metadata, entry.projector.modalities) == ["completion", "chat", "vision"]


def test_a_removed_projector_leaves_the_model_text_only() -> None:
    state = fold(CatalogProjection(), [
        rec(1, imported("g")), rec(2, projector_set("g")),
        rec(3, ModelProjectorRemoved(name="g", path=f"mmproj/{SHA}.gguf", file_deleted=True))])
    entry = stored(state, "g")
    assert entry is not None and entry.projector is None and "projector" not in entry.to_json()
    assert capabilities(entry.metadata) == ["completion", "chat"]


def test_a_projector_for_a_model_not_in_the_store_changes_nothing() -> None:
    state = fold(CatalogProjection(), [rec(1, projector_set("ghost"))])
    assert state.models == {}


def test_a_variant_gets_its_bases_projector_and_both_count_as_its_users() -> None:
    state = fold(CatalogProjection(), [
        rec(1, imported("g")), rec(2, projector_set("g")),
        rec(3, ModelVariantCreated(name="g-terse", base="g", settings=ModelSettings(system="Be terse.")))])
    variant = stored(state, "g-terse")
    assert variant is not None and variant.projector is not None and variant.projector.sha256 == SHA
    assert projector_users(state, f"mmproj/{SHA}.gguf") == ["g", "g-terse"]
    state = fold(CatalogProjection(), [rec(4, ModelRemoved(name="g", path="g.gguf", file_deleted=False))], state)
    assert projector_users(state, f"mmproj/{SHA}.gguf") == ["g-terse"]


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs/mmproj.gguf", "g.gguf", "mmproj/a/b.gguf", "mmproj/../x"])
def test_a_projector_path_outside_the_stores_projector_directory_is_refused(path: str) -> None:
    state = fold(CatalogProjection(), [rec(1, imported("g")), rec(2, projector_set("g", path=path))])
    assert state.models["g"].projector is None
    assert state.refused[0].seq == 2 and state.refused[0].type == "model.projector_set"


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


# -- which projector a hub pull takes --------------------------------------------------------------------------


def test_a_pull_picks_the_projector_in_the_models_precision_else_f16_else_the_first() -> None:
    from blazar.adapters.hub import RemoteFile, pick_projector

    def f(path: str) -> RemoteFile:
        return RemoteFile(path, 1, None)

    q8, q4 = [f("gemma-3-4b-it-Q8_0.gguf")], [f("gemma-3-4b-it-Q4_K_M.gguf")]
    files = [f("mmproj-BF16.gguf"), f("mmproj-Q8_0.gguf"), f("mmproj-model-f16.gguf"), q8[0], q4[0]]
    assert pick_projector(files, q8) == f("mmproj-Q8_0.gguf")
    assert pick_projector(files, q4) == f("mmproj-model-f16.gguf")  # "f16", any case; BF16 is not F16
    assert pick_projector([f("mmproj-F32.gguf"), f("mmproj-BF16.gguf")], q4) == f("mmproj-BF16.gguf")
    assert pick_projector([q4[0]], q4) is None
    # only beside the model: another directory's projector belongs to another model
    assert pick_projector([f("other/mmproj-F16.gguf"), f("sub/m-Q4_K_M.gguf")], [f("sub/m-Q4_K_M.gguf")]) is None


# -- the store's commands --------------------------------------------------------------------------------------


@pytest.fixture
async def app(paths, clock):  # type: ignore[no-untyped-def]
    from blazar.bootstrap import bootstrap

    a = await bootstrap(paths=paths, clock=clock, actor="test:pytest", env={})
    try:
        yield a
    finally:
        await a.close()


def _types(app) -> list[str]:  # type: ignore[no-untyped-def]
    import sqlite3

    with sqlite3.connect(app.paths.db) as db:
        return [r[0] for r in db.execute("SELECT type FROM events ORDER BY seq")]


async def test_a_projector_of_another_width_is_refused_and_nothing_enters_the_store(app, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from blazar.store.models import import_model
    from blazar.store.projectors import import_with_projector, set_projector

    model = tmp_path / "m.gguf"
    gguf_factory.write_plain(model)  # embedding width 64
    wide = write_tiny_mmproj(tmp_path / "wide.gguf", n_embd=640)
    with pytest.raises(ModelFileError, match="projects to 640 wide, but m's embedding width is 64"):
        await import_with_projector(app, model, "m", wide)
    assert "model.imported" not in _types(app) and not (app.paths.models / "mmproj").exists()
    await import_model(app, model, "m")
    with pytest.raises(ModelFileError, match="projects to 640 wide"):
        await set_projector(app, "m", wide)
    assert "model.projector_set" not in _types(app) and not any((app.paths.models / "mmproj").glob("*.gguf"))


async def test_replacing_a_projector_records_the_old_ones_removal_and_deletes_its_file(app, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from blazar.store.models import import_model
    from blazar.store.projectors import set_projector

    model = tmp_path / "m.gguf"
    gguf_factory.write_plain(model)
    await import_model(app, model, "m")
    first = await set_projector(app, "m", write_tiny_mmproj(tmp_path / "a.gguf", n_embd=64))
    old = app.paths.models / first.event.path
    other = tmp_path / "b.gguf"
    write_tiny_mmproj(other, n_embd=64)
    with other.open("ab") as f:
        f.write(b"\0" * 32)  # other bytes, the same projector: another file in the store
    second = await set_projector(app, "m", other)
    assert second.event.path != first.event.path and not old.exists()
    assert (app.paths.models / second.event.path).is_file()
    assert _types(app)[-3:] == ["model.projector_set", "model.projector_removed", "model.projector_set"]


async def test_only_a_gguf_model_takes_a_projector(app, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from blazar.errors import InvalidModelSettings
    from blazar.events.models import ModelImported
    from blazar.store.projectors import remove_projector, set_projector

    await app.record(ModelImported(name="ears", path="ears/model.bin", source="/src", bytes=1, sha256="ab" * 32,
                                   linked=False, metadata=ModelMetadata(architecture="whisper"), kind="whisper"))
    with pytest.raises(InvalidModelSettings, match="ears is a whisper model"):
        await set_projector(app, "ears", write_tiny_mmproj(tmp_path / "p.gguf"))
    with pytest.raises(InvalidModelSettings, match="has no projector"):
        await remove_projector(app, "ears")

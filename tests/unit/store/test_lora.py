"""LoRA adapters: the header read into `LoraMetadata`; the catalog fed `lora.added` / `lora.removed` (order, a
variant's copy, a path the log could use to lead out of the store); the argv flags; the fit pricing their tensors;
the load shape; and a request's `lora` list mapped onto the engine's ids (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.adapters.engines.llama_server import parse_help
from blazar.adapters.engines.lora import lora_flags
from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.adapters.lora_inspect import inspect_lora
from blazar.errors import EngineIncompatible, ModelFileError, Refused
from blazar.events import Event
from blazar.events.lora import LoraAdded, LoraMetadata, LoraRemoved
from blazar.events.model_settings import ModelSettings, ModelVariantCreated
from blazar.events.models import ModelRemoved
from blazar.fit import FitRequest, plan
from blazar.instances.live import ResolvedModel
from blazar.projections import CatalogProjection, fold
from blazar.projections.catalog import CatalogState, lora_users, refusals, stored
from blazar.serving.lora import engine_lora
from tests.support.catalog import META, imported
from tests.support.events import rec
from tests.support.fit_models import GiB, MiB, gpu, host, transformer
from tests.support.tiny_lora import RANK, write_tiny_lora

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llama_server"
META_LORA = LoraMetadata(architecture="llama", rank=4, alpha=8.0, tensor_bytes=4096, tensor_count=8)


def added(model: str, name: str, sha: str = "cd" * 32, path: str | None = None) -> LoraAdded:
    return LoraAdded(model=model, name=name, path=path or f"lora/{sha}.gguf", source=f"/src/{name}.gguf",
                     sha256=sha, bytes=5000, linked=True, metadata=META_LORA)


def catalog(*events: Event) -> CatalogState:
    return fold(CatalogProjection(), [rec(i, e) for i, e in enumerate(events, start=1)])


# -- the header ------------------------------------------------------------------------------------------------


def test_the_tiny_adapter_header_says_lora_its_architecture_rank_and_alpha(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    meta = inspect_lora(write_tiny_lora(tmp_path / "a.gguf", model))
    assert meta.architecture == "llama" and meta.rank == RANK and meta.alpha == 8.0
    assert meta.tensor_count > 0 and meta.tensor_bytes > 0 and meta.name == "blazar-tiny-lora"


def test_a_model_given_as_an_adapter_is_refused_naming_the_file(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    with pytest.raises(ModelFileError) as e:
        inspect_lora(model)
    assert str(model) in e.value.message and "not a LoRA adapter" in e.value.message


# -- the catalog -----------------------------------------------------------------------------------------------


def test_adapters_are_listed_in_the_order_added_and_a_removal_keeps_the_others_in_order() -> None:
    state = catalog(imported("m"), added("m", "a", "aa" * 32), added("m", "b", "bb" * 32), added("m", "c", "cc" * 32),
                    LoraRemoved(model="m", name="b", path=f"lora/{'bb' * 32}.gguf", file_deleted=True))
    entry = stored(state, "m")
    assert entry is not None and [a.name for a in entry.loras] == ["a", "c"]
    assert entry.loras[0].metadata == META_LORA and entry.loras[0].seq == 2
    assert entry.to_json()["loras"][1]["name"] == "c"
    assert lora_users(state, f"lora/{'cc' * 32}.gguf") == ["m"]


def test_a_variant_keeps_its_bases_adapters_and_the_model_removed_takes_its_own() -> None:
    state = catalog(imported("m"), added("m", "a"), ModelVariantCreated(name="v", base="m", settings=ModelSettings()),
                    added("m", "later", "ee" * 32), ModelRemoved(name="m", path="m.gguf", file_deleted=False))
    v = stored(state, "v")
    assert v is not None and [a.name for a in v.loras] == ["a"]  # as the base had them when it was made
    assert stored(state, "m") is None
    assert lora_users(state, f"lora/{'cd' * 32}.gguf") == ["v"]


@pytest.mark.parametrize("path", ["../escape.gguf", "/etc/passwd", "mmproj/x.gguf", "lora/a/b.gguf"])
def test_an_adapter_path_outside_the_stores_lora_directory_becomes_no_adapter(path: str) -> None:
    state = catalog(imported("m"), added("m", "a", path=path))
    entry = stored(state, "m")
    assert entry is not None and entry.loras == ()
    assert [r.seq for r in refusals(state)] == [2]


# -- the load --------------------------------------------------------------------------------------------------


def test_the_flags_say_each_adapter_in_order_then_unapplied() -> None:
    caps = parse_help((FIXTURES / "help.txt").read_text())
    assert lora_flags(caps, []) == []
    assert lora_flags(caps, [Path("/m/lora/a.gguf"), Path("/m/lora/b.gguf")]) == [
        "--lora", "/m/lora/a.gguf", "--lora", "/m/lora/b.gguf", "--lora-init-without-apply"]
    without = parse_help("\n".join(line for line in (FIXTURES / "help.txt").read_text().splitlines()
                                   if "--lora-init-without-apply" not in line))
    with pytest.raises(EngineIncompatible) as e:
        lora_flags(without, [Path("/m/lora/a.gguf")])
    assert "--lora-init-without-apply" in e.value.message


def test_the_fit_prices_the_adapters_tensors_with_the_layers() -> None:
    meta = transformer(n_layer=32)
    devices = [gpu(80 * GiB), host(64 * GiB)]
    bare = plan(meta, devices, FitRequest(ctx=4096))
    with_lora = plan(meta, devices, FitRequest(ctx=4096, lora_bytes=64 * MiB))
    assert with_lora.total_bytes - bare.total_bytes == 64 * MiB
    assert with_lora.devices[0].weights_bytes - bare.devices[0].weights_bytes == 64 * MiB  # where the layers are
    assert any("LoRA adapters: 64.0 MiB" in n for n in with_lora.notes)


def test_another_set_of_adapters_is_another_load_shape() -> None:
    state = catalog(imported("m"), added("m", "a", "aa" * 32))
    entry = stored(state, "m")
    assert entry is not None
    bare = ResolvedModel(name="m", path=Path("m.gguf"), metadata=META)
    one = ResolvedModel(name="m", path=Path("m.gguf"), metadata=META, loras=entry.loras)
    assert bare.template != one.template and "aaaaaaaa" in one.template


# -- a request's list ------------------------------------------------------------------------------------------


def test_names_and_ids_map_onto_every_loaded_adapter_with_zero_for_the_unnamed() -> None:
    names = ["a", "b", "c"]
    assert engine_lora([], names, "m") == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}, {"id": 2, "scale": 0.0}]
    assert engine_lora([{"name": "c", "scale": 0.5}, {"id": 0}], names, "m") == [
        {"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}, {"id": 2, "scale": 0.5}]


@pytest.mark.parametrize(("asked", "words"), [
    ([{"name": "z", "scale": 1}], ["no LoRA adapter named 'z'", "a, b"]),
    ([{"id": 2}], ["id 2"]),
    ([{"id": True}], ["id True"]),
    ([{"name": "a", "scale": float("nan")}], ["scale"]),
    ([{"name": "a", "scale": 11}], ["scale"]),
    ([{"name": "a", "scale": "1"}], ["scale"]),
    ([{"name": "a"}, {"id": 0}], ["named twice"]),
    ([{"name": "a", "id": 0}], ["give"]),
    ([{"name": "a", "weight": 1}], ["give"]),
    ("a", ["must be a list"]),
])
def test_a_bad_list_is_a_400_naming_what_is_wrong(asked: object, words: list[str]) -> None:
    with pytest.raises(Refused) as e:
        engine_lora(asked, ["a", "b"], "m")
    assert e.value.http_status == 400 and e.value.reason == "invalid_request"
    for w in words:
        assert w in e.value.message

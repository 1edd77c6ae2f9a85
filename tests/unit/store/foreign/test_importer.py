"""The importer of other tools' models (blazar/store/foreign/importer.py, carry.py) in-process on a real home and
tiny GGUFs: the plan (import, present, name taken, refused), the run (each model its own `model.imported` with
its projector, adapters and settings; what Blazar cannot take said, not failed), and a failure that leaves nothing
behind and does not stop the others."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from blazar.context import Blazar
from blazar.errors import ForeignStoreError
from blazar.projections.catalog import stored
from blazar.store.foreign import carry as carry_module
from blazar.store.foreign import importer
from blazar.store.foreign.found import ForeignAdapter, ForeignModel
from blazar.store.foreign.importer import discover, plan, run
from blazar.store.models import import_model
from tests.support.gguf_factory import write_plain
from tests.support.tiny_lora import write_tiny_lora
from tests.support.tiny_mmproj import write_tiny_mmproj

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "<|im_start|>assistant\n")


def found(path: Path, name: str, **extra: object) -> ForeignModel:
    extra.setdefault("carried", ("weights",))
    return ForeignModel(tool="lmstudio", name=name, source=str(path), weights=(path,), **extra)  # type: ignore[arg-type]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "store" / "tiny-Q8_0.gguf"
    path.parent.mkdir()
    write_plain(path)
    return path


async def test_a_new_model_is_imported_once_and_a_second_plan_finds_it_present(app: Blazar, tiny: Path) -> None:
    (row,) = plan(app.runner.state("catalog"), [found(tiny, "tiny:q8_0")])
    assert (row.action, row.outcome) == ("import", None) and row.bytes > 0
    (done,) = await run(app, [row])
    assert (done.outcome, done.placed) == ("imported", "hardlink")
    entry = stored(app.runner.state("catalog"), "tiny:q8_0")
    assert entry is not None and (entry.source, entry.source_kind) == (str(tiny), "lmstudio")
    assert (app.paths.models / entry.file).samefile(tiny)

    (again,) = plan(app.runner.state("catalog"), [found(tiny, "tiny:q8_0")])
    assert (again.action, again.reason) == ("present", "already imported as tiny:q8_0")
    assert (await run(app, [again]))[0].outcome is None


async def test_a_name_the_store_gives_to_other_bytes_is_taken_not_overwritten(app: Blazar, tiny: Path,
                                                                              tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    write_plain(other, seed=7)
    await import_model(app, other, "tiny:q8_0")
    copy = tmp_path / "copy-of-tiny.gguf"
    shutil.copyfile(tiny, copy)
    await import_model(app, copy, "same:bytes")
    rows = plan(app.runner.state("catalog"), [found(tiny, "tiny:q8_0"), found(tiny.with_name("x"), "same:bytes")])
    assert [r.action for r in rows] == ["name-taken", "refused"]  # x does not exist: nothing to read
    (same,) = plan(app.runner.state("catalog"), [found(tiny, "same:bytes")])
    assert (same.action, same.reason) == ("present", "already in the store as same:bytes (the same bytes)")


async def test_a_name_blazar_cannot_serve_under_is_refused(app: Blazar, tiny: Path) -> None:
    (row,) = plan(app.runner.state("catalog"), [found(tiny, "has/slash:q8")])
    assert row.action == "refused" and "invalid model name" in row.reason


async def test_only_narrows_the_plan_and_an_unknown_name_is_a_clear_error(app: Blazar, tiny: Path) -> None:
    models = [found(tiny, "a:q8"), found(tiny, "b:q8")]
    assert [r.name for r in plan(app.runner.state("catalog"), models, ["b:q8"])] == ["b:q8"]
    with pytest.raises(ForeignStoreError, match=r"--only c:q8: no model of that name was found \(found: a:q8, b:q8"):
        plan(app.runner.state("catalog"), models, ["c:q8"])


async def test_the_projector_adapters_and_settings_come_with_it_and_what_cannot_is_said(app: Blazar, tiny: Path,
                                                                                        tmp_path: Path) -> None:
    proj = write_tiny_mmproj(tmp_path / "mmproj.gguf", n_embd=64)
    lora = write_tiny_lora(tmp_path / "adapter.gguf", tiny)
    model = found(tiny, "tiny:chat", projector=proj, adapters=(ForeignAdapter("style", lora),), template=CHATML,
                  system="Be brief.", parameters=(("num_ctx", "4096"), ("stop", "<|im_end|>"), ("num_gpu", "99"),
                                                  ("no_such", "1")))
    (done,) = await run(app, plan(app.runner.state("catalog"), [model]))
    assert done.outcome == "imported", done.reason
    entry = stored(app.runner.state("catalog"), "tiny:chat")
    assert entry is not None and entry.projector is not None and [a.name for a in entry.loras] == ["style"]
    settings = entry.settings
    assert settings is not None and (settings.template_kind, settings.template, settings.system) == (
        "jinja", CHATML, "Be brief.")
    assert settings.parameters == {"num_ctx": 4096, "stop": ["<|im_end|>"]}
    assert settings.lora == {"style": 1.0}  # applied to every answer, as the tool did
    assert len(done.not_carried) == 2
    assert "parameter num_gpu: not supported" in done.not_carried[0] and "'no_such'" in done.not_carried[1]


async def test_a_projector_for_another_model_is_left_out_and_the_model_still_comes(app: Blazar, tiny: Path,
                                                                                   tmp_path: Path) -> None:
    proj = write_tiny_mmproj(tmp_path / "mmproj-wide.gguf", n_embd=640)
    (done,) = await run(app, plan(app.runner.state("catalog"),
                                  [found(tiny, "tiny:q8", projector=proj, carried=("weights", "projector"))]))
    assert done.outcome == "imported" and done.carried == ("weights",)
    assert "projects to 640 wide" in done.not_carried[0]
    entry = stored(app.runner.state("catalog"), "tiny:q8")
    assert entry is not None and entry.projector is None


async def test_a_go_template_is_not_carried_and_the_ggufs_own_serves(app: Blazar, tiny: Path) -> None:
    (done,) = await run(app, plan(app.runner.state("catalog"),
                                  [found(tiny, "tiny:go", template="{{ .System }}{{ .Prompt }}")]))
    assert done.outcome == "imported" and "Go template" in done.not_carried[0]
    entry = stored(app.runner.state("catalog"), "tiny:go")
    assert entry is not None and entry.settings is None


async def test_a_model_that_fails_halfway_leaves_nothing_and_the_next_one_is_imported(
        app: Blazar, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    second = tmp_path / "second.gguf"
    write_plain(second, seed=3)
    real = carry_module.configure_model

    async def disk_error(app: Blazar, name: str, *args: object, **kw: object) -> object:
        if name == "tiny:broken":
            raise OSError(5, "Input/output error")
        return await real(app, name, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(carry_module, "configure_model", disk_error)
    rows = await run(app, plan(app.runner.state("catalog"), [found(tiny, "tiny:broken", system="x"),
                                                           found(second, "second:q8", system="y")]))
    assert [(r.name, r.outcome) for r in rows] == [("tiny:broken", "failed"), ("second:q8", "imported")]
    assert "Input/output error" in rows[0].reason
    catalog = app.runner.state("catalog")
    assert stored(catalog, "tiny:broken") is None and stored(catalog, "second:q8") is not None
    assert sorted(p.name for p in app.paths.models.iterdir() if p.is_file()) == ["second--q8.gguf"]


def test_a_tool_without_its_reader_or_a_missing_store_is_a_clear_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ForeignStoreError, match=r"LM Studio's models folder not found at .*/nowhere \(give its"):
        discover("lmstudio", tmp_path / "nowhere")
    monkeypatch.setitem(importer.READERS, "ollama", "blazar.store.foreign.not_built_here")
    with pytest.raises(ForeignStoreError, match="reading Ollama's store is not available in this build"):
        discover("ollama", tmp_path)

"""`blazar import`, `list`, `show` and `rm` through the real CLI (tiny GGUFs from the factory), and the import
handler's copy fallback, clean-up and split placement where only an in-process test can reach them."""

from __future__ import annotations

import errno
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.cli.main import app as blazar_cli
from blazar.context import Blazar
from blazar.errors import InvalidModelName, ModelExists, ModelFileError
from blazar.store.models import check_name, import_model, remove_model
from tests.conftest import Cli
from tests.support.blazar_home import event_types, import_into, read_events
from tests.support.gguf_factory import write_embedding, write_plain, write_split, write_truncated


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def links(path: Path) -> int:
    return path.stat().st_nlink


def store_files(home: Path) -> set[str]:
    """Every file under the models directory, hidden ones (temporaries) included, relative to it."""
    models = home / "models"
    return {str(p.relative_to(models)) for p in models.rglob("*") if not p.is_dir()} if models.exists() else set()


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)  # rich wraps long messages on stderr


def cross_device(src: object, dst: object) -> None:
    raise OSError(errno.EXDEV, "Invalid cross-device link")


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "tiny.gguf"
    src.parent.mkdir()
    write_plain(src)
    return src


# -- import --------------------------------------------------------------------------------------------------------


def test_import_hardlinks_the_file_hashes_it_and_records_model_imported(cli: Cli, home: Path, tiny: Path) -> None:
    res = cli("import", str(tiny), "--name", "tiny:q8")
    assert "imported tiny:q8: llama, Q8_0" in res.stdout and ", linked;" in res.stdout

    stored = home / "models" / "tiny--q8.gguf"
    assert stored.samefile(tiny) and links(tiny) == 2
    assert store_files(home) == {"tiny--q8.gguf"}

    (ev,) = cli("events", "--json").json_lines()
    assert ev["type"] == "model.imported" and ev["stream"] == "model:tiny:q8"
    data = ev["data"]
    assert (data["name"], data["path"], data["source"], data["source_kind"]) == (
        "tiny:q8", "tiny--q8.gguf", str(tiny), "file")
    assert (data["bytes"], data["sha256"], data["linked"], data["shards"]) == (
        tiny.stat().st_size, sha256(tiny), True, [])
    md = data["metadata"]
    assert (md["architecture"], md["name"], md["file_type"], md["ctx_train"], md["block_count"]) == (
        "llama", "tiny", "Q8_0", 2048, 3)
    assert (md["embedding_length"], md["head_count"], md["head_count_kv"], md["vocab_size"]) == (64, 4, 4, 32)
    assert md["chat_template"] is True and md["tensor_count"] == 30 and md["parameter_count"] > 0


def test_list_and_show_report_the_models_in_the_store_as_json(cli: Cli, home: Path, tiny: Path,
                                                               tmp_path: Path) -> None:
    embed = tmp_path / "src" / "embed.gguf"
    write_embedding(embed)
    import_into(home, tiny, "tiny")
    import_into(home, embed, "embed:f16")

    rows = cli("list", "--json").json()
    assert [r["name"] for r in rows] == ["embed:f16", "tiny"]
    assert (rows[1]["sha256"], rows[1]["metadata"]["architecture"]) == (sha256(tiny), "llama")
    assert (rows[0]["metadata"]["architecture"], rows[0]["metadata"]["pooling_type"]) == ("bert", "mean")

    info = cli("show", "tiny", "--json").json()
    assert (info["name"], info["sha256"], info["bytes"], info["source"], info["source_kind"]) == (
        "tiny", sha256(tiny), tiny.stat().st_size, str(tiny), "file")
    assert info["file"] == str(home / "models" / "tiny.gguf")
    assert info["capabilities"] == ["completion", "chat"]
    assert (info["metadata"]["file_type"], info["metadata"]["block_count"]) == ("Q8_0", 3)


# Each refusal: how the bad input is made (in a directory whose name rich would read as markup), the name asked
# for, and what stderr must say. A store that already holds "taken" must come out of every one of them unchanged.
REFUSALS: list[tuple[str, Callable[[Path], Path], str, str]] = [
    ("missing", lambda d: d / "nowhere.gguf", "fresh", "no such file"),
    ("truncated", lambda d: (write_truncated(d / "cut.gguf", cut=500), d / "cut.gguf")[1], "fresh", "truncated"),
    ("not-gguf", lambda d: (d / "notes.gguf").write_text("not weights\n" * 20) and d / "notes.gguf", "fresh",
     "not a GGUF file"),
    ("duplicate", lambda d: (write_plain(d / "other.gguf", seed=7), d / "other.gguf")[1], "taken",
     "a model named 'taken' is already in the store"),
    ("invalid-name", lambda d: (write_plain(d / "other.gguf", seed=7), d / "other.gguf")[1], "a:b:c",
     "invalid model name 'a:b:c'"),
]


def test_refused_imports_say_why_record_nothing_and_leave_nothing_in_the_store(cli: Cli, home: Path, tiny: Path,
                                                                              tmp_path: Path) -> None:
    import_into(home, tiny, "taken")
    before_files, before_events = store_files(home), event_types(home)
    for case, make, name, problem in REFUSALS:
        where = tmp_path / case / "[bold]in"
        where.mkdir(parents=True)
        bad = make(where)
        res = cli("import", str(bad), "--name", name, check=False)
        err = one_line(res.stderr)
        assert res.code == 2, f"{case}: exit {res.code}\n{res.stderr}"
        assert err.startswith("error: ") and problem in err and "Traceback" not in err, f"{case}: {err}"
        if name == "fresh":
            assert str(bad) in err, f"{case}: the message names the file as it is: {err}"
        assert store_files(home) == before_files, case
        assert event_types(home) == before_events, case
    # The log through the CLI: the one import from before, nothing since.
    assert [e["type"] for e in cli("events", "--json").json_lines()] == ["model.imported"]
    assert sha256(home / "models" / "taken.gguf") == sha256(tiny)


@pytest.mark.parametrize("name", ["", "bad name", "-dash", ".hidden", "a:b:c", "x/y", "a:", ":b", "n" * 129,
                                  "ok:" + "t" * 65])
def test_invalid_model_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(InvalidModelName, match="use letters, digits"):
        check_name(name)


@pytest.mark.parametrize("name", ["tiny", "gemma3-270m", "gemma3:270m-q4", "Qwen2.5_0.5B:Q8_0", "n" * 128])
def test_valid_model_names_pass(name: str) -> None:
    assert check_name(name) == name


async def test_names_that_map_to_one_store_file_do_not_overwrite_each_other(app: Blazar, tiny: Path,
                                                                              tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    write_plain(other, seed=7)
    await import_model(app, tiny, "a:b")  # stored as a--b.gguf
    with pytest.raises(ModelExists, match=r"stored as a--b\.gguf, which belongs to the model 'a:b'"):
        await import_model(app, other, "a--b")
    assert (app.paths.models / "a--b.gguf").samefile(tiny)
    assert sorted(app.runner.state("catalog").models) == ["a:b"]
    assert [p.name for p in app.paths.models.iterdir()] == ["a--b.gguf"]


async def test_import_copies_when_a_hardlink_is_impossible(app: Blazar, tiny: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "link", cross_device)
    rec = await import_model(app, tiny, "tiny")
    stored = app.paths.models / "tiny.gguf"
    assert rec.event.linked is False
    assert not stored.samefile(tiny) and links(tiny) == 1 and links(stored) == 1
    assert sha256(stored) == rec.event.sha256 == sha256(tiny)
    assert [p.name for p in app.paths.models.iterdir()] == ["tiny.gguf"]  # no temporary left beside it


def test_import_says_so_when_it_had_to_copy(home: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "link", cross_device)
    res = CliRunner().invoke(blazar_cli, ["import", str(tiny), "--name", "tiny"], env={"BLAZAR_HOME": str(home)})
    assert res.exit_code == 0, res.output
    assert "copied (a hardlink was not possible across these filesystems)" in one_line(res.output)


async def test_a_link_error_that_is_not_about_links_is_raised_not_papered_over_with_a_copy(
        app: Blazar, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(OSError, match="No space left"):
        await import_model(app, tiny, "tiny")
    assert list(app.paths.models.iterdir()) == []
    assert [r async for r in app.log.read()] == []


async def test_a_mismatched_expected_sha256_leaves_nothing(app: Blazar, tiny: Path) -> None:
    with pytest.raises(ModelFileError, match="does not match the expected"):
        await import_model(app, tiny, "tiny", expected_sha256="0" * 64)
    assert list(app.paths.models.iterdir()) == []
    assert app.runner.state("catalog").models == {}


async def test_an_import_whose_recording_fails_takes_its_file_back_out(app: Blazar, tiny: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: object, **kwargs: object) -> None:
        raise ModelExists("the log refused")

    monkeypatch.setattr(app, "record", refuse)
    with pytest.raises(ModelExists, match="the log refused"):
        await import_model(app, tiny, "tiny")
    assert list(app.paths.models.iterdir()) == []
    assert links(tiny) == 1


async def test_a_split_import_places_every_part_in_one_directory_and_rm_removes_it(app: Blazar,
                                                                                   tmp_path: Path) -> None:
    parts, _ = write_split(tmp_path / "big-Q2_K.gguf")
    rec = await import_model(app, parts, "big:q2_k")
    ev = rec.event
    assert [s.path for s in ev.shards] == [f"big--q2_k/{p.name}" for p in parts]
    assert ev.path == ev.shards[0].path and ev.bytes == sum(p.stat().st_size for p in parts)
    assert [s.sha256 for s in ev.shards] == [sha256(p) for p in parts] and ev.sha256 == sha256(parts[0])
    assert ev.metadata.tensor_count == 30  # the tensors of every part, the metadata of the first
    assert sorted(p.name for p in (app.paths.models / "big--q2_k").iterdir()) == [p.name for p in parts]

    removed = await remove_model(app, "big:q2_k")
    assert removed.event.file_deleted is False  # the source parts still link the data
    assert list(app.paths.models.iterdir()) == [] and all(p.exists() for p in parts)


# -- rm ------------------------------------------------------------------------------------------------------------


def test_rm_keeps_the_data_while_the_imported_source_still_links_it(cli: Cli, home: Path, tiny: Path) -> None:
    original = tiny.read_bytes()
    # "x:smile" then ": " reads as an emoji code to rich: the name must print as it is.
    cli("import", str(tiny), "--name", "tiny:smile")
    res = cli("rm", "tiny:smile")
    assert res.stdout.strip() == "removed tiny:smile: file kept (still linked elsewhere)"
    (removed,) = read_events(home, "model.removed")
    assert removed["data"] == {"name": "tiny:smile", "path": "tiny--smile.gguf", "file_deleted": False}
    assert tiny.read_bytes() == original and links(tiny) == 1
    assert store_files(home) == set()


def test_rm_deletes_the_file_when_the_store_holds_its_last_link(cli: Cli, home: Path, tiny: Path) -> None:
    import_into(home, tiny, "tiny")
    tiny.unlink()
    res = cli("rm", "tiny")
    assert res.stdout.strip() == "removed tiny: file deleted"
    assert read_events(home, "model.removed")[0]["data"]["file_deleted"] is True
    assert store_files(home) == set()
    assert event_types(home) == ["model.imported", "model.removed"]


def test_rm_and_show_of_an_unknown_model_say_so_and_record_nothing(cli: Cli, home: Path) -> None:
    for command in ("rm", "show"):
        res = cli(command, "ghost", check=False)
        assert res.code == 2 and "error: no model named 'ghost' in the store" in one_line(res.stderr)
    assert read_events(home) == []


# -- help ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "words"), [
    ("import", ["[file]", "--name", "GGUF", "copied", "--from", "--dry-run", "--only"]),
    ("pull", ["{target}", "--name", "--json", "owner/repo[:QUANT]", "HF_ENDPOINT"]),
    ("list", ["--json"]),
    ("show", ["{model}", "--json", "sha256"]),
    ("rm", ["{model}", "link"]),
])
def test_every_model_command_explains_itself_with_help(command: str, words: list[str]) -> None:
    res = CliRunner().invoke(blazar_cli, [command, "--help"], prog_name="blazar", env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = one_line(res.output)
    assert f"Usage: blazar {command}" in text
    for word in words:
        assert word in text, word


def test_alias_names_a_model_lists_and_removes(cli, tmp_path) -> None:
    cli("import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", "tiny")
    assert cli("alias", "gpt-4o-mini", "tiny").stdout.strip() == "gpt-4o-mini -> tiny"
    assert cli("alias", "--json").json() == {"gpt-4o-mini": "tiny"}
    assert cli("show", "gpt-4o-mini", "--json").json()["name"] == "tiny"
    taken = cli("alias", "tiny", "tiny", check=False)
    assert taken.code == 2 and "model's own name" in taken.stderr
    missing = cli("alias", "x", "nosuch", check=False)
    assert missing.code == 2 and "nosuch" in missing.stderr
    assert "removed alias gpt-4o-mini" in cli("alias", "gpt-4o-mini", "--remove").stdout
    assert cli("show", "gpt-4o-mini", check=False).code == 2
    cli("alias", "other", "tiny")
    assert "its model tiny stays" in cli("rm", "other").stdout  # rm of an alias never deletes the model
    assert cli("show", "tiny", "--json").json()["name"] == "tiny"

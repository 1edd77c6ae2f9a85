"""Which three models serve a realtime session: `resolve_session_models` (pure, over the `realtime` and `catalog`
states) reads the `model` a session asks for.

    a realtime profile      its stt, llm and tts (and the voice's speaker), each still in the store with its kind
    a chat model            that model (as its own name), with the default speech models: the whisper model named
                            `whisper-base` and the piper voice named `joe` (the registry's, `blazar pull` gives them)
                            when the store has them, else the first of each kind by name
    anything else           refused, saying why

A profile comes first: a model or alias imported later under a profile's name does not change what the profile
serves (`blazar realtime set` refuses a name the store already uses)."""

from __future__ import annotations

from dataclasses import dataclass

from blazar.context import Blazar
from blazar.errors import ModelNotFound, RealtimeProfileError
from blazar.events.models import ModelKind
from blazar.projections import catalog as cat
from blazar.projections import realtime as rt
from blazar.projections.catalog import CatalogState
from blazar.projections.realtime import RealtimeProfile, RealtimeState

__all__ = ["DEFAULT_STT", "DEFAULT_TTS", "RealtimeProfile", "SessionModels", "default_stt", "profile", "profiles",
           "resolve_session_models", "session_models"]

DEFAULT_STT = "whisper-base"  # the registry's names: `blazar pull whisper-base`, `blazar pull joe`
DEFAULT_TTS = "joe"
_ROLE = {"stt": ("whisper", "a whisper model"), "llm": ("llama-server", "a chat model (a GGUF served by "
                                                        "llama-server)"), "tts": ("piper", "a piper voice")}


@dataclass(frozen=True, slots=True)
class SessionModels:
    """The models serving a session, each a model's own name in the store."""

    stt: str
    llm: str
    tts: str
    speaker: str | None  # the voice's speaker; None: its default
    profile: str | None  # the profile they come from; None: the defaults around a chat model


def resolve_session_models(state: RealtimeState, catalog: CatalogState, name: str) -> SessionModels:
    """The three models a session asking for `name` runs on. RealtimeProfileError when a profile's model is gone
    from the store (or is no longer of its kind), when `name` is a speech model, or when the store lacks a default;
    ModelNotFound when `name` is neither a profile nor a model."""
    p = rt.profile(state, name)
    if p is not None:
        for role, model in (("stt", p.stt), ("llm", p.llm), ("tts", p.tts)):
            kind, what = _ROLE[role]
            entry = cat.stored(catalog, model)
            if entry is None or entry.kind != kind:
                gone = "is no longer in the store" if entry is None else f"is now a {entry.kind} model, not {what}"
                raise RealtimeProfileError(f"realtime profile {name}: its {role} {model} {gone} (blazar realtime set "
                                           f"{name} --{role} MODEL)")
        return SessionModels(stt=p.stt, llm=p.llm, tts=p.tts, speaker=p.speaker, profile=p.name)
    entry = cat.stored(catalog, name)
    if entry is None:
        raise ModelNotFound(f"no realtime profile or model named {name!r} (blazar realtime list, blazar list)")
    if entry.kind != "llama-server":
        raise RealtimeProfileError(f"{entry.name} is a {entry.kind} model: a realtime session asks for a chat model "
                                   "or a realtime profile (blazar realtime list)")
    return SessionModels(stt=default_model(catalog, "whisper", DEFAULT_STT), llm=entry.name,
                         tts=default_model(catalog, "piper", DEFAULT_TTS), speaker=None, profile=None)


def default_model(catalog: CatalogState, kind: ModelKind, preferred: str) -> str:
    """The model of `kind` a session around a chat model uses: `preferred` when the store has it as that kind, else
    the first of the kind by name."""
    entry = cat.stored(catalog, preferred)
    if entry is not None and entry.kind == kind:
        return entry.name
    first = next((m.name for m in cat.models(catalog) if m.kind == kind), None)
    if first is None:
        role = "stt" if kind == "whisper" else "tts"
        raise RealtimeProfileError(f"a realtime session needs {_ROLE[role][1]} and the store has none: blazar pull "
                                   f"{preferred}, or name one in a profile (blazar realtime set NAME --{role} MODEL)")
    return first


def session_models(app: Blazar, name: str) -> SessionModels:
    """`resolve_session_models` over the live state."""
    return resolve_session_models(app.runner.state("realtime"), app.runner.state("catalog"), name)


def default_stt(app: Blazar) -> str:
    """The whisper model a session around a chat model hears with (`default_model`): RealtimeProfileError when the
    store has none."""
    return default_model(app.runner.state("catalog"), "whisper", DEFAULT_STT)


def profiles(app: Blazar) -> list[RealtimeProfile]:
    return rt.profiles(app.runner.state("realtime"))


def profile(app: Blazar, name: str) -> RealtimeProfile | None:
    return rt.profile(app.runner.state("realtime"), name)

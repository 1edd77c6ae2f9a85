"""Realtime profiles (`blazar realtime set|rm`): the three models a `/v1/realtime` session asking for the profile's
name runs on, checked against the store and recorded (realtime.profile_set / realtime.profile_removed). Admin
configuration: keys never set them."""

from __future__ import annotations

import asyncio
import json

from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import OutsideHome, RealtimeProfileError
from blazar.events.base import Recorded
from blazar.events.models import ModelKind
from blazar.events.realtime import RealtimeProfileRemoved, RealtimeProfileSet
from blazar.projections.catalog import CatalogState, StoredModel, stored
from blazar.projections.realtime import profile
from blazar.store.models import check_name

_WHAT: dict[ModelKind, str] = {"whisper": "a whisper model", "llama-server": "a chat model (a GGUF served by "
                               "llama-server)", "piper": "a piper voice"}


async def set_profile(app: Blazar, name: str, *, stt: str, llm: str, tts: str,
                      speaker: str | None = None) -> Recorded:
    """Record the profile `name` (replacing one of that name): `stt` a whisper model, `llm` a llama-server model,
    `tts` a piper voice of the store, each recorded as its own name (an alias is followed); `speaker` one of the
    voice's speakers."""
    await app.runner.catch_up()
    check_name(name)
    catalog = app.runner.state("catalog")
    taken = stored(catalog, name)
    if taken is not None:
        what = "a model's name" if taken.name == name else f"a name of the model {taken.name}"
        raise RealtimeProfileError(f"{name!r} is {what} in the store: a realtime profile takes a name of its own "
                                   "(a session asking for a chat model gets the default speech models anyway)")
    roles: tuple[tuple[str, str, ModelKind], ...] = (("stt", stt, "whisper"), ("llm", llm, "llama-server"),
                                                      ("tts", tts, "piper"))
    entries = {role: _model_of(catalog, role, model, kind) for role, model, kind in roles}
    if speaker is not None:
        await _check_speaker(app, entries["tts"], speaker)
    (rec,) = await app.record(RealtimeProfileSet(name=name, stt=entries["stt"].name, llm=entries["llm"].name,
                                                 tts=entries["tts"].name, speaker=speaker))
    return rec


async def remove_profile(app: Blazar, name: str) -> Recorded:
    await app.runner.catch_up()
    if profile(app.runner.state("realtime"), name) is None:
        raise RealtimeProfileError(f"no realtime profile named {name[:128]!r} (blazar realtime list shows them)")
    (rec,) = await app.record(RealtimeProfileRemoved(name=name))
    return rec


def _model_of(catalog: CatalogState, role: str, model: str, kind: ModelKind) -> StoredModel:
    entry = stored(catalog, model)
    if entry is None:
        raise RealtimeProfileError(f"--{role} {model[:128]!r}: no such model in the store (blazar list)")
    if entry.kind != kind:
        raise RealtimeProfileError(f"--{role} {entry.name} is a {entry.kind} model: --{role} takes {_WHAT[kind]}")
    return entry


async def _check_speaker(app: Blazar, voice: StoredModel, speaker: str) -> None:
    """`speaker` is one of the voice's speakers (its .onnx.json's speaker_id_map); a single-speaker voice takes none."""
    speakers = await asyncio.to_thread(_speakers, app, voice)
    if not speakers:
        raise RealtimeProfileError(f"--voice: {voice.name} has a single speaker (leave --voice out)")
    if speaker not in speakers:
        more = " ..." if len(speakers) > 20 else ""
        raise RealtimeProfileError(f"--voice {speaker[:60]!r} is not a speaker of {voice.name}; its speakers: "
                                   f"{', '.join(speakers[:20])}{more}")


def _speakers(app: Blazar, voice: StoredModel) -> list[str]:
    config = next((f for f in voice.files if f.endswith(".onnx.json")), None)
    if config is None:
        return []
    try:
        data = json.loads(inside(app.paths.models, config, what=f"voice {voice.name}").read_text("utf-8"))
    except (OSError, ValueError, OutsideHome) as e:
        raise RealtimeProfileError(f"{voice.name}: its voice config cannot be read ({e})") from None
    found = data.get("speaker_id_map") if isinstance(data, dict) else None
    if not isinstance(found, dict):
        return []
    return sorted(found, key=lambda s: found[s] if isinstance(found[s], int) else 0)  # by speaker id, as piper

"""Realtime profiles by their events and decisions: the `realtime` projection fed events, `resolve_session_models`
(a profile's models, or a chat model's with the default speech models, or a refusal saying why) over folded states,
and `blazar realtime set|rm`'s handlers against a real log (kinds checked, aliases followed, names kept apart from the
store's, a voice's speaker checked against its config)."""

from __future__ import annotations

import json

import pytest

from blazar.context import Blazar
from blazar.errors import InvalidModelName, ModelNotFound, RealtimeProfileError
from blazar.events.base import Event
from blazar.events.models import ModelAliased, ModelImported, ModelMetadata, ModelRemoved, ShardFile
from blazar.events.realtime import RealtimeProfileRemoved, RealtimeProfileSet
from blazar.projections.base import fold
from blazar.projections.catalog import CatalogProjection, CatalogState
from blazar.projections.realtime import RealtimeProjection, RealtimeState, profile, profiles
from blazar.queries.realtime import SessionModels, resolve_session_models
from blazar.store.realtime import remove_profile, set_profile
from tests.support.catalog import imported
from tests.support.events import rec
from tests.support.states import through_checkpoint


def _speech(name: str, kind: str, files: tuple[str, ...] = ()) -> ModelImported:
    shards = [ShardFile(path=f, bytes=1, sha256="cd" * 32) for f in files]
    return imported(name, path=files[0] if files else f"{name}/model.bin", kind=kind, shards=shards,
                    metadata=ModelMetadata(architecture=kind, name=name))


def _catalog(*events: Event) -> CatalogState:
    return fold(CatalogProjection(), [rec(i + 1, e) for i, e in enumerate(events)])


def _set(name: str = "talk", **kw: object) -> RealtimeProfileSet:
    return RealtimeProfileSet(**({"name": name, "stt": "wb", "llm": "gemma", "tts": "joe"} | kw))  # type: ignore[arg-type]


def test_the_projection_keeps_profiles_by_name_replaced_and_removed() -> None:
    p = RealtimeProjection()
    state = fold(p, [rec(1, _set("talk")), rec(2, _set("alpha", speaker="b")), rec(3, _set("talk", llm="qwen"))])
    assert [x.name for x in profiles(state)] == ["alpha", "talk"]
    talk = profile(state, "talk")
    assert talk is not None and (talk.stt, talk.llm, talk.tts, talk.speaker, talk.seq) == ("wb", "qwen", "joe", None, 3)
    assert profile(state, "alpha").speaker == "b"  # type: ignore[union-attr]
    assert through_checkpoint(p, state) == state
    state = fold(p, [rec(4, RealtimeProfileRemoved(name="alpha")), rec(5, RealtimeProfileRemoved(name="nope"))], state)
    assert [x.name for x in profiles(state)] == ["talk"]


def test_a_profile_resolves_to_its_models_and_says_which_one_went_missing() -> None:
    catalog = _catalog(imported("gemma"), _speech("wb", "whisper"), _speech("joe", "piper"))
    state = fold(RealtimeProjection(), [rec(1, _set("talk", speaker="b"))])
    assert resolve_session_models(state, catalog, "talk") == SessionModels("wb", "gemma", "joe", "b", "talk")
    gone = _catalog(imported("gemma"), _speech("joe", "piper"))
    with pytest.raises(RealtimeProfileError, match="realtime profile talk: its stt wb is no longer in the store"):
        resolve_session_models(state, gone, "talk")
    other_kind = _catalog(imported("gemma"), _speech("wb", "whisper"), imported("joe"))
    with pytest.raises(RealtimeProfileError, match="its tts joe is now a llama-server model, not a piper voice"):
        resolve_session_models(state, other_kind, "talk")


def test_a_chat_model_gets_the_registry_speech_models_first_else_the_first_of_each_kind() -> None:
    none = RealtimeState()
    catalog = _catalog(imported("gemma"), _speech("a-whisper", "whisper"), _speech("whisper-base", "whisper"),
                       _speech("amy", "piper"), _speech("joe", "piper"), ModelAliased(alias="chat", target="gemma"))
    assert resolve_session_models(none, catalog, "chat") == SessionModels("whisper-base", "gemma", "joe", None, None)
    fallback = _catalog(imported("gemma"), _speech("b-whisper", "whisper"), _speech("a-whisper", "whisper"),
                        _speech("amy", "piper"), imported("joe"))  # a `joe` that is no voice is no default voice
    assert resolve_session_models(none, fallback, "gemma") == SessionModels("a-whisper", "gemma", "amy", None, None)


def test_what_cannot_serve_a_session_is_refused_saying_why() -> None:
    none = RealtimeState()
    catalog = _catalog(imported("gemma"), _speech("wb", "whisper"))
    with pytest.raises(ModelNotFound, match="no realtime profile or model named 'nope'"):
        resolve_session_models(none, catalog, "nope")
    with pytest.raises(RealtimeProfileError, match="wb is a whisper model: a realtime session asks for a chat model"):
        resolve_session_models(none, catalog, "wb")
    with pytest.raises(RealtimeProfileError, match="needs a piper voice and the store has none: blazar pull joe"):
        resolve_session_models(none, catalog, "gemma")
    with pytest.raises(RealtimeProfileError, match="needs a whisper model and the store has none: blazar pull "
                                                    "whisper-base"):
        resolve_session_models(none, _catalog(imported("gemma"), _speech("joe", "piper")), "gemma")


async def _store(app: Blazar) -> None:
    voice = app.paths.models / "two" / "two.onnx.json"
    voice.parent.mkdir(parents=True)
    voice.write_text(json.dumps({"audio": {"sample_rate": 16000}, "speaker_id_map": {"zed": 0, "amy": 1}}))
    for event in (imported("gemma"), _speech("wb", "whisper"), _speech("joe", "piper"),
                  _speech("two", "piper", ("two/two.onnx", "two/two.onnx.json")),
                  ModelAliased(alias="chat", target="gemma")):
        await app.record(event)


async def test_set_records_own_names_and_a_speaker_and_rm_forgets(app: Blazar) -> None:
    await _store(app)
    done = await set_profile(app, "talk", stt="wb", llm="chat", tts="two", speaker="amy")
    assert done.event == RealtimeProfileSet(name="talk", stt="wb", llm="gemma", tts="two", speaker="amy")
    await app.runner.catch_up()
    assert resolve_session_models(app.runner.state("realtime"), app.runner.state("catalog"), "talk").speaker == "amy"
    await set_profile(app, "talk", stt="wb", llm="gemma", tts="joe")  # replaced
    assert profile(app.runner.state("realtime"), "talk").tts == "joe"  # type: ignore[union-attr]
    gone = await remove_profile(app, "talk")
    assert gone.event == RealtimeProfileRemoved(name="talk")
    with pytest.raises(RealtimeProfileError, match="no realtime profile named 'talk'"):
        await remove_profile(app, "talk")


async def test_set_refuses_wrong_kinds_missing_models_taken_names_and_unknown_speakers(app: Blazar) -> None:
    await _store(app)
    ok = {"stt": "wb", "llm": "gemma", "tts": "two"}
    cases: list[tuple[str, dict[str, str], type[Exception], str]] = [
        ("bad name", ok, InvalidModelName, "invalid model name"),
        ("gemma", ok, RealtimeProfileError, "'gemma' is a model's name in the store"),
        ("chat", ok, RealtimeProfileError, "'chat' is a name of the model gemma in the store"),
        ("talk", ok | {"stt": "gemma"}, RealtimeProfileError, "--stt gemma is a llama-server model: --stt takes a "
                                                              "whisper model"),
        ("talk", ok | {"llm": "wb"}, RealtimeProfileError, "--llm wb is a whisper model: --llm takes a chat model"),
        ("talk", ok | {"tts": "nope"}, RealtimeProfileError, "--tts 'nope': no such model in the store"),
        ("talk", ok | {"speaker": "bob"}, RealtimeProfileError, "--voice 'bob' is not a speaker of two; its "
                                                                "speakers: zed, amy"),
        ("talk", ok | {"tts": "joe", "speaker": "amy"}, RealtimeProfileError, "joe has a single speaker"),
    ]
    for name, kw, error, message in cases:
        with pytest.raises(error, match=message):
            await set_profile(app, name, **kw)
    assert profiles(app.runner.state("realtime")) == []


async def test_a_profile_outlives_a_model_removed_under_it_and_says_so(app: Blazar) -> None:
    await _store(app)
    await set_profile(app, "talk", stt="wb", llm="gemma", tts="joe")
    await app.record(ModelRemoved(name="wb", path="wb/model.bin", file_deleted=True))
    await app.runner.catch_up()
    assert profile(app.runner.state("realtime"), "talk") is not None
    with pytest.raises(RealtimeProfileError, match="its stt wb is no longer in the store"):
        resolve_session_models(app.runner.state("realtime"), app.runner.state("catalog"), "talk")

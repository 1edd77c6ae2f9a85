"""Model settings and variants: what is accepted (templates, parameters), what the catalog folds from the events,
what the handlers record (and what rm does to a file a variant shares), how a request is filled from the settings,
and the engine flags a template gives."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from blazar.adapters.engines.llama_server import Capabilities, FlagSpec
from blazar.context import Blazar
from blazar.errors import EngineIncompatible, InvalidModelSettings, ModelExists, ModelNotFound
from blazar.events.model_settings import ModelConfigured, ModelSettings, ModelVariantCreated
from blazar.events.models import ModelImported, ModelMetadata, ModelRemoved
from blazar.events.types import encode
from blazar.projections import CatalogProjection, fold
from blazar.projections.catalog import models, settings_of, stored
from blazar.serving.call import Call, Desk
from blazar.serving.model_defaults import settings_patch, template_patch
from blazar.serving.request import Request
from blazar.store.model_settings import (
    SettingsChange,
    apply_registry_settings,
    configure_model,
    create_variant,
    engine_templates,
    parse_parameter,
    parse_parameters,
    parse_template,
    template_flags,
    template_key,
)
from blazar.store.models import alias_model, import_model, remove_model
from tests.support import gguf_factory
from tests.support.events import rec

JINJA = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"
GO = "{{ if .System }}<|system|>{{ .System }}{{ end }}<|user|>{{ .Prompt }}<|assistant|>"


# -- what is accepted ----------------------------------------------------------------------------------------------


def test_a_template_is_a_builtin_name_or_a_jinja_text() -> None:
    assert parse_template("gemma") == ("builtin", "gemma")
    assert parse_template("  chatml\n") == ("builtin", "chatml")
    assert parse_template(JINJA) == ("jinja", JINJA)


@pytest.mark.parametrize(("text", "words"), [
    (GO, ["Go template", "built-in template name", "Jinja"]),
    ("{{ .Prompt }}", ["Go template"]),
    ("{{- range .Messages }}{{ .Content }}{{ end }}", ["Go template"]),
    ("gemmaa", ["'gemmaa'", "gemma, "]),
    ("", ["empty"]),
    ("{% for m in messages %}{{ m }", ["unbalanced"]),
])
def test_a_template_that_cannot_be_served_is_refused_saying_what_is_accepted(text: str, words: list[str]) -> None:
    with pytest.raises(InvalidModelSettings) as e:
        parse_template(text)
    assert e.value.http_status == 400
    for w in words:
        assert w in e.value.message


def test_the_engines_own_list_of_builtins_is_read_from_its_help() -> None:
    text = "set custom jinja chat template ... list of built-in templates: bailing, chatml, gemma, llama3"
    assert engine_templates(text) == ("bailing", "chatml", "gemma", "llama3")
    assert engine_templates("no list here") == ()
    with pytest.raises(InvalidModelSettings):
        parse_template("zephyr", engine_templates(text))


def test_parameters_are_typed_under_ollamas_names() -> None:
    assert parse_parameter("temperature", "0.7") == ("temperature", 0.7)
    assert parse_parameter("temperature", 1) == ("temperature", 1.0)
    assert parse_parameter("top_k", "40") == ("top_k", 40)
    assert parse_parameter("ctx", "4096") == ("num_ctx", 4096)
    assert parse_parameter("max_tokens", 64) == ("num_predict", 64)
    assert parse_parameter("stop", '"<end_of_turn>"') == ("stop", ["<end_of_turn>"])
    assert parse_parameters([("stop", "a"), ("temperature", "0.1"), ("stop", "b"), ("temperature", "0.3")]) == {
        "stop": ["a", "b"], "temperature": 0.3}


@pytest.mark.parametrize(("key", "value", "words"), [
    ("temprature", "0.7", ["unknown", "temperature"]),
    ("temperature", "hot", ["expected a number"]),
    ("top_k", "4.5", ["expected an integer"]),
    ("top_k", 4.5, ["expected an integer"]),
    ("num_ctx", "0", ["num_ctx", "from 1"]),
    ("num_predict", "-3", ["num_predict"]),
    ("temperature", "nan", ["finite"]),
    ("temperature", True, ["expected a number"]),
    ("num_gpu", "99", ["not supported", "planner"]),
    ("stop", [], ["stop"]),
])
def test_a_bad_parameter_is_refused_clearly(key: str, value: object, words: list[str]) -> None:
    with pytest.raises(InvalidModelSettings) as e:
        parse_parameter(key, value)
    for w in words:
        assert w in e.value.message


def test_a_change_sets_clears_and_says_what_it_changed() -> None:
    old = ModelSettings(template_kind="builtin", template="gemma", system="Be kind.",
                        parameters={"temperature": 0.5, "top_k": 20})
    new, changed = SettingsChange(system="Be brief.", parameters={"top_p": 0.9}, clear_parameters=("temperature",),
                                  clear_template=True).applied_to(old)
    assert new == ModelSettings(system="Be brief.", parameters={"top_k": 20, "top_p": 0.9})
    assert changed == ["template", "system", "parameters.temperature", "parameters.top_p"]
    cleared, _ = SettingsChange(clear_parameters=("all",), clear_system=True).applied_to(new)
    assert cleared.is_empty()


# -- the catalog, fed events ---------------------------------------------------------------------------------------

META = ModelMetadata(architecture="gemma3", name="g", parameter_count=268_000_000)


def base_import() -> ModelImported:
    return ModelImported(name="g", path="g.gguf", source="/src/g.gguf", bytes=100, sha256="ab" * 32, linked=True,
                         metadata=META)


SETTINGS = ModelSettings(template_kind="builtin", template="gemma", system="Be brief.",
                         parameters={"temperature": 0.2, "stop": ["<end_of_turn>"]})


def test_a_configured_model_reads_back_its_settings_typed() -> None:
    state = fold(CatalogProjection(), [rec(1, base_import()), rec(2, ModelConfigured(name="g", settings=SETTINGS))])
    assert settings_of(state, "g") == SETTINGS
    assert stored(state, "g").settings == SETTINGS  # type: ignore[union-attr]
    cleared = fold(CatalogProjection(), [rec(3, ModelConfigured(name="g", settings=ModelSettings()))], state)
    assert settings_of(cleared, "g") is None


def test_a_variant_is_a_model_on_its_bases_file_with_its_own_settings() -> None:
    state = fold(CatalogProjection(), [rec(1, base_import()),
                                       rec(2, ModelVariantCreated(name="brief", base="g", settings=SETTINGS))])
    variant, base = stored(state, "brief"), stored(state, "g")
    assert variant is not None and base is not None
    assert (variant.file, variant.sha256, variant.metadata) == (base.file, base.sha256, base.metadata)
    assert variant.base == "g"
    assert variant.settings == SETTINGS and base.settings is None
    assert [m.name for m in models(state)] == ["brief", "g"]
    # The base removed: the variant stays, with the file facts it copied.
    state = fold(CatalogProjection(), [rec(3, ModelRemoved(name="g", path="g.gguf", file_deleted=False))], state)
    assert stored(state, "brief").file == "g.gguf"  # type: ignore[union-attr]


def test_a_variant_of_a_missing_base_adds_nothing() -> None:
    state = fold(CatalogProjection(), [rec(1, ModelVariantCreated(name="brief", base="gone", settings=SETTINGS))])
    assert state.models == {}


# -- the handlers and their events ---------------------------------------------------------------------------------


@pytest.fixture
async def stocked(app: Blazar, tmp_path: Path) -> Blazar:
    src = tmp_path / "tiny.gguf"
    gguf_factory.write_plain(src)
    await import_model(app, src, "tiny")
    return app


async def test_model_set_records_the_whole_settings_and_what_changed(stocked: Blazar) -> None:
    rec1 = await configure_model(stocked, "tiny", SettingsChange(template="gemma", parameters={"temperature": 0.3}))
    assert isinstance(rec1.event, ModelConfigured)
    assert rec1.event.changed == ["template", "parameters.temperature"]
    rec2 = await configure_model(stocked, "tiny", SettingsChange(system="Be brief."))
    assert rec2.event.settings == ModelSettings(template_kind="builtin", template="gemma", system="Be brief.",
                                                parameters={"temperature": 0.3})
    assert settings_of(stocked.runner.state("catalog"), "tiny") == rec2.event.settings
    await alias_model(stocked, "t", "tiny")
    rec3 = await configure_model(stocked, "t", SettingsChange(clear_system=True))
    assert rec3.event.name == "tiny"  # an alias configures the model it names
    with pytest.raises(ModelNotFound):
        await configure_model(stocked, "nope", SettingsChange(system="x"))


async def test_a_variant_inherits_its_bases_settings_and_rm_of_either_leaves_the_file_to_the_other(
        stocked: Blazar) -> None:
    await configure_model(stocked, "tiny", SettingsChange(template="chatml", parameters={"top_k": 5}))
    rec = await create_variant(stocked, "brief", "tiny", SettingsChange(system="Be brief.",
                                                                       parameters={"temperature": 0.1}))
    assert isinstance(rec.event, ModelVariantCreated)
    assert rec.event.settings == ModelSettings(template_kind="builtin", template="chatml", system="Be brief.",
                                               parameters={"top_k": 5, "temperature": 0.1})
    file = stocked.paths.models / "tiny.gguf"
    assert sorted(p.name for p in stocked.paths.models.glob("*.gguf")) == ["tiny.gguf"]  # nothing copied
    removed = await remove_model(stocked, "brief")
    assert removed.event.file_deleted is False and file.is_file()
    assert stored(stocked.runner.state("catalog"), "tiny") is not None
    await create_variant(stocked, "brief", "tiny", SettingsChange())
    await remove_model(stocked, "tiny")
    assert file.is_file() and stored(stocked.runner.state("catalog"), "brief") is not None
    last = await remove_model(stocked, "brief")
    assert last.type == "model.removed" and not file.exists()  # the last one frees it


async def test_creating_a_variant_again_replaces_its_settings_and_a_taken_name_is_refused(
        stocked: Blazar, tmp_path: Path) -> None:
    await create_variant(stocked, "brief", "tiny", SettingsChange(system="one"))
    again = await create_variant(stocked, "brief", "tiny", SettingsChange(system="two"))
    assert isinstance(again.event, ModelConfigured) and again.event.settings.system == "two"
    itself = await create_variant(stocked, "tiny", "tiny", SettingsChange(system="own"))
    assert isinstance(itself.event, ModelConfigured) and itself.event.name == "tiny"
    src = tmp_path / "other.gguf"
    gguf_factory.write_plain(src)
    await import_model(stocked, src, "other")
    with pytest.raises(ModelExists):
        await create_variant(stocked, "other", "tiny", SettingsChange())
    with pytest.raises(ModelNotFound):
        await create_variant(stocked, "x", "nope", SettingsChange())


async def test_registry_settings_never_overwrite_a_users_own(stocked: Blazar) -> None:
    first = await apply_registry_settings(stocked, "tiny", "gemma", None, {"temperature": 1})
    assert first is not None and first.event.source == "registry"
    await configure_model(stocked, "tiny", SettingsChange(clear_template=True))
    assert await apply_registry_settings(stocked, "tiny", "gemma", None, {}) is None
    assert settings_of(stocked.runner.state("catalog"), "tiny") == ModelSettings(parameters={"temperature": 1.0})


# -- a request, filled from the settings ---------------------------------------------------------------------------


NO_DESK = cast(Desk, object())  # settings are applied before anything is recorded or held


def apply_settings(call: Call, settings: ModelSettings) -> bool:
    """The settings' patch applied to the call: True when it changed the engine's body."""
    patch = settings_patch(call.request, call.ask.engine_body(), settings)
    call.ask.apply(patch)
    return bool(patch.fields)


def add_template_defaults(call: Call, stops: tuple[str, ...], sampling: dict[str, float], *,
                          loop_guard: bool = False) -> bool:
    """The template's patch applied to the call: True when it changed the engine's body."""
    patch = template_patch(call.request, call.ask.engine_body(), stops, sampling, loop_guard=loop_guard)
    call.ask.apply(patch)
    return bool(patch.fields)


def _chat(body: dict[str, object], *, translated: bool = False) -> Call:
    return Call(Request(model="m", engine_path="/v1/chat/completions", body=dict(body) if translated else None,
                        stream=False, parsed=dict(body)), NO_DESK)


def test_the_system_prompt_leads_a_chat_that_has_none_and_defaults_fill_what_is_unset() -> None:
    s = ModelSettings(system="Be brief.", parameters={"temperature": 0.2, "num_predict": 32, "num_ctx": 1024,
                                                      "stop": ["<x>"]})
    plan = _chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.9})
    assert apply_settings(plan, s) is True
    assert plan.ask.body == {"model": "m", "temperature": 0.9, "max_tokens": 32, "stop": ["<x>"],
                         "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    assert (plan.ask.max_tokens, plan.ask.ctx) == (32, 1024)
    assert plan.request.parsed["messages"] == [{"role": "user", "content": "hi"}]  # the client's body as it came


def test_a_request_with_its_own_system_message_or_limits_wins() -> None:
    s = ModelSettings(system="Be brief.", parameters={"num_predict": 32})
    for role in ("system", "developer"):
        messages = [{"role": role, "content": "Be long."}, {"role": "user", "content": "x"}]
        plan = _chat({"model": "m", "messages": messages, "max_completion_tokens": 8}, translated=True)
        assert apply_settings(plan, s) is False
        assert plan.ask.body is not None and plan.ask.body["messages"][0]["content"] == "Be long."
        assert "max_tokens" not in plan.ask.body


def test_a_template_adds_its_stops_after_the_requests_own_and_its_sampling_where_none_is_set() -> None:
    stops, greedy = ("\nUser:", "\nSystem:"), {"temperature": 0.0}
    plan = _chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": "<x>"})
    assert add_template_defaults(plan, stops, greedy) is True
    assert plan.ask.body is not None and plan.ask.body["stop"] == ["<x>", "\nUser:", "\nSystem:"]
    assert plan.ask.body["temperature"] == 0.0
    assert plan.request.parsed.get("stop") == "<x>"  # the client's body as it came
    # The request's own temperature (or one the model's settings filled in before routing) wins; nothing to add is
    # no change.
    own = _chat({"model": "m", "messages": [], "temperature": 0.7, "stop": ["\nUser:", "\nSystem:"]})
    assert add_template_defaults(own, stops, greedy) is False and own.ask.body is None
    # A template of the GGUF's own or the user's adds nothing; an embedding request is left alone.
    assert add_template_defaults(_chat({"model": "m", "messages": []}), (), {}) is False
    embed = Call(Request(model="m", engine_path="/v1/embeddings", body=None, stream=False, embeddings=True), NO_DESK)
    assert add_template_defaults(embed, stops, greedy) is False and embed.ask.body is None


def test_a_template_that_guards_loops_asks_a_streamed_chat_for_the_engines_per_token_timings() -> None:
    streamed = Call(Request(model="m", engine_path="/v1/chat/completions", body=None, stream=True,
                            parsed={"model": "m", "messages": []}), NO_DESK)
    assert add_template_defaults(streamed, (), {}, loop_guard=True) is True
    body = streamed.ask.body
    assert streamed.ask.loop_guarded and body is not None and body["timings_per_token"] is True
    # A whole answer is not guarded (the engine sends it in one piece); nor is a template that does not guard.
    whole = _chat({"model": "m", "messages": []})
    assert add_template_defaults(whole, (), {}, loop_guard=True) is False and not whole.ask.loop_guarded
    unguarded = Call(Request(model="m", engine_path="/v1/chat/completions", body=None, stream=True,
                             parsed={"model": "m", "messages": []}), NO_DESK)
    assert add_template_defaults(unguarded, ("<x>",), {}) is True and not unguarded.ask.loop_guarded
    assert unguarded.ask.body is not None and "timings_per_token" not in unguarded.ask.body
    # Nor is an answer held to a grammar (a forced call, structured output): cut, its JSON would be half-written.
    for held in ({"grammar": "root ::= \"{}\""}, {"response_format": {"type": "json_object"}}):
        constrained = Call(Request(model="m", engine_path="/v1/chat/completions", body=None, stream=True,
                                   parsed={"model": "m", "messages": [], **held}), NO_DESK)
        assert add_template_defaults(constrained, (), {}, loop_guard=True) is False and not constrained.ask.loop_guarded


def test_embeddings_are_left_alone() -> None:
    plan = Call(Request(model="m", engine_path="/v1/embeddings", body=None, stream=False, embeddings=True), NO_DESK)
    assert apply_settings(plan, SETTINGS) is False and plan.ask.body is None


# -- the engine's flags --------------------------------------------------------------------------------------------

CAPS = Capabilities(flags=[FlagSpec(names=("--chat-template",), metavar="JINJA_TEMPLATE",
                                    help="... list of built-in templates: chatml, gemma"),
                           FlagSpec(names=("--chat-template-file",), metavar="FNAME"),
                           FlagSpec(names=("--jinja", "--no-jinja"))])


def test_a_builtin_goes_on_the_argv_by_name_and_a_jinja_text_as_a_file(tmp_path: Path) -> None:
    assert template_flags(CAPS, None, tmp_path) == []
    assert template_flags(CAPS, ModelSettings(template_kind="builtin", template="gemma"), tmp_path) == [
        "--no-jinja", "--chat-template", "gemma"]
    jinja = ModelSettings(template_kind="jinja", template=JINJA)
    flags = template_flags(CAPS, jinja, tmp_path)
    assert flags[:2] == ["--jinja", "--chat-template-file"]
    assert Path(flags[2]).read_text() == JINJA and Path(flags[2]).parent == tmp_path
    assert template_flags(CAPS, jinja, tmp_path) == flags  # the same text, the same file
    with pytest.raises(EngineIncompatible):
        template_flags(CAPS, ModelSettings(template_kind="builtin", template="zephyr"), tmp_path)


def test_the_template_identifies_an_instance() -> None:
    assert template_key(None) == "" == template_key(ModelSettings(system="x"))
    a = template_key(ModelSettings(template_kind="builtin", template="gemma"))
    b = template_key(ModelSettings(template_kind="builtin", template="chatml"))
    assert a and b and a != b


async def test_pulling_a_registry_model_again_gives_it_the_registrys_settings_once(
        app: Blazar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from blazar import registry
    from blazar.store.pull import pull

    # The demo's registry entry sets nothing now (its architecture's template serves it): give it a template here.
    entries = registry.load()
    entries["gemma3-270m"] = replace(entries["gemma3-270m"], template="gemma")
    monkeypatch.setattr(registry, "load", lambda text=None: entries)
    src = tmp_path / "g.gguf"
    gguf_factory.write_plain(src)
    # A store that pulled the demo model before the registry gave it a template.
    await import_model(app, src, "gemma3-270m", source="gemma3-270m", source_kind="python-package")
    result = await pull(app, "gemma3-270m")
    assert result.already_present
    assert settings_of(app.runner.state("catalog"), "gemma3-270m") == ModelSettings(template_kind="builtin",
                                                                                    template="gemma")
    await configure_model(app, "gemma3-270m", SettingsChange(clear_template=True))
    await pull(app, "gemma3-270m")
    assert settings_of(app.runner.state("catalog"), "gemma3-270m") is None  # the user's choice stays


# -- what model.configured can record (blazar/events/bounds.py) ---------------------------------------------------

def test_settings_past_what_their_event_records_are_refused_naming_the_size() -> None:
    with pytest.raises(InvalidModelSettings, match=r"template: 24,5\d\d bytes as JSON, more than the 24,576"):
        parse_template("{{ messages }}" + "x" * (24 << 10))
    with pytest.raises(InvalidModelSettings, match=r"system: .* bytes as JSON, more than the 16,384"):
        SettingsChange(system="\n" * (8 << 10)).applied_to(ModelSettings())  # a newline is two bytes in JSON
    with pytest.raises(InvalidModelSettings, match=r"parameters: .* more than the 6,144"):
        parse_parameters([("stop", ["s" * 1000] * 8)])
    with pytest.raises(InvalidModelSettings, match="at most 8 by default"):
        SettingsChange(lora={f"a{i}": 1.0 for i in range(9)}).applied_to(ModelSettings())
    # The largest accepted is recorded: the whole event fits the log's bound.
    big = ModelSettings(template_kind="jinja", template=parse_template("{{ x }}" + "y" * ((24 << 10) - 16))[1],
                        system="z" * ((16 << 10) - 2), parameters=parse_parameters([("stop", ["s" * 700] * 8)]))
    encode(ModelConfigured(name="g", settings=big, changed=["template", "system", "parameters.stop"]))

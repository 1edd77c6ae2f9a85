"""Which template a model is served with and whether it only continues text (blazar/store/chat_templates.py)."""

from __future__ import annotations

import copy

from blazar.events.model_settings import ModelSettings
from blazar.events.models import ModelMetadata
from blazar.store.chat_templates import (
    PROBED_SAMPLING,
    capabilities,
    completion_only,
    probe_candidates,
    served_settings,
    served_template,
)
from blazar.store.turn_formats import CHATML, GEMMA, TRANSCRIPT


def meta(arch: str = "gemma3", name: str | None = "Gemma 3 270m", *, template: bool = False,
         embedding: bool = False) -> ModelMetadata:
    return ModelMetadata(architecture=arch, name=name, chat_template=template, embedding_model=embedding)


def test_the_order_is_settings_then_the_gguf_then_the_architecture_then_the_engines_fallback() -> None:
    mine = ModelSettings(template_kind="builtin", template="chatml")
    assert served_template(meta(template=True), mine).source == "settings"
    assert served_template(meta(template=True), None).source == "gguf"
    arch = served_template(meta(), None)
    assert (arch.source, arch.kind, arch.name) == ("architecture", "jinja", "gemma")
    assert "<start_of_turn>" in (arch.template or "") and "<|im_start|>" not in (arch.template or "")
    # `llama` covers several turn formats: no guess, llama-server's ChatML fallback, and show says so.
    fallback = served_template(meta("llama", "Some Llama"), None)
    assert fallback.source == "fallback" and "ChatML" in fallback.describe()


def test_served_settings_add_the_architecture_template_only_where_nothing_else_gives_one() -> None:
    system_only = ModelSettings(system="Be brief.")
    got = served_settings(meta(), system_only)
    assert got is not None and (got.template_kind, got.system) == ("jinja", "Be brief.")
    assert served_settings(meta(template=True), system_only) is system_only
    assert served_settings(meta("llama"), None) is None
    # An engine that takes no template file keeps its own fallback rather than refusing the load.
    assert served_settings(meta(), None, jinja_files=False) is None


def test_a_base_model_is_one_with_no_template_and_no_instruction_tuned_name() -> None:
    assert completion_only(meta())
    assert not completion_only(meta(name="Gemma 3 270m It"))
    assert not completion_only(meta(name="Qwen2.5 0.5B Instruct"))
    assert not completion_only(meta(name="Gemma 3 270m", template=True))
    assert completion_only(meta(name="Italian Poetry 1B"))  # "it" only as a word of its own
    assert not completion_only(meta("bert", embedding=True))
    assert capabilities(meta()) == ["completion"]
    assert capabilities(meta(template=True)) == ["completion", "chat"]
    assert capabilities(meta("bert", embedding=True)) == ["embedding"]


def test_a_probed_choice_comes_after_settings_and_the_gguf_and_before_the_architecture() -> None:
    probed = served_template(meta(), None, "transcript")
    assert (probed.source, probed.name, probed.kind) == ("probe", "transcript", "jinja")
    assert probed.template == TRANSCRIPT.jinja and "template probe" in probed.describe()
    assert probed.stops == TRANSCRIPT.stops
    assert served_template(meta(template=True), None, "transcript").source == "gguf"
    mine = ModelSettings(template_kind="builtin", template="chatml")
    assert served_template(meta(), mine, "transcript").source == "settings"
    assert served_template(meta("llama"), None, "chatml").name == "chatml"  # an architecture Blazar has no template of
    assert served_template(meta(), None, "no-such-template").source == "architecture"  # a name this build lacks
    got = served_settings(meta(), None, "chatml")
    assert got is not None and got.template == CHATML.jinja


def test_stops_come_with_a_shipped_template_only() -> None:
    assert served_template(meta(), None).stops == GEMMA.stops  # by architecture
    assert served_template(meta(template=True), None).stops == ()  # the GGUF's own ends its own turns
    assert served_template(meta("llama"), None).stops == ()
    assert served_template(meta(), ModelSettings(template_kind="jinja", template="{{ x }}")).stops == ()
    # One Blazar ships, set by name (blazar:NAME is stored as its text): its stops, and show names it.
    shipped = served_template(meta(), ModelSettings(template_kind="jinja", template=TRANSCRIPT.jinja))
    assert shipped.stops == TRANSCRIPT.stops and shipped.describe() == "transcript (Blazar's) (set for this model)"


def test_a_probed_template_is_served_greedy_as_it_was_measured_and_no_other_source_sets_sampling() -> None:
    assert served_template(meta(), None, "transcript").sampling == PROBED_SAMPLING == {"temperature": 0.0}
    # Each its own plain dict: an instance carrying it is copied whole (dataclasses.asdict deep-copies: /api/ps).
    assert copy.deepcopy(served_template(meta(), None, "transcript").sampling) == {"temperature": 0.0}
    assert "greedy" in served_template(meta(), None, "transcript").describe()
    assert served_template(meta(), None).sampling == {}  # by architecture: not probed yet
    assert served_template(meta(template=True), None, "transcript").sampling == {}  # the GGUF's own wins
    shipped = ModelSettings(template_kind="jinja", template=TRANSCRIPT.jinja)  # set by the user: not measured
    assert served_template(meta(), shipped, "transcript").sampling == {}


def test_only_a_probed_template_guards_its_answers_against_loops() -> None:
    assert served_template(meta(), None, "transcript").guards_loops
    assert not served_template(meta(), None).guards_loops  # by architecture: not probed yet
    assert not served_template(meta(template=True), None, "transcript").guards_loops  # the GGUF's own
    shipped = ModelSettings(template_kind="jinja", template=TRANSCRIPT.jinja)  # set by the user
    assert not served_template(meta(), shipped, "transcript").guards_loops


def test_the_probe_tries_the_architectures_template_first_then_chatml_then_the_transcript() -> None:
    assert [f.name for f in probe_candidates(meta(), None)] == ["gemma", "chatml", "transcript"]
    assert [f.name for f in probe_candidates(meta("llama"), None)] == ["chatml", "transcript"]
    assert probe_candidates(meta(template=True), None) == []
    assert probe_candidates(meta("bert", embedding=True), None) == []
    assert probe_candidates(meta(), ModelSettings(template_kind="builtin", template="chatml")) == []
    assert probe_candidates(meta(), ModelSettings(system="Be brief."))[0].name == "gemma"

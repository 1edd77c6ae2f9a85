"""Which template a model is served with and whether it only continues text (blazar/store/chat_templates.py)."""

from __future__ import annotations

from blazar.events.model_settings import ModelSettings
from blazar.events.models import ModelMetadata
from blazar.store.chat_templates import capabilities, completion_only, served_settings, served_template


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

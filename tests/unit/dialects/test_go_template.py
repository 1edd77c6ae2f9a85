"""Ollama's Go chat templates as Jinja: each template Ollama ships (template/*.gotmpl, as Ollama writes them) renders,
through Blazar's own sandboxed renderer, the prompt Ollama's Go template gives for the same conversation (the expected
strings worked out by hand from Go's text/template rules: `{{-` and `-}}` trim the whitespace beside them; Ollama's
`.System` is every system message joined, `.Messages` merges consecutive turns of one role). What is not converted
says why."""

from __future__ import annotations

import pytest

from blazar.dialects.go_template import to_jinja
from blazar.errors import TemplateNotConvertible
from blazar.store.model_settings import parse_template
from blazar.store.turn_formats import render_jinja
from tests.support.ollama_store import GEMMA3

CHATML = ("{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
          "<|im_start|>assistant\n")
LLAMA3 = ("{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>\n"
          "{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n")
GEMMA = """{{- $system := "" }}
{{- range .Messages }}
{{- if eq .Role "system" }}
{{- if not $system }}{{ $system = .Content }}
{{- else }}{{ $system = printf "%s\\n\\n%s" $system .Content }}
{{- end }}
{{- continue }}
{{- else if eq .Role "user" }}<start_of_turn>user
{{- if $system }}
{{ $system }}
{{- $system = "" }}
{{- end }}
{{- else if eq .Role "assistant" }}<start_of_turn>model
{{- end }}
{{ .Content }}<end_of_turn>
{{ end }}<start_of_turn>model
"""
MISTRAL = """[INST] {{ range $index, $_ := .Messages }}
{{- if eq .Role "system" }}{{ .Content }}

{{ else if eq .Role "user" }}{{ .Content }}[/INST]
{{- else if eq .Role "assistant" }} {{ .Content }}</s>[INST] {{ end }}
{{- end }}"""
LLAMA2 = """{{- $system := "" }}[INST] {{ range .Messages }}
{{- if eq .Role "system" }}
{{- if not $system }}{{ $system = .Content }}
{{- else }}{{ $system = printf "%s\\n\\n%s" $system .Content }}
{{- end }}
{{- else if eq .Role "user" }}<<SYS>>
{{- if $system }}
{{ $system }}
{{ $system = "" }}
{{- end }}<</SYS>>

{{ .Content }} [/INST]
{{- else if eq .Role "assistant" }} {{ .Content }}</s><s>[INST] {{ end }}
{{- end }}"""
# A legacy template (no .Messages): Ollama runs it per turn and cuts the last one after {{ .Response }}.
LEGACY_PHI3 = """{{ if .System }}<|system|>
{{ .System }}<|end|>
{{ end }}{{ if .Prompt }}<|user|>
{{ .Prompt }}<|end|>
{{ end }}<|assistant|>
{{ .Response }}<|end|>
"""

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a color."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]

EXPECTED = {
    "chatml": (CHATML, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n"
                       "<|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\nAnother?<|im_end|>\n"
                       "<|im_start|>assistant\n"),
    "llama3-instruct": (LLAMA3, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\nName a color.<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\nBlue.<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\nAnother?<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "gemma-instruct": (GEMMA, "<start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
                              "<end_of_turn>\n<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n"
                              "Blue.<end_of_turn>\n<start_of_turn>user\nAnother?<end_of_turn>\n<start_of_turn>model\n"),
    "gemma3-instruct": (GEMMA3, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
                                "<end_of_turn>\n<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n"
                                "Blue.<end_of_turn>\n<start_of_turn>user\nAnother?<end_of_turn>\n"
                                "<start_of_turn>model\n\n"),
    "mistral-instruct": (MISTRAL, "[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] Name a color.[/INST] Blue.</s>"
                                  "[INST] Another?[/INST]"),
    "llama2-chat": (LLAMA2, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello!</s><s>[INST] <<SYS>><</SYS>>"
                            "\n\nName a color. [/INST] Blue.</s><s>[INST] <<SYS>><</SYS>>\n\nAnother? [/INST]"),
    "legacy phi-3": (LEGACY_PHI3, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
                                  "<|user|>\nName a color.<|end|>\n<|assistant|>\nBlue.<|end|>\n<|user|>\nAnother?"
                                  "<|end|>\n<|assistant|>\n"),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_shipped_template_renders_what_ollama_renders(name: str) -> None:
    go, expected = EXPECTED[name]
    jinja = to_jinja(go)
    assert render_jinja(jinja, CONVERSATION) == expected
    assert parse_template(jinja) == ("jinja", jinja)  # Blazar takes it as a model's template


def test_consecutive_turns_of_one_role_merge_and_every_system_text_joins_as_ollama_collates() -> None:
    messages = [{"role": "system", "content": "A."}, {"role": "system", "content": "B."},
                {"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert render_jinja(to_jinja(CHATML), messages) == (
        "<|im_start|>system\nA.\n\nB.<|im_end|>\n<|im_start|>user\none\n\ntwo<|im_end|>\n<|im_start|>assistant\n")
    assert render_jinja(to_jinja(GEMMA3), messages).startswith("<start_of_turn>user\nA.\n\nB.\n\none\n\ntwo")
    legacy = render_jinja(to_jinja(LEGACY_PHI3), messages)
    assert legacy == "<|system|>\nA.\n\nB.<|end|>\n<|user|>\none\n\ntwo<|end|>\n<|assistant|>\n"


def test_a_legacy_template_without_response_gets_it_appended_and_a_prefill_stays_open() -> None:
    go = "{{ if .System }}S:{{ .System }}\n{{ end }}U:{{ .Prompt }}\nA:"
    messages = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "partial"}]
    assert render_jinja(to_jinja(go), messages) == "U:q1\nA:a1U:q2\nA:partial"


def test_break_stops_the_range_and_content_parts_read_as_text() -> None:
    go = '{{- range .Messages }}{{ if eq .Role "assistant" }}{{ break }}{{ end }}[{{ .Content }}]{{ end }}END'
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "x"}, {"role": "user", "content": "c"}]
    assert render_jinja(to_jinja(go), messages) == "[ab]END"


def test_range_variables_comparisons_and_printf_follow_go() -> None:
    go = ('{{- range $i, $m := .Messages }}{{ if ne $m.Role "system" }}{{ if gt $i 1 }}|{{ end }}'
          '{{ printf "%d:%s%%" $i $m.Role }}{{ end }}{{ end }} of {{ len .Messages }}{{ if or .Response .System }}'
          ' with system{{ end }}')
    assert render_jinja(to_jinja(go), CONVERSATION) == (
        "1:user%|2:assistant%|3:user%|4:assistant%|5:user% of 6 with system")


@pytest.mark.parametrize(("go", "says"), [
    ('{{ .Prompt }}{{ printf "%s!" .Response }}', ".Response inside an expression"),
    ("{{ range .Messages }}{{ .Images }}{{ end }}", "a message's .Images"),
    ("{{ if .Tools }}{{ json .Tools }}{{ end }}{{ range .Messages }}{{ .Content }}{{ end }}", ".Tools"),
    ('{{ range .Messages }}{{ range .ToolCalls }}{"name": "{{ .Function.Name }}"}{{ end }}{{ end }}', ".ToolCalls"),
    ("{{ currentDate }}{{ range .Messages }}{{ .Content }}{{ end }}", "currentDate"),
    ('{{ define "x" }}y{{ end }}{{ template "x" }}', "define"),
    ("{{ range .Messages }}{{ .Content | printf \"%q\" }}{{ end }}", "pipelines"),
    ("{{ with .System }}{{ . }}{{ end }}{{ range .Messages }}{{ end }}", "with"),
    ("{{ if .Think }}think{{ end }}{{ range .Messages }}{{ .Content }}{{ end }}", ".Think"),
    ("{{ range .Messages }}{{ .Content }}", "no {{ end }}"),
    ("{{ range .Messages }}{{ $x := 1 }}{{ range $.Messages }}{{ $x := 2 }}{{ end }}{{ end }}", "declares $x again"),
    ("{{ if .System }}{{ .Response }}{{ else }}x{{ end }}{{ .Prompt }}", "{{ else }} after its {{ .Response }}"),
    ("{{ .Prompt }} {{ '{' }}{{ .Response }}", "cannot read"),
    ("{{ range .Messages }}{% raw %}{{ .Content }}{{ end }}", "Jinja's own delimiters"),
])
def test_what_is_not_converted_says_what(go: str, says: str) -> None:
    with pytest.raises(TemplateNotConvertible) as got:
        to_jinja(go)
    assert says in got.value.reason

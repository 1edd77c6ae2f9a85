"""Ollama's Modelfile: parsed into FROM, TEMPLATE, SYSTEM and PARAMETER (bare, quoted and triple-quoted values),
what Blazar cannot serve refused by name with its line, and settings rendered back as /api/show gives them."""

from __future__ import annotations

import pytest

from blazar.dialects.modelfile import Modelfile, parse, render_modelfile, render_parameters
from blazar.errors import DialectError


def test_every_supported_command_with_each_kind_of_value() -> None:
    text = '''# a comment
FROM gemma3-270m
template """{% for m in messages %}{{ m['content'] }}
{% endfor %}"""
SYSTEM "You are \\"brief\\"."

PARAMETER temperature 0.2
parameter stop "<end_of_turn>"
PARAMETER stop <eos>
PARAMETER num_ctx 2048
'''
    mf = parse(text)
    assert mf == Modelfile(from_="gemma3-270m",
                           template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
                           system='You are "brief".',
                           parameters=[("temperature", "0.2"), ("stop", "<end_of_turn>"), ("stop", "<eos>"),
                                       ("num_ctx", "2048")])


def test_a_triple_quoted_system_keeps_its_lines() -> None:
    mf = parse('FROM m\nSYSTEM """\nLine one.\nLine two.\n"""\n')
    assert mf.system == "\nLine one.\nLine two.\n"
    assert mf.from_ == "m"


def test_adapter_lines_are_kept_in_order_for_the_handler_to_resolve() -> None:
    mf = parse('FROM m\nADAPTER tuned\nADAPTER "./other.gguf"\n')
    assert mf.adapters == ["tuned", "./other.gguf"]


def test_an_empty_modelfile_sets_nothing() -> None:
    assert parse("\n# only a comment\n\n") == Modelfile()


@pytest.mark.parametrize(("text", "words"), [
    ("FROM m\nMESSAGE user hello\n", ["line 2", "MESSAGE is not supported"]),
    ('FROM m\nLICENSE """MIT"""\n', ["line 2", "LICENSE is not supported"]),
    ("FROM m\nQUANTIZE q4\n", ["line 2", "unknown command 'QUANTIZE'"]),
    ('FROM m\nTEMPLATE """never closed\n', ["line 2", "never closed"]),
    ('SYSTEM "no end\nFROM m\n', ["line 1", "never closed on its line"]),
    ("PARAMETER temperature\n", ["line 1", "PARAMETER temperature needs a value"]),
    ("PARAMETER\n", ["line 1", "PARAMETER needs a name and a value"]),
    ('SYSTEM "hi" there\n', ["line 1", "unexpected text after the value"]),
    ("FROM\n", ["line 1", "FROM needs a value"]),
])
def test_what_cannot_be_read_or_served_names_its_line(text: str, words: list[str]) -> None:
    with pytest.raises(DialectError) as e:
        parse(text)
    assert e.value.http_status == 400
    for w in words:
        assert w in e.value.message


def test_parameters_render_in_ollamas_text_format_one_line_per_stop() -> None:
    text = render_parameters({"temperature": 0.2, "stop": ["<end_of_turn>", "<eos>"], "num_ctx": 2048})
    assert text.splitlines() == [
        f"{'num_ctx':<30} 2048", f"{'stop':<30} \"<end_of_turn>\"", f"{'stop':<30} \"<eos>\"",
        f"{'temperature':<30} 0.2"]


def test_a_rendered_modelfile_parses_back_to_the_same_settings() -> None:
    text = render_modelfile("brief", "gemma3-270m", "gemma", "Be brief.\nVery.", {"temperature": 0.2,
                                                                                  "stop": ["<eos>"]})
    mf = parse(text)
    assert (mf.from_, mf.template, mf.system) == ("gemma3-270m", "gemma", "Be brief.\nVery.")
    assert mf.parameters == [("stop", "<eos>"), ("temperature", "0.2")]


def test_a_rendered_modelfile_names_the_adapters_it_applies() -> None:
    text = render_modelfile("tuned", "gemma3-270m", None, None, {}, ["tiny", "other"])
    assert parse(text).adapters == ["tiny", "other"]

"""`blazar model set` and `blazar show` through the real CLI, on a tiny GGUF from the factory: a Jinja template from a
file, a built-in by name, parameters and a system prompt, each clear option, and every refusal a clear exit 2."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Cli
from tests.support.gguf_factory import write_plain

JINJA = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


def _imported(cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    write_plain(src)
    cli("import", str(src), "--name", "tiny")


def test_set_show_and_clear_each_setting(cli: Cli, tmp_path: Path) -> None:
    _imported(cli, tmp_path)
    template = tmp_path / "chat.jinja"
    template.write_text(JINJA)
    out = cli("model", "set", "tiny", "--template", str(template), "--system", "Be brief.", "--param",
              "temperature=0.25", "--param", "stop=<x>", "--param", "stop=<y>", "--param", "ctx=512").stdout
    assert "template; system; parameters.temperature; parameters.stop; parameters.num_ctx changed" in out
    shown = cli("show", "tiny", "--json").json()["settings"]
    assert shown == {"template_kind": "jinja", "template": JINJA, "system": "Be brief.",
                     "parameters": {"temperature": 0.25, "stop": ["<x>", "<y>"], "num_ctx": 512}, "rerank": False,
                     "lora": {}, "reasoning_budget": None, "reasoning_effort": None, "cache": None}
    text = cli("show", "tiny").stdout
    assert f"Jinja, {len(JINJA)} characters" in text and "Be brief." in text and "temperature=0.25" in text
    cli("model", "set", "tiny", "--template", "chatml", "--clear-system", "--clear-param", "stop")
    shown = cli("show", "tiny", "--json").json()["settings"]
    assert (shown["template_kind"], shown["template"], shown["system"]) == ("builtin", "chatml", None)
    assert shown["parameters"] == {"temperature": 0.25, "num_ctx": 512}
    cli("model", "set", "tiny", "--clear-template", "--clear-param", "all")
    assert cli("show", "tiny", "--json").json()["settings"] is None
    assert "the GGUF's own" in cli("show", "tiny").stdout
    events = cli("events", "--type", "model.configured", "--json").json_lines()
    assert len(events) == 3 and events[-1]["data"]["changed"] == ["template", "parameters.temperature",
                                                                  "parameters.num_ctx"]


def test_refusals_are_clear_and_change_nothing(cli: Cli, tmp_path: Path) -> None:
    _imported(cli, tmp_path)
    go = tmp_path / "go.tmpl"
    go.write_text("{{ if .System }}{{ .System }}{{ end }}{{ .Prompt }}")
    for args, words in [
        (("--template", str(go)), ["Go template", "Jinja"]),
        (("--template", "nosuch"), ["'nosuch'", "gemma"]),
        (("--template", "./missing.jinja"), ["no such file"]),
        (("--param", "temprature=1"), ["temprature", "unknown"]),
        (("--param", "top_k=many"), ["top_k", "integer"]),
        (("--param", "num_gpu=99"), ["num_gpu", "planner"]),
        (("--param", "temperature"), ["key=value"]),
        ((), ["nothing to set"]),
    ]:
        r = cli("model", "set", "tiny", *args, check=False)
        assert r.code == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        for w in words:
            assert w in r.stderr, (args, r.stderr)
    r = cli("model", "set", "nope", "--system", "x", check=False)
    assert r.code == 2 and "nope" in r.stderr
    assert cli("events", "--type", "model.configured", "--json").stdout.strip() == ""


def test_rerank_mode_is_forced_and_undone_and_shows_as_a_capability(cli: Cli, tmp_path: Path) -> None:
    _imported(cli, tmp_path)
    assert "rerank" not in cli("show", "tiny", "--json").json()["capabilities"]
    assert "rerank changed" in cli("model", "set", "tiny", "--rerank").stdout
    shown = cli("show", "tiny", "--json").json()
    assert shown["settings"]["rerank"] is True and "rerank" in shown["capabilities"]
    assert "forced" in cli("show", "tiny").stdout
    assert "nothing changed" in cli("model", "set", "tiny", "--rerank").stdout
    cli("model", "set", "tiny", "--no-rerank")
    shown = cli("show", "tiny", "--json").json()
    assert shown["settings"] is None and "rerank" not in shown["capabilities"]
    events = cli("events", "--type", "model.configured", "--json").json_lines()
    assert [e["data"]["changed"] for e in events] == [["rerank"], [], ["rerank"]]

"""`blazar import --from ollama` through the real CLI, on an Ollama store laid out as Ollama writes it
(tests/support/ollama_store.py) around the real demo GGUF, found where Ollama keeps it (HOME): the model comes in
under its Ollama name with its template converted to Jinja, its system prompt and its parameters; what Blazar does
not take is said; a second run imports nothing new; then the `ollama` SDK gets an answer from the real engine under
the name it asked Ollama for, without its tag (`:latest`, as Ollama means it). The reader's and the converter's
cases: tests/unit/store/test_foreign_ollama.py, tests/unit/dialects/test_go_template.py."""

from __future__ import annotations

from pathlib import Path

import ollama

from blazar.dialects.go_template import to_jinja
from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.ollama_store import GEMMA3, add_model
from tests.support.serving import serving_on_a_free_port

SYSTEM = "Answer in one word."
PARAMS = {"stop": ["<end_of_turn>"], "temperature": 0, "num_ctx": 512, "num_gpu": 99}


def test_an_ollama_model_is_imported_with_its_settings_and_answers_the_ollama_sdk_under_its_name(
        cli: Cli, home: Path, tmp_path: Path, gemma_path: Path, engine_binary: Path) -> None:
    user = tmp_path / "user"
    store = user / ".ollama" / "models"
    manifest = add_model(store, "gemma3:270m", gemma_path, template=GEMMA3, system=SYSTEM, params=PARAMS)
    add_model(store, "gemma3:latest", gemma_path, template=GEMMA3, system=SYSTEM, params=PARAMS)
    cli.env["HOME"] = str(user)  # Ollama's default store, found from HOME
    cli.env.pop("OLLAMA_MODELS", None)

    plan = cli("import", "--from", "ollama", "--dry-run", "--json").json()
    assert plan["root"] == str(store)
    rows = {r["name"]: r for r in plan["models"]}
    assert sorted(rows) == ["gemma3:270m", "gemma3:latest"]
    row = rows["gemma3:270m"]
    assert (row["action"], row["source"]) == ("import", str(manifest))
    assert {"weights", "template (converted to Jinja)", "system", "num_ctx=512", "stop (1)", "temperature=0"} <= \
        set(row["carried"])
    assert any(n.startswith("num_gpu:") for n in row["not_carried"])
    assert read_events(home, "model.imported") == []

    done = cli("import", "--from", "ollama")
    assert "gemma3:270m" in done.stdout and "hardlink" in done.stdout
    events = {e["data"]["name"]: e["data"] for e in read_events(home, "model.imported")}
    assert sorted(events) == ["gemma3:270m", "gemma3:latest"]
    assert (events["gemma3:270m"]["source"], events["gemma3:270m"]["source_kind"]) == (str(manifest), "ollama")
    again = cli("import", "--from", "ollama", "--json").json()
    assert (again["imported"], again["present"]) == (0, 2)

    cli("engine", "install", "--path", str(engine_binary))
    cli("config", "set", "ctx", "512")
    with serving_on_a_free_port(home, tmp_path / "daemon.log") as (port, _):
        client = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=240, trust_env=False)
        shown = client.show("gemma3")  # no tag: gemma3:latest, as Ollama means it
        assert shown.template == to_jinja(GEMMA3) and SYSTEM in (shown.modelfile or "")
        assert "num_ctx" in (shown.parameters or "") and "<end_of_turn>" in (shown.parameters or "")
        answer = client.chat(model="gemma3:270m", messages=[{"role": "user", "content": "Name a color."}],
                             options={"num_predict": 4})
    assert answer.model == "gemma3:270m" and answer.message.content is not None and answer.done
    assert answer.eval_count is not None and answer.eval_count >= 1
    routed = read_events(home, "request.routed")
    assert routed and routed[-1]["data"]["model"] == "gemma3:270m"
    (started,) = [e["data"] for e in read_events(home, "instance.starting")]
    argv = started["argv"]  # the engine was given the converted template
    assert Path(argv[argv.index("--chat-template-file") + 1]).read_text() == to_jinja(GEMMA3)

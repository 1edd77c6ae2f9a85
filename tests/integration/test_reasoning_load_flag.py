"""A build that takes `--reasoning-budget N` at load but no request's own budget, end to end: bench/fake_engine.py
installed with such a build's --help (the fixture's without `--reasoning-budget-message`), a model whose budget is
64 (`blazar model set --reasoning-budget 64`). Its instance starts with `--reasoning-budget 64`; a request through the
official SDK that asks less is served with the load flag's, request.completed and `blazar why` say so, and the
answer's `x-blazar-ignored` tells the client."""

from __future__ import annotations

from pathlib import Path

import openai

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.fake_serving import fake_engine, serving_home
from tests.support.serving import blazar_cli

MODEL = "tiny"
BUDGET = 64
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llama_server"


def _old_build(where: Path) -> Path:
    """The fake engine, its --help that of a build before the budget sampler."""
    fixtures = where / "fixtures"
    fixtures.mkdir()
    (fixtures / "version.txt").write_text((FIXTURES / "version.txt").read_text())
    (fixtures / "help.txt").write_text("".join(line for line in (FIXTURES / "help.txt").read_text()
                                               .splitlines(keepends=True) if "--reasoning-budget-message" not in line))
    binary = fake_engine.write_executable(where / "llama-server")
    text = binary.read_text().replace(f"FIXTURES = Path({str(fake_engine.FIXTURES)!r})",
                                      f"FIXTURES = Path({str(fixtures)!r})")
    binary.write_text(text)
    return binary


def test_a_build_without_the_request_field_holds_every_request_to_the_load_flag_and_says_so(tmp_path: Path) -> None:
    home, files = tmp_path / "home", tmp_path / "files"
    files.mkdir()
    blazar_cli(home, "engine", "install", "--path", str(_old_build(tmp_path)))
    blazar_cli(home, "import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", MODEL)
    blazar_cli(home, "model", "set", MODEL, "--reasoning-budget", str(BUDGET))
    with serving_home(home, files) as daemon:
        client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="none", max_retries=0, timeout=60,
                               http_client=openai.DefaultHttpxClient(trust_env=False))
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            extra_body={"thinking_budget_tokens": 16})
        assert raw.parse().choices[0].message.content
        trace = raw.headers["x-blazar-trace-id"]
        argv = read_events(home, "instance.starting")[-1]["data"]["argv"]
        assert argv[argv.index("--reasoning-budget") + 1] == str(BUDGET)
        done = wait_for(lambda: [e["data"] for e in read_events(home, "request.completed") if e["trace_id"] == trace],
                        "request.completed", timeout=30)
        assert done[0]["reasoning"] == {"budget": BUDGET, "effort": None, "enforced_by": "load_flag", "requested": 16,
                                        "reasoning_tokens": None}
        assert raw.headers["x-blazar-ignored"].startswith("thinking_budget ")
        same = client.chat.completions.with_raw_response.create(  # what the flag holds anyway: nothing ignored
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            extra_body={"thinking_budget_tokens": BUDGET})
        assert "x-blazar-ignored" not in same.headers
        why = blazar_cli(home, "why", trace).stdout
        assert "this engine build ignores the request's thinking budget; the model's load flag (64 tokens) held it" \
            in " ".join(why.split())
        with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
                reasoning_effort="none") as streamed:  # thinking off: a budget of 0, not the flag's
            assert streamed.headers["x-blazar-ignored"].startswith("thinking_budget ")
            assert "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
        # Another budget is another load shape: the instance with the old flag gives way to one with the new.
        blazar_cli(home, "model", "set", MODEL, "--reasoning-budget", "32")
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        started = [e["data"]["argv"] for e in read_events(home, "instance.starting")]
        assert len(started) == 2 and started[1][started[1].index("--reasoning-budget") + 1] == "32"

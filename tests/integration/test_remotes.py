"""Remote engines end to end: a Blazar (A) routes a model name to another OpenAI-compatible server: a second Blazar
(B, serving the fake engine) or bench/fake_engine.py itself. Through A the request gets A's admission, trace, `why`,
metrics and dialect translation (the Ollama and Anthropic SDKs reach the OpenAI-only upstream); the remote's key
comes from A's environment and is never in A's log; a dead remote opens its circuit (503 remote_unavailable at
once) and a live one closes it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import ollama
import openai
import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.conftest import Cli
from tests.support import cli_zygote
from tests.support.daemon import free_port, start_serve, stop_home_daemon, wait_for
from tests.support.fake_serving import fake_engine, fake_engine_binary
from tests.support.homes import configure_all, model_home, session_file
from tests.support.serving import stop_daemon

KEY = "sk-remote-test-0123456789"

# Every daemon a test started, reaped at its end (tests stop them by their home's run/daemon.json, and restart them).
_STARTED: list[subprocess.Popen[bytes] | cli_zygote.Process] = []


@pytest.fixture(autouse=True)
def _daemons_reaped() -> Iterator[None]:
    yield
    while _STARTED:
        stop_daemon(_STARTED.pop())


def _daemon(cli: Cli, port: int) -> None:
    """`blazar serve` on the port set in the home's config (`blazar config set server.port`), up once it wrote
    run/daemon.json; its stderr in a file beside the home, one per start."""
    configure_all(cli.home, {"port": port})
    log = cli.home.parent / f"{cli.home.name}-daemon-{len(_STARTED)}.log"
    proc = start_serve(cli.home, log=log, env=cli.env)
    _STARTED.append(proc)
    try:
        wait_for(lambda: (cli.home / "run" / "daemon.json").exists(), "daemon", timeout=60, proc=proc)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None


def _tiny_home(home: Path) -> None:
    """`home` with the fake engine installed and the tiny model imported as `tiny` (a clone of the session's)."""
    model_home(home, fake_engine_binary(), session_file("tiny.gguf", write_tiny_model), "tiny")


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[Cli, int]]:
    """Blazar B: the fake engine, the tiny model imported as `tiny`, a key (the remote's vendor key, here)."""
    cli = Cli(tmp_path / "b-home")
    _tiny_home(cli.home)
    secret = cli("keys", "create", "a-gateway").stdout.strip()
    port = free_port()
    _daemon(cli, port)
    cli.env["B_SECRET"] = secret
    try:
        yield cli, port
    finally:
        stop_home_daemon(cli.home)


@pytest.fixture
def gateway(tmp_path: Path, upstream: tuple[Cli, int]) -> Iterator[tuple[Cli, int]]:
    """Blazar A: no model of its own; `tiny` is B's, B's key in A's environment as REMOTE_B_KEY."""
    b, b_port = upstream
    cli = Cli(tmp_path / "a-home")
    cli.env["REMOTE_B_KEY"] = b.env["B_SECRET"]
    cli("remote", "add", "b", f"http://127.0.0.1:{b_port}/v1", "--models", "tiny", "--api-key-env", "REMOTE_B_KEY",
        "--max-concurrent", "2")
    configure_all(cli.home, {"remote_health_s": 3600})  # a test turns them on when it wants them
    port = free_port()
    _daemon(cli, port)
    try:
        yield cli, port
    finally:
        stop_home_daemon(cli.home)


def test_a_remote_model_is_served_through_the_gateway_in_every_dialect(gateway: tuple[Cli, int]) -> None:
    a, port = gateway
    base = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)
    assert "tiny" in [m.id for m in client.models.list()]
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                           max_tokens=4)
    chat = raw.parse()
    # The remote's own answer, as it gave it (its `model` included: the remote names what served it).
    assert chat.choices[0].message.content == fake_engine.answer_text(4)
    trace = raw.headers["x-blazar-trace-id"]
    why = None
    for _ in range(100):
        res = a("why", trace, "--json", check=False)
        if res.code == 0 and res.json()["outcome"] == "completed":
            why = res.json()
            break
        time.sleep(0.1)
    assert why is not None
    routed = next(s for s in why["steps"] if s["type"] == "request.routed")
    assert routed["data"]["instance_id"] == "remote:b"
    # Streamed, and through the translated dialects.
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True) if c.choices)
    assert text == fake_engine.answer_text(3)
    ant = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=60)
    msg = ant.messages.create(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == fake_engine.answer_text(3)  # type: ignore[union-attr]
    oll = ollama.Client(host=base, timeout=60)
    reply = oll.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 3})
    assert reply.message.content == fake_engine.answer_text(3)
    # The key is the environment's: nowhere in A's log.
    assert KEY not in (a("events", "--json").stdout) and a.env["REMOTE_B_KEY"] not in a("events", "--json").stdout
    listed = a("remote", "list", "--json").json()
    assert listed[0]["api_key_env"] == "REMOTE_B_KEY" and listed[0]["circuit_open"] is False


def test_a_dead_remote_opens_its_circuit_and_a_live_one_closes_it(gateway: tuple[Cli, int],
                                                                   upstream: tuple[Cli, int]) -> None:
    a, port = gateway
    b, b_port = upstream
    a("config", "set", "routing.remote_circuit_failures", "2")
    a("config", "set", "routing.remote_circuit_s", "2")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
    stop_home_daemon(b.home)  # B goes away
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert e.value.status_code == 502
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.status_code == 503  # refused by the open circuit, not tried against B again (a 502)
    assert e.value.body["code"] == "remote_unavailable"  # type: ignore[index]
    assert e.value.response.headers.get("retry-after")
    opened = [x["data"] for x in a("events", "--type", "remote.circuit_opened", "--json").json_lines()]
    assert opened and opened[-1]["source"] == "request"
    # B comes back on the same port; once the circuit's time is up, a request goes through and closes it.
    _daemon(b, b_port)
    time.sleep(2.2)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.choices[0].message.content == fake_engine.answer_text(2)
    assert a("events", "--type", "remote.circuit_closed", "--json").json_lines()
    # With health checks every second, B going away opens the circuit with no request at all.
    a("config", "set", "routing.remote_health_s", "1")
    stop_home_daemon(b.home)
    opened_by_check = wait_for(lambda: [x["data"] for x in a("events", "--type", "remote.circuit_opened",
                                                             "--json").json_lines() if x["data"]["source"] ==
                                        "health_check"], "a health check opening the circuit", timeout=30)
    assert "GET /v1/models failed" in opened_by_check[0]["reason"]


def test_remote_commands_refuse_what_cannot_be_served(cli: Cli, tmp_path: Path) -> None:
    cli("import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", "tiny")
    bad = cli("remote", "add", "x", "http://127.0.0.1:9/v1", "--models", "tiny", check=False)
    assert bad.code != 0 and "is a model in the store" in " ".join(bad.stderr.split())
    bad = cli("remote", "add", "x", "ftp://host", "--models", "m", check=False)
    assert bad.code != 0 and "invalid remote URL" in " ".join(bad.stderr.split())
    bad = cli("remote", "add", "x", "http://u:p@host/v1", "--models", "m", check=False)
    assert bad.code != 0 and "credentials" in " ".join(bad.stderr.split())
    cli("remote", "add", "x", "http://127.0.0.1:9/v1/", "--models", "m1", "--models", "m2")
    assert cli("remote", "list", "--json").json()[0]["url"] == "http://127.0.0.1:9"
    cli("remote", "rm", "x")
    assert cli("remote", "list", "--json").json() == []
    gone = cli("remote", "rm", "x", check=False)
    assert gone.code != 0 and "no remote named" in " ".join(gone.stderr.split())





def test_the_fake_engine_itself_serves_as_a_remote_and_its_concurrency_is_admitted(cli: Cli, tmp_path: Path) -> None:
    """bench/fake_engine.py run on its own (an OpenAI-compatible server): registered as a remote with a concurrency
    of 1, two requests at once queue in the remote's lane, and both are answered."""
    port = free_port()
    engine = subprocess.Popen([sys.executable, str(fake_engine.__file__), "--port", str(port), "--fake-delay-ms", "200",
                               "-m", "upstream.gguf"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _up(port), "the fake engine", timeout=30)
        cli("remote", "add", "fake", f"http://127.0.0.1:{port}", "--models", "up", "--max-concurrent", "1")
        a_port = free_port()
        _daemon(cli, a_port)
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{a_port}/v1", api_key="x", max_retries=0, timeout=60)

        async def one(i: int) -> tuple[str | None, str]:
            # Streamed: the fake engine sleeps between chunks only when streaming, so the first answer surely
            # holds the remote's one slot while the second arrives.
            raw = await client.chat.completions.with_raw_response.create(
                model="up", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=8, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
            return raw.headers.get("x-blazar-queue-position"), text

        async def both() -> list[tuple[str | None, str]]:
            return await asyncio.gather(*(one(i) for i in range(2)))

        answers = asyncio.run(both())
        assert [text for _, text in answers] == [fake_engine.answer_text(8)] * 2
        queued = [h for h, _ in answers if h]
        assert queued == ["1"]  # one of the two waited for the remote's single slot
    finally:
        stop_home_daemon(cli.home)
        engine.terminate()
        engine.wait(timeout=10)


def _up(port: int) -> bool:
    try:
        return httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx2.TransportError:
        return False


# -- best-of-N and cascades with a remote ------------------------------------------------------------------------------

@pytest.fixture
def mixed(cli: Cli, tmp_path: Path) -> Iterator[tuple[Cli, int, subprocess.Popen]]:
    """Blazar A with a model of its own (`tiny`, on the fake engine installed here) and a remote one (`up`: the fake
    engine run on its own, two requests at a time)."""
    up_port = free_port()
    engine = subprocess.Popen([sys.executable, str(fake_engine.__file__), "--port", str(up_port),
                               "-m", "upstream.gguf"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _up(up_port), "the fake engine", timeout=30)
        _tiny_home(cli.home)
        cli("remote", "add", "r1", f"http://127.0.0.1:{up_port}/v1", "--models", "up", "--max-concurrent", "2")
        configure_all(cli.home, {"remote_health_s": 3600})
        port = free_port()
        _daemon(cli, port)
        yield cli, port, engine
    finally:
        stop_home_daemon(cli.home)
        engine.terminate()
        engine.wait(timeout=10)


def _lanes_idle(port: int) -> bool:
    """Every admission lane of the gateway with no slot taken and nobody waiting."""
    queues = httpx2.get(f"http://127.0.0.1:{port}/api/blazar/queue", timeout=10).json()["queues"]
    return all(q["busy"] == 0 and q["queued"] == 0 for q in queues.values())


def _routed(cli: Cli, trace: str) -> list[str]:
    def got() -> list[dict[str, Any]] | None:
        res = cli("why", trace, "--json", check=False)
        return res.json()["steps"] if res.code == 0 and res.json()["outcome"] != "in_progress" else None
    return [s["data"]["instance_id"] for s in wait_for(got, f"the outcome of {trace}", timeout=30)
            if s["type"] == "request.routed"]


def test_best_of_on_a_remote_model_runs_on_its_lane_and_gives_every_slot_back(
        mixed: tuple[Cli, int, subprocess.Popen]) -> None:
    a, port, engine = mixed
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
    for _ in range(6):  # three times the remote's slots: a slot kept by any of them would stall the rest
        raw = client.chat.completions.with_raw_response.create(
            model="up", messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Blazar-Best-Of": "3"})
        assert raw.parse().choices[0].message.content == fake_engine.answer_text(fake_engine.DEFAULT_CHUNKS)
        assert raw.headers["x-blazar-best-of"] == "asked=3 used=2"  # the remote's --max-concurrent 2
        assert _lanes_idle(port)
    why = a("why", raw.headers["x-blazar-trace-id"], "--json").json()
    assert "best of 2 (asked 3)" in why["verdict"]
    scored = [s["data"] for s in why["steps"] if s["type"] == "request.candidate_scored"]
    assert len(scored) == 2 and all(c["mean_logprob"] is None and c["valid"] for c in scored)  # no logprobs given
    # In the Anthropic dialect too; and a remote that is gone is a 502 in the caller's dialect, its slots given back.
    ant = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="x", max_retries=0, timeout=60)
    msg = ant.messages.with_raw_response.create(model="up", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                                extra_headers={"X-Blazar-Best-Of": "2"})
    assert msg.headers["x-blazar-best-of"] == "asked=2 used=2" and msg.parse().type == "message"
    engine.terminate()
    engine.wait(timeout=10)
    for _ in range(3):
        with pytest.raises(anthropic.APIStatusError) as e:
            ant.messages.create(model="up", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                extra_headers={"X-Blazar-Best-Of": "2"})
        assert e.value.status_code in (502, 503) and e.value.body["type"] == "error"  # type: ignore[index]
        assert _lanes_idle(port)


def test_a_cascade_ends_on_a_remote_model_and_moves_on_from_one(mixed: tuple[Cli, int, subprocess.Popen]) -> None:
    a, port, _ = mixed
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
    # max_tokens cuts every answer of the fake engine short (finish "length"): invalid, so the cascade moves on.
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        extra_body={"cascade": ["tiny", "up"]})
    assert raw.headers["x-blazar-cascade"] == "tried=tiny,up served=up reason=invalid"
    assert raw.parse().choices[0].message.content == fake_engine.answer_text(4)
    routed = _routed(a, raw.headers["x-blazar-trace-id"])
    assert len(routed) == 2 and routed[0] != "remote:r1" and routed[1] == "remote:r1"
    # From the remote to a local model: the second step runs here, not on the remote.
    raw = client.chat.completions.with_raw_response.create(
        model="up", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        extra_headers={"X-Blazar-Cascade": "up,tiny"})
    assert raw.headers["x-blazar-cascade"] == "tried=up,tiny served=tiny reason=invalid"
    routed = _routed(a, raw.headers["x-blazar-trace-id"])
    assert routed[0] == "remote:r1" and routed[1] != "remote:r1"
    # A remote's answer without logprobs is judged on validity alone: a valid one ends the cascade.
    raw = client.chat.completions.with_raw_response.create(
        model="up", messages=[{"role": "user", "content": "hi"}], extra_body={"cascade": ["up", "tiny"]})
    assert raw.headers["x-blazar-cascade"] == "tried=up served=up reason=accepted"
    # A cascade naming a model that is nobody's is a 404 before anything runs.
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"cascade": ["tiny", "nobody"]})
    assert _lanes_idle(port)

"""Speculation governed while serving, end to end: `blazar serve` with the real llama-server and Gemma 3 270M at an
adopted n-gram posture (`--spec-type ngram-simple`, one slot), a half-second governor window. A repetitive request
drafts (the engine's counters grow); more concurrent requests than slots turn speculation off, recorded as
`spec.switched` with the window's numbers, and it comes back on once they are done; a client turns it off per request
with `X-Blazar-Spec: off` (OpenAI and Anthropic SDKs) or Ollama's `options.spec` (ollama SDK); a bad value is a 400
in each dialect's shape.

Timing on the shared 2-core machine is noisy: nothing here asserts a rate, and every wait is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import ollama
import openai
import pytest

from blazar.adapters.machine import this_machine
from blazar.bootstrap import bootstrap
from blazar.events.tuning import Posture, ProfileAdopted
from blazar.store.engines import active_engine
from tests.support.blazar_home import home_paths, read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
POSTURE = Posture(spec_type="ngram-simple", slots=1)
SETTINGS = {"ctx": 1024, "slots": 1, "queue_depth": 16, "queue_timeout_s": 300, "spec_window_s": 0.5}
# Counting with a pattern: the n-gram draft finds the continuation in the prompt, so most drafted tokens are accepted.
PROMPT = " ".join(str(i % 10) for i in range(60))


def prompt(n: int) -> str:
    """A different repetitive prompt per n: identical deterministic requests would share one generation."""
    return " ".join(str((i + n) % 10) for i in range(60))
SATURATING = 4  # concurrent requests for the one slot


def _adopt(home: Path) -> None:
    """The adopted profile the daemon's loads apply: n-gram speculation, one slot, on this engine build."""

    async def go() -> None:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest")
        try:
            await app.record(ProfileAdopted(model=MODEL, posture=POSTURE, engine_tag=active_engine(app).tag,
                                            machine=this_machine(), rule="recorded by the test"))
        finally:
            await app.close()

    asyncio.run(go())


class Daemon:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.base = home, f"http://127.0.0.1:{port}"

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=300)

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)

    def of(self, kind: str, trace: str, timeout: float = 30) -> dict[str, Any]:
        """The trace's `kind` event's data, once group commit has written it."""
        return wait_for(lambda: next((e["data"] for e in self.events(kind) if e["trace_id"] == trace), None),
                        f"{kind} of {trace}", timeout=timeout)

    def complete(self, **extra: Any) -> tuple[str, Any]:
        raw = self.openai().completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                                                 temperature=0, **extra)
        return raw.headers["x-blazar-trace-id"], raw.parse()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("spec-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, SETTINGS, before_serve=_adopt) as (port, _):
        yield Daemon(home, port)


def _started(d: Daemon) -> dict[str, Any]:
    return wait_for(lambda: next(iter(d.events("instance.started")), None), "instance.started")["data"]


def test_the_instance_runs_the_posture_and_a_repetitive_request_drafts(daemon: Daemon) -> None:
    trace, done = daemon.complete()
    assert done.usage.completion_tokens > 0
    started = _started(daemon)
    assert "--spec-type" in started["argv"] and "ngram-simple" in started["argv"]
    assert daemon.of("request.admitted", trace)["spec"] == "on"
    timings = daemon.of("request.completed", trace)["engine_timings"]
    assert timings.get("draft_n", 0) > 0, timings  # the engine drafted for it


def test_saturation_turns_speculation_off_with_its_numbers_and_it_comes_back_on(daemon: Daemon) -> None:
    daemon.complete()  # loaded, warm

    async def burst() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{daemon.base}/v1", api_key="unused", max_retries=0, timeout=300)
        async with client:
            raws = await asyncio.gather(*(client.completions.with_raw_response.create(
                model=MODEL, prompt=prompt(n), max_tokens=48, temperature=0) for n in range(1, SATURATING + 1)))
        return [r.headers["x-blazar-trace-id"] for r in raws]

    before = len(daemon.events("spec.switched"))
    traces = asyncio.run(asyncio.wait_for(burst(), 300))
    off = wait_for(lambda: next((e["data"] for e in daemon.events("spec.switched")[before:]
                                 if not e["data"]["enabled"]), None), "spec.switched off", timeout=30)
    assert off["slots"] == 1 and off["in_flight"] > 1 and "requests for 1 slot" in off["reason"]
    # The engine adds a request's drafts and times to its counters when the request ends: a window in which none
    # ended has zeros (and no rate), which is why saturation is judged from admission's demand, not from them.
    assert off["window_s"] >= 0.5 and off["drafted"] >= 0 and off["accepted"] >= 0
    # Requests admitted after the switch were told not to draft.
    specs = [daemon.of("request.admitted", t)["spec"] for t in traces]
    assert "off_governor" in specs, specs
    # Once the burst is over, a window without saturation turns it back on.
    on = wait_for(lambda: next((e["data"] for e in daemon.events("spec.switched")[before:]
                                if e["data"]["enabled"]), None), "spec.switched on", timeout=30)
    assert "saturation gone" in on["reason"]
    trace, _ = daemon.complete()
    assert daemon.of("request.admitted", trace)["spec"] == "on"
    text = httpx2.get(f"{daemon.base}/metrics", timeout=30).text
    assert 'blazar_spec_switches_total{model="gemma",to="off"}' in text


def test_x_blazar_spec_off_through_the_openai_sdk(daemon: Daemon) -> None:
    trace, done = daemon.complete(extra_headers={"X-Blazar-Spec": "off"})
    assert done.usage.completion_tokens > 0
    assert daemon.of("request.admitted", trace)["spec"] == "off_client"
    daemon.of("request.completed", trace)
    why = blazar_cli(daemon.home, "why", trace).stdout
    assert "speculative decoding off (the client asked)" in why, why
    drafted = daemon.of("request.completed", trace)["engine_timings"].get("draft_n")
    if drafted:  # this build ignores the field (see the xfail below): why says so rather than pretend
        assert "although speculation was off" in why, why
    text = httpx2.get(f"{daemon.base}/metrics", timeout=30).text
    assert 'blazar_spec_requests_total{model="gemma",spec="off_client"}' in text


@pytest.mark.xfail(strict=True, reason="this llama.cpp build (11434) compiles every per-request speculative field out "
                   "(tools/server/server-schema.cpp, #if 0): speculative.n_max 0 is ignored and the request drafts")
def test_a_request_sent_speculation_off_does_not_draft(daemon: Daemon) -> None:
    trace, _ = daemon.complete(extra_headers={"X-Blazar-Spec": "off"})
    timings = daemon.of("request.completed", trace)["engine_timings"]
    assert not timings.get("draft_n"), timings


def test_ollama_options_spec_through_the_ollama_sdk(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.base, timeout=300, trust_env=False)
    before = {e["trace_id"] for e in daemon.events("request.admitted")}
    out = client.generate(model=MODEL, prompt=PROMPT, raw=True, options={"spec": False, "num_predict": 8,
                                                                         "temperature": 0})
    assert out.done
    admitted = wait_for(lambda: [e["data"] for e in daemon.events("request.admitted") if e["trace_id"] not in before],
                        "request.admitted")
    assert [a["spec"] for a in admitted] == ["off_client"]


def test_a_bad_spec_is_a_400_in_each_dialect(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as oe:
        daemon.openai().completions.create(model=MODEL, prompt="x", max_tokens=1,
                                           extra_headers={"X-Blazar-Spec": "sometimes"})
    assert "X-Blazar-Spec" in str(oe.value.body)
    with pytest.raises(ollama.ResponseError) as le:
        ollama.Client(host=daemon.base, timeout=60, trust_env=False).generate(
            model=MODEL, prompt="x", options={"spec": "fast", "num_predict": 1})
    assert le.value.status_code == 400 and "options.spec" in le.value.error
    client = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError) as ae:
        client.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "x"}],
                               extra_headers={"X-Blazar-Spec": "maybe"})
    body = ae.value.body
    assert isinstance(body, dict) and body["type"] == "error" and "X-Blazar-Spec" in body["error"]["message"]

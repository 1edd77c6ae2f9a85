"""A dead engine is seen at once, end to end: `blazar serve` with the real llama-server and the real Gemma 3 270M
on one slot, its child SIGKILLed in the middle of a streamed answer. The stream in flight ends with the error event
(it had sent bytes: never retried); a request that was already routed to that child, waiting for its slot, and one
sent right after the kill are both answered (the OpenAI SDK), the model loaded again; `blazar why` on the waiting
one shows it routed again; and the child's crash is recorded at once (`blazar ps --json`, polled briefly)."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
BOUND_S = 180.0  # the most any request of this test may take (a load on two busy cores included)
ASK = [{"role": "user", "content": "Count from 1 to 200, one number per line."}]


@pytest.fixture
def daemon(tmp_path: Path, engine_binary: Path, gemma_path: Path) -> Iterator[tuple[Path, int]]:
    home = tmp_path / "home"
    settings = {"ctx": 1024, "slots": 1, "keep_alive": "10m"}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings) as (port, _):
        blazar_cli(home, "load", MODEL)
        yield home, port


def _ps(home: Path) -> list[dict[str, Any]]:
    return list(json.loads(blazar_cli(home, "ps", "--json").stdout)["instances"])


class Call(threading.Thread):
    """One whole chat answer through the OpenAI SDK, in a thread: its text and trace id, or what it raised."""

    def __init__(self, client: openai.OpenAI) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.text: str | None = None
        self.trace: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8)
            self.trace = raw.headers["x-blazar-trace-id"]
            self.text = raw.parse().choices[0].message.content
        except BaseException as e:  # reported by the test, whatever it is
            self.error = e

    def answer(self) -> str:
        self.join(BOUND_S)
        assert not self.is_alive(), "the request did not end"
        assert self.error is None, f"the request failed: {self.error!r}"
        assert self.text, "an empty answer"
        return self.text


def test_a_sigkilled_engine_is_recorded_at_once_and_requests_routed_to_it_are_answered(
        daemon: tuple[Path, int]) -> None:
    home, port = daemon
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                           timeout=BOUND_S)
    (old,) = _ps(home)
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=400, stream=True)  # type: ignore[arg-type]
    chunks = iter(stream)
    next(chunks)  # the answer is streaming: the one slot is busy
    waiting = Call(client)
    waiting.start()  # routed to the same child, queued for its slot
    wait_for(lambda: read_events(home, "request.queued"), "the second request to queue", timeout=60)

    os.kill(old["pid"], signal.SIGKILL)
    at_once = Call(client)
    at_once.start()
    # The crash is recorded at once: the instance leaves `blazar ps` (the daemon folds instance.exited).
    wait_for(lambda: all(r["instance_id"] != old["instance_id"] for r in _ps(home)), "ps without the killed child")
    (exited,) = [e["data"] for e in read_events(home, "instance.exited")
                 if e["data"]["instance_id"] == old["instance_id"]]
    assert exited["reason"] == "crashed" and exited["exit_code"] == -signal.SIGKILL

    # The stream that had sent bytes is not retried: it ends with the error event the SDK raises.
    with pytest.raises(openai.APIError, match="the engine's stream broke"):
        for _ in chunks:
            pass
    assert waiting.answer() and at_once.answer()  # both answered, not a 502
    (now,) = _ps(home)
    assert now["instance_id"] != old["instance_id"] and now["state"] == "ready"  # loaded again

    # The waiting request had been routed to the killed child: `why` shows it routed again, on the new instance.
    assert waiting.trace is not None
    trace = waiting.trace

    def completed() -> dict[str, Any] | None:  # request events are group-committed: the outcome may trail the answer
        w = json.loads(blazar_cli(home, "why", trace, "--json").stdout)
        return w if w["outcome"] == "completed" else None

    why = wait_for(completed, "the waiting request's outcome", timeout=30)
    rerouted = [s for s in why["steps"] if s["type"] == "request.rerouted"]
    assert [s["data"]["instance_id"] for s in rerouted] == [old["instance_id"]]
    routed = [s["data"]["instance_id"] for s in why["steps"] if s["type"] == "request.routed"]
    assert routed == [old["instance_id"], now["instance_id"]]
    assert f"routed again: instance {old['instance_id']} of {MODEL} was gone" in why["verdict"]
    text = blazar_cli(home, "why", trace).stdout
    assert "routed again" in text

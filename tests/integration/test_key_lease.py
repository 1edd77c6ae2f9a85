"""A key's concurrency lease (`blazar keys create --max-concurrent`) is held by an open stream until its last chunk,
end to end: the real `blazar serve`, the official `openai` and `ollama` SDKs, and bench/fake_engine.py as the engine,
which holds a stream after its first chunk until the test touches a file (`fake_hold_until`): the stream stays open
for exactly as long as the test needs, whatever the machine's speed (the real engine's answer may end after three
tokens, before the second request arrives)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.fake_serving import FakeDaemon, serving_fake
from tests.support.serving import blazar_cli

MODEL = "tiny"
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, FakeDaemon]]:
    home, files = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("files")
    with serving_fake(home, files, MODEL, settings={"slots": 4}) as d:
        yield home, d


def _key(home: Path, name: str, *args: str) -> str:
    return str(json.loads(blazar_cli(home, "keys", "create", name, *args, "--json").stdout)["secret"])


def _trace_end(home: Path, trace_id: str) -> dict:
    """Request events are group-committed: wait for the trace's end event."""
    ends = ("request.completed", "request.failed", "request.rejected")
    return wait_for(lambda: next((e for e in read_events(home, *ends) if e["trace_id"] == trace_id), None),
                    f"the end of {trace_id}", timeout=30)


def test_an_open_stream_holds_the_keys_concurrency_lease(daemon: tuple[Path, FakeDaemon], tmp_path: Path) -> None:
    home, d = daemon
    key = _key(home, "one-at-a-time", "--max-concurrent", "1")
    client = openai.OpenAI(base_url=f"{d.base}/v1", api_key=key, max_retries=0, timeout=60,
                           http_client=openai.DefaultHttpxClient(trust_env=False))
    release = tmp_path / "release"
    stream = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=8, stream=True,  # type: ignore[arg-type]
        extra_body={"fake_hold_until": str(release)})
    trace = stream.headers["x-blazar-trace-id"]
    chunks = iter(stream.parse())
    next(chunks)  # the stream is open and has started; the engine holds it until `release` exists
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
    assert "max_concurrent" in e.value.message and e.value.response.headers["retry-after"]
    lo = ollama.Client(host=d.base, timeout=60, trust_env=False, headers={"Authorization": f"Bearer {key}"})
    with pytest.raises(ollama.ResponseError) as le:
        lo.chat(model=MODEL, messages=CHAT, options={"num_predict": 1})
    assert le.value.status_code == 429
    release.touch()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text  # the held stream ran on to its end
    assert _trace_end(home, trace)["type"] == "request.completed"  # recorded after the lease is given back
    assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1).choices  # type: ignore[arg-type]

"""Answers the schemathesis run (tests/integration/test_schemathesis.py) found wrong, each pinned down against the
real `blazar serve` with bench/fake_engine.py as its engine."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from tests.support.fake_serving import FakeDaemon, serving_fake

TIMEOUT_S = 30.0


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    with serving_fake(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("files"), "tiny") as d:
        yield d


def _post(d: FakeDaemon, path: str, body: dict) -> httpx2.Response:
    return httpx2.post(f"{d.base}{path}", json=body, timeout=TIMEOUT_S, trust_env=False)


def test_a_pinned_model_refuses_another_shape_with_409_saying_why(daemon: FakeDaemon) -> None:
    loaded = _post(daemon, "/api/blazar/load", {"model": "tiny", "pin": True, "ctx": 512})
    assert loaded.status_code == 200, loaded.text
    # An embeddings request needs an instance started with the endpoint: the pin stands in the way (was: 507
    # insufficient_memory, "...and None were asked for").
    r = _post(daemon, "/v1/embeddings", {"model": "tiny", "input": "hello"})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "model_pinned"
    assert "embeddings" in err["message"] and "None" not in err["message"] and "--unpin" in err["message"]
    r = _post(daemon, "/api/blazar/load", {"model": "tiny", "ctx": 4096})
    assert r.status_code == 409 and "4096 were asked for" in r.json()["error"]["message"]
    r = _post(daemon, "/api/embed", {"model": "tiny", "input": "hello"})
    assert r.status_code == 409 and "pinned" in r.json()["error"]
    # The pinned instance is still the one serving.
    ps = httpx2.get(f"{daemon.base}/api/blazar/ps", timeout=TIMEOUT_S, trust_env=False).json()["instances"]
    assert [(row["instance_id"], row["ctx_tokens"]) for row in ps] == [(loaded.json()["instance_id"], 512)]


def test_a_streamed_responses_call_ends_cleanly_and_its_usage_is_counted(daemon: FakeDaemon) -> None:
    # The Responses API's deltas are strings (`"delta": "The"`): reading usage from them raised once the stream had
    # been sent, so the client got a chunked body cut short and the request no usage.
    body = {"model": "tiny", "input": "hello there", "stream": True, "max_output_tokens": 3}
    with httpx2.stream("POST", f"{daemon.base}/v1/responses", json=body, timeout=TIMEOUT_S, trust_env=False) as r:
        assert r.status_code == 200
        text = b"".join(r.iter_bytes()).decode()
    # Cut at max_output_tokens (the fake engine's finish_reason "length"): Responses says so with its last event.
    assert text.rstrip().splitlines()[-2] == "event: response.incomplete"
    metrics = httpx2.get(f"{daemon.base}/metrics", timeout=TIMEOUT_S, trust_env=False).text
    out = [line for line in metrics.splitlines()
           if line.startswith("blazar_tokens_total") and 'direction="out"' in line]
    assert out and float(out[0].rsplit(" ", 1)[1]) == 3, metrics

"""Ollama's `POST /api/pull` end to end: the official `ollama` SDK against a real `blazar serve` (no engine needed)
whose hub is the local stand-in (tests/support/hub_server.py) serving tiny GGUFs from the factory."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import ollama
import pytest
from gguf.constants import LlamaFileType

from tests.support import cli_zygote
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.gguf_factory import write_plain
from tests.support.hub_server import HubServer
from tests.support.serving import stop_daemon

REPO, BIG_REPO = "org/tiny-GGUF", "org/big-GGUF"
Q4, Q8, BIG = "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "big-Q4_K_M.gguf"
TAIL = ["verifying sha256 digest", "writing manifest", "success"]
WAIT_S = 30.0


@dataclass
class Daemon:
    home: Path
    base: str
    hub: HubServer
    proc: subprocess.Popen[bytes] | cli_zygote.Process

    def client(self) -> ollama.Client:
        return ollama.Client(host=self.base, timeout=WAIT_S, trust_env=False)

    def names(self) -> list[str]:
        return [m.model or "" for m in self.client().list().models]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("repos")
    write_plain(d / Q4, file_type=LlamaFileType.MOSTLY_Q4_K_M, seed=1)
    write_plain(d / Q8, seed=2)
    write_plain(d / BIG, embd=512, ff=512, file_type=LlamaFileType.MOSTLY_Q4_K_M, seed=4)  # ~6 MB: a slow pull
    home = tmp_path_factory.mktemp("ollama-pull-home")
    port = free_port()
    log = home.parent / f"{home.name}-daemon.log"
    with HubServer({REPO: {Q4: d / Q4, Q8: d / Q8}, BIG_REPO: {BIG: d / BIG}}) as hub:
        with pytest.MonkeyPatch.context() as mp:  # the daemon's environment is this one's: none of the user's hub
            for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
                mp.delenv(var, raising=False)
            proc = start_serve(home, "--port", str(port), log=log, env={"HF_ENDPOINT": hub.url})
        try:
            try:
                wait_for(lambda: healthy(port), "/health", proc=proc)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
            yield Daemon(home, f"http://127.0.0.1:{port}", hub, proc)
        finally:
            stop_daemon(proc, WAIT_S)
    err = log.read_text(errors="replace")
    # A hung-up client, a failed pull: none of it may leave a traceback in the daemon's log.
    assert "Traceback" not in err and "never retrieved" not in err, err


def check_progress(parts: list[ollama.ProgressResponse], size: int) -> None:
    """Ollama's sequence: manifest, one layer's progress (never past its total, ending complete), the tail."""
    statuses = [p.status for p in parts]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == TAIL
    layer = parts[1:-3]
    assert layer and all(p.status == f"pulling {p.digest}" and p.digest for p in layer)
    done = [p.completed or 0 for p in layer]
    assert all(p.total == size for p in layer) and all(c <= size for c in done)
    assert done == sorted(done) and done[-1] == size


def test_stream_reports_progress_then_success_and_the_model_is_listed(daemon: Daemon) -> None:
    size = daemon.hub.blob(REPO, Q4).size
    parts = list(daemon.client().pull(f"hf.co/{REPO}:Q4_K_M", stream=True))
    check_progress(parts, size)
    assert parts[1].digest == "tiny:q4_k_m"
    assert "tiny:q4_k_m" in daemon.names()
    # Pulled again: already in the store, answered at once, in the same shape and without touching the hub.
    daemon.hub.clear_log()
    again = list(daemon.client().pull(f"hf.co/{REPO}:Q4_K_M", stream=True))
    check_progress(again, size)
    assert not [r for r in daemon.hub.requests if r.server == "cdn"]


def test_without_stream_one_success_object(daemon: Daemon) -> None:
    r = daemon.client().pull(f"{REPO}:Q8_0", stream=False)
    assert r.status == "success"
    assert "tiny:q8_0" in daemon.names()
    # Older clients name the model `name`; the answer is one JSON object.
    raw = httpx2.post(f"{daemon.base}/api/pull", json={"name": f"{REPO}:Q8_0", "stream": False}, trust_env=False,
                      timeout=WAIT_S)
    assert raw.status_code == 200 and raw.json() == {"status": "success"}


def test_stream_is_ndjson(daemon: Daemon) -> None:
    with httpx2.stream("POST", f"{daemon.base}/api/pull", json={"model": f"{REPO}:Q8_0"}, trust_env=False,
                       timeout=WAIT_S) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1] == {"status": "success"}


@pytest.mark.parametrize("model", [f"{REPO}:Q5_K_S", "org/nosuch-GGUF", "nosuch-model"])
def test_unknown_model_is_404(daemon: Daemon, model: str) -> None:
    for stream in (True, False):
        with pytest.raises(ollama.ResponseError) as e:
            result = daemon.client().pull(model, stream=stream)
            if stream:
                list(result)  # type: ignore[arg-type]
        assert e.value.status_code == 404 and e.value.error


def test_bad_requests_are_400(daemon: Daemon) -> None:
    for body in ({"model": "Bad Name!"}, {}, {"model": 3}, {"model": "x", "stream": "yes"}):
        r = httpx2.post(f"{daemon.base}/api/pull", json=body, trust_env=False, timeout=WAIT_S)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), body
    r = httpx2.post(f"{daemon.base}/api/pull", content=b"{nope", trust_env=False, timeout=WAIT_S)
    assert r.status_code == 400 and "error" in r.json()


def test_a_client_that_hangs_up_leaves_the_pull_to_finish(daemon: Daemon) -> None:
    daemon.hub.delay_per_chunk = 0.005  # ~6 MB in 16 KiB chunks: about two seconds
    try:
        with httpx2.stream("POST", f"{daemon.base}/api/pull", json={"model": BIG_REPO}, trust_env=False,
                           timeout=WAIT_S) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert json.loads(next(lines)) == {"status": "pulling manifest"}
            first = json.loads(next(lines))
            assert first["completed"] < first["total"]
        # The connection is closed: the pull carries on to its recorded outcome.
        wait_for(lambda: "big:q4_k_m" in daemon.names(), "the pulled model in /api/tags")
    finally:
        daemon.hub.delay_per_chunk = 0.0
    outcomes = [e["data"]["name"] for e in read_events(daemon.home, "model.pull_completed")]
    assert "big:q4_k_m" in outcomes
    assert not [e for e in read_events(daemon.home, "model.pull_failed") if e["data"]["name"] == "big:q4_k_m"]

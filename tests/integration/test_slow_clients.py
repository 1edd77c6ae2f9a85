"""Slow request bodies against a real `blazar serve` (on the fake engine): a thousand sockets dribbling their bodies
leave /health answering, a body that stops or dribbles past its limits gets 408 in the route's dialect and its
connection closed, bodies past the budget are refused at once while fast requests are served, and a large body sent
at once still works. Sockets are real TCP sockets on 127.0.0.1; every loop is bounded in count and time."""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator

import httpx2
import orjson
import pytest

from tests.support.fake_serving import FakeDaemon, serving_fake

MODEL = "tiny"
SLOW_SOCKETS = 1000
# The tight daemon: the max_connections 64, so at most 32 bodies may arrive at once; short body limits.
TIGHT = {"max_connections": 64, "body_idle_timeout_s": 1, "body_timeout_s": 3}


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    """The default limits (body_idle_timeout_s 5, body_timeout_s 60, max_connections 8192)."""
    with serving_fake(tmp_path_factory.mktemp("roomy-home"), tmp_path_factory.mktemp("roomy-files"), MODEL) as d:
        yield d


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    with serving_fake(tmp_path_factory.mktemp("tight-home"), tmp_path_factory.mktemp("tight-files"), MODEL,
                      settings=TIGHT) as d:
        yield d


def _head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _slow_body(daemon: FakeDaemon, path: str = "/v1/chat/completions", *, timeout: float = 10) -> socket.socket:
    """Headers that announce a 100 kB body, then its first byte only."""
    s = socket.create_connection(("127.0.0.1", daemon.port), timeout=timeout)
    s.sendall(_head(path, 100_000) + b"{")
    return s


def _answer(s: socket.socket, *, limit_bytes: int = 1 << 16) -> tuple[bytes, bool]:
    """What the server sends until it closes the connection (True) or stops for the socket's timeout (False)."""
    got = b""
    try:
        while len(got) < limit_bytes:
            data = s.recv(4096)
            if not data:
                return got, True
            got += data
    except TimeoutError:
        return got, False
    raise AssertionError("the server kept sending")


def _status_and_body(raw: bytes) -> tuple[int, object]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


def _pending(s: socket.socket) -> bool:
    """The server has neither answered nor closed this socket."""
    s.setblocking(False)
    try:
        return not s.recv(1, socket.MSG_PEEK)  # b"": closed
    except BlockingIOError:
        return True
    finally:
        s.setblocking(True)


@contextlib.contextmanager
def _sockets(count: int, opener) -> Iterator[list[socket.socket]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(4096, count + 256)), hard))
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            opened.append(opener())
        yield opened
    finally:
        for s in opened:
            s.close()


def _dribble(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.send(b" ")


def test_a_thousand_slow_bodies_leave_health_answering(roomy: FakeDaemon) -> None:
    with _sockets(SLOW_SOCKETS, lambda: _slow_body(roomy)) as slow:
        latencies = []
        for _ in range(5):  # about 2 s, well inside body_idle_timeout_s between bytes and body_timeout_s in all
            _dribble(slow)
            started = time.monotonic()
            r = httpx2.get(f"{roomy.base}/health", timeout=10, trust_env=False)
            latencies.append(time.monotonic() - started)
            assert r.status_code == 200
            time.sleep(0.3)
        # Measured while every slow body was still arriving: none was answered or closed.
        assert all(_pending(s) for s in slow)
    assert max(latencies) < 1.0, latencies


def test_a_large_body_sent_at_once_still_works(roomy: FakeDaemon) -> None:
    body = orjson.dumps({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    # 8 MiB on the wire (JSON whitespace, under max_body_mib 32), in chunks as fast as the socket takes them; the
    # prompt stays within the tiny model's context.
    large = body[:-1] + b" " * (8 << 20) + b"}"
    with httpx2.Client(base_url=roomy.base, trust_env=False, timeout=60) as c:
        r = c.post("/v1/chat/completions", content=large, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"]


def test_a_body_stalled_past_body_idle_timeout_s_gets_408_and_the_connection_is_closed(tight: FakeDaemon) -> None:
    with _slow_body(tight) as s:
        raw, closed = _answer(s)  # nothing more is sent: body_idle_timeout_s (1) passes
    assert closed, "the connection was left open after the 408"
    status, body = _status_and_body(raw)
    assert status == 408
    assert b"connection: close" in raw.lower()
    assert body["error"]["code"] == "request_timeout"  # the OpenAI shape, on /v1/chat/completions
    assert "body_idle_timeout_s" in body["error"]["message"]


@pytest.mark.parametrize(("path", "message_of"), [
    ("/v1/messages", lambda b: b["error"]["message"] if b["type"] == "error" else None),  # Anthropic's shape
    ("/api/chat", lambda b: b["error"]),  # Ollama's
])
def test_a_body_dribbled_slower_than_body_timeout_s_allows_gets_408(tight: FakeDaemon, path: str, message_of) -> None:
    with _slow_body(tight, path, timeout=0.3) as s:
        deadline = time.monotonic() + 20
        got, closed = b"", False
        while not closed and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                s.send(b" ")  # a byte every 0.3 s: never idle for body_idle_timeout_s, never whole by body_timeout_s
            part, closed = _answer(s)
            got += part
    assert closed, "the connection was left open after the 408"
    status, body = _status_and_body(got)
    assert status == 408
    assert "body_timeout_s" in message_of(body)


def test_slow_bodies_past_the_budget_are_refused_at_once_and_fast_requests_are_served(tight: FakeDaemon) -> None:
    # The case: max_connections 64 and 70 slow bodies kept /health from answering.
    most = TIGHT["max_connections"] // 2
    with _sockets(70, lambda: _slow_body(tight, timeout=5)) as slow:
        deadline = time.monotonic() + 2.5  # under body_timeout_s (3): the held bodies are still arriving
        while sum(_pending(s) for s in slow) > most and time.monotonic() < deadline:
            _dribble(slow)  # a byte every 0.2 s: the held bodies never pause for body_idle_timeout_s (1)
            time.sleep(0.2)
        r = httpx2.get(f"{tight.base}/health", timeout=5, trust_env=False)
        assert r.status_code == 200
        held = [s for s in slow if _pending(s)]
        refused = [_answer(s) for s in slow if not _pending(s)]
    # At most half the connections may hold a body that is still arriving; the others were refused at once.
    assert 0 < len(held) <= most
    assert len(refused) == 70 - len(held)
    for raw, closed in refused:
        status, body = _status_and_body(raw)
        assert status == 503 and closed
        assert b"retry-after: 1" in raw.lower()
        assert "max_incoming_bodies" in body["error"]["message"]


def test_the_daemon_still_serves_chat_after_the_slow_bodies(tight: FakeDaemon) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with httpx2.Client(base_url=tight.base, trust_env=False, timeout=30) as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 200

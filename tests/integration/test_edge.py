"""The hardened edge end to end, against a real `blazar serve` (on the fake engine where tokens are not the point):
web pages and rebinding DNS names cannot change state, chunked bodies meet the size limit, idle connections cannot
starve the daemon, a wide bind needs a key, and https works with the official SDK and `blazar run`."""

from __future__ import annotations

import os
import resource
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import free_port
from tests.support.fake_serving import FakeDaemon, serving_fake
from tests.support.serving import blazar_cli
from tests.support.tls import self_signed, serving_tls

MODEL = "tiny"
ALLOWED_ORIGIN = "https://app.example"
EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, FakeDaemon]]:
    home = tmp_path_factory.mktemp("edge-home")
    files = tmp_path_factory.mktemp("edge-files")
    settings = {"cors_origins": ALLOWED_ORIGIN, "max_body_mib": 1, "idle_timeout_s": 2}
    with serving_fake(home, files, MODEL, settings=settings) as daemon:
        yield home, daemon


def _http(daemon: FakeDaemon) -> httpx2.Client:
    return httpx2.Client(base_url=daemon.base, trust_env=False, timeout=30)


def test_a_text_plain_pull_is_415_and_pulls_nothing(fake) -> None:
    home, daemon = fake
    with _http(daemon) as c:
        r = c.post("/api/pull", content=b'{"model":"acme/tiny-GGUF","stream":false}',
                   headers={"Content-Type": "text/plain;charset=UTF-8"})
    assert r.status_code == 415
    assert "application/json" in r.json()["error"]  # Ollama's shape
    assert not read_events(home, "model.pull_started", "model.pulled", "model.pull_failed")


def test_an_html_form_cannot_load_a_model(fake) -> None:
    home, daemon = fake
    with _http(daemon) as c:
        r = c.post("/api/blazar/load", data={"model": MODEL})
    assert r.status_code == 415
    assert r.json()["error"]["code"] == "unsupported_media_type"
    assert not read_events(home, "instance.starting")


@pytest.mark.parametrize("path", ["/api/blazar/stop", "/api/blazar/reset", "/api/copy", "/api/delete",
                                  "/v1/chat/completions", "/api/chat"])
@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain;charset=UTF-8",
                                          "multipart/form-data; boundary=x"])
def test_no_simple_cross_origin_request_changes_state(fake, path: str, content_type: str) -> None:
    home, daemon = fake
    before = len(read_events(home))
    with _http(daemon) as c:
        r = c.post(path, content=b'{"model":"tiny","source":"tiny","destination":"x","messages":[]}',
                   headers={"Content-Type": content_type})
        assert r.status_code == 415
        assert any(m["name"] == MODEL for m in c.get("/api/tags").json()["models"])
    assert len(read_events(home)) == before


@pytest.mark.parametrize("path", ["/api/blazar/stop", "/api/blazar/reset", "/api/copy", "/api/pull",
                                  "/v1/chat/completions"])
def test_a_foreign_origin_is_refused_even_with_a_json_body(fake, path: str) -> None:
    home, daemon = fake
    before = len(read_events(home))
    with _http(daemon) as c:
        r = c.post(path, json={"model": MODEL, "source": MODEL, "destination": "copy", "messages": [
            {"role": "user", "content": "hi"}]}, headers={"Origin": EVIL})
    assert r.status_code == 403
    assert "cors_origins" in r.text
    assert "access-control-allow-origin" not in r.headers
    assert len(read_events(home)) == before  # nothing recorded: nothing happened


def test_a_rebinding_host_cannot_delete_a_model(fake) -> None:
    home, daemon = fake
    with _http(daemon) as c:
        r = c.request("DELETE", "/api/delete", json={"model": MODEL},
                      headers={"Host": f"rebind.attacker.example:{daemon.port}"})
        assert r.status_code == 403
        assert "allowed_hosts" in r.json()["error"]
        assert any(m["name"] == MODEL for m in c.get("/api/tags").json()["models"])
    assert not read_events(home, "model.removed")


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "[::1]"])
def test_loopback_names_are_served(fake, host: str) -> None:
    _, daemon = fake
    with _http(daemon) as c:
        assert c.get("/api/version", headers={"Host": host.format(port=daemon.port)}).status_code == 200


def test_a_preflight_from_an_allowed_origin_gets_cors_headers(fake) -> None:
    _, daemon = fake
    with _http(daemon) as c:
        r = c.options("/v1/chat/completions", headers={
            "Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "x-stainless-os" in r.headers["access-control-allow-headers"]
        assert "Origin" in r.headers["vary"]
        evil = c.options("/v1/chat/completions", headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in evil.headers
        # The allowed origin's real request works, and the trace id is readable by its script.
        chat = c.post("/v1/chat/completions", headers={"Origin": ALLOWED_ORIGIN},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert chat.status_code == 200
        assert chat.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "x-blazar-trace-id" in chat.headers["access-control-expose-headers"]


def test_a_chunked_body_over_the_limit_is_413_and_never_reaches_the_engine(fake) -> None:
    home, daemon = fake
    chunk = b" " * 65536

    def body() -> Iterator[bytes]:
        yield b'{"model":"tiny","messages":[{"role":"user","content":"'
        for _ in range(40):  # 2.5 MiB of spaces against a 1 MiB limit, with no Content-Length
            yield chunk
        yield b'"}]}'

    with _http(daemon) as c:
        r = c.post("/v1/chat/completions", content=body(), headers={"x-blazar-trace-id": "chunked-too-large-1"})
    assert r.status_code == 413
    assert "max_body_mib" in r.json()["error"]["message"]
    assert not [e for e in read_events(home) if e["trace_id"] == "chunked-too-large-1"]


def test_a_thousand_idle_connections_do_not_starve_the_daemon(fake) -> None:
    _, daemon = fake
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", daemon.port), timeout=5))
        # Starved, the daemon would never answer while the idle connections stay open; it answers.
        r = httpx2.get(f"{daemon.base}/health", timeout=60, trust_env=False)
        assert r.status_code == 200
    finally:
        for s in idle:
            s.close()


def test_an_idle_connection_is_closed_after_idle_timeout_s(fake) -> None:
    _, daemon = fake
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=120) as s:
        assert s.recv(1) == b""  # the server closed it (idle_timeout_s = 2): our own timeout would raise instead


def _read_until_closed(s: socket.socket, *, limit_bytes: int = 1 << 16) -> bytes:
    got = b""
    while len(got) < limit_bytes:
        data = s.recv(4096)
        if not data:
            return got
        got += data
    raise AssertionError("the server kept sending")


def test_an_idle_keep_alive_connection_is_closed_after_idle_timeout_s(fake) -> None:
    _, daemon = fake
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = _read_until_closed(s)  # a socket.timeout here: the kept-alive connection was never closed
    assert answer.startswith(b"HTTP/1.1 200")


def test_headers_sent_slowly_are_cut_off(fake) -> None:
    _, daemon = fake
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")  # and never the blank line
        answer = _read_until_closed(s)
    assert b"200" not in answer.split(b"\r\n", 1)[0]


def test_a_wide_bind_with_no_key_refuses_to_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "BLAZAR_HOME": str(home), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "blazar.cli.main", "serve", "--host", "0.0.0.0", "--port",
                           str(free_port())], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9
    assert "blazar keys create" in proc.stderr
    assert "--insecure-no-auth" in proc.stderr


def test_insecure_no_auth_warns_at_start(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the bind fails after the warning, so nothing outside
    # loopback is ever listened on.
    env = {**os.environ, "BLAZAR_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "blazar.cli.main", "serve", "--host", "192.0.2.1", "--port",
                           str(free_port()), "--insecure-no-auth"], env=env, capture_output=True, text=True, timeout=60)
    assert "with no API key (--insecure-no-auth)" in proc.stderr
    assert "192.0.2.1" in proc.stderr
    assert proc.returncode != 0 and "blazar keys create" not in proc.stderr  # forced past the refusal


# -- TLS ----------------------------------------------------------------------------------------------------------


def test_https_serves_the_openai_sdk_and_blazar_run(tmp_path: Path, engine_binary: Path, gemma_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    home = tmp_path / "home"
    with serving_tls(home, engine_binary, gemma_path, cert, key) as (port, base):
        with pytest.raises(httpx2.TransportError):  # plain http on the https port gets no answer
            httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5, trust_env=False)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120,
                               http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(cert)),
                                                           trust_env=False))
        answer = client.chat.completions.create(model="gemma", max_tokens=4,
                                                messages=[{"role": "user", "content": "Say hi."}])
        assert answer.choices[0].finish_reason in ("length", "stop")
        ran = blazar_cli(home, "run", "gemma", "Say hi.", "--max-tokens", "4", "--json",
                         "--chat")
        assert '"chat.completion"' in ran.stdout

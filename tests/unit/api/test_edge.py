"""The edge's decisions: which Host names and web origins are served, which bodies count as JSON, and which binds
need a key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
import pytest
from falcon import testing

from blazar import config
from blazar.addresses import is_loopback
from blazar.api import errors
from blazar.api.context import RequestContext
from blazar.api.edge import Edge, EdgePolicy, host_name, json_content_type
from blazar.daemon import UnsafeBind, check_bind, tls_files
from blazar.daemon_file import DaemonInfo
from blazar.errors import BlazarError, ConfigError


@pytest.mark.parametrize(("header", "name"), [("localhost:11435", "localhost"), ("[::1]:80", "::1"), ("[::1]", "::1"),
                                              ("127.0.0.1", "127.0.0.1"), ("LocalHost.", "localhost"),
                                              ("::1", "::1")])
def test_host_name_strips_the_port_and_brackets(header: str, name: str) -> None:
    assert host_name(header) == name


def test_a_loopback_bind_serves_only_loopback_names_and_allowed_hosts() -> None:
    policy = EdgePolicy.of("127.0.0.1", ["blazar.internal"], [])
    for ok in ("localhost", "localhost:11435", "127.0.0.1:1", "[::1]:11435", "blazar.internal:8080"):
        assert policy.host_allowed(ok), ok
    for refused in ("rebind.attacker.example:11435", "127.0.0.1.nip.io", "", None, "192.168.1.5"):
        assert not policy.host_allowed(refused), refused


def test_a_specific_bind_serves_its_own_address_and_a_wildcard_any_unless_narrowed() -> None:
    assert EdgePolicy.of("10.1.2.3", [], []).host_allowed("10.1.2.3:11435")
    assert not EdgePolicy.of("10.1.2.3", [], []).host_allowed("evil.example")
    assert EdgePolicy.of("0.0.0.0", [], []).host_allowed("box.lan:11435")
    narrowed = EdgePolicy.of("0.0.0.0", ["box.lan"], [])
    assert narrowed.host_allowed("box.lan") and not narrowed.host_allowed("evil.example")


def test_origins_are_allowed_by_the_list_by_being_our_own_and_star_only_with_keys() -> None:
    policy = EdgePolicy.of("127.0.0.1", [], ["https://app.example/"])
    own = "http://localhost:11435"
    assert policy.origin_allowed("https://app.example", own=own, keys_on=False)
    assert policy.origin_allowed("http://localhost:11435", own=own, keys_on=False)
    assert not policy.origin_allowed("https://evil.example", own=own, keys_on=True)
    assert not policy.origin_allowed("null", own=own, keys_on=False)
    star = EdgePolicy.of("127.0.0.1", [], ["*"])
    assert not star.origin_allowed("https://any.example", own=own, keys_on=False)
    assert star.origin_allowed("https://any.example", own=own, keys_on=True)
    assert star.cors("https://any.example", keys_on=True) and not star.cors("https://any.example", keys_on=False)


@pytest.mark.parametrize(("value", "ok"), [(None, True), ("", True), ("application/json", True),
                                           ("application/json; charset=utf-8", True), ("application/vnd.x+json", True),
                                           ("text/plain;charset=UTF-8", False), ("application/x-www-form-urlencoded",
                                                                                  False),
                                           ("multipart/form-data; boundary=x", False)])
def test_only_json_bodies_count(value: str | None, ok: bool) -> None:
    assert json_content_type(value) is ok


def test_a_wide_bind_needs_a_key_or_the_insecure_flag() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(host)
        assert check_bind(host, keys_on=False, insecure_no_auth=False) is None
    assert check_bind("0.0.0.0", keys_on=True, insecure_no_auth=False) is None
    with pytest.raises(UnsafeBind, match="blazar keys create"):
        check_bind("0.0.0.0", keys_on=False, insecure_no_auth=False)
    with pytest.raises(UnsafeBind):
        check_bind("192.168.1.10", keys_on=False, insecure_no_auth=False)
    warning = check_bind("::", keys_on=False, insecure_no_auth=True)
    assert warning is not None and "no API key" in warning


# -- the middleware on a small app: what a browser sees ------------------------------------------------------------


class _Echo:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"got": await req.get_media()}

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"ok": True}


def _client(cors_origins: list[str], *, keys_on: bool = False, max_body_bytes: int = 1 << 20) -> testing.TestClient:
    api = falcon.asgi.App(middleware=[RequestContext(max_body_bytes=max_body_bytes),
                                      Edge(EdgePolicy.of("127.0.0.1", [], cors_origins), lambda: keys_on)])
    api.req_options.default_media_type = falcon.MEDIA_JSON
    errors.register(api)
    api.add_route("/v1/echo", _Echo())
    api.add_route("/api/echo", _Echo())
    return _Local(api)


class _Local(testing.TestClient):
    """A client on this machine: Host localhost:11435 unless a test names another (falcon's default is refused)."""

    def simulate_request(self, *args: Any, **kwargs: Any) -> testing.Result:
        headers = kwargs.setdefault("headers", {})
        kwargs["host"] = headers.pop("Host", "localhost")
        kwargs.setdefault("port", 11435)
        return super().simulate_request(*args, **kwargs)


def test_a_preflight_names_what_a_client_may_send_and_is_cached() -> None:
    r = _client(["https://app.example"]).simulate_options(
        "/v1/echo", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    allowed = r.headers["access-control-allow-headers"]
    for header in ("authorization", "content-type", "x-api-key", "anthropic-version", "x-blazar-trace-id"):
        assert header in allowed
    assert "DELETE" in r.headers["access-control-allow-methods"]
    assert int(r.headers["access-control-max-age"]) > 0
    assert "Origin" in r.headers["vary"]


def test_star_answers_any_origin_only_while_keys_are_on() -> None:
    ask = {"Origin": "https://any.example", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in _client(["*"]).simulate_options("/v1/echo", headers=ask).headers
    on = _client(["*"], keys_on=True)
    assert on.simulate_options("/v1/echo", headers=ask).headers["access-control-allow-origin"] == "https://any.example"
    assert on.simulate_get("/v1/echo", headers={"Origin": "https://any.example"}).status_code == 200
    assert _client(["*"]).simulate_get("/v1/echo", headers={"Origin": "https://any.example"}).status_code == 403


def test_refusals_come_in_the_routes_dialect_with_a_trace_id() -> None:
    c = _client([])
    r = c.simulate_post("/v1/echo", body=b"model=x", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and r.json["error"]["code"] == "unsupported_media_type"
    assert r.headers["x-blazar-trace-id"]
    r = c.simulate_post("/api/echo", json={"model": "x"}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "cors_origins" in r.json["error"]  # Ollama's {"error": "..."}
    r = c.simulate_delete("/api/echo", headers={"Host": "rebind.attacker.example"})
    assert r.status_code == 403 and "allowed_hosts" in r.json["error"]


def test_a_body_with_no_content_type_is_json_and_its_own_origin_is_served() -> None:
    c = _client([])
    assert c.simulate_post("/v1/echo", body=b'{"a": 1}').json == {"got": {"a": 1}}
    own = c.simulate_post("/v1/echo", json={"a": 1}, headers={"Origin": "http://localhost:11435"})
    assert own.status_code == 200 and "access-control-allow-origin" not in own.headers


def test_an_allowed_origins_refusal_is_readable_by_its_script() -> None:
    r = _client(["https://app.example"]).simulate_post(
        "/v1/echo", body=b"x", headers={"Origin": "https://app.example", "Content-Type": "text/plain"})
    assert r.status_code == 415
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-blazar-trace-id" in r.headers["access-control-expose-headers"]


def test_tls_files_go_together_and_must_be_pem(tmp_path: Path) -> None:
    assert tls_files("", "") is None
    with pytest.raises(BlazarError, match="both"):
        tls_files(str(tmp_path / "cert.pem"), "")
    with pytest.raises(BlazarError, match="cannot read the TLS file"):
        tls_files(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(BlazarError, match="not PEM"):
        tls_files(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))


def test_the_printed_address_is_the_one_bound_and_the_cli_reaches_it_on_loopback() -> None:
    wide = DaemonInfo(pid=1, host="0.0.0.0", port=11435, started=0.0, scheme="https")
    assert wide.bound == "https://0.0.0.0:11435"
    assert wide.url == "https://127.0.0.1:11435"
    assert DaemonInfo(pid=1, host="::", port=8, started=0.0).bound == "http://[::]:8"


@pytest.mark.parametrize(("text", "value"), [("https://a.example, http://b.example:8080", ["https://a.example",
                                                                                            "http://b.example:8080"]),
                                             ("", []), ("*", ["*"])])
def test_origin_lists_are_set_as_comma_separated_text(text: str, value: list[str]) -> None:
    assert config.parse_value("server.cors_origins", text) == value


def test_an_origin_without_its_scheme_is_refused_saying_why() -> None:
    with pytest.raises(ConfigError, match="scheme://host"):
        config.parse_value("server.cors_origins", "app.example")
    with pytest.raises(ConfigError, match="not a host name"):
        config.parse_value("server.allowed_hosts", "a b")


def test_what_start_up_made_is_frozen_out_of_the_collectors_reach() -> None:
    import gc

    from blazar.daemon import freeze_startup_heap

    before = gc.get_freeze_count()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > before  # a full collection no longer scans the modules and the app
    finally:
        gc.unfreeze()


class _Upload:
    multipart = True  # as blazar/api/files.py's upload route says

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"ok": True}


def test_a_form_is_taken_only_by_an_upload_route_and_never_from_another_origin() -> None:
    api = falcon.asgi.App(middleware=[RequestContext(max_body_bytes=1 << 10, path_limits={"/v1/upload": 1 << 20}),
                                      Edge(EdgePolicy.of("127.0.0.1", [], []), lambda: False)])
    errors.register(api)
    api.add_route("/v1/upload", _Upload())
    api.add_route("/v1/echo", _Echo())
    c = _Local(api)
    form = {"Content-Type": "multipart/form-data; boundary=x"}
    assert c.simulate_post("/v1/upload", body=b"--x--", headers=form).status_code == 200
    assert c.simulate_post("/v1/echo", body=b"--x--", headers=form).status_code == 415
    cross = c.simulate_post("/v1/upload", body=b"--x--", headers={**form, "Origin": "https://evil.example"})
    assert cross.status_code == 403
    # The upload route's own body bound, not max_body_bytes; every other route keeps that one.
    assert c.simulate_post("/v1/upload", body=b"x" * 4096, headers=form).status_code == 200
    big = c.simulate_post("/v1/echo", body=b"x" * 4096, headers={"Content-Type": "application/json"})
    assert big.status_code == 413
    assert c.simulate_post("/v1/upload", body=b"x" * (2 << 20), headers=form).status_code == 413

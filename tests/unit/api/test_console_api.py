"""The web console's HTTP side in the assembled app (a fake supervisor): the page and its files with a strict CSP and
no inline script, style or handler; the Host and Origin guards on its routes; the key rules (the page open, what it
calls admin-only once keys exist); the event-log tail, why, the store with fits, and the engines routes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from typing import Any, cast

import pytest

from blazar.api import console
from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.events.requests import RequestPrefixCompared
from blazar.events.system import ConfigChanged
from blazar.operations import keys
from tests.support.asgi import LocalConductor as ASGIConductor
from tests.support.fakes import FakeGateway, FakeSupervisor

STATIC = console.STATIC_DIR


@pytest.fixture
async def client(app: Blazar) -> AsyncIterator[ASGIConductor]:
    # With the dialects' routes (/api/pull, /api/delete, which the console calls); nothing here reaches the gateway.
    async with ASGIConductor(create_app(app, FakeSupervisor(), cast(Any, FakeGateway()))) as c:
        yield c


class _Page(HTMLParser):
    """Every tag with its attributes, and the text inside <script> and <style> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._in = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None and data.strip():
            self.inline.append(f"<{self._in}>{data[:80]}")


def _csp(header: str) -> dict[str, str]:
    return {d.split()[0]: " ".join(d.split()[1:]) for d in (p.strip() for p in header.split(";")) if d}


async def test_the_page_is_served_with_a_strict_csp_and_the_hardening_headers(client: ASGIConductor) -> None:
    r = await client.get("/console")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    csp = _csp(r.headers["content-security-policy"])
    assert csp["default-src"] == "'none'"
    for directive in ("script-src", "style-src", "connect-src"):
        assert csp[directive] == "'self'", directive
    assert csp["frame-ancestors"] == "'none'" and csp["base-uri"] == "'none'" and csp["form-action"] == "'none'"
    assert "unsafe" not in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["x-frame-options"] == "DENY"


async def test_the_page_has_no_inline_script_style_or_event_handler(client: ASGIConductor) -> None:
    page = _Page()
    page.feed((await client.get("/console")).text)
    assert page.inline == []
    scripts = [a for t, a in page.tags if t == "script"]
    assert scripts and all(a.get("src", "").startswith("/console/static/") for a in scripts)
    assert not [t for t, _ in page.tags if t == "style"]
    offending = [(t, name) for t, a in page.tags for name in a if name == "style" or name.startswith("on")]
    assert offending == []
    for tag, attrs in page.tags:  # every file the page loads is served, with its own type
        ref = attrs.get("src") or (attrs.get("href") if tag == "link" and attrs.get("rel") == "stylesheet" else None)
        if ref:
            r = await client.get(ref)
            assert r.status_code == 200, ref
            assert r.headers["content-type"].split(";")[0] in ("text/javascript", "text/css"), ref
            assert r.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("name", ["console.js", "talk.js", "talk-worklet.js"])
def test_the_modules_never_write_html_from_data(name: str) -> None:
    source = (STATIC / name).read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in source, sink
    assert not re.search(r"setAttribute\(\s*[\"']on", source)


async def test_the_talk_view_s_modules_are_served_as_scripts_of_the_page_s_own_origin(client: ASGIConductor) -> None:
    """console.js imports talk.js; talk.js loads the worklet by its path: both under the CSP's script-src 'self'."""
    assert 'from "./talk.js"' in (STATIC / "console.js").read_text()
    assert '"/console/static/talk-worklet.js"' in (STATIC / "talk.js").read_text()
    for name in ("talk.js", "talk-worklet.js"):
        r = await client.get(f"/console/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript"), name
        assert "script-src 'self'" in r.headers["content-security-policy"]


async def test_static_files_revalidate_by_etag_and_unknown_names_are_404(client: ASGIConductor) -> None:
    r = await client.get("/console/static/console.js")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-cache"
    assert r.text == (STATIC / "console.js").read_text()
    again = await client.get("/console/static/console.js", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    for name in ("nope.js", "..%2Fconsole.py", "index.py", ".hidden.css"):
        assert (await client.get(f"/console/static/{name}")).status_code == 404, name


async def test_the_host_guard_and_the_origin_check_hold_on_the_console_routes(client: ASGIConductor) -> None:
    assert (await client.get("/console", host="evil.example")).status_code == 403
    assert (await client.get("/console/static/console.js", host="evil.example")).status_code == 403
    assert (await client.get("/api/blazar/events", host="rebind.example")).status_code == 403
    own = {"Origin": "http://localhost"}
    assert (await client.get("/api/blazar/events", headers=own)).status_code == 200
    r = await client.post("/api/blazar/engines/verify", json={}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json["error"]["code"] == "origin_not_allowed"
    r = await client.get("/api/blazar/events", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    r = await client.post("/api/blazar/load", json={"model": "m"}, headers={"Origin": "http://evil.localhost"})
    assert r.status_code == 403


async def test_with_keys_the_page_stays_open_and_what_it_calls_needs_an_admin_key(app: Blazar,
                                                                                   client: ASGIConductor) -> None:
    _, user = await keys.create(app, "alice")
    _, root = await keys.create(app, "root", admin=True)
    assert (await client.get("/console")).status_code == 200
    assert (await client.get("/console/static/console.css")).status_code == 200
    reads = ["/api/blazar/events", "/api/blazar/events/follow?timeout_s=0.1", "/api/blazar/models",
             "/api/blazar/engines", "/api/blazar/why/last", "/api/blazar/ps"]
    actions = [("POST", "/api/blazar/load", {"model": "m"}), ("POST", "/api/blazar/stop", {"model": "m"}),
               ("POST", "/api/blazar/engines/verify", {}), ("POST", "/api/pull", {"model": "m"}),
               ("DELETE", "/api/delete", {"model": "m"})]
    for path in reads:
        assert (await client.get(path)).status_code == 401, path
        assert (await client.get(path, headers={"Authorization": f"Bearer {user}"})).status_code == 403, path
    for method, path, body in actions:
        r = await client.simulate_request(method, path, json=body)
        assert r.status_code == 401, path
        r = await client.simulate_request(method, path, json=body, headers={"Authorization": f"Bearer {user}"})
        assert r.status_code == 403, path
    r = await client.get("/api/blazar/events", headers={"Authorization": f"Bearer {root}"})
    assert r.status_code == 200 and r.json["events"][-1]["type"] == "key.created"


async def test_the_events_tail_filters_by_type_and_stream_and_is_bounded(app: Blazar, client: ASGIConductor) -> None:
    for i in range(30):
        await app.record(ConfigChanged(key="log_level", new="debug" if i % 2 else "info"))
    await app.record(ConfigChanged(key="ctx", new=2048))
    r = await client.get("/api/blazar/events", params={"type": "config.changed", "limit": 5})
    body = r.json
    assert r.status_code == 200 and len(body["events"]) == 5
    assert body["events"][-1]["data"]["key"] == "ctx" and body["last_seq"] == body["events"][-1]["seq"]
    seqs = [e["seq"] for e in body["events"]]
    assert seqs == sorted(seqs)
    only = (await client.get("/api/blazar/events", params={"stream": "config:ctx"})).json["events"]
    assert [e["data"]["key"] for e in only] == ["ctx"]
    both = await client.get("/api/blazar/events?type=config.changed,key.created&limit=500")
    assert len(both.json["events"]) == 31
    none = await client.get("/api/blazar/events", params={"type": "no.such_type"})
    assert none.json["events"] == []
    for bad in ("limit=0", "limit=501", "limit=x", "before=-1", "color=red"):
        r = await client.get(f"/api/blazar/events?{bad}")
        assert r.status_code == 400 and r.json["error"]["code"] == "invalid_request", bad


async def test_why_of_an_unknown_trace_is_404_and_last_with_no_failure_says_so(client: ASGIConductor) -> None:
    r = await client.get("/api/blazar/why/0123456789abcdef")
    assert r.status_code == 404 and r.json["error"]["code"] == "trace_not_found"
    r = await client.get("/api/blazar/why/last")
    assert r.status_code == 404 and "failed" in r.json["error"]["message"]
    assert (await client.get("/api/blazar/why/a%20b")).status_code == 404


async def test_engines_empty_and_verify_without_an_engine_is_no_engine(client: ASGIConductor) -> None:
    r = await client.get("/api/blazar/engines")
    assert r.status_code == 200 and r.json == {"active": None, "engines": []}
    r = await client.post("/api/blazar/engines/verify", json={})
    assert r.status_code == 503 and r.json["error"]["code"] == "no_engine"
    r = await client.post("/api/blazar/engines/verify", json={"tag": 5})
    assert r.status_code == 400
    r = await client.post("/api/blazar/engines/verify", json={"tag": "no-such-engine"})
    assert r.status_code == 404 and "blazar engine list" in r.json["error"]["message"]


async def test_models_lists_an_empty_store(client: ASGIConductor) -> None:
    r = await client.get("/api/blazar/models")
    assert r.status_code == 200 and r.json == {"models": [], "aliases": {}}


async def test_the_dashboard_lists_the_clients_that_break_the_prefix_cache_and_only_those(app: Blazar) -> None:
    def compared(trace: str, agent: str, broke: bool) -> RequestPrefixCompared:
        return RequestPrefixCompared(
            trace_id=trace, model="m", instance_id="i1", slot_id=0, agent=agent, previous_trace_id="p",
            previous_prompt_tokens=2950, previous_messages=2, messages=4, prompt_tokens=3010,
            reused_tokens=98 if broke else 2950, missed=broke, part="tools" if broke else None,
            reprocessed_tokens=2912 if broke else 60, prefill_ms=4100.0 if broke else 80.0)

    await app.log.append([compared(f"b{i}", "claude-cli", True) for i in range(3)]
                         + [compared(f"k{i}", "tidy", False) for i in range(3)], actor="key:alice")
    await app.runner.catch_up()
    async with ASGIConductor(create_app(app, FakeSupervisor())) as admin_only:  # the log's figures, no gateway
        r = await admin_only.get("/api/blazar/dashboard")
    assert r.status_code == 200
    [row] = r.json["prefix_clients"]
    assert (row["actor"], row["agent"], row["streak"], row["changed"], row["break_trace_id"]) == \
        ("key:alice", "claude-cli", 3, "the tool list", "b2")
    js = (STATIC / "console.js").read_text()
    assert "prefix_clients" in js and 'id="prefix-clients"' in (STATIC / "index.html").read_text()

"""Errors in their caller's words (blazar/api/errors.py `Audience`): the machine's owner (no keys yet, an admin key, the
CLI's token) reads an error's whole message; a key that is not an admin's, another node, or a caller no key was found
for reads its public text, never a path, a log's name or a traceback, and the daemon log keeps what it was not told."""

from __future__ import annotations

import logging
import re
from typing import Any

import falcon
import falcon.asgi
import pytest
from falcon import testing

import blazar.errors as tree
from blazar.api import auth, errors
from blazar.errors import LoadFailed
from blazar.serving.principal import Principal

HOME = "/srv/ann/blazar"
DETAIL = (f"gemma exited while loading (code 1): failed to load model '{HOME}/models/g.gguf'; the engine log: "
          f"{HOME}/log/instances/abc.log")
PUBLIC = "gemma could not be loaded: its engine exited while loading"
CALLERS = {"admin": Principal(actor="key:root", admin=True), "user": Principal(actor="key:ann", admin=False),
           "node": Principal(actor="cluster:node", admin=False, cluster=True), "cli": Principal("cli:ann", True)}


class _As:
    """Stands in for the auth middleware: the principal a test names in `x-as` (none: no principal)."""

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        req.context.trace_id = "t-1"
        req.context.principal = CALLERS.get(req.get_header("x-as") or "")


class _Fails:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if req.get_param("bug"):
            raise FileNotFoundError(2, "No such file or directory", f"{HOME}/files/f-1")
        raise LoadFailed(DETAIL, public=PUBLIC)


def _client(*, keys_on: bool) -> testing.TestClient:
    api = falcon.asgi.App(middleware=[_As()])
    errors.register(api, audience=errors.Audience(lambda: keys_on, (HOME,)))
    api.add_route("/v1/chat/completions", _Fails())
    api.add_route("/api/chat", _Fails())
    api.add_route("/v1/messages", _Fails())
    return testing.TestClient(api)


def _message(r: testing.Result) -> Any:
    body = r.json
    return body["error"] if isinstance(body["error"], str) else body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/v1/messages"])
def test_a_key_that_is_not_an_admins_reads_the_public_text_in_its_dialect(path: str) -> None:
    client = _client(keys_on=True)
    for caller in ("user", "node", ""):  # a key, another node, a caller no key was found for
        r = client.simulate_post(path, headers={"x-as": caller})
        assert r.status_code == 502 and _message(r) == PUBLIC, caller
        assert HOME not in r.text and ".log" not in r.text


def test_the_owner_reads_the_whole_message() -> None:
    with_keys, without = _client(keys_on=True), _client(keys_on=False)
    for caller in ("admin", "cli"):
        assert _message(with_keys.simulate_post("/v1/chat/completions", headers={"x-as": caller})) == DETAIL
    assert _message(without.simulate_post("/v1/chat/completions")) == DETAIL  # no keys: everyone is the owner


def test_the_daemon_log_keeps_what_a_key_was_not_told(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="blazar.api"):
        _client(keys_on=True).simulate_post("/v1/chat/completions", headers={"x-as": "user"})
    assert f"POST /v1/chat/completions (trace t-1) failed: {DETAIL}" in caplog.text


def test_a_bug_of_ours_tells_a_key_nothing_of_itself_and_the_owner_what_it_is() -> None:
    client = _client(keys_on=True)
    user = client.simulate_post("/v1/chat/completions", params={"bug": "1"}, headers={"x-as": "user"})
    assert user.status_code == 500 and HOME not in user.text and "FileNotFoundError" not in user.text
    admin = client.simulate_post("/v1/chat/completions", params={"bug": "1"}, headers={"x-as": "admin"})
    assert "FileNotFoundError" in _message(admin) and HOME in _message(admin)


def test_the_status_table_of_api_errors_says_what_the_error_tree_does() -> None:
    # blazar/api/errors.py's docstring lists, per status, the code and the error class raised: each class it names
    # answers with that status and code (the table is documentation a change to the tree must keep true).
    rows = [m.groups() for line in (errors.__doc__ or "").splitlines()
            if (m := re.match(r"\s+(\d{3})\s+(\w+)\s+([A-Z]\w+)", line))]
    assert len(rows) >= 12
    for status, code, name in rows:
        cls = getattr(tree, name, None) or getattr(auth, name)
        assert (cls.http_status, cls.code) == (int(status), code), name

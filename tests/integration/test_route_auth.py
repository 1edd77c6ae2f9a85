"""The report of `//api/delete` end to end, against a real `blazar serve` (the fake engine, a tiny model): a scoped
key, and the cluster key of a node sharing a PostgreSQL log, send admin requests on paths the router once read
differently from auth (`//x`, `///x`, `/%2Fx` as raw bytes, `/./x`, `/x/../y`, a trailing slash); each is refused
(403 or 404, with a trace id), and the models and instances are as they were. The same requests by an admin key on
the canonical path work. /api/ps shows a scoped key only the models in its scope."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.support.blazar_home import read_events
from tests.support.daemon import healthy, wait_for
from tests.support.fake_serving import FakeDaemon, fake_engine, serving_fake
from tests.support.nodes import CLUSTER_KEY, Node
from tests.support.postgres import cluster
from tests.support.serving import blazar_cli

MODEL, OTHER = "tiny", "other"
# State that an admin request would change: none of it may appear after the refused ones.
STATE_EVENTS = ("model.removed", "model.aliased", "model.alias_removed", "model.variant_created", "model.configured",
                "model.pull_started", "instance.starting", "instance.evicted", "model.circuit_reset")
# (method, path as sent on the wire, body): a scoped key's admin requests on paths that are not canonical, and one
# (`/api%2Fblazar%2Fps`) that the server decodes to the canonical path, where the route's own rule refuses it.
ATTACKS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("DELETE", "//api/delete", {"model": OTHER}),
    ("DELETE", "///api/delete", {"model": OTHER}),
    ("DELETE", "/%2Fapi%2Fdelete", {"model": OTHER}),
    ("DELETE", "/api/delete/", {"model": OTHER}),
    ("DELETE", "/./api/delete", {"model": OTHER}),
    ("DELETE", "/x/../api/delete", {"model": OTHER}),
    ("POST", "//api/create", {"model": "hijack", "from": OTHER, "system": "Obey the app key.", "stream": False}),
    ("POST", "//api/copy", {"source": OTHER, "destination": "mine"}),
    ("GET", "///api/blazar/ps", None),
    ("GET", "/%2Fapi%2Fblazar%2Fps", None),
    ("GET", "/api%2Fblazar%2Fps", None),
    ("GET", "//api/blazar/events", None),
    ("GET", "//api/blazar/sessions", None),
    ("GET", "//metrics", None),
    ("POST", "//api/blazar/load", {"model": OTHER}),
    ("POST", "//api/blazar/stop", {"model": MODEL}),
    ("POST", "//api/blazar/reset", {"model": OTHER}),
]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def send(port: int, method: str, path: str, key: str | None = None, body: dict[str, Any] | None = None) -> Answer:
    """`path` exactly as given on the request line (http.client does not normalise it, nor decode `%2F`)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def state_events(home: Path) -> list[str]:
    return [f"{e['type']} {e['stream']}" for e in read_events(home, *STATE_EVENTS)]


def secret(home: Path, name: str, *args: str) -> str:
    return str(json.loads(blazar_cli(home, "keys", "create", name, *args, "--json").stdout)["secret"])


@dataclass
class Served:
    home: Path
    daemon: FakeDaemon
    root: str
    app: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("route-auth-home")
    files = tmp_path_factory.mktemp("route-auth-files")
    with serving_fake(home, files, MODEL) as daemon:
        blazar_cli(home, "import", str(write_tiny_model(files / "other.gguf")), "--name", OTHER)
        root = secret(home, "root", "--admin")
        app = secret(home, "app", "--models", "tiny*")  # `blazar keys create app --models gem` in the report
        wait_for(lambda: send(daemon.port, "GET", "/api/tags").status == 401, "keys on", timeout=30)
        wait_for(lambda: send(daemon.port, "GET", "/api/tags", app).status == 200, "the app key", timeout=30)
        yield Served(home, daemon, root, app)


def test_a_scoped_keys_admin_requests_on_other_paths_are_refused_and_change_nothing(served: Served) -> None:
    port = served.daemon.port
    before = state_events(served.home)
    for method, path, body in ATTACKS:
        r = send(port, method, path, served.app, body)
        assert r.status in (403, 404), (method, path, r.status, r.body[:300])
        assert r.headers.get("x-blazar-trace-id"), path
    r = send(port, "DELETE", "//api/delete", served.app, {"model": OTHER})
    assert r.status == 404 and isinstance(r.json()["error"], str)  # in the Ollama route's shape
    assert state_events(served.home) == before
    assert {m["name"] for m in send(port, "GET", "/api/tags", served.root).json()["models"]} == {MODEL, OTHER}
    # And on the canonical paths the rule is the route's own: 403.
    assert send(port, "DELETE", "/api/delete", served.app, {"model": OTHER}).status == 403
    assert send(port, "GET", "/api/blazar/ps", served.app).status == 403


def test_an_admin_key_on_the_canonical_paths_still_works(served: Served) -> None:
    port, root = served.daemon.port, served.root
    assert send(port, "GET", "/api/blazar/ps", root).status == 200
    assert send(port, "POST", "/api/copy", root, {"source": OTHER, "destination": "other-copy"}).status == 200
    assert send(port, "DELETE", "/api/delete", root, {"model": "other-copy"}).status == 200
    assert send(port, "GET", "/api/blazar/events", root).status == 200
    assert send(port, "GET", "/metrics", root).status == 200
    # Not canonical is 404 for an admin too: one path, one route.
    assert send(port, "GET", "//api/blazar/ps", root).status == 404


def test_api_ps_shows_a_scoped_key_only_its_models(served: Served) -> None:
    port, root = served.daemon.port, served.root
    for model in (MODEL, OTHER):
        r = send(port, "POST", "/api/blazar/load", root, {"model": model})
        assert r.status == 200, r.body[:300]
    names = {m: [row["name"] for row in send(port, "GET", "/api/ps", key).json()["models"]]
             for m, key in (("app", served.app), ("root", root))}
    assert names["app"] == [MODEL]
    assert sorted(names["root"]) == sorted([MODEL, OTHER])
    assert [m["id"] for m in json.loads(send(port, "GET", "/v1/models", served.app).body)["data"]] == [MODEL]


def test_the_cluster_key_is_no_admin_on_any_path(tmp_path: Path) -> None:
    """A node of a cluster (a shared PostgreSQL log, BLAZAR_CLUSTER_KEY) with keys on: the cluster key may pull
    and infer, nothing else, on whatever path."""
    node = Node("a", tmp_path, cluster().new_database())
    node.cli("engine", "install", "--path", str(fake_engine.write_executable(tmp_path / "fake" / "llama-server")),
             timeout=120)
    node.cli("import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", MODEL)
    node.cli("keys", "create", "root", "--admin")
    try:
        node.serve()
        wait_for(lambda: healthy(node.port), "node a up")  # refused connections too, until it listens
        models_before = node.cli("list", "--json").json()
        for method, path, body in [*ATTACKS, ("POST", "//api/pull", {"model": "acme/x-GGUF", "stream": False})]:
            r = send(node.port, method, path, CLUSTER_KEY, body)
            assert r.status in (403, 404), (method, path, r.status, r.body[:300])
        assert send(node.port, "GET", "/api/blazar/ps", CLUSTER_KEY).status == 403
        assert send(node.port, "DELETE", "/api/delete", CLUSTER_KEY, {"model": MODEL}).status == 403
        # What it may do: /api/pull on its canonical path reaches the route (here, a body it refuses).
        r = send(node.port, "POST", "/api/pull", CLUSTER_KEY, {"stream": False})
        assert r.status == 400, r.body[:300]
        assert node.cli("list", "--json").json() == models_before
    finally:
        node.stop()

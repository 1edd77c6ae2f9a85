"""Several gateways on one PostgreSQL log, end to end: two daemons (nodes a and b, each its own home, engine and
model store; the fake engine) join, beat and list each other; b's instance is b's (a restart of a leaves it alone);
a model only b holds is not a's; b killed is marked down by a with its instance lost, a then loads the model
itself, and b started again joins again and settles its orphan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import ollama
import openai
import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.conftest import Cli
from tests.support.daemon import start_serve, wait_for
from tests.support.fake_serving import fake_engine
from tests.support.nodes import Node
from tests.support.postgres import cluster


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    url = cluster().new_database()
    a, b = Node("a", tmp_path, url), Node("b", tmp_path, url)
    binary = fake_engine.write_executable(tmp_path / "fake" / "llama-server")
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    for n in (a, b):  # each machine its own engine and store: the same files, installed on each
        n.cli("engine", "install", "--path", str(binary), timeout=120)
        n.cli("import", str(tiny), "--name", "tiny")
    b.cli("import", str(tiny), "--name", "only-b")
    a.cli("config", "set", "cluster.node_heartbeat_s", "1")  # shared config: one change for the whole cluster
    # A node is up while heard from within this; a loaded 2-core CI machine can stall a heartbeat for seconds, and a
    # peer taken for down is not forwarded to. The dead-node test shortens it for itself.
    a.cli("config", "set", "cluster.node_down_after_s", "60")
    try:
        a.serve()
        b.serve()
        yield a, b
    finally:
        for n in (a, b):
            n.stop()


def test_two_gateways_on_one_log_are_nodes_with_their_own_stores_and_instances(pair: tuple[Node, Node]) -> None:
    a, b = pair
    wait_for(lambda: {n for n, v in a.nodes().items() if v["up"]} == {"a", "b"}, "both nodes up", timeout=30)
    seen = a.nodes()
    assert seen["b"]["url"] == f"http://127.0.0.1:{b.port}" and seen["a"]["url"] == f"http://127.0.0.1:{a.port}"
    # Stores are per node: only b has only-b, and while it is loaded nowhere a knows no such model.
    assert "only-b" in [m["name"] for m in b.cli("list", "--json").json()]
    assert "only-b" not in [m["name"] for m in a.cli("list", "--json").json()]
    with pytest.raises(openai.NotFoundError):
        a.client().chat.completions.create(model="only-b", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2)
    # b's instance is b's, and every node sees it.
    b.cli("load", "tiny", timeout=120)
    (row,) = a.ps()
    assert row["node"] == "b" and row["model"] == "tiny"
    # a restarted settles only its own instances: b's goes on serving.
    a.stop()
    a.serve()
    assert [r["instance_id"] for r in a.ps()] == [row["instance_id"]]
    chat = b.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=3)
    assert chat.choices[0].message.content == fake_engine.answer_text(3)


def test_a_dead_node_is_marked_down_its_instances_lost_and_the_model_loads_elsewhere(
        pair: tuple[Node, Node]) -> None:
    a, b = pair
    a.cli("config", "set", "cluster.node_down_after_s", "4")  # the daemons fold the shared config change as they run
    b.cli("load", "tiny", timeout=120)
    (row,) = a.ps()
    assert b.proc is not None
    b.proc.send_signal(signal.SIGKILL)  # b's host "dies": no node.stopped, no instance.exited
    b.proc.wait(timeout=10)
    wait_for(lambda: not a.nodes()["b"]["up"], "a marks b down", timeout=30)
    down = a.nodes()["b"]
    assert down["noticed_by"] == "a" and "no heartbeat for" in down["down_reason"]
    verdict = a.cli("events", "--type", "node.down", "--json").json_lines()[-1]["data"]
    assert verdict["instances_lost"] == [row["instance_id"]]
    assert a.ps() == []
    # The next request loads the model where it fits: here.
    chat = a.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=3)
    assert chat.choices[0].message.content == fake_engine.answer_text(3)
    assert [r["node"] for r in a.ps()] == ["a"]
    # b comes back: it joins again and stops the engine child its dead daemon left behind.
    orphan = row["pid"]
    b.serve()
    wait_for(lambda: a.nodes()["b"]["up"], "b up again", timeout=30)
    wait_for(lambda: not _alive(orphan), "b's orphan stopped", timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
        return f.read().split()[2] != "Z"


def test_node_list_explains_itself_with_sqlite(cli: Cli) -> None:
    out = cli("node", "list").stdout
    assert "no nodes" in out and json.loads(cli("node", "list", "--json").stdout) == {"this_node": None,
                                                                                        "nodes": []}


def _why(node: Node, trace: str) -> dict[str, Any]:
    got: dict[str, Any] = {}
    last: list[str] = []

    def done() -> bool:
        res = node.cli("why", trace, "--json", check=False)
        last[:] = [f"exit {res.code}", res.stderr[-300:]] if res.code != 0 else [
            f"{s['type']}@{s['data'].get('node') or ''}" for s in res.json()["steps"]]
        if res.code == 0 and res.json()["outcome"] == "completed" and any(
                s["type"] == "request.completed" and s["data"].get("trace_id") == trace for s in res.json()["steps"]):
            got.update(res.json())
            return sum(1 for s in res.json()["steps"] if s["type"] == "request.completed") == 2
        return False

    # Each try is a `blazar why` process on the shared log (a few seconds on a loaded 2-core CI machine).
    try:
        wait_for(done, "both nodes' ends in the trace", timeout=90)
    except AssertionError as e:
        raise AssertionError(f"{e}; the last `why` saw: {last}") from None
    return got


def test_a_request_for_a_model_ready_on_another_node_is_forwarded_as_one_trace(pair: tuple[Node, Node]) -> None:
    a, b = pair
    b.cli("load", "tiny", timeout=120)
    b.cli("load", "only-b", timeout=120)
    (before,) = [r for r in a.ps() if r["model"] == "tiny"]
    raw = a.client().chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert raw.parse().choices[0].message.content == fake_engine.answer_text(4)
    trace = raw.headers["x-blazar-trace-id"]
    assert [r["instance_id"] for r in a.ps() if r["node"] == "a"] == []  # nothing loaded on a: b served it
    why = _why(a, trace)
    types = [s["type"] for s in why["steps"]]
    assert types.count("request.received") == 2 and "request.forwarded" in types
    forwarded = next(s for s in why["steps"] if s["type"] == "request.forwarded")
    assert forwarded["data"]["node"] == "b" and forwarded["data"]["reason"] == "ready_there"
    assert forwarded["data"]["instance_id"] == before["instance_id"]
    # The hop's own `received`: the two nodes' group commits may land in either order.
    hop = next(s for s in why["steps"] if s["type"] == "request.received" and s["data"].get("forwarded_from") == "a")
    assert "forwarded to by a" in hop["text"]
    assert why["verdict"].startswith("completed 200") and why["actor"] != "node:a"
    assert [s["seq"] for s in _why(b, trace)["steps"]] == [s["seq"] for s in why["steps"]]  # one log, one trace
    # Streamed, through another dialect, and a model only b stores.
    text = "".join(c.choices[0].delta.content or "" for c in a.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True) if c.choices)
    assert text == fake_engine.answer_text(3)
    reply = ollama.Client(host=f"http://127.0.0.1:{a.port}", timeout=60).chat(
        model="tiny", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 3})
    assert reply.message.content == fake_engine.answer_text(3)
    only = a.client().chat.completions.with_raw_response.create(
        model="only-b", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert only.parse().choices[0].message.content == fake_engine.answer_text(2)
    steps = _why(a, only.headers["x-blazar-trace-id"])["steps"]
    assert next(s for s in steps if s["type"] == "request.forwarded")["data"]["reason"] == "not_stored_here"
    # A request counts once in the cluster's figures, though two gateways recorded it.
    counts = a.cli("state", "--json").json()["projections"]["traces"]["counts"]
    assert counts["received"] == counts["completed"] + counts["failed"] + counts["rejected"]


def test_a_forwarding_header_without_the_cluster_key_is_refused(pair: tuple[Node, Node]) -> None:
    _, b = pair
    res = httpx2.post(f"http://127.0.0.1:{b.port}/v1/chat/completions",
                      headers={"x-blazar-forwarded-by": "a", "x-blazar-trace-id": "0123456789abcdef"},
                      json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert res.status_code == 401 and "cluster key" in res.json()["error"]["message"]


def test_pull_node_fills_that_nodes_store_and_node_list_shows_where_each_model_is(pair: tuple[Node, Node]) -> None:
    a, b = pair
    b.cli("load", "tiny", timeout=120)
    done = a.cli("pull", "gemma3-270m", "--node", "b", "--json", timeout=300).json()
    assert done == {"node": "b", "target": "gemma3-270m", "status": "success"}
    assert "gemma3-270m" in [m["name"] for m in b.cli("list", "--json").json()]
    assert "gemma3-270m" not in [m["name"] for m in a.cli("list", "--json").json()]  # b's store, not a's
    where = {n["name"]: n for n in a.cli("node", "list", "--json").json()["nodes"]}
    assert where["b"]["models"] == ["gemma3-270m", "only-b", "tiny"] and where["b"]["loaded"] == ["tiny"]
    assert where["a"]["models"] == ["tiny"] and where["a"]["loaded"] == []
    # The console reads the same.
    seen = httpx2.get(f"http://127.0.0.1:{a.port}/api/blazar/nodes", timeout=30).json()
    assert {n["name"]: n["models"] for n in seen["nodes"]} == {k: v["models"] for k, v in where.items()}
    # The words when it cannot be done.
    gone = a.cli("pull", "gemma3-270m", "--node", "nowhere", check=False)
    assert gone.code != 0 and "no node named 'nowhere'" in " ".join(gone.stderr.split())
    a.cli.env.pop("BLAZAR_CLUSTER_KEY")
    keyless = a.cli("pull", "gemma3-270m", "--node", "b", check=False)
    assert keyless.code != 0 and "BLAZAR_CLUSTER_KEY" in " ".join(keyless.stderr.split())


def test_a_node_reached_over_plain_http_off_this_machine_starts_only_with_insecure_cluster(tmp_path: Path) -> None:
    c = Node("c", tmp_path, cluster().new_database())
    c.cli.env["BLAZAR_NODE_URL"] = f"http://10.0.0.7:{c.port}"  # the cluster key would cross the LAN in clear
    argv = [sys.executable, "-m", "blazar.cli.main", "serve", "--port", str(c.port)]
    refused = subprocess.run(argv, env=c.cli.env, capture_output=True, text=True, timeout=120, check=False)
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 9 and "Traceback" not in refused.stderr
    assert "http://10.0.0.7" in said and "plain http off this machine" in said and "--insecure-cluster" in said
    assert c.nodes() == {}  # refused before it joined: the cluster never saw it
    # Chosen on purpose: it starts, warns, and its node.started records the choice.
    stderr = tmp_path / "c.stderr"
    c.proc = start_serve(c.cli.home, "--port", str(c.port), "--insecure-cluster", log=stderr, env=c.cli.env)
    try:
        wait_for(lambda: "c" in c.nodes(), "node c joined", timeout=60, proc=c.proc)
        joined = c.nodes()["c"]
        assert joined["url"] == f"http://10.0.0.7:{c.port}" and joined["insecure_cluster"] is True
        assert "--insecure-cluster" in stderr.read_text() and "over plain http" in stderr.read_text()
    finally:
        c.stop()


def test_a_forwarded_request_keeps_its_keys_tenancy_and_session_on_the_serving_node(pair: tuple[Node, Node]) -> None:
    a, b = pair
    b.cli("load", "tiny", timeout=120)
    secret = a.cli("keys", "create", "alice", "--json").json()["secret"]
    # a follows the shared log: until it has folded the key, keys are off there and a request runs as the owner.
    wait_for(lambda: httpx2.get(f"http://127.0.0.1:{a.port}/v1/models", timeout=10).status_code == 401,
             "node a has folded alice's key", timeout=60)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key=secret, max_retries=0, timeout=60)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_headers={"X-Blazar-Session": "s1"})
    trace = raw.headers["x-blazar-trace-id"]
    steps = _why(a, trace)["steps"]
    assert next(s for s in steps if s["type"] == "request.forwarded")["data"]["node"] == "b"
    received = [s["data"] for s in steps if s["type"] == "request.received"]
    assert len(received) == 2  # here, and the hop on b
    assert all(r["tenant"] == "key:alice" and r["session"] == "key:alice/s1" for r in received), received
    placed = next(s["data"] for s in steps if s["type"] == "request.placed")  # on b, in alice's namespace
    assert placed["session"] == "key:alice/s1"

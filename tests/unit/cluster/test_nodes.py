"""Nodes by their events and decisions: the nodes projection fed events, residency per node (a node's instances lost
with it), the keeper marking a silent node down (once, with its instances) and rejoining when it finds itself marked
down, and a node's identity from the environment, config.toml or the host name."""

from __future__ import annotations

import pytest

from blazar import config as settings
from blazar.addresses import in_clear_off_host
from blazar.clock import FakeClock
from blazar.cluster.nodes import (
    CLUSTER_KEY_ENV,
    NodeKeeper,
    check_node_url,
    may_send_key,
    node_name,
    node_url,
    pull_on_node,
    ready_peer,
)
from blazar.context import Blazar
from blazar.errors import ConfigError, NodeError, UnsafeNodeUrl
from blazar.events.instances import InstanceReady, InstanceStarting
from blazar.events.log import EventLog
from blazar.events.models import ModelImported, ModelMetadata
from blazar.events.nodes import NodeDown, NodeHeartbeat, NodeStarted, NodeStopped
from blazar.paths import Paths
from blazar.projections import all_projections
from blazar.projections.base import fold
from blazar.projections.catalog import models as catalog_models
from blazar.projections.nodes import NodesProjection, node, nodes
from blazar.projections.residency import ResidencyProjection, engine_tags_in_use, instances
from blazar.projections.runner import ProjectionRunner
from tests.support.events import rec
from tests.support.states import through_checkpoint


def started(name: str, url: str = "http://h:1") -> NodeStarted:
    return NodeStarted(name=name, url=url, pid=1, host="h")


def starting(iid: str, node_: str, model: str = "m") -> InstanceStarting:
    return InstanceStarting(instance_id=iid, model=model, engine_tag="t", port=1, argv=["x"], log_path=f"{iid}.log",
                            ctx_tokens=4096, engine_ctx=4096, slots=1, planned_bytes=1, estimate_bytes=1, node=node_)


def test_the_projection_follows_joins_heartbeats_stops_and_verdicts() -> None:
    p = NodesProjection()
    state = fold(p, [rec(1, started("a")), rec(2, started("b", "http://b:2")),
                     rec(3, NodeHeartbeat(name="b", instances=2, in_flight=1), ts=150.0)])
    b = node(state, "b")
    assert b is not None and b.up and b.last_seen_ts == 150.0 and b.instances == 2 and b.url == "http://b:2"
    state = fold(p, [rec(4, NodeDown(name="b", detail="no heartbeat for 30 s", noticed_by="a", last_seen_ts=150.0)),
                     rec(5, NodeDown(name="b", detail="later verdict", noticed_by="c")),
                     rec(6, NodeHeartbeat(name="b"), ts=200.0)], state)
    b = node(state, "b")
    assert b is not None and not b.up and b.down_reason == "no heartbeat for 30 s" and b.noticed_by == "a"
    assert b.last_seen_ts == 150.0  # a heartbeat racing the verdict does not bring it back
    state = fold(p, [rec(7, started("b")), rec(8, NodeStopped(name="a"))], state)
    assert [n.name for n in nodes(state, up_only=True)] == ["b"]
    a = node(state, "a")
    assert a is not None and a.down_reason == "stopped"
    assert through_checkpoint(p, state) == state
    # A verdict or a heartbeat about a node never seen is ignored.
    unseen = fold(p, [rec(1, NodeHeartbeat(name="z")), rec(2, NodeDown(name="z", noticed_by="a"))])
    assert node(unseen, "z") is None


def test_residency_is_per_node_and_a_down_node_loses_its_instances() -> None:
    p = ResidencyProjection()
    state = fold(p, [rec(1, starting("i1", "a")), rec(2, starting("i2", "b")), rec(3, starting("i3", "b", "n")),
                     rec(4, starting("i0", ""))])
    # "": from before nodes, anyone's
    assert [i.instance_id for i in instances(state, node="a")] == ["i1", "i0"]
    assert {i.node for i in instances(state)} == {"a", "b", ""}
    state = fold(p, [rec(5, NodeDown(name="b", noticed_by="a", instances_lost=["i2", "i3"]))], state)
    assert [i.instance_id for i in instances(state)] == ["i1", "i0"]
    last_exit = state.models["n"].last_exit
    assert last_exit is not None and last_exit.reason == "node_lost"
    assert engine_tags_in_use(state) == {"t"}


async def test_the_keeper_marks_a_silent_node_down_once_with_its_instances(app: Blazar, clock: FakeClock) -> None:
    app.node = "a"
    stopped: list[str] = []

    async def stop_instances() -> None:
        stopped.append("a")

    keeper = NodeKeeper(app, url="http://a:1", live=lambda: (0, 0), stop_instances=stop_instances)
    await keeper._join(rejoined=False)
    await app.record([started("b"), starting("ib", "b")])
    clock.advance(15)
    await app.record(NodeHeartbeat(name="a"))
    assert await keeper.mark_silent() == []  # 15 s: within node_down_after_s (20)
    clock.advance(10)
    await app.record(NodeHeartbeat(name="a"))
    assert await keeper.mark_silent() == ["b"]
    downs = [r.event async for r in app.log.read(types=["node.down"])]
    assert len(downs) == 1 and downs[0].instances_lost == ["ib"] and downs[0].noticed_by == "a"
    assert "no heartbeat for 25 s" in downs[0].detail
    assert instances(app.runner.state("residency")) == []
    assert await keeper.mark_silent() == []  # already down: no second verdict
    assert stopped == []


async def test_a_node_whose_own_heartbeats_stopped_landing_judges_no_one(app: Blazar, clock: FakeClock) -> None:
    app.node = "a"
    keeper = NodeKeeper(app, url="http://a:1", live=lambda: (0, 0), stop_instances=_nothing)
    await keeper._join(rejoined=False)
    await app.record(started("b"))
    clock.advance(60)  # neither a's nor b's heartbeats landed: the database was away, not b
    assert await keeper.mark_silent() == []


async def test_a_node_marked_down_while_alive_stops_its_instances_and_joins_again(app: Blazar,
                                                                                 clock: FakeClock) -> None:
    app.node = "a"
    stopped: list[bool] = []

    async def stop_instances() -> None:
        stopped.append(True)

    keeper = NodeKeeper(app, url="http://a:1", live=lambda: (3, 1), stop_instances=stop_instances)
    await keeper._join(rejoined=False)
    await app.record(NodeDown(name="a", noticed_by="b", detail="no heartbeat for 40 s"))
    await keeper.beat_once()
    assert stopped == [True]
    joins = [r.event async for r in app.log.read(types=["node.started"])]
    assert [j.rejoined for j in joins] == [False, True]
    await app.request_writer().flush()
    await app.runner.catch_up()
    a = node(app.runner.state("nodes"), "a")
    assert a is not None and a.up and a.instances == 3 and a.in_flight == 1


async def _nothing() -> None:
    return None


def test_a_nodes_identity_comes_from_the_environment_the_homes_file_or_the_host(paths: Paths) -> None:
    paths.ensure()
    assert node_name(paths, {"BLAZAR_NODE_NAME": "gpu-1"}) == "gpu-1"
    settings.write_file(paths.config_file, {"cluster.node_name": "box-2", "cluster.node_url": "http://10.0.0.2:11434"})
    assert node_name(paths, {}) == "box-2"
    assert node_url(paths, {}, port=1) == "http://10.0.0.2:11434"
    assert node_url(paths, {"BLAZAR_NODE_URL": "http://x:9/"}, port=1) == "http://x:9"
    settings.write_file(paths.config_file, {})
    assert settings.NODE_NAME.fullmatch(node_name(paths, {}))  # the host name, made a valid name
    assert node_url(paths, {}, port=4242) == "http://127.0.0.1:4242"
    with pytest.raises(ConfigError, match="invalid node name"):
        node_name(paths, {"BLAZAR_NODE_NAME": "no spaces"})


@pytest.mark.parametrize(("key", "value"), [("node_name", "a b"), ("node_url", "ftp://x"),
                                            ("node_url", "http://u:p@x:1")])
def test_bad_node_settings_are_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError):
        settings.validate_overrides({key: value}, source="test")


def test_node_identity_is_local_to_the_home() -> None:
    assert {"cluster.node_name", "cluster.node_url"} <= settings.LOCAL_KEYS


def imported(name: str, node_: str = "") -> ModelImported:
    return ModelImported(name=name, path=f"{name}.gguf", source="/x", bytes=1, sha256="0" * 64, linked=True,
                         metadata=ModelMetadata(architecture="llama", name=name), node=node_)


async def test_a_nodes_runner_folds_only_its_own_node_local_events(log: EventLog) -> None:
    await log.append([imported("mine", "a"), imported("theirs", "b"), imported("old"), starting("ib", "b")],
                     actor="test")
    runner = ProjectionRunner(log, all_projections(), node="a")
    await runner.start()
    assert sorted(m.name for m in catalog_models(runner.state("catalog"))) == ["mine", "old"]
    assert [i.instance_id for i in instances(runner.state("residency"))] == ["ib"]  # the cluster's view
    everyone = ProjectionRunner(log, all_projections())
    await everyone.start()  # no node (a snapshot's check, `blazar state --at`): the whole log
    assert sorted(m.name for m in catalog_models(everyone.state("catalog"))) == ["mine", "old", "theirs"]
    # Each node keeps its own checkpoint of what is node-local, beside the shared ones.
    await runner.checkpoint()
    names = {row[0] for row in await log.checkpoints.rows()}
    assert {"catalog@a", "engines@a", "residency"} <= names and "catalog" not in names
    again = ProjectionRunner(log, all_projections(), node="a")
    await again.start()
    assert sorted(m.name for m in catalog_models(again.state("catalog"))) == ["mine", "old"]


async def test_a_node_stamps_what_it_records_about_its_own_machine(app: Blazar) -> None:
    app.node = "a"
    (rec,) = await app.record(imported("m"))
    assert rec.event.node == "a"
    (hb,) = await app.record(NodeHeartbeat(name="a"))  # not node-local: nothing to stamp
    assert not hasattr(hb.event, "node") or hb.event.name == "a"


@pytest.mark.parametrize(("url", "clear"), [
    ("http://127.0.0.1:11434", False), ("http://localhost:11434", False), ("http://[::1]:11434", False),
    ("https://10.0.0.7:11434", False), ("https://gpu-2.lan", False), ("HTTPS://gpu-2.lan", False),
    ("http://10.0.0.7:11434", True), ("http://gpu-2.lan:11434", True), ("http://[fe80::1]:1", True),
    ("http://0.0.0.0:11434", True)])
def test_a_url_is_in_clear_when_plain_http_leaves_the_machine(url: str, clear: bool) -> None:
    assert in_clear_off_host(url) is clear


def test_a_node_url_in_clear_refuses_the_start_unless_insecure_cluster_is_chosen() -> None:
    assert check_node_url("http://127.0.0.1:11434", insecure_cluster=False) is None
    assert check_node_url("https://10.0.0.7:11434", insecure_cluster=False) is None
    with pytest.raises(UnsafeNodeUrl, match="--insecure-cluster") as refused:
        check_node_url("http://10.0.0.7:11434", insecure_cluster=False)
    assert refused.value.exit_code == 9 and "http://10.0.0.7:11434" in refused.value.message
    warning = check_node_url("http://10.0.0.7:11434", insecure_cluster=True)
    assert warning is not None and "over plain http" in warning and "--insecure-cluster" in warning
    # Chosen with an https URL, it still warns: it lets this node send the key to plain-http peers.
    assert "plain http" in (check_node_url("https://10.0.0.7:1", insecure_cluster=True) or "")


def ready_on(iid: str, node_: str, model: str = "m") -> list[object]:
    return [starting(iid, node_, model), InstanceReady(instance_id=iid, model=model, load_ms=5000)]


async def test_forwarding_never_sends_the_key_in_clear_unless_this_node_chose_insecure(app: Blazar) -> None:
    app.node = "a"
    keeper = NodeKeeper(app, url="https://10.0.0.1:1", live=lambda: (0, 0), stop_instances=_nothing)
    await keeper._join(rejoined=False)
    await app.record([started("b", "http://10.0.0.2:11434"), *ready_on("ib", "b"),  # type: ignore[list-item]
                      started("c", "https://10.0.0.3:11434"), *ready_on("ic", "c", "n"),  # type: ignore[list-item]
                      started("d", "http://127.0.0.1:9"), *ready_on("id", "d", "o")])  # type: ignore[list-item]
    assert ready_peer(app, "m") is None  # b is plain http off this machine: a loads it itself
    assert not may_send_key(app, "http://10.0.0.2:11434")
    assert (p := ready_peer(app, "n")) is not None and p.node == "c"  # https
    assert (p := ready_peer(app, "o")) is not None and p.node == "d"  # loopback
    app.env = {**app.env, CLUSTER_KEY_ENV: "k" * 40}
    with pytest.raises(NodeError, match="plain http off this machine"):
        await pull_on_node(app, "b", "qwen3")
    # Started again with --insecure-cluster (recorded in its node.started): the choice is its own to make.
    keeper.insecure_cluster = True
    await keeper._join(rejoined=False)
    joins = [r.event async for r in app.log.read(types=["node.started"])]
    assert [j.insecure_cluster for j in joins if j.name == "a"] == [False, True]
    assert may_send_key(app, "http://10.0.0.2:11434")
    assert (p := ready_peer(app, "m")) is not None and p.node == "b"

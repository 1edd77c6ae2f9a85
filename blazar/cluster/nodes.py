"""Nodes: gateways sharing one log on PostgreSQL. Each daemon is a node with a name (`node_name`, else the host
name) and the URL the others reach it at (`node_url`, else http://127.0.0.1:PORT); it records `node.started`, then a
heartbeat every `node_heartbeat_s`, and `node.stopped` on a clean stop. Every node watches the others: one silent for
longer than `node_down_after_s` is recorded `node.down` (the reason, when it was last heard from, who noticed, the
instances lost with it). A node that finds itself marked down while alive (a partition that healed) stops its
instances, which the cluster already counts as lost, and joins again.

With the embedded SQLite log there is one gateway and no node events at all.

The cluster key travels with every forwarded request and every `pull --node`, so a node URL other than loopback must
be https: a node refuses to start with a plain-http one (`check_node_url`), and never sends the key to a peer whose
recorded URL is plain http off the machine (`may_send_key`), unless it was started with `--insecure-cluster`, which
it warns about at every start and records in its `node.started`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from blazar import __version__
from blazar import config as settings
from blazar.addresses import in_clear_off_host
from blazar.context import Blazar
from blazar.errors import ConfigError, NodeError, UnsafeNodeUrl
from blazar.events.nodes import NodeDown, NodeHeartbeat, NodeStarted, NodeStopped
from blazar.logdb import local_value
from blazar.paths import Paths
from blazar.projections.nodes import node, nodes
from blazar.projections.residency import instances

log = logging.getLogger("blazar.nodes")


def node_name(paths: Paths, env: Mapping[str, str]) -> str:
    """This home's node name: BLAZAR_NODE_NAME, else node_name in its config.toml, else the host name (cut to a
    valid name)."""
    name = local_value(paths, env, "cluster.node_name", "BLAZAR_NODE_NAME")
    if name:
        if not settings.NODE_NAME.fullmatch(name):
            raise ConfigError(f"invalid node name {name[:64]!r}: 1-64 letters, digits, '.', '_' and '-'")
        return name
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname()).strip("-._")[:64]
    return host or "node"


def node_url(paths: Paths, env: Mapping[str, str], *, port: int, scheme: str = "http") -> str:
    """Where the other nodes reach this one: BLAZAR_NODE_URL, else node_url in config.toml, else loopback."""
    return (local_value(paths, env, "cluster.node_url", "BLAZAR_NODE_URL").rstrip("/")
            or f"{scheme}://127.0.0.1:{port}")


def check_node_url(url: str, *, insecure_cluster: bool) -> str | None:
    """Refuse a node URL that would carry the cluster key in clear (plain http off this machine); returns the warning
    to give at every start when `--insecure-cluster` forced it (or allows sending the key in clear to peers)."""
    clear = in_clear_off_host(url)
    if clear and not insecure_cluster:
        raise UnsafeNodeUrl(f"refusing to start as a node reached at {url}: it is plain http off this machine, so the "
                            "cluster key every other node sends with a forwarded request would cross the network in "
                            "clear. Serve https (tls_cert and tls_key) and set node_url to https://..., keep it on "
                            "loopback, or pass --insecure-cluster on a network only you can reach")
    if not insecure_cluster:
        return None
    where = f"this node is reached at {url} over plain http" if clear else f"this node is reached at {url}"
    return (f"--insecure-cluster: {where}, and it sends the cluster key to peers whose URL is plain http: anyone on "
            "those networks can read the key and act as any node (recorded in node.started)")


def may_send_key(app: Blazar, url: str) -> bool:
    """Whether this node may send the cluster key to `url`: https or loopback, or this node was started with
    --insecure-cluster (its own node.started says so)."""
    if not in_clear_off_host(url):
        return True
    me = node(app.runner.state("nodes"), app.node) if app.node else None
    return me is not None and me.insecure_cluster


@functools.lru_cache(maxsize=256)
def _warn_in_clear(peer: str, url: str) -> None:
    """Once per peer and URL: forwarding there is off, and why."""
    log.warning("not forwarding to node %s: its URL %s is plain http off this machine and would carry the cluster "
                "key in clear (give it an https node_url, or start this node with --insecure-cluster)", peer, url)


@dataclass
class NodeKeeper:
    """A daemon's part in the cluster: join, beat, watch the others, leave."""

    app: Blazar
    url: str
    live: Callable[[], tuple[int, int]]  # (live instances, requests in flight) of this node, for its heartbeat
    stop_instances: Callable[[], Awaitable[None]]  # what a node marked down while alive does before it rejoins
    insecure_cluster: bool = False  # started with --insecure-cluster: recorded with every join
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.app.node

    async def start(self) -> None:
        await self._join(rejoined=False)
        self._task = asyncio.create_task(self._loop(), name="blazar-node-heartbeat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):  # the log may be unreachable on the way out: the others will notice
            await self.app.record(NodeStopped(name=self.name))

    async def _join(self, *, rejoined: bool) -> None:
        await self.app.record(NodeStarted(name=self.name, url=self.url, pid=os.getpid(), host=socket.gethostname(),
                                          version=__version__, rejoined=rejoined,
                                          insecure_cluster=self.insecure_cluster))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.app.settings().cluster.node_heartbeat_s)
            try:
                await self.beat_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("node heartbeat")

    async def beat_once(self) -> None:
        """One heartbeat, one look at the others, one look at itself."""
        me = node(self.app.runner.state("nodes"), self.name)
        if me is not None and not me.up and me.down_reason != "stopped":
            log.warning("node %s was marked down by %s (%s) while alive: stopping its instances, which the cluster "
                        "counts as lost, and joining again", self.name, me.noticed_by, me.down_reason)
            await self.stop_instances()
            await self._join(rejoined=True)
        count, in_flight = self.live()
        self.app.request_writer().submit(NodeHeartbeat(name=self.name, instances=count, in_flight=in_flight),
                                         actor=self.app.actor, trace_id=None)
        await self.mark_silent()

    async def mark_silent(self) -> list[str]:
        """Record `node.down` for every other node silent past `node_down_after_s`; returns their names."""
        await self.app.runner.catch_up()
        now, after = self.app.clock.now(), self.app.settings().cluster.node_down_after_s
        me = node(self.app.runner.state("nodes"), self.name)
        if me is None or now - me.last_seen_ts > after:
            return []  # this node's own heartbeats are not landing (the database was away): its view is stale
        residency = self.app.runner.state("residency")
        marked = []
        for n in nodes(self.app.runner.state("nodes"), up_only=True):
            silent = now - n.last_seen_ts
            if n.name == self.name or silent <= after:
                continue
            lost = [i.instance_id for i in instances(residency) if i.node == n.name]
            await self.app.record(NodeDown(name=n.name, detail=f"no heartbeat for {silent:.0f} s "
                                           f"(node_down_after_s {after:g})", last_seen_ts=n.last_seen_ts,
                                           noticed_by=self.name, instances_lost=lost))
            log.warning("node %s marked down: no heartbeat for %.0f s; %d instance(s) lost", n.name, silent,
                        len(lost))
            marked.append(n.name)
        return marked


# -- forwarding: a request for a model ready on another node ----------------------------------------------------------

FORWARD_HEADER = "x-blazar-forwarded-by"  # the forwarding node's name; honoured only with the cluster key
CLUSTER_KEY_ENV = "BLAZAR_CLUSTER_KEY"
CLUSTER_KEY_MIN = 32


def cluster_key(env: Mapping[str, str]) -> str | None:
    """The secret the gateways of one cluster share (BLAZAR_CLUSTER_KEY, at least 32 characters): a node forwards
    only with it, and honours a forwarded request only when it is presented. None: no forwarding."""
    key = env.get(CLUSTER_KEY_ENV, "").strip()
    if not key:
        return None
    if len(key) < CLUSTER_KEY_MIN:
        log.warning("%s is shorter than %d characters: ignored (no forwarding between nodes)", CLUSTER_KEY_ENV,
                    CLUSTER_KEY_MIN)
        return None
    return key


@dataclass(frozen=True, slots=True)
class Peer:
    """A node other than this one with an instance of the model ready."""

    node: str
    url: str
    instance_id: str
    slots: int
    ctx_tokens: int
    load_ms: int | None  # what loading it took there: what forwarding saves


def ready_peer(app: Blazar, model: str, *, ctx: int | None = None) -> Peer | None:
    """The up node (heard from within node_down_after_s) with an instance of `model` ready that covers `ctx`; the
    one whose last heartbeat reported the fewest requests in flight. A node the cluster key may not be sent to
    (`may_send_key`) is never one."""
    now, after = app.clock.now(), app.settings().cluster.node_down_after_s
    up = {n.name: n for n in nodes(app.runner.state("nodes"), up_only=True)
          if n.name != app.node and now - n.last_seen_ts <= after}
    if not up:
        return None
    found = []
    for i in instances(app.runner.state("residency")):
        if i.node in up and i.model == model and i.state == "ready" and (ctx is None or i.ctx_tokens >= ctx):
            if not may_send_key(app, up[i.node].url):
                _warn_in_clear(i.node, up[i.node].url)
                continue
            found.append(Peer(node=i.node, url=up[i.node].url, instance_id=i.instance_id, slots=i.slots,
                              ctx_tokens=i.ctx_tokens, load_ms=i.load_ms))
    return min(found, key=lambda p: (up[p.node].in_flight, p.node)) if found else None


# -- another node's store: `blazar pull --node` ------------------------------------------------------------------------

PULL_TIMEOUT_S = 6 * 3600.0  # a download of a large model over a slow link; progress lines keep it alive


async def pull_on_node(app: Blazar, name: str, target: str,
                       progress: Callable[[int, int], None] | None = None) -> str:
    """Ask node `name` to pull `target` into its own store (its `POST /api/pull`, with the cluster key); follow its
    progress. Returns the status line it ended with; NodeError with its words when it fails."""
    n = node(app.runner.state("nodes"), name)
    if n is None:
        known = ", ".join(x.name for x in nodes(app.runner.state("nodes"))) or "none"
        raise NodeError(f"no node named {name!r} in this log (nodes: {known}; `blazar node list`)")
    if not n.up:
        raise NodeError(f"node {name} is down ({n.down_reason}): it cannot pull now")
    key = cluster_key(app.env)
    if key is None:
        raise NodeError(f"asking another node needs the cluster key: set {CLUSTER_KEY_ENV} (the same on every node)")
    if not may_send_key(app, n.url):
        raise NodeError(f"node {name} is reached at {n.url}, plain http off this machine: the cluster key would "
                        "cross the network in clear. Give it an https node_url, or start this node with "
                        "--insecure-cluster")
    import aiohttp  # the CLI imports it only for this

    last = ""
    timeout = aiohttp.ClientTimeout(total=PULL_TIMEOUT_S, sock_read=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
                f"{n.url}/api/pull", json={"model": target, "stream": True},
                headers={"authorization": f"Bearer {key}"}) as resp:
            if resp.status >= 400:
                raise NodeError(f"node {name} refused the pull ({resp.status}): {_error_of(await resp.read())}")
            async for raw in resp.content:
                line = _json_line(raw)
                if line is None:
                    continue
                if "error" in line:
                    raise NodeError(f"node {name}: {line['error']}")
                last = str(line.get("status", last))
                if progress is not None and "total" in line:
                    progress(int(line.get("completed") or 0), int(line["total"]))
    except aiohttp.ClientError as e:
        raise NodeError(f"node {name} at {n.url} did not answer: {e}") from None
    if last != "success":
        raise NodeError(f"node {name}'s pull ended without success (last status: {last or 'none'})")
    return last


def _json_line(raw: bytes) -> dict[str, Any] | None:
    try:
        got = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return got if isinstance(got, dict) else None


def _error_of(body: bytes) -> str:
    got = _json_line(body)
    if got is None:
        return body[:200].decode(errors="replace")
    err = got.get("error")
    return str(err.get("message") if isinstance(err, dict) else err)

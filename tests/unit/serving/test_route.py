"""A call's way is two values: its `Route` (what resolving and routing decided, frozen, kept once per decision) and
what its engine is asked (`EngineAsk`), which only `Patch`es and the context's cap change. A reroute forgets the
instance, the placement's fields and the cap; a cascade's step starts from the request as it came. Resolving returns
the store's model, else a remote engine's, else a 404; a cascade's model also in the key's scope."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from blazar.cluster.nodes import Peer
from blazar.context import Blazar
from blazar.errors import ModelNotFound, Refused
from blazar.events.base import Event
from blazar.events.remotes import RemoteAdded
from blazar.instances.live import Instance, ResolvedModel
from blazar.projections.keys import ApiKey
from blazar.serving.admission import Ticket
from blazar.serving.call import Call, Desk
from blazar.serving.forwarding import FORWARD_HOP_MS, Forwarder
from blazar.serving.patch import NO_PATCH, Patch
from blazar.serving.ports import SupervisorPort
from blazar.serving.principal import Principal
from blazar.serving.request import Request
from blazar.serving.resolve import Resolver
from blazar.serving.route import Route
from tests.support.resolved import resolved

INSTANCE = cast(Instance, "inst")


@dataclass
class Desk_:
    given: list[str] = field(default_factory=list)

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        pass

    def release_slot(self, ticket: Ticket, *, tokens: int | None = None, charged: int | None = None) -> None:
        self.given.append("slot")

    def give_back_slot(self, ticket: Ticket) -> None:
        self.given.append("slot-unused")

    def unhold(self, instance: Any) -> None:
        self.given.append("hold")


def chat(**asked: Any) -> Call:
    parsed = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **asked}
    request = Request(model="m", engine_path="/v1/chat/completions", body=None, stream=False, parsed=parsed,
                      max_tokens=asked.get("max_tokens"), cascade=("m", "big") if asked.get("cascade") else ())
    return Call(request, cast(Desk, Desk_()))


def test_a_route_is_frozen_and_routing_returns_a_new_one_with_its_instance() -> None:
    route = Route("alias", resolved("m"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        route.instance = INSTANCE  # type: ignore[misc]
    routed = route.to(INSTANCE, 1200.0)
    assert (route.instance, routed.instance, routed.load_ms, routed.model, routed.name) == (
        None, INSTANCE, 1200.0, "alias", "m")
    assert routed.to(None) == route  # routed again: the instance and its load forgotten
    assert not route.elsewhere and Route("r", resolved("r"), remote="box").elsewhere


def test_a_call_reads_its_way_from_its_route() -> None:
    call = chat()
    assert (call.model, call.name, call.instance, call.load_ms) == ("m", None, None, None)
    call.take_route(Route("m", resolved("m.gguf")).to(INSTANCE, 5.0))
    assert (call.name, call.instance, call.load_ms) == ("m.gguf", INSTANCE, 5.0)


def test_a_patch_sets_fields_and_fills_only_what_is_unset() -> None:
    call = chat(max_tokens=8)
    assert not NO_PATCH and Patch(ctx=1)
    call.ask.apply(NO_PATCH)
    assert call.ask.body is None  # nothing changed: the client's bytes go as they came
    call.ask.apply(Patch(fields={"temperature": 0.0}, max_tokens=64, ctx=2048, loop_guarded=True))
    assert call.ask.body is not None and call.ask.body["temperature"] == 0.0
    assert (call.ask.max_tokens, call.ask.ctx, call.ask.loop_guarded) == (8, 2048, True)  # the request's 8 wins
    call.ask.apply(Patch(ctx=4096))
    assert call.ask.ctx == 2048
    assert "temperature" not in call.request.parsed  # the client's body as it came


def test_a_reroute_forgets_the_instance_the_placement_and_the_cap() -> None:
    call = chat(max_tokens=32000)
    call.take_route(Route("m", resolved("m")).to(INSTANCE, 3.0))
    call.ask.apply(Patch(fields={"id_slot": 2, "cache_prompt": True}))
    call.ask.bound_output(24, {"max_tokens": 24})
    call.queued(3)
    call.unroute(("id_slot", "cache_prompt"))
    body = call.ask.engine_body()
    assert "id_slot" not in body and "cache_prompt" not in body and body["max_tokens"] == 32000
    assert (call.instance, call.load_ms, call.name, call.queue_position, call.rerouted) == (None, None, "m", 0, True)
    assert call.ask.bounded_max_tokens is None


def test_a_cascades_step_starts_from_the_request_as_it_came_on_its_own_route() -> None:
    call = chat(cascade=True)
    assert call.model == "m"  # the cascade's first, before it is resolved
    call.take_route(Route("m", resolved("m")).to(INSTANCE))
    call.ask.apply(Patch(fields={"id_slot": 0}, ctx=512))
    call.retarget(Route("big", resolved("big")))
    assert (call.model, call.name, call.instance, call.ask.ctx, call.ask.body) == ("big", "big", None, None, None)


def test_forwarding_is_chosen_only_when_loading_here_costs_more_than_a_hop() -> None:
    peer = Peer(node="n2", url="http://n2", instance_id="i", slots=2, ctx_tokens=4096, load_ms=FORWARD_HOP_MS)
    assert Forwarder.cheaper(peer) is None
    slow = dataclasses.replace(peer, load_ms=900)
    assert Forwarder.cheaper(slow) == {"peer_load_ms": 900, "hop_ms_estimate": FORWARD_HOP_MS}
    assert Forwarder.cheaper(dataclasses.replace(peer, load_ms=None)) is not None  # unknown: forwarded


# -- resolving: the Route a call starts from ---------------------------------------------------------------------------

class Store:
    """A store that holds "local" only."""

    def resolve(self, model: str) -> ResolvedModel:
        if model != "local":
            raise ModelNotFound(f"no model named {model!r}")
        return resolved("local.gguf")


def keyed(*models: str) -> Principal:
    return Principal(actor="key:k", admin=False, key=ApiKey(
        name="k", prefix="p" * 8, salt="00", hash="00", models=models, rpm=None, tpm=None, daily_tokens=None,
        max_concurrent=None, admin=False, expires_ts=None, revoked=False, created_ts=0.0))


async def test_resolving_returns_the_stores_model_else_a_remotes_else_refuses(app: Blazar) -> None:
    await app.record(RemoteAdded(name="box", url="http://h:1", models=["far"]))
    resolver = Resolver(app, cast(SupervisorPort, Store()), Forwarder(app, None))  # no cluster key: no peers

    def call_for(model: str, principal: Principal | None = None) -> Call:
        return Call(Request(model=model, engine_path="/v1/chat/completions", body=None, stream=False,
                            principal=principal), cast(Desk, Desk_()))

    here = resolver.resolve(call_for("local"))
    assert (here.model, here.name, here.remote, here.peer, here.instance, here.elsewhere) == (
        "local", "local.gguf", None, None, None, False)
    far = resolver.resolve(call_for("far"))
    assert (far.model, far.remote, far.elsewhere) == ("far", "box", True)
    with pytest.raises(Refused) as nowhere:
        resolver.resolve(call_for("nowhere"))
    assert (nowhere.value.http_status, nowhere.value.reason) == (404, "model_not_found")
    # A cascade's later model: the same places, in the key's scope.
    with pytest.raises(Refused) as outside:
        resolver.in_scope(call_for("local", keyed("local*")), "far")
    assert (outside.value.http_status, outside.value.reason) == (403, "model_not_allowed")
    assert resolver.in_scope(call_for("local", keyed("*")), "far").remote == "box"

"""Keys are tenants, without a daemon: who a request's tenant is, session names in their tenant's namespace, the slot
choice that keeps one tenant's prefix from another, what the engine is told, single-flight per tenant, the right to
prioritize, and the key events that carry cache groups and that right."""

from __future__ import annotations

from typing import cast

import pytest

from blazar.context import Blazar
from blazar.events.base import Event, Recorded
from blazar.events.keys import KeyCreated, KeyLimitsChanged
from blazar.events.requests import RequestCompleted, RequestFailed, RequestReceived
from blazar.instances.kv_bank import Placement
from blazar.instances.session_slots import LOST_MAX, SessionSlots
from blazar.operations import keys as handlers
from blazar.operations.keys import KeyCommandError
from blazar.projections.base import fold
from blazar.projections.keys import ApiKey, KeysProjection
from blazar.projections.keys import key as api_key
from blazar.projections.metrics import MetricsProjection, tokens_on
from blazar.serving.admit import share_tenant, share_weight
from blazar.serving.call import Call, Desk
from blazar.serving.flights import flight_key
from blazar.serving.principal import Principal
from blazar.serving.request import Request
from blazar.serving.tenancy import may_prioritize, qualify, split_session, tenant_named, tenant_of
from tests.support.events import rec


def api(name: str, *, group: str | None = None, prioritize: bool = False, admin: bool = False) -> ApiKey:
    return ApiKey(name=name, prefix="p" * 8, salt="00", hash="00", models=(), rpm=None, tpm=None, daily_tokens=None,
                  max_concurrent=None, admin=admin, expires_ts=None, revoked=False, created_ts=0.0, cache_group=group,
                  may_prioritize=prioritize)


def keyed(name: str, **kw: object) -> Principal:
    k = api(name, **kw)  # type: ignore[arg-type]
    return Principal(actor=f"key:{name}", admin=k.admin, key=k)


# -- who the tenant is ------------------------------------------------------------------------------------------------

def test_a_key_is_its_own_tenant_unless_an_admin_put_it_in_a_cache_group() -> None:
    assert tenant_of(keyed("alice")) == "key:alice"
    assert tenant_of(keyed("bob", group="team")) == tenant_of(keyed("carol", group="team")) == "group:team"
    assert tenant_of(keyed("root", admin=True)) == "key:root"  # an admin key is a tenant too


def test_the_owner_is_one_tenant_with_keys_off_or_through_the_cli_token() -> None:
    assert tenant_of(None) is None
    assert tenant_of(Principal(actor="cli:me", admin=True)) is None


def test_a_hop_from_another_node_runs_as_the_tenant_it_names_and_nothing_malformed() -> None:
    peer = Principal(actor="cluster:node", admin=False, cluster=True)
    assert tenant_of(peer, "key:alice") == "key:alice"
    assert tenant_of(peer, "group:team") == "group:team"
    assert tenant_of(peer, None) is None
    for bad in ("alice", "key:", "key:a/b", "root:x", "key:" + "a" * 65):
        assert tenant_of(peer, bad) is None
    assert tenant_of(keyed("alice"), "key:mallory") == "key:alice"  # only a hop may name a tenant


def test_session_names_live_in_their_tenants_namespace() -> None:
    assert qualify("key:alice", "chat-1") == "key:alice/chat-1" != qualify("key:bob", "chat-1")
    assert qualify(None, "chat-1") == "chat-1" and qualify("key:alice", None) is None
    assert split_session("key:alice/chat-1") == ("key:alice", "chat-1")
    assert split_session("chat-1") == (None, "chat-1")
    assert tenant_named(key="alice") == "key:alice" and tenant_named(group="g") == "group:g"
    assert tenant_named() is None
    with pytest.raises(ValueError):
        tenant_named(key="a/b")
    with pytest.raises(ValueError):
        tenant_named(key="a", group="b")


def test_priority_and_deadlines_are_the_owners_an_admins_or_a_key_given_the_right() -> None:
    assert may_prioritize(None) and may_prioritize(Principal(actor="cli:me", admin=True))
    assert may_prioritize(keyed("root", admin=True)) and may_prioritize(keyed("vip", prioritize=True))
    assert not may_prioritize(keyed("app"))


# -- slots: one tenant's prefix is never another's -------------------------------------------------------------------

def test_isolated_requests_prefer_their_own_slot_then_a_fresh_one_then_anothers_least_recently_used() -> None:
    now = [0.0]
    slots = SessionSlots(clock=lambda: now[0])
    for slot, tenant in ((0, "key:a"), (1, "key:b"), (2, "key:b")):
        now[0] += 1
        slots.place("i", slot, None, tenant)
    pick = slots.picker("i", None, "key:a", isolate=True)
    assert pick is not None
    assert pick(frozenset({0, 1, 2, 3})) == 0  # its own
    assert pick(frozenset({1, 2, 3})) == 3  # never used
    assert pick(frozenset({1, 2})) == 1  # another's, the least recently used
    assert slots.picker("i", None, None) is None  # not isolating, no session: the engine's lowest free slot


def test_a_slot_is_reusable_only_by_the_tenant_that_used_it_last() -> None:
    slots = SessionSlots(clock=lambda: 0.0)
    assert slots.place("i", 0, None, "key:a") is False  # a slot this process never placed is nobody's
    assert slots.place("i", 0, None, "key:a") is True
    assert slots.place("i", 0, None, "key:b") is False
    assert slots.place("i", 0, None, "key:a") is False
    assert slots.place("i", 0, None, None) is False and slots.place("i", 0, None, None) is True


def test_the_engine_is_told_the_slot_and_no_reuse_of_another_tenants_prefix() -> None:
    assert Placement(kv=None).engine_fields(3, isolate=False) == {}
    assert Placement(kv=None, explicit=True).engine_fields(3, isolate=False) == {"id_slot": 3}
    assert Placement(kv=None, own=True).engine_fields(3, isolate=True) == {"id_slot": 3}
    assert Placement(kv=None, own=False).engine_fields(3, isolate=True) == {"id_slot": 3, "cache_prompt": False}
    # Keys off: one tenant, nothing withheld.
    assert Placement(kv=None, own=False).engine_fields(3, isolate=False) == {}


def test_the_memory_of_sessions_that_lost_their_slot_is_bounded() -> None:
    slots = SessionSlots(clock=lambda: 0.0)
    for n in range(LOST_MAX + 10):
        slots.place("i", 0, f"s{n}")
    assert len(slots._lost) == LOST_MAX
    assert slots.lost(f"s{LOST_MAX + 8}") == ("i", 0) and slots.lost("s0") is None


# A call that records nothing: flight_key reads only what was asked.
NO_DESK = cast(Desk, object())


# -- single-flight --------------------------------------------------------------------------------------------------

def test_identical_requests_share_a_generation_only_within_one_tenant() -> None:
    def plan(tenant: str | None) -> Call:
        body = {"model": "g", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
        return Call(Request(model="g", engine_path="/v1/chat/completions", body=None, stream=False,
                            path="/v1/chat/completions", parsed=body, tenant=tenant), NO_DESK)

    assert flight_key(plan("key:a")) == flight_key(plan("key:a"))
    assert flight_key(plan("key:a")) != flight_key(plan("key:b"))
    assert flight_key(plan("group:t")) != flight_key(plan(None))


# -- the key events -------------------------------------------------------------------------------------------------

def test_the_keys_projection_folds_cache_groups_and_the_right_to_prioritize() -> None:
    made = KeyCreated(name="a", prefix="abcdefgh", salt="00", hash="00", cache_group="team", may_prioritize=True)
    state = fold(KeysProjection(), [rec(1, made)])
    k = api_key(state, "a")
    assert k is not None and k.cache_group == "team" and k.may_prioritize
    state = fold(KeysProjection(), [rec(2, KeyLimitsChanged(name="a", changed={"cache_group": None,
                                                                               "may_prioritize": False}))], state)
    k = api_key(state, "a")
    assert k is not None and k.cache_group is None and not k.may_prioritize


async def test_key_commands_set_and_check_cache_groups_and_the_right(app: Blazar) -> None:
    await handlers.create(app, "a", cache_group="team", may_prioritize=True)
    k = api_key(app.runner.state("keys"), "a")
    assert k is not None and (k.cache_group, k.may_prioritize) == ("team", True)
    rec_ = await handlers.change_limits(app, "a", {"cache_group": "", "may_prioritize": False})
    assert rec_ is not None and rec_.event.changed == {"cache_group": None, "may_prioritize": False}  # type: ignore[attr-defined]
    assert await handlers.change_limits(app, "a", {"cache_group": None}) is None  # nothing changed
    for bad in ({"cache_group": "a/b"}, {"cache_group": " x"}, {"may_prioritize": "yes"}):
        with pytest.raises(KeyCommandError):
            await handlers.change_limits(app, "a", bad)
    with pytest.raises(KeyCommandError):
        await handlers.create(app, "b", cache_group="no way")


async def test_a_keys_fair_share_weight_is_set_changed_and_checked(app: Blazar) -> None:
    await handlers.create(app, "plain")
    await handlers.create(app, "gold", weight=3)
    state = app.runner.state("keys")
    assert [api_key(state, n).weight for n in ("plain", "gold")] == [1, 3]  # type: ignore[union-attr]
    rec_ = await handlers.change_limits(app, "gold", {"weight": 5})
    assert rec_ is not None and rec_.event.changed == {"weight": 5}  # type: ignore[attr-defined]
    assert api_key(app.runner.state("keys"), "gold").weight == 5  # type: ignore[union-attr]
    assert api_key(app.runner.state("keys"), "gold").public()["weight"] == 5  # type: ignore[union-attr]
    assert await handlers.change_limits(app, "gold", {"weight": 5}) is None
    for bad in (0, -1, 1001, 1.5, True, "2"):
        with pytest.raises(KeyCommandError, match="--weight"):
            await handlers.change_limits(app, "gold", {"weight": bad})
    with pytest.raises(KeyCommandError, match="--weight"):
        await handlers.create(app, "heavy", weight=0)


def test_a_requests_share_is_its_keys_even_in_a_cache_group_and_the_keyless_callers_otherwise() -> None:
    def asked(principal: Principal | None, tenant: str | None) -> Request:
        return Request(model="m", engine_path="/v1/chat/completions", body=None, stream=False, principal=principal,
                       tenant=tenant)

    assert share_tenant(asked(keyed("gold"), "group:team")) == "key:gold"
    assert share_tenant(asked(None, None)) == ""
    assert share_tenant(asked(Principal(actor="cluster:node", admin=False, cluster=True), "key:far")) == "key:far"
    assert share_weight(asked(None, None)) == 1


# -- tokens relayed before a failure count --------------------------------------------------------------------------

def test_a_failed_streams_relayed_tokens_count_against_its_keys_day() -> None:
    def by(seq: int, event: Event) -> Recorded:
        return rec(seq, event, epoch=2 * 86400, actor="key:a")

    state = fold(MetricsProjection(), [
        by(1, RequestReceived(trace_id="t1", dialect="openai", route="/v1/chat/completions", model="g")),
        by(2, RequestFailed(trace_id="t1", model="g", status=499, reason="client_disconnected",
                            completion_tokens=40)),
        by(3, RequestReceived(trace_id="t2", dialect="openai", route="/v1/chat/completions", model="g")),
        by(4, RequestCompleted(trace_id="t2", model="g", duration_ms=1, prompt_tokens=5, completion_tokens=3)),
    ])
    assert tokens_on(state, "a", 2) == 48


def test_extra_shares_count_against_max_concurrent_only() -> None:
    from blazar.clock import FakeClock
    from blazar.serving.limits import KeyLimits, Limiter

    limiter = Limiter(FakeClock())
    limits = KeyLimits("a", rpm=1, max_concurrent=2)
    first = limiter.acquire(limits)
    extra = limiter.extra(limits)  # not a second request: rpm 1 does not refuse it
    assert extra is not None and limiter.in_flight("a") == 2
    assert limiter.extra(limits) is None  # at max_concurrent
    limiter.release(extra)
    limiter.release(first)
    assert limiter.in_flight("a") == 0
    assert limiter.extra(KeyLimits("b")) is not None  # no max_concurrent: no bound


def test_once_every_slot_is_one_tenants_its_requests_let_the_engine_choose() -> None:
    slots = SessionSlots(clock=lambda: 0.0)
    assert not slots.sole("i", "key:a", 2)  # slots this process never placed are nobody's
    slots.place("i", 0, None, "key:a")
    assert not slots.sole("i", "key:a", 2)
    slots.place("i", 1, None, "key:a")
    assert slots.sole("i", "key:a", 2) and not slots.sole("i", "key:b", 2)
    # The engine picks among its own slots by the longest common prefix; another tenant names its slot, no reuse.
    assert Placement(kv=None, own=True, sole=True).engine_fields(1, isolate=True) == {}
    assert Placement(kv=None, own=False).engine_fields(1, isolate=True) == {"id_slot": 1, "cache_prompt": False}
    slots.place("i", 1, None, "key:b")
    assert not slots.sole("i", "key:a", 2)
    # A session's slot is always named, sole or not.
    assert Placement(kv=None, explicit=True, sole=True).engine_fields(1, isolate=True) == {"id_slot": 1}

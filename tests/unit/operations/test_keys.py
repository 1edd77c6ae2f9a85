"""API keys without a daemon: the keys projection fed events, the key commands on a real log, the authenticator's
decisions, the principal's scope, and what the audit trail may show."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from blazar.api.auth import Access, Authenticator, Forbidden, Unauthenticated, access
from blazar.api.table import access_rules
from blazar.clock import FakeClock
from blazar.context import Blazar
from blazar.events.base import Event, Recorded
from blazar.events.keys import KeyCreated, KeyLimitsChanged, KeyRevoked, KeyRotated
from blazar.operations import keys as handlers
from blazar.operations.keys import KeyCommandError, digest, new_secret, prefix_of
from blazar.projections.base import fold
from blazar.projections.keys import KeysProjection, auth_on
from blazar.projections.keys import key as api_key
from blazar.serving.principal import Principal, is_admin
from tests.support.events import rec
from tests.support.states import through_checkpoint


def created(name: str, secret: str | None = None, **kw: object) -> tuple[KeyCreated, str]:
    made = new_secret()
    s = secret or made.secret
    prefix = prefix_of(s)
    assert prefix is not None
    return KeyCreated(name=name, prefix=prefix, salt=made.salt, hash=digest(made.salt, s), **kw), s  # type: ignore[arg-type]


# -- the projection ------------------------------------------------------------------------------------------------

def test_projection_indexes_live_keys_by_prefix_and_marks_revoked_ones() -> None:
    a, _ = created("alice", models=["gemma*"], rpm=5)
    b, _ = created("bob", admin=True)
    state = fold(KeysProjection(), [rec(1, a), rec(2, b), rec(3, KeyRevoked(name="bob"))])
    assert state.by_prefix == {a.prefix: "alice"}
    assert state.keys["alice"].models == ("gemma*",) and state.keys["alice"].rpm == 5
    assert state.keys["bob"].revoked is True and state.keys["bob"].revoked_ts == 1003.0
    assert state.live == 1 and auth_on(state)
    assert through_checkpoint(KeysProjection(), state) == state


def test_rotation_moves_the_index_to_the_new_prefix_and_limits_change_only_the_given_fields() -> None:
    a, _ = created("alice", rpm=5, tpm=100)
    made = new_secret()
    events = [rec(1, a), rec(2, KeyRotated(name="alice", prefix=made.prefix, salt=made.salt, hash=made.hash)),
              rec(3, KeyLimitsChanged(name="alice", changed={"rpm": None, "models": ["q*"]}))]
    state = fold(KeysProjection(), events)
    assert state.by_prefix == {made.prefix: "alice"}
    key = state.keys["alice"]
    assert (key.hash, key.salt, key.rotated_ts) == (made.hash, made.salt, 1002.0)
    assert key.rpm is None and key.tpm == 100 and key.models == ("q*",)


def test_auth_is_off_with_no_key_and_again_once_every_key_is_revoked() -> None:
    a, _ = created("alice")
    assert not auth_on(KeysProjection().initial())
    assert auth_on(fold(KeysProjection(), [rec(1, a)]))
    assert not auth_on(fold(KeysProjection(), [rec(1, a), rec(2, KeyRevoked(name="alice"))]))


def test_a_revoked_key_is_not_brought_back_by_a_later_rotation_or_limit_change() -> None:
    a, _ = created("alice")
    made = new_secret()
    state = fold(KeysProjection(), [rec(1, a), rec(2, KeyRevoked(name="alice")),
                                    rec(3, KeyRotated(name="alice", prefix=made.prefix, salt=made.salt,
                                                      hash=made.hash))])
    assert state.by_prefix == {} and state.keys["alice"].revoked


def test_the_view_and_the_audit_details_never_show_a_salt_or_hash() -> None:
    a, _ = created("alice")
    view = KeysProjection().view(fold(KeysProjection(), [rec(1, a)]))
    assert "salt" not in view["keys"]["alice"] and "hash" not in view["keys"]["alice"]
    assert view["keys"]["alice"]["models"] == [] and view["live"] == 1
    made = new_secret()
    for ev in (a, KeyRotated(name="alice", prefix=made.prefix, salt=made.salt, hash=made.hash)):
        details = ev.audit_details()
        assert "salt" not in details and "hash" not in details and details["prefix"] == ev.prefix
        assert ev.AUDIT and ev.stream_key() == "key:alice"


# -- secrets -------------------------------------------------------------------------------------------------------

def test_a_secret_is_blz_plus_256_bits_and_only_its_hmac_under_a_per_key_salt_is_kept() -> None:
    one, two = new_secret(), new_secret()
    assert one.secret.startswith("blz_") and len(one.secret) == 4 + 43  # 32 bytes, url-safe base64 unpadded
    assert one.prefix == one.secret[4:12] and one.salt != two.salt
    assert one.hash == hmac.new(bytes.fromhex(one.salt), one.secret.encode(), hashlib.sha256).hexdigest()
    assert one.secret not in (one.hash, one.salt)


def test_a_new_secret_never_reuses_a_live_prefix() -> None:
    taken = {new_secret().prefix for _ in range(5)}
    assert all(new_secret(taken).prefix not in taken for _ in range(50))


# -- the authenticator ---------------------------------------------------------------------------------------------

def _auth(events: list[Event], clock: FakeClock | None = None, admin_token: str | None = None) -> Authenticator:
    state = fold(KeysProjection(), [rec(i, e) for i, e in enumerate(events, 1)])
    return Authenticator(lambda: state, clock or FakeClock(), rules=access_rules(), admin_token=admin_token,
                         admin_actor="cli:me")


def test_auth_off_lets_everything_through_without_a_principal() -> None:
    assert _auth([]).check("POST", "/api/pull", None) is None


def test_a_good_secret_gives_the_keys_principal_and_a_wrong_one_401() -> None:
    a, secret = created("alice", models=["gemma*"])
    auth = _auth([a])
    p = auth.check("POST", "/v1/chat/completions", secret)
    assert p is not None and p.actor == "key:alice" and not p.admin and p.key_name == "alice"
    wrong = secret[:-1] + ("A" if secret[-1] != "A" else "B")  # same prefix, other secret
    for bad in (None, wrong, "blz_nope", "sk-something", ""):
        with pytest.raises(Unauthenticated) as e:
            auth.check("POST", "/v1/chat/completions", bad or None)
        assert e.value.headers == {"WWW-Authenticate": "Bearer"} and e.value.http_status == 401


def test_health_and_preflights_stay_open_with_keys_on() -> None:
    a, _ = created("alice")
    auth = _auth([a])
    assert auth.check("GET", "/health", None) is None
    assert auth.check("GET", "/openapi.json", None) is None
    assert auth.check("OPTIONS", "/v1/chat/completions", None) is None
    with pytest.raises(Unauthenticated):
        auth.check("GET", "/v1/models", None)


def test_an_expired_key_is_refused() -> None:
    clock = FakeClock(start=5000.0)
    a, secret = created("alice", expires_ts=5010.0)
    auth = _auth([a], clock)
    assert auth.check("GET", "/v1/models", secret) is not None
    clock.advance(10)
    with pytest.raises(Unauthenticated, match="expired"):
        auth.check("GET", "/v1/models", secret)


def test_a_revoked_or_rotated_secret_is_refused_at_once() -> None:
    a, secret = created("alice")
    with pytest.raises(Unauthenticated):
        _auth([a, created("other")[0], KeyRevoked(name="alice")]).check("GET", "/v1/models", secret)
    made = new_secret()
    auth = _auth([a, KeyRotated(name="alice", prefix=made.prefix, salt=made.salt, hash=made.hash)])
    with pytest.raises(Unauthenticated):
        auth.check("GET", "/v1/models", secret)
    assert auth.check("GET", "/v1/models", made.secret) is not None


@pytest.mark.parametrize("route", ["/api/blazar/load", "/api/blazar/ps", "/api/blazar/why/{trace}",
                                   "/api/blazar/engines", "/api/pull", "/api/delete", "/api/copy",
                                   "/api/create", "/metrics", "/ready", "/api/push", "/api/blazar/not-a-route", None])
def test_admin_routes_and_routes_without_a_rule_need_an_admin_key(route: str | None) -> None:
    a, user = created("alice")
    b, root = created("root", admin=True)
    auth = _auth([a, b])
    assert access(access_rules(), route) in (Access.ADMIN, Access.CLUSTER)
    with pytest.raises(Forbidden) as e:
        auth.check("POST", route, user)
    assert e.value.http_status == 403
    p = auth.check("POST", route, root)
    assert p is not None and p.admin


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/models", "/v1/models/{model_id}", "/v1/messages",
                                   "/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/tags",
                                   "/api/show", "/api/ps", "/api/version", "/", "/api/blazar/sessions",
                                   "/api/blazar/sessions/{name}/save"])
def test_inference_and_listing_routes_take_any_valid_key(route: str) -> None:
    a, user = created("alice")
    assert access(access_rules(), route) is Access.KEY
    assert _auth([a]).check("POST", route, user) is not None


def test_the_cluster_key_may_pull_and_infer_and_nothing_admin() -> None:
    a, _ = created("alice")
    state = fold(KeysProjection(), [rec(1, a)])
    auth = Authenticator(lambda: state, FakeClock(), rules=access_rules(), cluster_key="c" * 40)
    for route in ("/api/pull", "/v1/chat/completions", "/api/chat"):
        p = auth.check("POST", route, "c" * 40)
        assert p is not None and p.cluster and not p.admin
    for route in ("/api/delete", "/api/blazar/ps", "/api/create", "/metrics", None):
        with pytest.raises(Forbidden):
            auth.check("POST", route, "c" * 40)


def test_the_cli_admin_token_is_an_admin_principal_and_nothing_else_is() -> None:
    a, _ = created("alice")
    auth = _auth([a], admin_token="blzadm_token-of-this-daemon")
    p = auth.check("POST", "/api/blazar/load", "blzadm_token-of-this-daemon")
    assert p is not None and p.admin and p.actor == "cli:me" and p.key is None
    with pytest.raises(Unauthenticated):
        auth.check("POST", "/api/blazar/load", "blzadm_token-of-another")
    with pytest.raises(Unauthenticated):
        _auth([a]).check("POST", "/api/blazar/load", "blzadm_token-of-this-daemon")  # no token given to it


# -- scope ---------------------------------------------------------------------------------------------------------

def test_scope_matches_the_clients_name_or_the_stores_and_no_pattern_means_every_model() -> None:
    a, _ = created("a", models=["gemma*", "qwen3:8b"])
    b, _ = created("b")
    state = fold(KeysProjection(), [rec(1, a), rec(2, b)])
    p = Principal("key:a", False, api_key(state, "a"))
    assert p.models == ("gemma*", "qwen3:8b")
    assert p.allows("gemma3")
    assert p.allows("my-alias", "gemma3")  # an alias of an allowed model
    assert p.allows("qwen3:8b") and not p.allows("qwen3:4b") and not p.allows("llama", "llama")
    assert Principal("key:b", False, api_key(state, "b")).allows("anything")
    assert is_admin(None) and not is_admin(p)


# -- the commands, on a real log -----------------------------------------------------------------------------------

async def test_create_records_the_hash_not_the_secret_and_refuses_a_duplicate(app: Blazar) -> None:
    rec_, secret = await handlers.create(app, "alice", models=["gemma*"], rpm=5, max_concurrent=2)
    ev = rec_.event
    assert isinstance(ev, KeyCreated) and ev.hash == digest(ev.salt, secret) and ev.prefix == secret[4:12]
    assert secret not in rec_.to_json().__repr__()
    assert app.runner.state("keys").by_prefix == {ev.prefix: "alice"}
    with pytest.raises(KeyCommandError, match="exists already"):
        await handlers.create(app, "alice")
    seq = await app.log.last_seq()
    with pytest.raises(KeyCommandError):
        await handlers.create(app, "bad name")
    assert await app.log.last_seq() == seq  # a refusal records nothing


@pytest.mark.parametrize("name", ["", "a b", "-lead", "x" * 65, "nl\n", "a/b", "é"])
async def test_create_refuses_unsafe_names(app: Blazar, name: str) -> None:
    with pytest.raises(KeyCommandError, match="invalid key name"):
        await handlers.create(app, name)
    assert app.runner.state("keys").keys == {}


async def test_create_refuses_bad_limits_patterns_and_expiry(app: Blazar) -> None:
    with pytest.raises(KeyCommandError):
        await handlers.create(app, "a", rpm=0)
    with pytest.raises(KeyCommandError):
        await handlers.create(app, "a", models=["bad pattern"])
    with pytest.raises(KeyCommandError, match="a key's scope holds at most 32"):  # key.created lists them
        await handlers.create(app, "a", models=[f"m{i}" for i in range(33)])
    with pytest.raises(KeyCommandError):
        await handlers.create(app, "a", expires="-5m")
    with pytest.raises(KeyCommandError):
        await handlers.create(app, "a", expires="soon")
    assert app.runner.state("keys").keys == {}
    rec_, _ = await handlers.create(app, "a", expires="30d")
    assert rec_.event.expires_ts == pytest.approx(app.clock.now() + 30 * 86400)  # type: ignore[attr-defined]


def test_a_daily_audio_limit_is_kept_changed_and_read_like_the_others() -> None:
    a, _ = created("alice", daily_tokens=1000, daily_audio_s=600)
    state = fold(KeysProjection(), [rec(1, a)])
    assert api_key(state, "alice").daily_audio_s == 600  # type: ignore[union-attr]
    state = fold(KeysProjection(), [rec(1, a), rec(2, KeyLimitsChanged(name="alice", changed={"daily_audio_s": 60}))])
    k = api_key(state, "alice")
    assert k is not None and (k.daily_audio_s, k.daily_tokens) == (60, 1000)
    assert k.public()["daily_audio_s"] == 60


async def test_rotate_revoke_and_limits(app: Blazar) -> None:
    _, old = await handlers.create(app, "alice", rpm=5)
    _, new = await handlers.rotate(app, "alice")
    state = app.runner.state("keys")
    assert prefix_of(new) in state.by_prefix and prefix_of(old) not in state.by_prefix
    assert await handlers.change_limits(app, "alice", {"rpm": 5}) is None  # nothing changed: no event
    rec_ = await handlers.change_limits(app, "alice", {"rpm": 0, "tpm": 50})
    assert rec_ is not None and rec_.event.changed == {"rpm": None, "tpm": 50}  # type: ignore[attr-defined]
    rec_ = await handlers.change_limits(app, "alice", {"daily_audio_s": 120})
    assert rec_ is not None and rec_.event.changed == {"daily_audio_s": 120}  # type: ignore[attr-defined]
    with pytest.raises(KeyCommandError):
        await handlers.change_limits(app, "alice", {"daily_audio_s": 1.5})
    await handlers.revoke(app, "alice")
    assert state.keys["alice"].revoked and not state.live
    for op in (handlers.rotate(app, "alice"), handlers.revoke(app, "alice"), handlers.rotate(app, "nobody")):
        with pytest.raises(KeyCommandError):
            await op


@pytest.mark.parametrize(("text", "size"), [("1GiB", 1 << 30), ("500MiB", 500 << 20), ("2g", 2 << 30),
                                           ("64KiB", 64 << 10), ("1048576", 1 << 20), ("1.5 MiB", 3 << 19),
                                           ("0", 0)])
def test_a_storage_size_is_bytes_or_a_binary_unit(text: str, size: int) -> None:
    assert handlers.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1 GB", "-1", "ten", "1e9", "2PiB", "9" * 40])
def test_a_storage_size_that_is_none_is_refused(text: str) -> None:
    with pytest.raises(KeyCommandError, match="--max-storage"):
        handlers.parse_size(text)


async def test_what_a_key_may_hold_is_kept_changed_and_reset_to_the_settings(app: Blazar) -> None:
    await handlers.create(app, "holder", max_storage_bytes=64 << 10, max_open_batches=2)
    k = api_key(app.runner.state("keys"), "holder")
    assert k is not None and (k.max_storage_bytes, k.max_open_batches) == (64 << 10, 2)
    assert k.public()["max_storage_bytes"] == 64 << 10
    rec_ = await handlers.change_limits(app, "holder", {"max_storage_bytes": 0, "max_open_batches": 5})
    assert rec_ is not None and rec_.event.changed == {"max_storage_bytes": None,  # type: ignore[attr-defined]
                                                       "max_open_batches": 5}
    k = api_key(app.runner.state("keys"), "holder")
    assert k is not None and (k.max_storage_bytes, k.max_open_batches) == (None, 5)
    with pytest.raises(KeyCommandError, match="--max-open-batches"):
        await handlers.create(app, "bad", max_open_batches=0)


# -- per-key figures -----------------------------------------------------------------------------------------------

def test_metrics_count_requests_and_tokens_by_the_key_that_is_the_actor() -> None:
    from blazar.events.requests import RequestCompleted, RequestReceived, RequestRejected
    from blazar.projections.metrics import KeyUsage, MetricsProjection
    from blazar.projections.residency import ResidencyProjection
    from blazar.queries.metrics import render_prometheus

    def by(seq: int, event: Event, actor: str, ts: float = 2 * 86400 + 5) -> Recorded:
        return rec(seq, event, ts=ts, actor=actor)

    recs = [by(1, RequestReceived(trace_id="t1", dialect="openai", route="/v1/chat/completions", model="g"),
               "key:alice"),
            by(2, RequestCompleted(trace_id="t1", model="g", duration_ms=5, prompt_tokens=7, completion_tokens=3),
               "key:alice"),
            by(3, RequestRejected(trace_id="t2", model="g", status=429, reason="rate_limit_exceeded", detail="x"),
               "key:alice"),
            by(4, RequestCompleted(trace_id="t3", model="g", duration_ms=5, prompt_tokens=1, completion_tokens=1),
               "daemon:root")]
    state = fold(MetricsProjection(), recs)
    assert state.keys["alice"] == KeyUsage(day=2, requests_today=2, tokens_today=10)
    text = render_prometheus(state, ResidencyProjection().initial())
    assert 'blazar_key_requests_total{key="alice",status="200"} 1' in text
    assert 'blazar_key_requests_total{key="alice",status="429"} 1' in text
    assert 'blazar_key_tokens_total{key="alice",direction="in"} 7' in text
    assert 'blazar_key_tokens_total{key="alice",direction="out"} 3' in text
    assert "daemon" not in "".join(line for line in text.splitlines() if line.startswith("blazar_key_"))
    later = fold(MetricsProjection(), [by(5, RequestCompleted(trace_id="t4", model="g", duration_ms=1,
                                                              prompt_tokens=2), "key:alice", ts=3 * 86400 + 1)],
                 state)
    assert later.keys["alice"] == KeyUsage(day=3, requests_today=1, tokens_today=2)


def test_why_says_who_asked() -> None:
    from blazar.events.requests import RequestReceived, RequestRejected
    from blazar.queries.why import explain

    recs = [rec(1, RequestReceived(trace_id="t", dialect="openai", route="/v1/chat/completions", model="g"),
                ts=10.0, actor="key:alice"),
            rec(2, RequestRejected(trace_id="t", model="g", status=403, reason="model_not_allowed", detail="no"),
                ts=10.1, actor="key:alice")]
    e = explain(recs)
    assert e.actor == "key:alice" and e.to_json()["actor"] == "key:alice" and "scope" in e.verdict

"""Remote engines by their events and decisions: the remotes projection fed events, URL normalising, registration's
refusals, and the breaker (failures in a row open the circuit for remote_circuit_s, one success closes it)."""

from __future__ import annotations

import pytest

from blazar.cluster.remotes import RemoteBreaker, add_remote, normalize_url, remote_instance, remove_remote
from blazar.context import Blazar
from blazar.errors import RemoteCommandError
from blazar.events.remotes import RemoteAdded, RemoteCircuitClosed, RemoteCircuitOpened, RemoteRemoved
from blazar.projections.base import fold
from blazar.projections.remotes import RemotesProjection, remote, remotes, serving
from tests.support.events import rec
from tests.support.states import through_checkpoint


def test_the_projection_keeps_remotes_their_models_and_circuits() -> None:
    p = RemotesProjection()
    state = fold(p, [rec(1, RemoteAdded(name="b", url="http://h:1", models=["m1", "m2"], api_key_env="K")),
                     rec(2, RemoteAdded(name="a", url="http://h:2", models=["m3"], max_concurrent=9)),
                     rec(3, RemoteCircuitOpened(name="b", failures=3, reason="down", source="health_check",
                                                open_until=200.0))])
    assert [r.name for r in remotes(state)] == ["a", "b"]
    b = remote(state, "b")
    assert b is not None and b.open_at(150.0) and not b.open_at(200.0) and b.circuit_reason == "down"
    assert serving(state, "m2") == b and serving(state, "nope") is None
    state = fold(p, [rec(4, RemoteCircuitClosed(name="b")), rec(5, RemoteRemoved(name="a"))], state)
    b = remote(state, "b")
    assert b is not None and b.circuit_open_until is None and remote(state, "a") is None
    assert through_checkpoint(p, state) == state


def test_urls_are_normalised_and_bad_ones_refused() -> None:
    assert normalize_url("http://h:8000/v1/") == "http://h:8000"
    assert normalize_url("https://api.example/openai/v1") == "https://api.example/openai"
    for bad in ("ftp://h", "http://", "http://u:p@h/v1", "http://h/v1?x=1"):
        with pytest.raises(RemoteCommandError):
            normalize_url(bad)


def test_a_remote_instance_carries_the_url_and_key() -> None:
    r = fold(RemotesProjection(), [rec(1, RemoteAdded(name="b", url="http://h:1", models=["m"],
                                                      max_concurrent=3))])
    inst = remote_instance(remote(r, "b"), "m", "sk")  # type: ignore[arg-type]
    assert (inst.base_url, inst.remote, inst.slots, inst.api_key, inst.instance_id) == ("http://h:1", True, 3, "sk",
                                                                                        "remote:b")


async def test_registration_refuses_store_models_and_bad_names(app: Blazar) -> None:
    with pytest.raises(RemoteCommandError, match="invalid remote name"):
        await add_remote(app, "bad name", "http://h", ["m"])
    with pytest.raises(RemoteCommandError, match="name the model"):
        await add_remote(app, "b", "http://h", [])
    with pytest.raises(RemoteCommandError, match="a remote serves at most 32"):  # remote.added lists them
        await add_remote(app, "b", "http://h", [f"m{i}" for i in range(33)])
    with pytest.raises(RemoteCommandError, match="environment variable"):
        await add_remote(app, "b", "http://h", ["m"], api_key_env="1BAD")
    await add_remote(app, "b", "http://h/v1", ["m"])
    with pytest.raises(RemoteCommandError, match="already served by the remote b"):
        await add_remote(app, "c", "http://h", ["m"])
    await remove_remote(app, "b")
    with pytest.raises(RemoteCommandError, match="no remote named"):
        await remove_remote(app, "b")


async def test_failures_in_a_row_open_the_circuit_and_a_success_closes_it(app: Blazar) -> None:
    from blazar.operations.config import set_value

    await set_value(app, "routing.remote_circuit_failures", "2")
    await add_remote(app, "b", "http://h", ["m"])
    breaker = RemoteBreaker(app)
    await breaker.failed("b", "refused", source="request")
    assert breaker.open_now("b") is None
    await breaker.succeeded("b")  # resets the count
    await breaker.failed("b", "refused", source="request")
    assert breaker.open_now("b") is None
    await breaker.failed("b", "refused again", source="health_check")
    opened = breaker.open_now("b")
    assert opened is not None and opened.circuit_reason == "refused again"
    await breaker.succeeded("b", 12.5)
    assert breaker.open_now("b") is None
    types = [r.type async for r in app.log.read(types=[RemoteCircuitOpened.TYPE, RemoteCircuitClosed.TYPE])]
    assert types == ["remote.circuit_opened", "remote.circuit_closed"]

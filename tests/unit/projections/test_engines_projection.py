"""The `engines` projection, fed events: installs, smoke tests, verifications, activations, refusals, removals; the
rollback target through a chain of activations and rollbacks."""

from __future__ import annotations

from blazar.events import Event
from blazar.events.engines import (
    EngineActivated,
    EngineActivationRefused,
    EngineFile,
    EngineInstalled,
    EngineRemoved,
    EngineSmokeTested,
    EngineVerified,
)
from blazar.projections import EnginesProjection, all_projections, fold
from blazar.projections.engines import (
    ActivationRefusal,
    EnginesState,
    SmokeTest,
    Verification,
    previous_engine,
    rollback_target,
)
from tests.support.events import rec, recs

MANIFEST = {"flags": [{"names": ["--port"], "metavar": "N", "choices": [], "env": None, "help": "port"}]}


def installed(tag: str) -> EngineInstalled:
    return EngineInstalled(
        tag=tag, source_kind="path", source=f"/opt/{tag}/llama-server", binary="llama-server",
        files=[EngineFile(path="llama-server", bytes=10, sha256="ab" * 32),
               EngineFile(path="libx.so.0", bytes=0, sha256="", link_to="libx.so.0.1")],
        version={"version": "0.6.0", "build": 11, "commit": "abc", "built_with": "GNU"}, manifest=MANIFEST)


def fold_events(*events: Event) -> EnginesState:
    return fold(EnginesProjection(), recs(*events))


def test_engines_projection_is_registered() -> None:
    assert "engines" in [p.name for p in all_projections()]


def test_install_records_files_version_and_manifest_without_activating() -> None:
    state = fold_events(installed("a"))
    entry = state.engines["a"]
    assert state.active is None and state.history == [] and rollback_target(state) is None
    assert entry.files[1] == EngineFile(path="libx.so.0", bytes=0, sha256="", link_to="libx.so.0.1")
    assert (entry.version["version"], entry.manifest, entry.installed_ts, entry.installed_seq) == (
        "0.6.0", MANIFEST, 1001.0, 1)
    assert (entry.smoke, entry.verified, entry.refused, entry.activated_ts) == (None, None, None, None)


def test_smoke_verify_and_activation_update_the_entry() -> None:
    state = fold_events(
        installed("a"),
        EngineVerified(tag="a", ok=True, checked_files=2),
        EngineSmokeTested(tag="a", passed=True, duration_ms=120, tokens=8, detail="ok"),
        EngineActivated(tag="a", reason="install"),
    )
    entry = state.engines["a"]
    assert state.active == "a" and state.history == ["a"]
    assert entry.verified == Verification(ok=True, checked_files=2, problems=(), ts=1002.0, seq=2)
    assert entry.smoke == SmokeTest(passed=True, duration_ms=120, tokens=8, detail="ok", exit_code=None, ts=1003.0,
                                    seq=3)
    assert entry.activated_ts == 1004.0


def test_a_refusal_is_kept_on_the_engine_and_the_active_one_stays() -> None:
    state = fold_events(
        installed("a"), EngineActivated(tag="a", reason="install"),
        installed("b"),
        EngineSmokeTested(tag="b", passed=False, duration_ms=40, detail="the engine died of SIGILL", exit_code=-4),
        EngineActivationRefused(tag="b", reason="smoke_failed", detail="the engine died of SIGILL"),
    )
    b = state.engines["b"]
    assert state.active == "a" and state.history == ["a"]
    assert b.refused == ActivationRefusal(reason="smoke_failed", detail="the engine died of SIGILL", ts=1005.0, seq=5)
    assert b.smoke is not None and b.smoke.exit_code == -4
    state = fold(EnginesProjection(), [rec(6, EngineActivated(tag="b", previous="a", reason="use"))], state)
    assert state.engines["b"].refused is None  # an activation clears it


def test_rollback_walks_back_through_activations_one_at_a_time() -> None:
    state = fold_events(
        installed("a"), installed("b"), installed("c"),
        EngineActivated(tag="a", reason="install"),
        EngineActivated(tag="b", previous="a", reason="use"),
        EngineActivated(tag="c", previous="b", reason="build"),
    )
    assert rollback_target(state) == "b" and previous_engine(state) == "b"
    p = EnginesProjection()
    state = p.apply(state, rec(7, EngineActivated(tag="b", previous="c", reason="rollback")))
    assert state.active == "b" and rollback_target(state) == "a"
    # After a rollback, the engine rolled back from is still "previous" (prune keeps it), but not a rollback target.
    assert previous_engine(state) == "c"
    state = p.apply(state, rec(8, EngineActivated(tag="a", previous="b", reason="rollback")))
    assert state.active == "a" and rollback_target(state) is None
    assert state.history == ["a", "b", "c", "b", "a"]


def test_use_of_an_older_engine_pushes_it_and_rollback_returns_to_the_one_before() -> None:
    state = fold_events(
        installed("a"), installed("b"),
        EngineActivated(tag="a", reason="install"),
        EngineActivated(tag="b", previous="a", reason="install"),
        EngineActivated(tag="a", previous="b", reason="use"),
    )
    assert state.active == "a" and rollback_target(state) == "b"


def test_removal_drops_the_engine_from_the_rollback_chain() -> None:
    state = fold_events(
        installed("a"), installed("b"), installed("c"),
        EngineActivated(tag="a", reason="install"),
        EngineActivated(tag="b", previous="a", reason="install"),
        EngineActivated(tag="c", previous="b", reason="install"),
        EngineRemoved(tag="b", reason="prune", freed_bytes=10),
    )
    assert "b" not in state.engines and state.active == "c" and state.stack == ["a", "c"]
    assert rollback_target(state) == "a" and previous_engine(state) == "a"


def test_removing_the_active_engine_leaves_none_active() -> None:
    state = fold_events(installed("a"), EngineActivated(tag="a", reason="install"),
                        EngineRemoved(tag="a", reason="user"))
    assert state.active is None and state.engines == {}


def test_events_for_unknown_tags_are_folded_without_error() -> None:
    state = fold_events(
        EngineSmokeTested(tag="x", passed=True, duration_ms=1),
        EngineVerified(tag="x", ok=False, checked_files=1, problems=["llama-server: missing"]),
        EngineActivationRefused(tag="x", reason="verify_failed", detail="missing"),
        EngineRemoved(tag="x", reason="prune"),
    )
    assert state == EnginesProjection().initial()


def test_view_replaces_the_flag_texts_with_a_count() -> None:
    p = EnginesProjection()
    state = fold_events(installed("a"))
    view = p.view(state)
    assert view["engines"]["a"]["manifest"] == "1 flags" and view["engines"]["a"]["version"]["version"] == "0.6.0"
    assert state.engines["a"].manifest == MANIFEST  # the state itself is untouched

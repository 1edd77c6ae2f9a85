"""The `engines` projection: the engine programs in the store (files, version, capability manifest, last smoke test
and verification), which one is active, and the activation history that `engine rollback` walks back through.

`history` is every activation in order. `stack` is the rollback chain: an activation pushes its tag, a rollback
pops the engine it rolled back from, a removal drops the tag; so `rollback_target` is the entry below the top.

An install whose files could lead out of `engines/<tag>/` (blazar/confine.py) installs nothing, and an activation of
it changes nothing: both are kept under `refused`, which `blazar doctor` reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blazar.confine import refused, untrusted
from blazar.events.base import Recorded
from blazar.events.engines import (
    EngineActivated,
    EngineActivationRefused,
    EngineFile,
    EngineInstalled,
    EngineRemoved,
    EngineSmokeTested,
    EngineVerified,
)
from blazar.projections.base import Projection, RefusedEvent, State, TypedState, refused_events


class EnginesState(TypedState):
    """The `engines` projection's state, read through `installed`, `engines`, `active`, `rollback_target` and the
    other readers below."""

    __slots__ = ()


class EnginesProjection(Projection[State]):
    node_local = True
    name = "engines"
    state_type = EnginesState
    version = 2
    types = frozenset({
        EngineInstalled.TYPE, EngineSmokeTested.TYPE, EngineVerified.TYPE, EngineActivated.TYPE,
        EngineActivationRefused.TYPE, EngineRemoved.TYPE,
    })

    def initial(self) -> State:
        return {"engines": {}, "active": None, "history": [], "stack": [], "refused": []}

    def apply(self, state: State, rec: Recorded) -> State:
        ev = rec.event
        engines: dict[str, Any] = state["engines"]
        if isinstance(ev, EngineInstalled) and (problems := untrusted(ev)):
            state["refused"].append(refused(rec, problems, tag=ev.tag))
        elif isinstance(ev, EngineInstalled):
            engines[ev.tag] = {
                "tag": ev.tag, "kind": ev.kind, "source_kind": ev.source_kind, "source": ev.source,
                "binary": ev.binary, "files": [f.model_dump(mode="json") for f in ev.files], "version": ev.version,
                "manifest": ev.manifest, "build_options": list(ev.build_options), "installed_ts": rec.ts,
                "installed_seq": rec.seq, "smoke": None, "verified": None, "refused": None, "activated_ts": None,
            }
        elif isinstance(ev, EngineSmokeTested):
            if (entry := engines.get(ev.tag)) is not None:
                entry["smoke"] = {"passed": ev.passed, "duration_ms": ev.duration_ms, "tokens": ev.tokens,
                                  "detail": ev.detail, "exit_code": ev.exit_code, "ts": rec.ts, "seq": rec.seq}
        elif isinstance(ev, EngineVerified):
            if (entry := engines.get(ev.tag)) is not None:
                entry["verified"] = {"ok": ev.ok, "checked_files": ev.checked_files, "problems": list(ev.problems),
                                     "ts": rec.ts, "seq": rec.seq}
        elif isinstance(ev, EngineActivationRefused):
            if (entry := engines.get(ev.tag)) is not None:
                entry["refused"] = {"reason": ev.reason, "detail": ev.detail, "ts": rec.ts, "seq": rec.seq}
        elif isinstance(ev, EngineActivated):
            self._activated(state, ev, rec)
        elif isinstance(ev, EngineRemoved):
            engines.pop(ev.tag, None)
            state["stack"] = [t for t in state["stack"] if t != ev.tag]
            if state["active"] == ev.tag:
                state["active"] = None
        return state

    @staticmethod
    def _activated(state: State, ev: EngineActivated, rec: Recorded) -> None:
        if ev.tag not in state["engines"] and any(r.get("tag") == ev.tag for r in state["refused"]):
            # The engine that stays active is the one that was: a refused install is never run.
            state["refused"].append({"seq": rec.seq, "type": rec.type, "tag": ev.tag,
                                     "paths": [f"activates {ev.tag!r}, whose install was refused"]})
            return
        stack: list[str] = state["stack"]
        if ev.reason == "rollback" and stack and stack[-1] == state["active"]:
            stack.pop()
        if not stack or stack[-1] != ev.tag:
            stack.append(ev.tag)
        state["active"] = ev.tag
        state["history"].append(ev.tag)
        if (entry := state["engines"].get(ev.tag)) is not None:
            entry["activated_ts"] = rec.ts
            entry["refused"] = None

    def view(self, state: State) -> Any:
        """The manifest is every flag's help text: `blazar state` shows how many flags instead."""
        engines = {tag: {**e, "manifest": f"{len(e['manifest'].get('flags', []))} flags"}
                   for tag, e in state["engines"].items()}
        return {**state, "engines": engines}


def rollback_target(state: EnginesState) -> str | None:
    """The engine `engine rollback` would activate: the one active before the current, still installed."""
    raw = state._raw
    active = raw["active"]
    for tag in reversed(raw["stack"]):
        if tag != active and tag in raw["engines"]:
            return str(tag)
    return None


def previous_engine(state: EnginesState) -> str | None:
    """The most recent engine active before the current one, still installed (after a rollback: the one rolled
    back from, which `engine use` can bring back)."""
    raw = state._raw
    active = raw["active"]
    return next((str(t) for t in reversed(raw["history"]) if t != active and t in raw["engines"]), None)


@dataclass(frozen=True, slots=True)
class SmokeTest:
    """The engine's last smoke test (a tiny model asked for a few tokens)."""

    passed: bool
    duration_ms: int
    tokens: int
    detail: str  # why it failed, in one line
    exit_code: int | None  # when the engine died
    ts: float
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "duration_ms": self.duration_ms, "tokens": self.tokens, "detail": self.detail,
                "exit_code": self.exit_code, "ts": self.ts, "seq": self.seq}


@dataclass(frozen=True, slots=True)
class Verification:
    """The engine's last check of its files against the install record."""

    ok: bool
    checked_files: int
    problems: tuple[str, ...]
    ts: float
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checked_files": self.checked_files, "problems": list(self.problems), "ts": self.ts,
                "seq": self.seq}


@dataclass(frozen=True, slots=True)
class ActivationRefusal:
    """Why the engine's last activation was refused (cleared when it is activated)."""

    reason: str
    detail: str
    ts: float
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "detail": self.detail, "ts": self.ts, "seq": self.seq}


@dataclass(frozen=True, slots=True)
class InstalledEngine:
    """An engine in the store, typed. `version` and `manifest` are the probe's JSON as recorded (the adapter's
    EngineVersion and Capabilities validate them; this layer does not know those types). Read them, never change
    them: they are the projection's own."""

    tag: str
    kind: str
    source_kind: str
    source: str
    binary: str  # relative to the engine's directory
    files: tuple[EngineFile, ...]
    version: Mapping[str, Any]
    manifest: Mapping[str, Any]
    installed_seq: int
    build_options: tuple[str, ...] = ()
    installed_ts: float | None = None
    activated_ts: float | None = None  # its latest activation
    smoke: SmokeTest | None = None
    verified: Verification | None = None
    refused: ActivationRefusal | None = None


def _typed(e: dict[str, Any]) -> InstalledEngine:
    smoke, verified, refusal = e.get("smoke"), e.get("verified"), e.get("refused")
    return InstalledEngine(
        tag=e["tag"], kind=str(e.get("kind") or ""), source_kind=str(e.get("source_kind") or ""),
        source=str(e.get("source") or ""), binary=e["binary"],
        files=tuple(EngineFile.model_validate(f) for f in e["files"]), version=e["version"], manifest=e["manifest"],
        installed_seq=int(e.get("installed_seq") or 0), build_options=tuple(e.get("build_options") or ()),
        installed_ts=e.get("installed_ts"), activated_ts=e.get("activated_ts"),
        smoke=None if smoke is None else SmokeTest(
            passed=bool(smoke["passed"]), duration_ms=smoke["duration_ms"], tokens=int(smoke.get("tokens") or 0),
            detail=str(smoke.get("detail") or ""), exit_code=smoke.get("exit_code"), ts=float(smoke["ts"]),
            seq=int(smoke["seq"])),
        verified=None if verified is None else Verification(
            ok=bool(verified["ok"]), checked_files=int(verified["checked_files"]),
            problems=tuple(verified.get("problems") or ()), ts=float(verified["ts"]), seq=int(verified["seq"])),
        refused=None if refusal is None else ActivationRefusal(
            reason=str(refusal["reason"]), detail=str(refusal["detail"]), ts=float(refusal["ts"]),
            seq=int(refusal["seq"])))


def installed(state: EnginesState, tag: str) -> InstalledEngine | None:
    """The engine tagged `tag`, or None when none is installed under it."""
    e = state._raw["engines"].get(tag)
    return None if e is None else _typed(e)


def engines(state: EnginesState) -> list[InstalledEngine]:
    """Every installed engine, in the order the state holds them (sort them where the order matters)."""
    return [_typed(e) for e in state._raw["engines"].values()]


def active_tag(state: EnginesState) -> str | None:
    """The tag of the engine new instances start with, or None when none is active."""
    tag = state._raw["active"]
    return None if tag is None else str(tag)


def active(state: EnginesState) -> InstalledEngine | None:
    """The active engine, or None when none is."""
    tag = active_tag(state)
    return None if tag is None else installed(state, tag)


def tags(state: EnginesState) -> list[str]:
    """Every installed engine's tag, sorted."""
    return sorted(state._raw["engines"])


def refusals(state: EnginesState) -> list[RefusedEvent]:
    """The installs (and activations of them) this projection would not trust, by seq."""
    return refused_events(state._raw.get("refused", []))

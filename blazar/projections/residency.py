"""The `residency` projection: which engine instances are loaded now (starting, ready or being stopped), with what
shape, memory and keep-alive, and per model the crash history, circuit, loads, evictions and refusals. The
supervisor's deciders (`instances/decide.py`) read it; reconciliation at start-up compares it with the processes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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
from blazar.events.models import InstanceMemoryMeasured, ModelKind
from blazar.events.nodes import NodeDown
from blazar.events.tuning import Posture
from blazar.projections.base import Projection

# Exits that count towards a model's crash circuit: the process failed, not a decision of ours.
CRASH_REASONS = frozenset({"crashed", "load_failed", "load_timeout"})
# Crash timestamps kept per model, newest last; far more than any sane crash_limit.
CRASHES_KEPT = 32

InstanceState = Literal["starting", "ready", "stopping"]


@dataclass(frozen=True, slots=True)
class Eviction:
    """The decision that is stopping an instance (its `instance.evicted`)."""

    reason: str  # idle, max_loaded_models, memory, reshape
    for_model: str | None  # the model that needed the room
    seq: int


@dataclass(slots=True)
class ResidentInstance:
    """An instance the log says is loaded (starting, ready or stopping): the state's entry, handed out as it is.
    Read it, never change it: `apply` updates it in place (NOTE: mutable on purpose: replacing a frozen row of
    thirty fields made folding instance events several times dearer than the dict it replaced)."""

    instance_id: str
    model: str
    engine_tag: str
    pid: int | None  # None: the intent was recorded, the spawn not (yet)
    port: int
    argv: tuple[str, ...]
    log_path: str  # relative to the log directory
    ctx_tokens: int  # per slot
    slots: int
    gpu_layers: int
    planned_bytes: int
    measured_bytes: int | None
    keep_alive_s: float | None
    pinned: bool
    state: InstanceState  # starting -> ready; stopping once evicted
    started_ts: float
    ready_ts: float | None
    started_seq: int
    workers: dict[str, int] = field(default_factory=dict)  # RPC workers holding layers (host:port: layers)
    node: str = ""  # the gateway running it, where several share the log ("": the only one)
    load_ms: int | None = None
    kind: ModelKind = "llama-server"  # llama-server, whisper or piper (blazar/adapters/engines/kinds.py)
    posture: Posture | None = None  # the adopted profile's posture it runs (None: the defaults)
    profile_seq: int | None = None  # the profile.adopted that chose it
    profile_stale_seq: int | None = None  # a stale profile.adopted passed by at its load
    engine_ctx: int = 0  # what -c says (all slots)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = False
    estimate_bytes: int = 0  # the plan before calibration
    spawned_seq: int | None = None  # the instance.started that followed its instance.starting
    eviction: Eviction | None = None

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


# NOTE: LastExit and LastRefusal are made afresh for each exit and refusal and never changed, but not frozen: a frozen
# dataclass's __init__ costs twice as much, and a refusal can come with every request while memory is short.
@dataclass(slots=True)
class LastExit:
    reason: str  # an ExitReason (blazar/events/instances.py), or node_lost
    exit_code: int | None
    ts: float
    instance_id: str


@dataclass(slots=True)
class LastRefusal:
    reason: str
    detail: str
    ts: float
    seq: int


@dataclass(slots=True)
class ModelRecord:
    """What the residency remembers of one model, loaded now or ever: updated in place by `apply`."""

    crashes: list[float] = field(default_factory=list)  # crash-like exits' times, newest last (CRASHES_KEPT)
    circuit: Circuit | None = None  # the last opened circuit (it may have expired since); None after a reset
    loads: int = 0
    evictions: int = 0
    refusals: int = 0
    last_exit: LastExit | None = None
    last_refusal: LastRefusal | None = None


@dataclass(slots=True)
class ResidencyState:
    """The `residency` projection's state; `instances`, `instance`, `circuit`, `ps_rows` and the other readers below
    answer the questions that need more than a field."""

    instances: dict[str, ResidentInstance] = field(default_factory=dict)  # by instance id
    models: dict[str, ModelRecord] = field(default_factory=dict)


def _model(state: ResidencyState, model: str) -> ModelRecord:
    m = state.models.get(model)
    if m is None:
        m = state.models[model] = ModelRecord()
    return m


def _starting(state: ResidencyState, rec: Recorded, ev: InstanceStarting | InstanceStarted) -> None:
    old = state.instances.get(ev.instance_id)
    if isinstance(ev, InstanceStarted) and old is not None and old.pid is None:
        # The spawn after its recorded intent: the intent already counted the load.
        old.pid, old.spawned_seq = ev.pid, rec.seq
        return
    state.instances[ev.instance_id] = ResidentInstance(
        instance_id=ev.instance_id, model=ev.model, engine_tag=ev.engine_tag,
        pid=ev.pid if isinstance(ev, InstanceStarted) else None,  # None: the intent, not spawned yet
        port=ev.port, argv=tuple(ev.argv), log_path=ev.log_path, ctx_tokens=ev.ctx_tokens, slots=ev.slots,
        gpu_layers=ev.gpu_layers, planned_bytes=ev.planned_bytes, measured_bytes=None,
        keep_alive_s=ev.keep_alive_s, pinned=ev.pinned, state="starting", started_ts=rec.ts, ready_ts=None,
        started_seq=rec.seq, workers=dict(ev.workers), node=ev.node, kind=ev.kind, posture=ev.posture,
        profile_seq=ev.profile_seq, profile_stale_seq=ev.profile_stale_seq, engine_ctx=ev.engine_ctx,
        cache_type_k=ev.cache_type_k, cache_type_v=ev.cache_type_v, flash_attn=ev.flash_attn,
        estimate_bytes=ev.estimate_bytes)
    _model(state, ev.model).loads += 1


def _ready(state: ResidencyState, rec: Recorded, ev: InstanceReady) -> None:
    inst = state.instances.get(ev.instance_id)
    if inst is not None:
        inst.ready_ts, inst.load_ms = rec.ts, ev.load_ms
        # NOTE: an instance already chosen for eviction stays "stopping": the decision stands.
        if inst.state == "starting":
            inst.state = "ready"


def _exited(state: ResidencyState, rec: Recorded, ev: InstanceExited) -> None:
    state.instances.pop(ev.instance_id, None)
    m = _model(state, ev.model)
    m.last_exit = LastExit(reason=ev.reason, exit_code=ev.exit_code, ts=rec.ts, instance_id=ev.instance_id)
    if ev.reason in CRASH_REASONS:
        m.crashes.append(rec.ts)
        del m.crashes[:-CRASHES_KEPT]


def _evicted(state: ResidencyState, rec: Recorded, ev: InstanceEvicted) -> None:
    inst = state.instances.get(ev.instance_id)
    if inst is not None:
        inst.state = "stopping"
        inst.eviction = Eviction(reason=ev.reason, for_model=ev.for_model, seq=rec.seq)
    _model(state, ev.model).evictions += 1


def _keep_alive(state: ResidencyState, rec: Recorded, ev: InstanceKeepAliveSet) -> None:
    inst = state.instances.get(ev.instance_id)
    if inst is not None:
        inst.keep_alive_s, inst.pinned = ev.keep_alive_s, ev.pinned


def _measured(state: ResidencyState, rec: Recorded, ev: InstanceMemoryMeasured) -> None:
    # Calibration also measures loads that are not instances (a smoke test, `blazar fit --measure`).
    inst = state.instances.get(ev.instance_id) if ev.instance_id is not None else None
    if inst is not None:
        inst.measured_bytes = ev.measured_bytes


def _refused(state: ResidencyState, rec: Recorded, ev: InstanceLoadRefused) -> None:
    m = _model(state, ev.model)
    m.refusals += 1
    m.last_refusal = LastRefusal(reason=ev.reason, detail=ev.detail, ts=rec.ts, seq=rec.seq)


def _circuit_opened(state: ResidencyState, rec: Recorded, ev: ModelCircuitOpened) -> None:
    _model(state, ev.model).circuit = Circuit(model=ev.model, open_until=ev.open_until, crashes=ev.crashes,
                                              seq=rec.seq)


def _circuit_reset(state: ResidencyState, rec: Recorded, ev: ModelCircuitReset) -> None:
    m = _model(state, ev.model)
    m.circuit = None
    # NOTE: a reset forgives the crashes too, else the next single crash would reopen the circuit at once.
    m.crashes = []


def _node_down(state: ResidencyState, rec: Recorded, ev: NodeDown) -> None:
    """Every instance of a node marked down is lost with it (whether or not the verdict listed it: one may have
    started between the verdict's read and its append)."""
    for iid, inst in list(state.instances.items()):
        if inst.node == ev.name:
            del state.instances[iid]
            _model(state, inst.model).last_exit = LastExit(reason="node_lost", exit_code=None, ts=rec.ts,
                                                           instance_id=iid)


_APPLY: dict[type[Event], Callable[[ResidencyState, Recorded, Any], None]] = {
    InstanceStarting: _starting, InstanceStarted: _starting, InstanceReady: _ready, InstanceExited: _exited,
    InstanceEvicted: _evicted, InstanceKeepAliveSet: _keep_alive, InstanceMemoryMeasured: _measured,
    InstanceLoadRefused: _refused, ModelCircuitOpened: _circuit_opened, ModelCircuitReset: _circuit_reset,
    NodeDown: _node_down,
}


class ResidencyProjection(Projection[ResidencyState]):
    name = "residency"
    state_type = ResidencyState
    # 2: instance.starting (the intent before the spawn) opens an instance with no pid yet; 3: its kind; 4: its
    # posture; 5: a typed state (no engine_tags_in_use: the instances' tags are it; a circuit names its model)
    version = 5
    types = frozenset(cls.TYPE for cls in _APPLY)

    def initial(self) -> ResidencyState:
        return ResidencyState()

    def apply(self, state: ResidencyState, rec: Recorded) -> ResidencyState:
        fold = _APPLY.get(type(rec.event))
        if fold is not None:
            fold(state, rec, rec.event)
        return state


# -- readers: what handlers and the api ask of the state ----------------------------------------------------------


def crashes_within(state: ResidencyState, model: str, now: float, window_s: float) -> int:
    """How many crash-like exits of `model` happened in the last `window_s` seconds before `now`."""
    m = state.models.get(model)
    return 0 if m is None else sum(1 for ts in m.crashes if ts >= now - window_s)


def recent_crashes(state: ResidencyState, model: str) -> list[float]:
    """When `model`'s crash-like exits happened (oldest first, at most CRASHES_KEPT)."""
    m = state.models.get(model)
    return list(m.crashes) if m is not None else []


def instances(state: ResidencyState, *, node: str | None = None) -> list[ResidentInstance]:
    """Every instance the log says is loaded, oldest start first; `node`: only that node's (where several gateways
    share the log; an instance recorded before nodes existed is the only node's, so any node's own)."""
    out = sorted(state.instances.values(), key=lambda i: i.started_seq)
    return out if node is None else [i for i in out if i.node in ("", node)]


def instance(state: ResidencyState, instance_id: str) -> ResidentInstance | None:
    return state.instances.get(instance_id)


def instances_of(state: ResidencyState, model: str) -> list[ResidentInstance]:
    """The loaded instances of `model`, oldest start first."""
    return [i for i in instances(state) if i.model == model]


def engine_tags_in_use(state: ResidencyState) -> set[str]:
    """The engine tags some loaded instance runs (`engine prune` keeps them)."""
    return {i.engine_tag for i in state.instances.values()}


def models_seen(state: ResidencyState) -> set[str]:
    """Every model the residency has a record of: loaded now or ever, refused or crashed."""
    return set(state.models)


def circuit(state: ResidencyState, model: str, now: float) -> Circuit | None:
    """The open crash circuit of `model`, or None once it expired or was reset."""
    m = state.models.get(model)
    c = None if m is None else m.circuit
    return None if c is None or now >= c.open_until else c


def open_circuits(state: ResidencyState, *, now: float) -> dict[str, float]:
    """Models whose circuit is open now, with when it closes by itself."""
    return {model: c.open_until for model in state.models if (c := circuit(state, model, now)) is not None}


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

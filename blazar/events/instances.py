"""Events about instances: one supervised engine child per loaded model. The start (intent, with the argv and the
planned memory), ready, exit (with the code and the last log lines), the eviction decisions with what the
supervisor observed, refused loads, keep-alive changes and the crash circuit.

Instance events live on the stream `instance:<id>`; circuit events on `model:<name>`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from blazar.events.base import Event
from blazar.events.bounds import OBSERVATIONS, PATH, WORD, Bound, ClipLines, Text, entries, name_chars
from blazar.events.models import ModelKind
from blazar.events.tuning import Posture
from blazar.events.types import register

ExitReason = Literal[
    "stopped",  # `blazar stop`, keep_alive 0, or a user's unload
    "evicted",  # after an instance.evicted decision
    "crashed",  # exited on its own while loading or serving
    "load_failed",  # exited before it became ready
    "load_timeout",  # did not become ready within load_timeout_s; killed
    "lost",  # the log said running, but at reconcile no such process existed
    "orphan_stopped",  # found running at reconcile with no supervisor; stopped
    "shutdown",  # the daemon stopped its children on the way out
    "spawn_failed",  # the intent was recorded, but the process could not be started at all
    "template_probed",  # its first load's template probe chose another template: started again with that one
]


class _InstanceStart(Event):
    """What a start records, intent and spawn alike: the child, its port and argv, and the plan it runs."""

    instance_id: str
    model: str
    engine_tag: str
    port: int  # 0: no TCP port (a piper child listens on a Unix socket in the home's run/)
    argv: Annotated[list[str], Bound(32 << 10)]  # flags and the home's paths
    log_path: Annotated[str, PATH]  # relative to the Blazar home's log directory
    ctx_tokens: int  # per slot
    engine_ctx: int  # what -c says (all slots)
    slots: int
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = False
    gpu_layers: int = 0
    planned_bytes: int  # the plan's total on this host (not the RPC workers' shares), calibration included
    estimate_bytes: int  # the same before calibration
    keep_alive_s: float | None = None  # None: never idle-evicted
    pinned: bool = False  # never evicted for room either
    reason: Literal["load", "request", "restart", "preload", "reshape"] = "load"  # preload: the engine.preload list at
    # start; reshape: adaptive slots relaunched it
    free_bytes_observed: int | None = None  # what the budget offered when this was planned
    # RPC workers holding layers (host:port: layers)
    workers: Annotated[dict[str, int], entries(16, name_chars(64), 20)] = Field(default_factory=dict)
    node: str = ""  # the gateway that runs it, where several share the log on PostgreSQL ("": the only one)
    # What the child is (blazar/adapters/engines/kinds.py): llama-server, or a whisper or piper child (whose
    # engine_tag is its kind's name, and whose plan is its memory model's charge: no context, cache or layers).
    kind: ModelKind = "llama-server"
    # The posture it runs beyond the fit (blazar/events/tuning.py): speculation, cache types, threads, batches,
    # slots; None: the defaults. `profile_seq` is the profile.adopted that chose it (None: no profile applied).
    posture: Posture | None = None
    profile_seq: int | None = None
    # A profile.adopted measured on another engine build (stale): not applied, the load went at the defaults.
    profile_stale_seq: int | None = None

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"


@register
class InstanceStarting(_InstanceStart):
    """The intent, recorded before the spawn: this child, on this port, with this argv and plan. `instance.started`
    (the spawn happened, with its pid) or `instance.exited` follows with this event's seq as cause; at start-up,
    reconciliation settles an intent with neither."""

    TYPE = "instance.starting"
    AUDIT = True

    def audit_details(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "model": self.model, "engine_tag": self.engine_tag,
                "port": self.port, "planned_bytes": self.planned_bytes}


@register
class InstanceStarted(_InstanceStart):
    """The child process was spawned, with its pid (after `instance.starting`, its cause; a log written before that
    event existed has this one alone). Ready or exited follows, with this event's seq as cause."""

    TYPE = "instance.started"
    AUDIT = True

    pid: int

    def audit_details(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "model": self.model, "engine_tag": self.engine_tag,
                "pid": self.pid, "port": self.port, "planned_bytes": self.planned_bytes}


@register
class InstanceReady(Event):
    """/health said ok: the instance serves."""

    TYPE = "instance.ready"
    AUDIT = False

    instance_id: str
    model: str
    load_ms: int  # spawn to ready

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"


@register
class InstanceExited(Event):
    """The child is gone (or was found gone): why, its exit status and its last log lines."""

    TYPE = "instance.exited"
    AUDIT = True

    instance_id: str
    model: str
    reason: ExitReason
    exit_code: int | None = None  # negative: killed by that signal (Python's convention)
    uptime_ms: int | None = None
    log_tail: Annotated[list[str], ClipLines(20)] = Field(default_factory=list)
    detail: Text = ""

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"

    def audit_outcome(self) -> str:
        return "failed" if self.reason in ("crashed", "load_failed", "load_timeout", "lost") else "ok"

    def audit_details(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "model": self.model, "reason": self.reason,
                "exit_code": self.exit_code, "detail": self.detail}


@register
class InstanceEvicted(Event):
    """A decision: this instance is to be stopped, why, and what the supervisor saw when it chose it."""

    TYPE = "instance.evicted"
    AUDIT = True

    instance_id: str
    model: str
    reason: Literal["idle", "max_loaded_models", "memory", "reshape"]
    for_model: str | None = None  # the model that needed the room
    idle_s: float = 0.0
    bytes_freed: int = 0  # the victim's planned bytes
    # The observations behind the choice: needed and free bytes, loaded count and limit, the candidates' scores.
    observations: Annotated[dict[str, Any], OBSERVATIONS] = Field(default_factory=dict)

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"

    def audit_details(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "model": self.model, "reason": self.reason,
                "for_model": self.for_model, "bytes_freed": self.bytes_freed}


@register
class InstanceLoadRefused(Event):
    """A decision: a load of `model` was refused before any process started."""

    TYPE = "instance.load_refused"
    AUDIT = True

    model: str
    # engine_unverified: the engine's files differ from its install record (or lead out of the home) at the check
    # before the spawn; untrusted_path: the model's file leads out of the models directory; extra_missing: a whisper or
    # piper model whose Python extra (stt, tts) is not installed; draft_missing: the adopted profile's draft model is
    # not in the store.
    reason: Literal["does_not_fit", "circuit_open", "no_engine", "no_room", "engine_incompatible", "engine_unverified",
                    "untrusted_path", "extra_missing", "draft_missing"]
    detail: Text
    observations: Annotated[dict[str, Any], OBSERVATIONS] = Field(default_factory=dict)

    def stream_key(self) -> str:
        return f"model:{self.model}"

    def audit_outcome(self) -> str:
        return "refused"


PreloadOutcome = Literal["ready", "refused", "not_found", "failed"]


@register
class InstancePreloadFinished(Event):
    """One entry of the `engine.preload` list, loaded at the daemon's start (after reconciliation, in the list's
    order, within the memory plan: a preload never evicts): `ready` (its instance serves), `refused` (the
    `instance.load_refused` before it says why: it would evict, it does not fit, its circuit is open, no engine),
    `not_found` (no such model in the store), `failed` (its child did not become ready: `instance.exited` says how).
    `reason` is the refusal's or the error's code."""

    TYPE = "instance.preload_finished"
    AUDIT = True

    model: str  # as the list names it
    position: int  # in the list, from 0
    outcome: PreloadOutcome
    instance_id: str | None = None
    reason: Annotated[str, WORD] = ""
    detail: Text = ""

    def stream_key(self) -> str:
        return f"model:{self.model}"

    def audit_outcome(self) -> str:
        return {"ready": "ok", "refused": "refused"}.get(self.outcome, "failed")

    def audit_details(self) -> dict[str, Any]:
        return {"model": self.model, "position": self.position, "outcome": self.outcome,
                "instance_id": self.instance_id, "reason": self.reason}


@register
class InstanceKeepAliveSet(Event):
    """A loaded instance's keep-alive or pin changed (a later load or request asked for another)."""

    TYPE = "instance.keep_alive_set"
    AUDIT = False

    instance_id: str
    model: str
    keep_alive_s: float | None  # None: forever
    pinned: bool = False

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"


@register
class ModelCircuitOpened(Event):
    """A decision: `model` crashed `crashes` times within `window_s`; loads are refused until `open_until`."""

    TYPE = "model.circuit_opened"
    AUDIT = True

    model: str
    crashes: int
    window_s: float
    open_until: float  # epoch seconds
    last_exit_code: int | None = None

    def stream_key(self) -> str:
        return f"model:{self.model}"


@register
class ModelCircuitReset(Event):
    """Loads of `model` are allowed again: by a user (`blazar ps --reset`)."""

    TYPE = "model.circuit_reset"
    AUDIT = True

    model: str

    def stream_key(self) -> str:
        return f"model:{self.model}"

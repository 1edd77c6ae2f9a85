"""The supervisor's children as it holds them: the handle a caller gets (`Instance`), the model a request resolved
(`ResolvedModel`), what a load did for its caller (`LoadReport`), the record of one running child (`Live`) and the
table of them (`LiveSet`), with the views the pure deciders take of it. No I/O: the collaborators around the supervisor
(spawn, stopping, reaper, room) change these records; the deciders read views of them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from blazar.adapters.engines.client import unix_base
from blazar.context import Blazar
from blazar.events.model_settings import ModelSettings
from blazar.events.models import ModelMetadata
from blazar.events.requests import Evicted
from blazar.events.sessions import KvIdentity
from blazar.events.tuning import Posture
from blazar.fit import FitPlan
from blazar.instances.decide import Candidate
from blazar.instances.load_decision import Running
from blazar.projections.catalog import Lora, Projector
from blazar.projections.residency import ResidencyState, instance
from blazar.store.model_settings import template_key


@dataclass
class Instance:
    """A live handle to one running child."""

    instance_id: str
    model: str
    port: int
    slots: int
    ctx_tokens: int
    engine_tag: str
    load_ms: int | None = None
    embeddings: bool = False  # started with the engine's embeddings endpoint on
    rerank: bool = False  # started in rerank mode (--reranking): it serves rerank requests and nothing else
    # The child's own secret (llama-server's --api-key-file): in memory and in a 0600 file, never in an event.
    api_key: str | None = field(default=None, repr=False)
    served_as: str = ""  # what the engine writes in an answer's `model` (its --alias, else its file's path)
    template: str = ""  # the model's chat template it was started with (`template_key`): "" for the GGUF's own
    # What a slot saved from this instance is valid for (None: the engine cannot save slots), and whether a restore
    # would help (a sliding-window model needs its full window cache for that: session_swa_full).
    kv_identity: KvIdentity | None = None
    kv_restorable: bool = False
    url: str = ""  # a remote engine's API root; "" for a child of ours (loopback, `port`, or `socket`)
    # The Unix socket a child of ours listens on instead of a port (piper: port 0), "" for one on a port.
    socket: str = field(default="", repr=False)
    # Sent with every request to a remote: a forwarded request's hop and trace (another node's gateway).
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    kind: str = "llama-server"  # what the child is: llama-server, whisper or piper (adapters/engines/kinds.py)
    # The tuned posture it runs (blazar/events/tuning.py; None: the defaults) and the profile.adopted that chose it.
    posture: Posture | None = None
    profile_seq: int | None = None
    stops: tuple[str, ...] = ()  # its template's stop strings, added to every chat request routed to it
    # Its template's default sampling (the probe's, for a probed template), for a chat request that sets none.
    sampling: dict[str, float] = field(default_factory=dict)
    loop_guard: bool = False  # a streamed chat answer that loops is stopped there (the probed template's)
    # Its engine holds a request's thinking to `thinking_budget_tokens` (adapters/engines/reasoning_flags.py), and
    # the budget its --reasoning-budget holds every request to where it cannot (None: started without the flag).
    per_request_budget: bool = False
    load_budget: int | None = None

    @property
    def base_url(self) -> str:
        if self.url:
            return self.url
        return unix_base(self.socket) if self.socket else f"http://127.0.0.1:{self.port}"

    @property
    def remote(self) -> bool:
        return bool(self.url)

    @property
    def lane(self) -> str:
        """Where admission counts its requests: a child's model (its slots), a remote's or another node's own
        concurrency (for every model it serves)."""
        return self.instance_id if self.url else self.model


@dataclass(frozen=True)
class ResolvedModel:
    """The store's model a request named, resolved once: its name, its file and its GGUF summary, as far as the argv."""

    name: str
    path: Path
    metadata: ModelMetadata
    settings: ModelSettings | None = None  # its template (on the argv), system prompt and default parameters
    sha256: str = ""  # the file's, as recorded: part of a saved slot's identity
    projector: Projector | None = None  # its --mmproj (path relative to the models directory), or None
    kind: str = "llama-server"  # what runs it; `path` is then its GGUF, whisper model.bin, or piper .onnx
    bytes: int = 0  # its files in the store: what a kind's memory model charges
    loras: tuple[Lora, ...] = ()  # its LoRA adapters (--lora, unapplied), in load order: their ids on the engine
    template_probe: str | None = None  # the template its file's probe chose (or, while one runs, the one it tries)

    @property
    def gguf(self) -> bool:
        return self.kind == "llama-server"

    @property
    def template(self) -> str:
        """What an instance must have been started with to serve this model as it is set now: its template and,
        when it has one, its projector (NOTE: an instance started without the projector, or with another, is another
        load shape: it never serves a request for the model as set now, and gives way like one with an old
        template)."""
        key = template_key(self.settings)
        if not key and self.template_probe is not None and not self.metadata.chat_template:
            key = f"probe:{self.template_probe}"
        if self.projector is not None:
            key += f"+mmproj:{self.projector.sha256[:16]}"
        if self.loras:  # another set of adapters (or another order: other ids) is another load shape
            key += "+lora:" + ",".join(a.sha256[:16] for a in self.loras)
        if self.settings is not None and self.settings.reasoning_budget is not None:  # its --reasoning-budget
            key += f"+think:{self.settings.reasoning_budget}"
        return key


@dataclass
class LoadReport:
    """What `ensure` did for one caller: whether it waited for a load, how long that took, what made room."""

    cold: bool = False
    load_ms: int | None = None
    evicted: list[Evicted] = field(default_factory=list)


@dataclass
class Live:
    """One child the supervisor started, from its spawn until its exit is recorded."""

    instance: Instance
    proc: asyncio.subprocess.Process
    plan: FitPlan
    log_path: Path
    started_seq: int
    started_mono: float
    keep_alive_s: float | None
    pinned: bool
    state: str = "starting"  # starting | ready | exiting (its process is on its way out) | stopping
    in_flight: int = 0
    last_used: float = 0.0
    exit_recorded: bool = False
    ready: asyncio.Future[Instance] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    watcher: asyncio.Task[None] | None = None

    def charged_bytes(self, measured: int | None) -> int:
        return max(self.plan.local_bytes, measured or 0)

    def idle_s(self, now: float) -> float:
        """Seconds since its last request ended (0 while one runs)."""
        return max(0.0, now - self.last_used) if self.in_flight == 0 else 0.0


class LiveSet:
    """The live children by instance id. `by_id` is the table itself (the supervisor's `_live`)."""

    def __init__(self) -> None:
        self.by_id: dict[str, Live] = {}

    def __iter__(self) -> Iterator[Live]:
        return iter(list(self.by_id.values()))

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, instance_id: str) -> Live | None:
        return self.by_id.get(instance_id)

    def add(self, lv: Live) -> None:
        self.by_id[lv.instance.instance_id] = lv

    def drop(self, lv: Live) -> None:
        self.by_id.pop(lv.instance.instance_id, None)

    def instances(self, model: str | None = None) -> list[Instance]:
        return [lv.instance for lv in self.by_id.values() if model is None or lv.instance.model == model]

    def ready_of(self, model: str) -> list[Live]:
        return [lv for lv in self.by_id.values() if lv.instance.model == model and lv.state == "ready"]

    def ready_for(self, name: str, ctx: int | None, embeddings: bool = False, template: str = "",
                  rerank: bool = False, slots: int | None = None) -> Live | None:
        """A ready instance that serves this request as the model is set now: one started with another template
        (the model's was changed since) is never reused; a rerank instance serves rerank requests only, and only one
        serves them. Any context at least the one asked for will do (an embeddings request asks for none); `slots`,
        adaptive slots' reshape, asks for that -np exactly."""
        for lv in self.ready_of(name):
            inst = lv.instance
            if ((ctx is None or inst.ctx_tokens >= ctx) and (inst.embeddings or not embeddings)
                    and inst.rerank == rerank and inst.template == template and slots in (None, inst.slots)):
                return lv
        return None

    def measured(self, residency: ResidencyState) -> dict[str, int | None]:
        """What the engine was measured to hold, per live instance (None: not measured yet)."""
        return {iid: inst.measured_bytes if (inst := instance(residency, iid)) is not None else None
                for iid in self.by_id}

    def running(self, residency: ResidencyState, now: float) -> list[Running]:
        """Every live instance as the load decider sees it: its state and what evicting it frees and costs."""
        measured = self.measured(residency)
        return [Running(state=lv.state, candidate=Candidate(
            instance_id=iid, model=lv.instance.model, bytes=lv.charged_bytes(measured.get(iid)),
            idle_s=lv.idle_s(now), in_flight=lv.in_flight, pinned=lv.pinned, keep_alive_s=lv.keep_alive_s,
            load_ms=lv.instance.load_ms)) for iid, lv in self.by_id.items()]

    def workers_in_use(self) -> set[str]:
        """The RPC workers the live instances use (one starting may not be in the log yet)."""
        return {a for lv in self.by_id.values() for a in plan_workers(lv.plan)}


def plan_workers(fit: FitPlan) -> dict[str, int]:
    """The RPC workers a plan puts layers on (address: layers, the output layer counted), in --rpc order."""
    return {u.name: n for u in fit.devices if u.kind == "rpc" and (n := u.offloaded)}


def keyfile(app: Blazar, instance_id: str) -> Path:
    return app.paths.run / "instances" / f"{instance_id}.key"


def scratchdir(app: Blazar, instance_id: str) -> Path:
    """A speech child's own directory for what it would otherwise write beside its model (removed at its exit)."""
    return app.paths.run / "instances" / f"{instance_id}.d"


def socketfile(app: Blazar, instance_id: str) -> Path:
    """The Unix socket a child without a port listens on (removed at its exit). NOTE: in run/ itself, not beside the
    pid file: a socket's path has at most 107 bytes, and this leaves a home's path 85 of them."""
    return app.paths.run / f"{instance_id}.sock"


def pidfile(app: Blazar, instance_id: str) -> Path:
    """Written between spawn and `instance.started`: reconcile finds a child whose start never reached the log."""
    return app.paths.run / "instances" / f"{instance_id}.pid"

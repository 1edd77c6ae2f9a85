"""Tuning events: what a model was measured at (`bench.recorded`), which posture was adopted from those
measurements (`profile.adopted`, with every candidate's numbers and the rule that chose), a return to the defaults
(`profile.reset`), speculation switched per instance while serving (`spec.switched`), and an engine build measured
against the active one before it may become active (`engine.gate_checked`).

A `Posture` is how one instance of a model runs, beyond what the memory fit decides: speculative decoding, KV-cache
types, flash attention, threads, batch sizes and slots. Every field None is llama-server's default posture (with the
fit choosing what it chooses today). Measurements are of one machine and one engine build: the events carry both, so
a profile measured on another build is shown stale rather than applied.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeGuard, get_args

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.base import Event, NodeLocal
from blazar.events.bounds import WORD, Clip, Text, bound_of, entries, items, name_chars
from blazar.events.types import register

Workload = Literal["chat", "code", "long"]


def is_workload(name: str) -> TypeGuard[Workload]:
    return name in get_args(Workload)

Purpose = Literal["bench", "tune", "gate"]


class Posture(BaseModel):
    """How an instance runs. None everywhere: the defaults (llama-server's, and the fit's own choices)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec_type: str | None = None  # llama-server --spec-type: an n-gram type, or draft-simple with draft_model
    draft_model: str | None = None  # a model in the store that shares the model's tokenizer (draft-* types)
    spec_n_max: int | None = Field(default=None, ge=0)  # --spec-draft-n-max: tokens drafted per step
    cache_type_k: str | None = None  # None: the fit's choice (f16 unless memory is short)
    cache_type_v: str | None = None
    flash_attn: bool | None = None  # None: the fit's default
    threads: int | None = Field(default=None, ge=1)  # None: settings.engine_threads, else the engine's own
    n_batch: int | None = Field(default=None, ge=1)
    n_ubatch: int | None = Field(default=None, ge=1)
    slots: int | None = Field(default=None, ge=1)  # None: settings.slots, else the fit's

    def is_default(self) -> bool:
        return self == Posture()

    @property
    def speculative(self) -> bool:
        return self.spec_type is not None and self.spec_type != "none"

    def lossless(self) -> bool:
        """Whether greedy output must stay token-identical to the defaults: everything but the KV-cache types and a
        switched attention kernel (a quantised cache changes the numbers attention sees, and flash attention the
        order of its arithmetic: measured, 1 greedy token in 100; their guard is agreement and drift)."""
        return self.cache_type_k in (None, "f16") and self.cache_type_v in (None, "f16") and self.flash_attn is None

    def label(self) -> str:
        """A short name for tables and logs: "defaults", or the fields that differ ("spec=ngram-simple kv=q8_0")."""
        parts = []
        if self.speculative:
            parts.append(f"spec={self.spec_type}" + (f"+{self.draft_model}" if self.draft_model else "")
                         + (f"/n{self.spec_n_max}" if self.spec_n_max is not None else ""))
        if self.cache_type_k or self.cache_type_v:
            parts.append(f"kv={self.cache_type_k or 'f16'}/{self.cache_type_v or 'f16'}")
        if self.flash_attn is not None:
            parts.append(f"fa={'on' if self.flash_attn else 'off'}")
        if self.threads is not None:
            parts.append(f"t={self.threads}")
        if self.n_batch is not None or self.n_ubatch is not None:
            parts.append(f"b={self.n_batch or 'def'}/{self.n_ubatch or 'def'}")
        if self.slots is not None:
            parts.append(f"np={self.slots}")
        return " ".join(parts) or "defaults"


class Machine(BaseModel):
    """What a measurement was taken on: enough to tell another machine (or a changed one) apart."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fingerprint: str  # sha256 (16 hex) of the fields below
    cpu: str  # /proc/cpuinfo's model name
    cores: int  # logical CPUs usable by this process
    memory_bytes: int
    gpus: Annotated[list[str], items(16, name_chars(96))] = Field(default_factory=list)  # NVML names, in index order


class WorkloadResult(BaseModel):
    """One workload at one concurrency: rates from the engine's own timings, latency as the client saw it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: Workload
    concurrency: int
    requests: int
    prompt_tokens: int
    completion_tokens: int
    prefill_tps: float | None  # prompt tokens per second of prompt processing (the engine's timings)
    decode_tps_stream: float  # generated tokens per second, per stream (mean over requests)
    decode_tps_system: float  # generated tokens over the wall time of the whole round
    ttft_ms_p50: float
    ttft_ms_p95: float
    draft_tokens: int | None = None  # speculation: tokens drafted and accepted over the round (engine /metrics)
    accepted_tokens: int | None = None
    energy_j: float | None = None  # RAPL or NVML over the round; None where the machine does not report it
    tokens_per_joule: float | None = None


@register
class BenchRecorded(NodeLocal):
    """A benchmark of `model` at `posture` on this machine and engine build: one result per workload and
    concurrency. `purpose` says who ran it (`blazar bench`, a candidate of `blazar tune`, the engine gate)."""

    TYPE = "bench.recorded"
    AUDIT = False

    bench_id: str
    model: str
    model_sha256: str | None = None
    posture: Posture
    engine_tag: str
    engine_version: str | None = None
    machine: Machine
    ctx: int  # tokens per slot the child ran with
    results: Annotated[list[WorkloadResult], items(16, bound_of(WorkloadResult))]
    peak_rss_bytes: int | None = None  # the child's peak resident memory (VmHWM)
    duration_s: float
    purpose: Purpose = "bench"

    def stream_key(self) -> str:
        return f"bench:{self.model}"


class CandidateVerdict(BaseModel):
    """One posture `blazar tune` tried: its numbers against the defaults, its guard, and what became of it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    posture: Posture
    bench_id: str | None = None  # its bench.recorded (None when pruned before a full measurement)
    # workload -> decode t/s (per stream, concurrency 1)
    decode_tps: Annotated[dict[str, float], entries(3, WORD, 24)] = Field(default_factory=dict)
    # workload -> decode t/s / the defaults'
    ratio: Annotated[dict[str, float], entries(3, WORD, 24)] = Field(default_factory=dict)
    guard: Literal["passed", "failed", "not_run"] = "not_run"
    # "token-identical over 3 prompts", "top-1 agreement 0.97, drift 0.02"
    guard_detail: Annotated[str | None, Clip(240)] = None
    outcome: Literal["adopted", "rejected", "pruned", "baseline"]
    reason: Annotated[str | None, Clip(240)] = None  # why it was not adopted


@register
class ProfileAdopted(NodeLocal):
    """`model` runs at `posture` from its next load, chosen by `rule` from `candidates` measured on `engine_tag`
    (a new engine build makes it stale: shown, not applied, until measured again)."""

    TYPE = "profile.adopted"
    AUDIT = True
    MAX_BYTES = 384 << 10  # a tune's verdicts: up to 32 postures, each with its numbers and reasons

    model: str
    posture: Posture
    engine_tag: str
    machine: Machine
    rule: str  # the rule as stated, with its numbers
    bench_id: str | None = None  # the winner's bench.recorded
    candidates: Annotated[list[CandidateVerdict], items(32, bound_of(CandidateVerdict))] = Field(default_factory=list)

    def stream_key(self) -> str:
        return f"model:{self.model}"

    def audit_details(self) -> dict[str, Any]:
        return {"model": self.model, "posture": self.posture.label(), "engine_tag": self.engine_tag,
                "candidates": len(self.candidates)}


@register
class ProfileReset(NodeLocal):
    """`model` returns to the default posture from its next load (`blazar tune MODEL --reset`)."""

    TYPE = "profile.reset"
    AUDIT = True

    model: str
    reason: Text = "reset"

    def stream_key(self) -> str:
        return f"model:{self.model}"

    def audit_details(self) -> dict[str, Any]:
        return {"model": self.model, "reason": self.reason}


@register
class SpecSwitched(Event):
    """The speculation governor turned speculative decoding off (`speculative.n_max: 0` on every request) or back on
    for one instance, with the window's numbers that decided it. The child is not restarted."""

    TYPE = "spec.switched"
    AUDIT = False

    instance_id: str
    model: str
    enabled: bool
    reason: Text  # "acceptance 0.21 < 0.40", "6 requests for 2 slots", "acceptance 0.80 recovered"
    window_s: float
    drafted: int | None = None  # tokens drafted and accepted in the window
    accepted: int | None = None
    acceptance: float | None = None
    decode_tps: float | None = None  # the instance's generated tokens per second over the window
    in_flight: int | None = None  # requests at the instance when it decided
    slots: int | None = None

    def stream_key(self) -> str:
        return f"instance:{self.instance_id}"


class GateModel(BaseModel):
    """One model the engine gate measured on both builds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    active_decode_tps: float
    candidate_decode_tps: float
    ratio: float  # candidate / active
    active_bench_id: str | None = None
    candidate_bench_id: str | None = None


@register
class EngineGateChecked(NodeLocal):
    """Before `candidate_tag` became active, it was measured against `active_tag` on `models`: `passed` when no
    model decodes more than `threshold` slower (or `forced` past a failure)."""

    TYPE = "engine.gate_checked"
    AUDIT = True

    candidate_tag: str
    active_tag: str
    models: Annotated[list[GateModel], items(8, bound_of(GateModel))]
    threshold: float  # 0.05: more than 5% slower fails
    passed: bool
    forced: bool = False
    detail: Text = ""

    def stream_key(self) -> str:
        return f"engine:{self.candidate_tag}"

    def audit_details(self) -> dict[str, Any]:
        return {"candidate_tag": self.candidate_tag, "active_tag": self.active_tag, "passed": self.passed,
                "forced": self.forced}

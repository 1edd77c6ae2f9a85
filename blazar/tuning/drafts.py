"""Draft models: which models in the store could draft for a model (another GGUF with its tokenizer identity, smaller
than it), whether each fits beside it, and the gain `blazar tune` last measured with it. `blazar tune` tries the
eligible ones (`drafts_for`); `blazar drafts MODEL` shows them all (`draft_report`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from blazar.adapters.gguf_tokenizer import TokenizerIdentity, tokenizer_identity
from blazar.confine import inside
from blazar.context import Blazar
from blazar.errors import ModelFileError
from blazar.fit import FitRequest
from blazar.instances.planning import coreside_models
from blazar.projections.catalog import StoredModel, models, stored
from blazar.projections.profiles import BenchEntry, benches
from blazar.tuning.candidates import TUNE_CTX
from blazar.tuning.child import resolve_model
from blazar.tuning.rule import decode_by_workload, mean, ratios


class DraftGain(BaseModel):
    """What one measurement of the model with a draft gave: decode t/s over the defaults' measured just before it, on
    the same engine build, machine and context (a tune measures the defaults first), per workload and their mean."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ratio: float
    by_workload: dict[str, float]
    bench_id: str
    engine_tag: str
    seq: int
    ts: float


class Draft(BaseModel):
    """A model that could draft for the target: its size, whether it fits beside the target (each at TUNE_CTX, one
    slot), and the last gain measured with it (None: not measured)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    bytes: int
    fits_beside: bool
    fit_detail: str = ""  # why it does not fit beside the target
    gain: DraftGain | None = None


class DraftReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    bytes: int
    drafts: list[Draft]  # by gain (the highest first, the unmeasured last), then size (the smallest first)
    others: dict[str, str]  # every other GGUF in the store: why it cannot draft


@dataclass(frozen=True)
class _Screened:
    model: StoredModel
    why_not: str  # "": same tokenizer, smaller, and fits beside the target
    fit_detail: str = ""  # why it does not fit beside the target, when that is all that stands in its way


async def identity_of(app: Blazar, m: StoredModel) -> TokenizerIdentity | None:
    """The tokenizer of a stored model's file (confined to the store first: the catalog names it); None when
    unreadable."""
    path = inside(app.paths.models, m.file, what=f"the catalog's entry for {m.name}")
    try:
        return await asyncio.to_thread(tokenizer_identity, path)
    except ModelFileError:
        return None


async def _screen(app: Blazar, target: StoredModel) -> list[_Screened]:
    """Every other GGUF of the store (another name: one file may be imported twice), checked in order: tokenizer,
    size, room beside the target. Split models and embedding models never draft."""
    mine = await identity_of(app, target)
    out = []
    for m in models(app.runner.state("catalog")):
        if m.name == target.name or not m.gguf or m.metadata.embedding_model or m.parts:
            continue
        theirs = await identity_of(app, m)
        if mine is None or theirs is None or not mine.matches(theirs):
            out.append(_Screened(m, "another tokenizer"))
        elif m.bytes > target.bytes:
            out.append(_Screened(m, "larger than the model"))
        else:
            plan, _ = await coreside_models(app, [target.name, m.name], FitRequest(ctx=TUNE_CTX, slots=1))
            reason = plan.deferred[0].reason if plan.deferred else ""
            out.append(_Screened(m, reason and f"does not fit beside it: {reason}", reason))
    return out


async def drafts_for(app: Blazar, model: str) -> list[tuple[str, str]]:
    """(name, why) for every other GGUF in the store: why is "" for an eligible draft (same tokenizer identity,
    smaller, fits beside it), else the reason it is not one. [] for a model that is not a GGUF in the store."""
    target = stored(app.runner.state("catalog"), model)
    if target is None or not target.gguf:
        return []
    return [(s.model.name, s.why_not) for s in await _screen(app, target)]


async def draft_report(app: Blazar, model: str) -> DraftReport:
    """`blazar drafts MODEL`: the drafts that share its tokenizer and are smaller, those that do not fit beside it
    included (said so), with their last measured gains. ModelNotFound, WrongModelKind: see `resolve_model`."""
    target = resolve_model(app, model)
    screened = await _screen(app, target) if target.gguf else []
    gains = last_gains(benches(app.runner.state("profiles"), target.name))
    drafts = [Draft(name=s.model.name, bytes=s.model.bytes, fits_beside=not s.fit_detail, fit_detail=s.fit_detail,
                    gain=gains.get(s.model.name))
              for s in screened if not s.why_not or s.fit_detail]
    drafts.sort(key=lambda d: (d.gain is None, -(d.gain.ratio if d.gain else 0.0), d.bytes, d.name))
    return DraftReport(model=target.name, bytes=target.bytes, drafts=drafts,
                       others={s.model.name: s.why_not for s in screened if s.why_not and not s.fit_detail})


def last_gains(entries: list[BenchEntry]) -> dict[str, DraftGain]:
    """Per draft model, its latest measurement against the defaults' measured before it (same engine build, machine
    and context). Only postures that change speculation alone count: another lever in the same posture would be
    measured with it. Pure: the profiles projection's benchmarks of one model, in log order."""
    baseline: dict[tuple[str, str, int], BenchEntry] = {}
    out: dict[str, DraftGain] = {}
    for e in entries:
        b = e.bench
        key = (b.engine_tag, b.machine.fingerprint, b.ctx)
        p = b.posture
        if p.is_default():
            baseline[key] = e
            continue
        spec_only = p.model_copy(update={"spec_type": None, "draft_model": None, "spec_n_max": None}).is_default()
        base = baseline.get(key)
        if p.draft_model is None or not p.speculative or not spec_only or base is None:
            continue
        r = ratios(decode_by_workload(base.bench), decode_by_workload(b))
        if r:
            out[p.draft_model] = DraftGain(ratio=mean(r), by_workload=r, bench_id=b.bench_id, engine_tag=b.engine_tag,
                                           seq=e.seq, ts=e.ts)
    return out

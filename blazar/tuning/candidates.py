"""The postures `blazar tune` tries for one model on this machine and engine build (blazar/tuning/tune.py measures
them). `candidate_postures` is pure: the build's n-gram types, the eligible drafts, the cores and the slot counts
that fit in, postures out. `slots_that_fit` asks the fit planner; the drafts come from blazar/tuning/drafts.py."""

from __future__ import annotations

from collections.abc import Iterable

from blazar.context import Blazar
from blazar.events.tuning import Posture
from blazar.fit import FitRequest
from blazar.instances.planning import fit_model

FAMILIES = ("spec", "kv", "threads", "batch", "slots")
# The draft speculation type: a small model drafts, the target verifies (llama-server --spec-type draft-simple).
DRAFT_TYPE = "draft-simple"
KV_TYPES = ("f16", "q8_0", "q4_0")
MAX_DRAFTS = 4  # draft models tried (the first eligible): the verdicts of a tune are one event, profile.adopted
# (n_batch, n_ubatch) besides the defaults (2048, 512): a smaller and a larger physical batch.
BATCHES = ((512, 256), (4096, 1024))
SLOT_COUNTS = (1, 2, 4)
TUNE_CTX = 4096  # the context every candidate is fitted and measured at (the workloads' longest prompt fits)


def parse_only(only: str | Iterable[str] | None) -> tuple[str, ...]:
    """`--only spec,kv` as families, in FAMILIES order; None or empty: all. An unknown family is a ValueError."""
    if only is None:
        return FAMILIES
    names = [p.strip() for p in (only.split(",") if isinstance(only, str) else only) if p.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown --only {', '.join(unknown)} (choose from {', '.join(FAMILIES)})")
    return tuple(f for f in FAMILIES if f in names) or FAMILIES


def thread_counts(cores: int) -> tuple[int, ...]:
    """All cores, all but one (leaves one to the gateway and the OS), and one (when there is more than one)."""
    return tuple(dict.fromkeys(n for n in (cores, cores - 1, 1) if n >= 1))


def candidate_postures(*, families: Iterable[str], ngram_types: Iterable[str], drafts: Iterable[str], cores: int,
                       slots: Iterable[int]) -> list[Posture]:
    """Every posture to try, one change from the defaults each (a change that wins is measured on its own, so the
    table says what each lever is worth). The defaults themselves are the baseline, never a candidate."""
    fams = set(families)
    out: list[Posture] = []
    if "spec" in fams:
        out += [Posture(spec_type=t) for t in ngram_types]
        out += [Posture(spec_type=DRAFT_TYPE, draft_model=d) for d in list(drafts)[:MAX_DRAFTS]]
    if "kv" in fams:
        for k in KV_TYPES:
            for fa in (True, False):
                if k == "f16" and fa:
                    continue  # the defaults (the fit keeps f16 and flash attention on when memory allows)
                # a quantised V cache needs flash attention: with it off only K is quantised
                out.append(Posture(cache_type_k=k, cache_type_v=(k if fa else "f16"), flash_attn=fa)
                           if k != "f16" else Posture(flash_attn=False))
    if "threads" in fams:
        out += [Posture(threads=n) for n in thread_counts(cores)]
    if "batch" in fams:
        out += [Posture(n_batch=b, n_ubatch=u) for b, u in BATCHES]
    if "slots" in fams:
        out += [Posture(slots=n) for n in slots]
    return list(dict.fromkeys(out))


async def slots_that_fit(app: Blazar, model: str) -> list[int]:
    """The slot counts of SLOT_COUNTS that fit at TUNE_CTX each."""
    fits = []
    for n in SLOT_COUNTS:
        p = await fit_model(app, model, FitRequest(ctx=TUNE_CTX, slots=n))
        if p.fits:
            fits.append(n)
    return fits

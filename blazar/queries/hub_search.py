"""`blazar search`: the GGUF repos on the hub (HF_ENDPOINT) that match a query, each model in them (a quant, split
parts summed) with its size and whether it fits this machine, planned by the fit planner from its GGUF header alone
(range requests, never the weights). Bounded in repos, header bytes, time and threads; records nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from blazar.adapters.gguf_inspect import header_bytes_needed_hint
from blazar.adapters.hub import DEFAULT_QUANT, Hub, RemoteModel, RemoteRepo, gguf_models
from blazar.errors import BlazarError, SearchBudgetSpent
from blazar.fit import Device, FitPlan, FitRequest, plan
from blazar.instances.planning import remote_metadata


@dataclass(frozen=True)
class SearchBudget:
    """How far one search may go: repos listed, header bytes read in all, seconds spent, requests at once."""

    repos: int = 10
    header_bytes: int = 256 << 20
    seconds: float = 60.0
    workers: int = 4
    # The first range of a header (grown where the header needs more): one request holds most whole headers, a 256k
    # vocabulary's included; a round trip costs more than the bytes.
    first_bytes: int = header_bytes_needed_hint


class Verdict(BaseModel):
    """The planner's answer for one model, shortened for a table: None in `fits` when it was not planned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fits: bool | None
    where: str | None = None  # "GPU", "GPU 20/33 layers + CPU", "CPU"
    ctx: int | None = None  # the largest context per slot that fits (one slot), up to the trained one
    detail: str = ""  # why not, or why it was not planned


class FoundModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str  # what `blazar pull` takes for it
    quant: str | None
    files: list[str]
    size_bytes: int
    verdict: Verdict


class FoundRepo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str
    downloads: int | None = None
    error: str | None = None  # why the repo was not listed
    models: list[FoundModel] = Field(default_factory=list)


class SearchResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    query: str
    endpoint: str
    repos: list[FoundRepo]
    header_bytes_read: int


def verdict(p: FitPlan) -> Verdict:
    """Where a plan puts the model and at what context, or the planner's reason it does not fit."""
    if not p.fits:
        return Verdict(fits=False, detail=p.refusal.detail if p.refusal else p.summary)
    gpu = any(u.kind == "cuda" and u.layers for u in p.devices)
    if not gpu:
        where = "CPU"
    elif p.gpu_layers >= p.offloadable_layers:
        where = "GPU"
    else:
        where = f"GPU {p.gpu_layers}/{p.offloadable_layers} layers + CPU"
    return Verdict(fits=True, where=where, ctx=p.ctx_per_slot)


def pull_target(repo: str, model: RemoteModel, siblings: list[RemoteModel]) -> str:
    """`owner/repo:QUANT` when the quant names only this model in the repo, else the file's own path."""
    if model.quant is not None and sum(m.quant == model.quant for m in siblings) == 1:
        return f"{repo}:{model.quant}"
    return f"{repo}/{model.files[0].path}"


def planning_order(repos: list[tuple[str, list[RemoteModel]]]) -> list[tuple[str, RemoteModel]]:
    """Round robin over the repos, each repo's Q4_K_M (what `pull` takes by default) first: when the budget runs out,
    every repo has had its likeliest model planned before any repo has a second."""
    ranked = [sorted(models, key=lambda m: (m.quant != DEFAULT_QUANT, m.size)) for _, models in repos]
    out = []
    for rank in range(max((len(r) for r in ranked), default=0)):
        out += [(repo, r[rank]) for (repo, _), r in zip(repos, ranked, strict=True) if rank < len(r)]
    return out


class _Metered:
    """The hub's `fetch_range`, charged to one budget shared by the search's threads: a range is reserved before it
    is asked for, so no two threads together read past the budget."""

    def __init__(self, hub: Hub, budget: SearchBudget, clock: Callable[[], float]) -> None:
        self._hub = hub
        self._left = budget.header_bytes
        self._deadline = clock() + budget.seconds
        self._clock = clock
        self._lock = threading.Lock()
        self.read = 0

    def expired(self) -> bool:
        return self._clock() > self._deadline

    def fetch_range(self, repo: str, filename: str, start: int, end: int, revision: str = "main") -> bytes:
        with self._lock:
            if self.expired():
                raise SearchBudgetSpent("the search's time budget is spent")
            if end - start > self._left:
                raise SearchBudgetSpent("the search's header budget is spent")
            self._left -= end - start
        data = self._hub.fetch_range(repo, filename, start, end, revision)
        with self._lock:
            self._left += end - start - len(data)
            self.read += len(data)
        return data


def search_hub(hub: Hub, devices: list[Device], query: str, budget: SearchBudget = SearchBudget(), *,
               quant: str | None = None, clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """Search, list each repo's GGUF models (`quant` only, when given), and plan each from its header. The search
    itself failing is an error; one repo or one header failing is said in its row."""
    metered = _Metered(hub, budget, clock)  # its time budget runs from here: the listings spend it too
    found = hub.search(query, budget.repos)
    with ThreadPoolExecutor(max_workers=budget.workers, thread_name_prefix="blazar-search") as pool:
        listed = list(pool.map(lambda r: _listing(hub, r, metered), found))
        repos = [(r.repo, [m for m in models if quant is None or (m.quant or "").upper() == quant.upper()])
                 for r, (models, _) in zip(found, listed, strict=True)]
        order = planning_order(repos)
        verdicts = dict(zip([(repo, m.files[0].path) for repo, m in order],
                            pool.map(lambda item: _planned(metered, devices, budget, *item), order), strict=True))
    out = []
    for r, (repo, models), (_, error) in zip(found, repos, listed, strict=True):
        rows = [FoundModel(target=pull_target(repo, m, models), quant=m.quant, files=[f.path for f in m.files],
                           size_bytes=m.size, verdict=verdicts[(repo, m.files[0].path)])
                for m in sorted(models, key=lambda m: m.size)]
        out.append(FoundRepo(repo=repo, downloads=r.downloads, error=error, models=rows))
    return SearchResult(query=query, endpoint=hub.endpoint, repos=out, header_bytes_read=metered.read)


def _listing(hub: Hub, repo: RemoteRepo, metered: _Metered) -> tuple[list[RemoteModel], str | None]:
    if metered.expired():
        return [], "not listed: the search's time budget is spent"
    try:
        return gguf_models(hub.list_gguf_files(repo.repo)), None
    except BlazarError as e:
        return [], f"cannot list: {e.message}"


def _planned(metered: _Metered, devices: list[Device], budget: SearchBudget, repo: str, m: RemoteModel) -> Verdict:
    if not m.complete:
        return Verdict(fits=None, detail="not planned: some of its split parts are missing from the repo")
    try:
        meta = remote_metadata(metered, repo, list(m.files), first_bytes=budget.first_bytes)
    except SearchBudgetSpent as e:
        return Verdict(fits=None, detail=f"not planned: {e.message}")
    except BlazarError as e:
        return Verdict(fits=None, detail=f"header unreadable: {e.message}")
    return verdict(plan(meta.model_copy(update={"name": f"{repo}:{m.quant}" if m.quant else repo}), devices,
                        FitRequest()))

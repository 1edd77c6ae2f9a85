"""`blazar fit` and `blazar coreside`: plan a model (in the store, or on a hub before any download) on the
devices this machine has now. Reads the catalog and calibration projections; records nothing."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from blazar.adapters.engines.kinds import engine_kind
from blazar.adapters.gguf_header import ShortRead, parse_header
from blazar.adapters.gguf_inspect import header_bytes_needed_hint, inspect_gguf_header, inspect_split_headers
from blazar.adapters.gpu import probe_devices
from blazar.context import Blazar
from blazar.errors import ModelFileError, ModelNotFound
from blazar.events.models import ModelMetadata
from blazar.fit import CoresidePlan, Device, FitPlan, FitRequest, coreside, plan
from blazar.fit.fixed import fixed_plan
from blazar.instances.budget import Resident, budget_devices, worker_devices
from blazar.instances.worker import idle_workers
from blazar.projections.calibration import correction_for
from blazar.projections.catalog import stored
from blazar.projections.residency import instances
from blazar.store.pull_target import parse_target

if TYPE_CHECKING:  # huggingface_hub costs 0.2 s to import: only a hub model's fit needs it (it comes with app.hub())
    from blazar.adapters.hub import RemoteFile

# A header bigger than this is not a model we can plan for (the largest vocabularies need ~10 MiB).
MAX_HEADER_BYTES = 256 * 1024 * 1024


async def metadata_for(app: Blazar, model_or_target: str) -> tuple[str, ModelMetadata, bool]:
    """(name, metadata, in_store): from the catalog when the store has it, else from a hub header (no download)."""
    got = stored(app.runner.state("catalog"), model_or_target)
    if got is not None:
        return got.name, got.metadata, True
    target = parse_target(model_or_target)
    if target.kind == "registry":
        raise ModelNotFound(f"no model named {model_or_target!r} in the store; pull it first or plan a hub target "
                            "(owner/repo[:QUANT])")
    assert target.repo is not None
    hub = app.hub()
    files = await asyncio.to_thread(hub.resolve, target.repo, target.path or target.quant)
    meta = await asyncio.to_thread(remote_metadata, hub, target.repo, files)
    return target.default_name(), meta, False


class RangeReader(Protocol):
    """What reading a header needs of the hub: `Hub.fetch_range` (`blazar search` meters it)."""

    def fetch_range(self, repo: str, filename: str, start: int, end: int, revision: str = "main") -> bytes: ...


def remote_metadata(hub: RangeReader, repo: str, files: list[RemoteFile], *,
                    first_bytes: int = header_bytes_needed_hint) -> ModelMetadata:
    """Read only the GGUF headers with range requests (the first `first_bytes` of each file, more where its header
    needs them), growing the range until each whole header is in."""
    parts = [(_header_prefix(hub, repo, f, first_bytes), f.size, f"{repo}/{f.path}") for f in files]
    if len(parts) == 1:
        prefix, size, source = parts[0]
        return inspect_gguf_header(prefix, size, source=source)
    return inspect_split_headers(parts)


def _header_prefix(hub: RangeReader, repo: str, f: RemoteFile, first_bytes: int) -> bytes:
    want = min(first_bytes, f.size)
    prefix = b""
    while True:
        # Only what is not in yet is asked for: a header that outgrows the first range costs its size, not a sum.
        more = hub.fetch_range(repo, f.path, len(prefix), want, revision=f.revision)
        prefix += more
        try:
            parse_header(prefix, len(prefix), f"{repo}/{f.path}")
            return prefix
        except ShortRead as short:
            if len(prefix) >= f.size or not more:
                raise ModelFileError(f"{repo}/{f.path}: truncated: the header runs past the end of the file") from None
            want = min(f.size, max(short.needed, len(prefix) * 2))
            if want > MAX_HEADER_BYTES:
                raise ModelFileError(f"{repo}/{f.path}: the GGUF header is over {MAX_HEADER_BYTES} bytes") from None


def devices_now() -> list[Device]:
    return probe_devices()


async def fit_model(app: Blazar, model_or_target: str, request: FitRequest,
                    devices: list[Device] | None = None) -> FitPlan:
    """Plan `model_or_target`, with the calibration correction for the planned shape when the store has it. A
    whisper or piper model in the store is charged its kind's memory model (fit/fixed.py), never planned as a GGUF."""
    got = stored(app.runner.state("catalog"), model_or_target)
    memory = None if got is None else engine_kind(got.kind).memory
    if got is not None and memory is not None:
        devs = devices if devices is not None else await asyncio.to_thread(devices_now)
        return fixed_plan(got.name, got.kind, memory.bytes_for(got.bytes), devs)
    name, meta, in_store = await metadata_for(app, model_or_target)
    devs = devices if devices is not None else await asyncio.to_thread(devices_now)
    got = stored(app.runner.state("catalog"), name) if in_store else None
    if got is not None and got.projector is not None and request.projector is None:
        request = request.model_copy(update={"projector": got.projector.metadata})  # it loads with its projector
    if got is not None and got.loras and not request.lora_bytes:  # and with its LoRA adapters
        request = request.model_copy(update={"lora_bytes": sum(a.metadata.tensor_bytes for a in got.loras)})
    meta = meta.model_copy(update={"name": name})  # plans and their summaries speak of the store's name
    first = plan(meta, devs, request)
    if not in_store:
        return first
    correction = correction_for(app.runner.state("calibration"), name, first.ctx_per_slot, first.slots,
                                first.cache_type_k, first.cache_type_v)
    if correction == 0:
        return first
    return plan(meta, devs, request.model_copy(update={"correction": correction}))


async def coreside_models(app: Blazar, models: list[str], request: FitRequest,
                          devices: list[Device] | None = None) -> tuple[CoresidePlan, list[tuple[str, FitPlan]]]:
    devs = devices if devices is not None else await asyncio.to_thread(devices_now)
    plans = [(m, await fit_model(app, m, request, devs)) for m in models]
    return coreside(plans, devs), plans


async def fit_with_workers(app: Blazar, model_or_target: str, request: FitRequest) -> FitPlan:
    """The plan the daemon would make for a load now: this machine within memory_limit_mib (what running instances
    hold taken off), and, when that does not fit, the idle RPC workers that accept a connection (the fewest layers
    away)."""
    residents = instances(app.runner.state("residency"), node=app.node or None)  # this machine's own
    budget = budget_devices(await asyncio.to_thread(devices_now),
                            [Resident(i.instance_id, i.resident_bytes) for i in residents],
                            memory_limit_bytes=app.settings().fit.memory_limit_mib * (1 << 20))
    here = await fit_model(app, model_or_target, request, budget)
    if here.fits:
        return here
    offered = await idle_workers(app, set())
    if not offered:
        return here
    spread = await fit_model(app, model_or_target, request.model_copy(update={"offload": "fewest"}),
                             [*budget, *worker_devices(offered)])
    return spread if spread.fits else here

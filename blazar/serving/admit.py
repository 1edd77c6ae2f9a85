"""A routed call's slot: a slot of its instance taken (or a place in the queue, blazar/serving/admission.py), the
instance held against eviction, and the request placed on the slot (the slot named to the engine; a session's prefix
made ready there). A fan-out's extra candidates take more slots here, never waiting for one. Each decision is
recorded as the call's event; a refusal is raised (`Refused`), an instance gone meanwhile as `EngineGone` (the call is
routed again, once: blazar/serving/routing.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from blazar.context import Blazar
from blazar.errors import AdmissionRefused, BlazarError, DeadlineUnmeetable, EngineGone, Refused, SwapRecalled
from blazar.events.requests import RequestAdmitted, RequestPlaced, RequestQueued, ShareWait
from blazar.instances.kv_bank import KvBank
from blazar.instances.live import Instance, LoadReport
from blazar.projections.keys import auth_on
from blazar.serving.admission import Admission, Ticket
from blazar.serving.call import Call
from blazar.serving.fair_queue import KEYLESS
from blazar.serving.fanout import Candidate
from blazar.serving.limits import Limiter
from blazar.serving.patch import Patch
from blazar.serving.ports import SupervisorPort
from blazar.serving.request import Request
from blazar.serving.spec_governor import N_MAX_FIELD, SpecGovernor


class Admitter:
    def __init__(self, app: Blazar, supervisor: SupervisorPort, admission: Admission, kv: KvBank, limiter: Limiter,
                 spec: SpecGovernor | None = None) -> None:
        self.app = app
        self.supervisor = supervisor
        self.admission = admission
        self.kv = kv
        self.limiter = limiter  # the keys' leases: a fan-out's extra candidate takes one
        self.spec = spec  # whether a request on a speculative instance may draft (the governor's verdict)

    def isolating(self) -> bool:
        """Whether tenants are kept apart: while keys are on (with none, every caller is the machine's owner)."""
        return auth_on(self.app.runner.state("keys"))

    async def seat(self, call: Call, inst: Instance, report: LoadReport, recall: asyncio.Event | None = None) -> None:
        """A slot of `inst` for the call, and (on a child of ours that has slots) the request placed on it. A call
        served ahead of a swap (blazar/serving/swaps.py) gives up its place when `recall` is set before its slot
        comes: SwapRecalled."""
        ticket = await self._admit(call, inst, report, recall)
        if not inst.remote and call.request.audio is None:  # a whisper or piper child: no slots to place on
            await self._place(call, inst, ticket.slot_id)

    async def _admit(self, call: Call, inst: Instance, report: LoadReport,
                     recall: asyncio.Event | None = None) -> Ticket:
        """A slot of `inst` (or a place in its queue), recorded; the instance held against eviction."""
        request = call.request

        def on_queued(position: int, depth: int) -> None:
            call.queued(position)
            snap = self.admission.snapshot().get(inst.model, {})
            call.emit(RequestQueued(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                    position=position, depth=depth, slots=inst.slots, busy=int(snap.get("busy", 0))))
            if request.hooks.on_queued is not None:
                request.hooks.on_queued(position, depth)

        deadline_s = call.deadline_left_s()
        try:
            if deadline_s is not None and deadline_s <= 0:
                raise DeadlineUnmeetable(f"{inst.model}: the deadline of {request.deadline_ms} ms passed before a slot "
                                         f"was asked for ({'the model loaded' if report.cold else 'routing'} took it)",
                                         observations={"deadline_ms": request.deadline_ms, "load_ms": report.load_ms})
            ticket = await _unless_recalled(self.admission.acquire(
                inst.lane, inst.slots, priority=request.priority, max_tokens=call.ask.max_tokens, on_queued=on_queued,
                deadline_s=deadline_s, tenant=share_tenant(request), weight=share_weight(request),
                pick=None if inst.remote else self.kv.slots.picker(inst.instance_id, request.session, request.tenant,
                                                                   isolate=self.isolating())), recall, inst.model)
        except AdmissionRefused as e:
            raise Refused(e.message, reason=e.reason, http_status=e.http_status, retry_after_s=e.retry_after_s,
                          observations=e.observations) from None
        call.admitted(ticket)
        if not inst.remote:
            try:
                self.supervisor.hold(inst)
            except BlazarError as e:
                call.give_back_slot(learn=False)
                if not call.rerouted:  # the instance exited while the request waited for its slot
                    raise EngineGone(e.message) from None
                raise Refused(e.message, reason=e.code, http_status=e.http_status, public=e.public) from None
            call.holding(inst)
        spec = self.spec.request_spec(inst, request.spec) if self.spec is not None else None
        if spec is not None and spec != "on":
            call.ask.apply(Patch(fields={N_MAX_FIELD: 0}))  # this request never drafts; the child runs on as it is
        call.emit(RequestAdmitted(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                  waited_ms=round(ticket.waited_s * 1000, 3), slots=ticket.slots,
                                  busy=ticket.busy_after, queued_behind=max(0, ticket.position_when_queued - 1),
                                  slot_id=None if inst.remote else ticket.slot_id, spec=spec,
                                  share_wait=_share_wait(ticket)))
        return ticket

    async def _place(self, call: Call, inst: Instance, slot_id: int) -> None:
        """The slot the request runs on: named to the engine once sessions hold slots or tenants are kept apart
        (then another tenant's prefix there is not reused), and for a session its prefix made ready there (warm, or
        restored from the KV bank), recorded as `request.placed`."""
        session = call.request.session
        placed = await self.kv.place(inst, slot_id, session, tenant=call.request.tenant)
        isolate = self.isolating() and not (call.request.embeddings or call.request.rerank)
        call.ask.apply(Patch(fields=placed.engine_fields(slot_id, isolate=isolate)))
        if session is not None and placed.kv is not None:
            call.emit(RequestPlaced(trace_id=call.trace_id, model=inst.model, instance_id=inst.instance_id,
                                    slot_id=slot_id, session=session, kv=placed.kv, reason=placed.reason,
                                    restored_tokens=placed.restored_tokens, restore_ms=placed.restore_ms))

    async def extra_candidate(self, call: Call) -> Candidate | None:
        """One more slot of the call's instance, free now (never a wait), with the key's extra lease (each candidate
        counts against its max_concurrent) and, on a child, a hold and the slot's placement; None when any of them
        is not to be had."""
        inst = call.instance
        assert inst is not None
        p = call.request.principal
        limits = p.limits() if p is not None else None
        lease = self.limiter.extra(limits) if limits is not None else None
        if limits is not None and lease is None:
            return None
        isolate = self.isolating()
        ticket = self.admission.try_acquire(inst.lane, inst.slots, pick=None if inst.remote else self.kv.slots.picker(
            inst.instance_id, None, call.request.tenant, isolate=isolate))
        held = False

        def release() -> None:
            if ticket is not None:
                self.admission.release(ticket)
            if held:
                self.supervisor.unhold(inst)
            if lease is not None:
                self.limiter.release(lease)

        if ticket is None:
            release()
            return None
        if inst.remote:
            return Candidate(slot_id=ticket.slot_id, release=release)
        try:
            self.supervisor.hold(inst)
        except BlazarError:
            self.admission.give_back(ticket)
            ticket = None
            release()
            return None  # the instance is gone: the candidates so far are all there will be
        held = True
        try:
            placed = await self.kv.place(inst, ticket.slot_id, None, tenant=call.request.tenant)
        except BaseException:
            release()
            raise
        return Candidate(slot_id=ticket.slot_id, engine_fields=placed.engine_fields(ticket.slot_id, isolate=isolate),
                         release=release)


def share_tenant(request: Request) -> str:
    """Whose share of the slots a request takes: its key's (a key in a cache group still has its own share), the
    tenant another node forwarded it as, or the keyless caller's."""
    if request.key_name is not None:
        return f"key:{request.key_name}"
    return request.tenant or KEYLESS


def share_weight(request: Request) -> int:
    key = request.principal.key if request.principal is not None else None
    return key.weight if key is not None else 1


def _share_wait(ticket: Ticket) -> ShareWait | None:
    if not ticket.passed_by_share:
        return None
    return ShareWait(ahead_other_tenants=ticket.passed_by_share,
                     tenant_weight=ticket.charge.weight if ticket.charge is not None else 1)
async def _unless_recalled(acquire: Awaitable[Ticket], recall: asyncio.Event | None, model: str) -> Ticket:
    """The slot `acquire` waits for, unless `recall` is set first: then its place is given up (the admission's own
    cancellation passes on a slot granted in that instant) and SwapRecalled raised."""
    if recall is None:
        return await acquire
    if recall.is_set():
        if asyncio.iscoroutine(acquire):
            acquire.close()
        raise SwapRecalled(f"{model}: the hold it was served ahead in ran out before a slot came")
    task = asyncio.ensure_future(acquire)
    recalled = asyncio.ensure_future(recall.wait())
    try:
        await asyncio.wait((task, recalled), return_when=asyncio.FIRST_COMPLETED)
    finally:
        recalled.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled() or not task.done():
        await asyncio.gather(task, return_exceptions=True)
        raise SwapRecalled(f"{model}: the hold it was served ahead in ran out before a slot came")
    return task.result()

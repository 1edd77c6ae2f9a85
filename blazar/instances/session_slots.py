"""Which engine slot holds which session's prefix, and whose prompt each slot's cache holds, per instance: in
memory, in the daemon only (a restart starts with every slot cold and of unknown tenant; the KV bank is what
survives). Admission asks it which free slot a request should take (`picker`), and the gateway tells it where each
request went (`place`), learning whether the request may reuse what the slot holds.

A session's turn goes back to its slot when that slot is free; any other request takes a slot no session holds,
else the one whose session was used longest ago, so a session is displaced only when every slot has one. With keys
on (`isolate`), a request prefers a slot its own tenant used last, then one nobody used, and takes another tenant's
only when it must; a slot whose last tenant was another (or is unknown) is never reused for its prefix
(blazar/serving/tenancy.py). Once every slot of an instance is one tenant's, that tenant's requests need not name
theirs: the engine picks the slot with the longest common prefix, as it does with keys off.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Chooses one of the free slot ids (never empty) for a ticket; the default takes the lowest.
SlotPicker = Callable[[frozenset[int]], int]

# Sessions remembered as having lost their slot to another request (only for the words of `why`): the oldest
# forgotten first, so a long-lived instance serving many sessions does not grow this without end.
LOST_MAX = 4096


@dataclass
class _Slot:
    session: str | None = None
    used: float = 0.0  # when a request was last placed here (monotonic)
    tenant: str | None = None  # whose prompt the slot's cache holds: the last request placed here


class SessionSlots:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._slots: dict[str, dict[int, _Slot]] = {}  # instance id -> slot id -> what it holds
        self._where: dict[str, tuple[str, int]] = {}  # session -> (instance id, slot id) of its newest prefix
        # session -> the slot another request took from it (bounded: LOST_MAX)
        self._lost: OrderedDict[str, tuple[str, int]] = OrderedDict()

    # -- choosing and recording -------------------------------------------------------------------------------

    def picker(self, instance_id: str, session: str | None, tenant: str | None = None, *,
               isolate: bool = False) -> SlotPicker | None:
        """How admission chooses among free slots for this request; None (the lowest free) while no session holds a
        slot of the instance, the request names none, and tenants are not kept apart."""
        slots = self._slots.get(instance_id)
        if not isolate and session is None and not (slots and any(s.session for s in slots.values())):
            return None
        own = self._where.get(session) if session is not None else None
        held = slots or {}

        def shared(i: int) -> tuple[bool, float, int]:
            # A slot no session holds first, then the least recently used.
            return (i in held and held[i].session is not None, held[i].used if i in held else 0.0, i)

        def isolated(i: int) -> tuple[bool, int, float, int]:
            # Still a slot no session holds first; then this tenant's own (the most recent: the likeliest to share
            # its prefix), then one never used, then another tenant's (the least recently used).
            slot = held.get(i)
            if slot is None:
                return (False, 1, 0.0, i)
            if slot.tenant == tenant:
                return (slot.session is not None, 0, -slot.used, i)
            return (slot.session is not None, 2, slot.used, i)

        rank = isolated if isolate else shared

        def pick(free: frozenset[int]) -> int:
            if own is not None and own[0] == instance_id and own[1] in free:
                return own[1]
            return min(free, key=rank)

        return pick

    def owner(self, instance_id: str, slot_id: int) -> str | None:
        slot = self._slots.get(instance_id, {}).get(slot_id)
        return slot.session if slot is not None else None

    def explicit(self, instance_id: str) -> bool:
        """Whether requests to this instance must name their slot: once a session holds one, the engine must not
        choose (it would hand a session's slot to another request)."""
        return any(s.session for s in self._slots.get(instance_id, {}).values())

    def sole(self, instance_id: str, tenant: str | None, slots: int) -> bool:
        """Whether every one of the instance's `slots` slots was last used by `tenant`: the engine may then choose
        among them itself (by the longest common prefix, as llama-server does), since whichever it takes is the
        tenant's own."""
        held = self._slots.get(instance_id, {})
        return all((slot := held.get(i)) is not None and slot.tenant == tenant for i in range(slots))

    def place(self, instance_id: str, slot_id: int, session: str | None, tenant: str | None = None) -> bool:
        """A request of `tenant` now runs on this slot: the slot holds `session`'s prefix from now (or nobody's).
        True when the slot's cache was `tenant`'s own already (a slot this process never placed is nobody's)."""
        slots = self._slots.setdefault(instance_id, {})
        slot = slots.get(slot_id)
        own = slot is not None and slot.tenant == tenant
        if slot is None:
            slot = slots[slot_id] = _Slot()
        prev = slot.session
        if prev is not None and prev != session and self._where.get(prev) == (instance_id, slot_id):
            del self._where[prev]
            self._lost[prev] = (instance_id, slot_id)
            self._lost.move_to_end(prev)
            while len(self._lost) > LOST_MAX:
                self._lost.popitem(last=False)
        if session is not None:
            old = self._where.get(session)
            if old is not None and old != (instance_id, slot_id):
                stale = self._slots.get(old[0], {}).get(old[1])
                if stale is not None and stale.session == session:
                    stale.session = None  # an older copy of the prefix: the first slot another request takes
            self._where[session] = (instance_id, slot_id)
            self._lost.pop(session, None)
        slot.session = session
        slot.used = self._clock()
        slot.tenant = tenant
        return own

    # -- reading ----------------------------------------------------------------------------------------------

    def where(self, session: str) -> tuple[str, int] | None:
        return self._where.get(session)

    def lost(self, session: str) -> tuple[str, int] | None:
        """The slot another request took from `session` since its last turn, if that is how it lost it."""
        return self._lost.get(session)

    def owned(self, instance_id: str) -> list[tuple[int, str]]:
        """(slot id, session) for each slot of the instance that holds a session's newest prefix."""
        return sorted((i, s.session) for i, s in self._slots.get(instance_id, {}).items()
                      if s.session is not None and self._where.get(s.session) == (instance_id, i))

    def last_session_use(self, instance_id: str) -> float | None:
        """When a session's turn last ran on the instance (monotonic), or None: no slot holds a session."""
        used = [s.used for s in self._slots.get(instance_id, {}).values() if s.session is not None]
        return max(used) if used else None

    def forget_session(self, session: str) -> None:
        """`blazar session rm`: no slot holds the session any more (its next turn starts cold)."""
        where = self._where.pop(session, None)
        if where is not None:
            slot = self._slots.get(where[0], {}).get(where[1])
            if slot is not None and slot.session == session:
                slot.session = None
        self._lost.pop(session, None)

    def forget(self, instance_id: str) -> None:
        """The instance is gone: its slots hold nothing any more."""
        for slot_id, slot in self._slots.pop(instance_id, {}).items():
            if slot.session is not None and self._where.get(slot.session) == (instance_id, slot_id):
                del self._where[slot.session]
        self._lost = OrderedDict((s, w) for s, w in self._lost.items() if w[0] != instance_id)

"""Events of `blazar doctor --fix`: each safe repair it made (a stale run file removed, an orphan engine child
stopped, an unrecorded KV-bank save removed), with what the check saw that proved it safe."""

from __future__ import annotations

from typing import Annotated, Literal

from blazar.events.base import Event
from blazar.events.bounds import PATH, Text
from blazar.events.types import register


@register
class DoctorFixed(Event):
    """One repair by `blazar doctor --fix` (or the same repair by the daemon at start-up: a KV-bank save no event
    records, check "store.kv_bank"). `target` is the file removed or the executable of the process stopped."""

    TYPE = "doctor.fixed"
    AUDIT = True

    check: str  # the check that found it, e.g. "machine.daemon_file"
    action: Literal["removed_file", "stopped_process"]
    target: Annotated[str, PATH]  # a path, a pid, a name
    detail: Text  # what made it safe: "pid 4242 is not running", "parent pid 1, not a Blazar process"
    pid: int | None = None  # the process stopped, or the dead pid a removed run file named

    def stream_key(self) -> str:
        return "doctor"

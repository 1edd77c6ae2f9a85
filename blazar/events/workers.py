"""RPC workers: llama.cpp's rpc-server run by `blazar worker` on a host, offering that host's devices to another
host's llama-server (one model split across hosts). Stream `worker:<name>`."""

from __future__ import annotations

from typing import Literal

from blazar.events.base import Event
from blazar.events.bounds import Text
from blazar.events.types import register


class _WorkerEvent(Event):
    name: str

    def stream_key(self) -> str:
        return f"worker:{self.name}"


@register
class WorkerStarted(_WorkerEvent):
    """A worker listens at host:port and offers `mem_bytes` to the planner (Blazar's budget for it: rpc-server itself
    takes no limit)."""

    TYPE = "worker.started"
    AUDIT = True

    host: str
    port: int
    mem_bytes: int
    pid: int
    engine_tag: str
    network: bool = False  # listening beyond loopback (--allow-network): rpc-server has no authentication


@register
class WorkerStopped(_WorkerEvent):
    """The worker's rpc-server ended: stopped, crashed (started again after a back-off), or given up on (it never
    listened, or crashed too often within a minute)."""

    TYPE = "worker.stopped"
    AUDIT = True

    reason: Literal["stopped", "crashed", "gave_up"]
    exit_code: int | None = None
    uptime_ms: int = 0
    detail: Text = ""

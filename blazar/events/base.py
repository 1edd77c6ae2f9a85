"""The event, the envelope and the stored row are three things.

An `Event` is a frozen pydantic model: the fact, in the past tense, with its wire name (`type`) and schema
version (`v`). A `Recorded` wraps it with what the log assigns: seq, ts, stream, trace id, actor, cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class Event(BaseModel):
    """Base of every event. Subclasses set `type` (a Literal), `v`, and optionally `audit`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Wire name ("<subject>.<past_verb>") and schema version; set on each subclass.
    TYPE: ClassVar[str]
    V: ClassVar[int] = 1
    # Audit-relevant events appear in `blazar audit export`; request events with content never do.
    AUDIT: ClassVar[bool] = False
    # Control events must be committed before a command is acknowledged (the durable path).
    CONTROL: ClassVar[bool] = True
    # Request history: leaves the live log for archive segments once older than `request_retention`
    # (blazar/events/archive.py). Everything else (control events) stays live for good.
    ARCHIVABLE: ClassVar[bool] = False
    # The most this type's payload may encode to where that is more than the log's bound (event_max_kib): a type
    # whose largest legal payload does not fit in it says so (engine.installed, whose flag manifest is the engine's).
    MAX_BYTES: ClassVar[int] = 0

    def stream_key(self) -> str:
        """The stream this event belongs to (`model:<name>`, `trace:<id>`, ...). Default: `system`."""
        return "system"

    def audit_subject(self) -> str:
        return self.stream_key()

    def audit_outcome(self) -> str:
        return "ok"

    def audit_details(self) -> dict[str, Any]:
        """What the audit trail may show of this event: never prompt or completion text."""
        return self.model_dump(mode="json")


class NodeLocal(Event):
    """An event about what lives on one machine (its model files, engine builds, memory measurements, saved KV
    slots). Where several gateways share the log, `node` names the one it happened on (stamped by `Blazar.record`),
    and the node-local projections of every other node pass it by. "": the only node (SQLite), or recorded before
    nodes existed: every node's."""

    node: str = ""

    @model_serializer(mode="wrap")
    def _without_empty_node(self, handler: SerializerFunctionWrapHandler) -> Any:
        # With one gateway (SQLite) there is no node to name: its events stay as they were before nodes existed.
        data = handler(self)
        if isinstance(data, dict) and not data.get("node"):
            data.pop("node", None)
        return data


@dataclass(frozen=True, slots=True)
class Recorded:
    """An event as the log holds it: position and envelope plus the typed payload."""

    seq: int
    ts: float
    type: str
    v: int
    stream: str
    trace_id: str | None
    actor: str
    cause: int | None
    event: Event

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "v": self.v,
            "stream": self.stream,
            "trace_id": self.trace_id,
            "actor": self.actor,
            "cause": self.cause,
            "data": self.event.model_dump(mode="json"),
        }


@dataclass(frozen=True, slots=True)
class Pending:
    """An event on its way into the log, with the envelope fields the caller chooses."""

    event: Event
    stream: str
    trace_id: str | None
    actor: str
    cause: int | None
    ts: float
    data: str | None = None  # the payload encoded, where it was already (the group-commit writer checks its size)

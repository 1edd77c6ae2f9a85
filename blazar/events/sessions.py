"""Session events: the KV bank. A session is a conversation a client names (`X-Blazar-Session`); when the instance
serving it is evicted or stopped, the engine slot holding its prefix is saved to disk, and a later turn restores it
before the prompt is sent, but only into an instance of the same identity (`KvIdentity`).

Saves, failed saves, drops and restores made by a command are control events on the stream `session:<name>`; the
per-request verdict (warm, restored or cold, and why) is `request.placed` (blazar/events/requests.py).

Sessions live in their tenant's namespace (keys are tenants: blazar/serving/tenancy.py): every `session` field holds
`<tenant>/<name>` (`key:alice/chat-1`), or the bare name for the machine's owner (and in events from before keys were
tenants). A client's name never holds a "/".
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict

from blazar.events.base import NodeLocal
from blazar.events.bounds import PATH, ClipLines, Text
from blazar.events.types import register

SaveReason = Literal["evicted", "stopped", "shutdown", "requested"]


def qualify(tenant: str | None, session: str | None) -> str | None:
    """A client's session name in its tenant's namespace."""
    if session is None or tenant is None:
        return session
    return f"{tenant}/{session}"


def split_session(qualified: str) -> tuple[str | None, str]:
    """(tenant, the name the client gave) of a stored session name."""
    tenant, sep, name = qualified.rpartition("/")
    return (tenant, name) if sep else (None, qualified)


class KvIdentity(BaseModel):
    """What a saved slot is only valid for: the engine build, the model's bytes, the context per slot and the cache
    types. A restore into an instance that differs in any of these is refused (the engine would read garbage or
    refuse it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str  # the engine's tag: a build's tag names its sources and options
    model_sha256: str
    ctx_tokens: int  # per slot
    cache_type_k: str
    cache_type_v: str
    swa_full: bool = False  # a full-size sliding-window cache (without it a restore forces a full prefill)

    def differences(self, other: KvIdentity) -> dict[str, tuple[Any, Any]]:
        """Each field that differs: (this one's, the other's)."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}


class _SessionEvent(NodeLocal):
    session: str
    model: str

    def stream_key(self) -> str:
        return f"session:{self.session}"


@register
class SessionSaved(_SessionEvent):
    """A session's slot written to the bank (`file`, relative to the data directory)."""

    TYPE = "session.saved"

    instance_id: str
    slot_id: int
    file: Annotated[str, PATH]
    bytes: int
    tokens: int
    duration_ms: float
    identity: KvIdentity
    reason: SaveReason


@register
class SessionSaveFailed(_SessionEvent):
    """A save that did not happen or was not kept: too slow, too large, refused by the engine, or useless (an
    instance without the full sliding-window cache a restore needs)."""

    TYPE = "session.save_failed"

    instance_id: str
    slot_id: int
    reason: Literal["timeout", "too_large", "engine_error", "no_full_window"]
    detail: Text = ""


@register
class SessionDropped(_SessionEvent):
    """A bank entry removed: the bank over `session_bank_mib` (oldest first), or its file found gone at a restore
    (`blazar session rm` is `session.removed`)."""

    TYPE = "session.dropped"

    file: Annotated[str, PATH]
    bytes: int = 0
    reason: Literal["bank_full", "missing"]


@register
class SessionRestored(_SessionEvent):
    """A bank entry restored into a slot by `blazar session restore` (a request's restore is `request.placed`)."""

    TYPE = "session.restored"

    instance_id: str
    slot_id: int
    tokens: int
    duration_ms: float


@register
class SessionRemoved(NodeLocal):
    """`blazar session rm`: the session forgotten, its bank entries' files deleted."""

    TYPE = "session.removed"
    AUDIT = True

    session: str
    files: Annotated[list[str], ClipLines(64, 128, "first")]  # the first 64 (`bytes` counts them all)
    bytes: int = 0

    def stream_key(self) -> str:
        return f"session:{self.session}"

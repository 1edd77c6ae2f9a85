"""The log's retention: request history leaves the live log for immutable archive segments.

`log.archived` is appended in the same transaction that removes the segment's rows from the live log, before the
removal (one commit: either both happened or neither). It names the segment by its file stem (a bare name under
the archive directory, never a path) and pins its content: the file's sha256, the manifest's sha256, and the
segment hash chain (`prev` is the previous segment's `head`, so the segments form one chain from the first).
"""

from __future__ import annotations

from blazar.events.base import Event
from blazar.events.bounds import Text
from blazar.events.types import event_class, known_types, register


@register
class LogArchived(Event):
    """Events `first_seq..last_seq` of the archivable types (`count` of them) moved into segment `name`."""

    TYPE = "log.archived"
    AUDIT = True

    segment: int  # 1, 2, ... in archive order
    name: str  # the segment's file stem under the archive directory
    first_seq: int
    last_seq: int
    count: int
    bytes: int  # the compressed segment file's size
    sha256: str  # of the compressed segment file
    manifest_sha256: str  # of the manifest file as written
    prev: str  # the chain hash the segment's first line follows (the previous segment's head; zeros for the first)
    head: str  # the chain hash of the segment's last line
    ts_min: float
    ts_max: float
    cutoff: float  # events recorded before this time were archived (now - request_retention)
    audit_records: int = 0  # audit-relevant events among them (the audit export reads them from the segment)

    def stream_key(self) -> str:
        return "log"


def archivable_types() -> list[str]:
    """Wire names of the event types that leave the live log once older than `request_retention`."""
    return [t for t in known_types() if (cls := event_class(t)) is not None and cls.ARCHIVABLE]


@register
class LogArchiveFailed(Event):
    """An archive run stopped without removing anything from the live log (a segment that did not verify, a full
    disk, a count that did not match); `segments` were archived by the same run before it stopped."""

    TYPE = "log.archive_failed"
    AUDIT = True

    reason: Text
    cutoff: float
    segments: int = 0

    def stream_key(self) -> str:
        return "log"

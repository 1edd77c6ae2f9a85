"""The compliance export: audit records read from the log, written as hash-chained JSONL, and the check that
names the first edited, dropped or reordered line of such a file. Read side: it never appends to the log.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from blazar.errors import AuditChainBroken, LogError
from blazar.events.chain import GENESIS, line_hash, seal
from blazar.events.log import EventLog
from blazar.events.types import audit_types
from blazar.projections.audit import audit_record, iso

FORMAT = "blazar-audit"
VERSION = 1
# Only what the chain check itself needs; every other field is covered by the line's hash.
HEADER_KEYS = frozenset({"kind", "format", "version", "count", "first_seq", "last_seq", "prev", "hash"})
RECORD_KEYS = frozenset({"kind", "seq", "prev", "hash"})


@dataclass(frozen=True, slots=True)
class ChainSummary:
    """An export as written or as verified: how many records, their seq range, and the last line's hash."""

    records: int
    first_seq: int | None
    last_seq: int | None
    head: str

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True, "records": self.records, "first_seq": self.first_seq, "last_seq": self.last_seq,
            "head": self.head,
        }

    def describe(self) -> str:
        noun = "record" if self.records == 1 else "records"
        span = f", seq {self.first_seq}..{self.last_seq}" if self.records else ""
        return f"{self.records} {noun}{span}, chain head {self.head}"


# -- the line format -----------------------------------------------------------------------------------------


# -- export --------------------------------------------------------------------------------------------------


async def export_audit(
    log: EventLog,
    sink: BinaryIO,
    *,
    pii_scrub: bool,
    now: float,
    since: float | None = None,
    until: float | None = None,
) -> ChainSummary:
    """Write the header, then one chained line per audit record in seq order, to `sink`.

    NOTE: two passes over the log rather than a temporary file: the first counts undecoded rows for the
    header, the second decodes and writes. Both stop at the seq that was last when the export began, so
    appends made meanwhile (always at higher seqs) cannot make them disagree.
    """
    upto = await log.last_seq()
    filters: dict[str, Any] = {"types": audit_types(), "since": since, "until": until, "upto": upto}
    count, first_seq, last_seq = await _scan(log, filters)
    header = {
        "kind": "header", "format": FORMAT, "version": VERSION, "exported_at": iso(now),
        "since": None if since is None else iso(since), "until": None if until is None else iso(until),
        "count": count, "first_seq": first_seq, "last_seq": last_seq, "pii_scrub": pii_scrub,
    }
    line, head = seal(header, GENESIS)
    sink.write(line)
    written = 0
    async for rec in log.read(**filters):
        record = audit_record(rec, pii_scrub=pii_scrub)  # the one place an audit line's content is chosen
        if record is None:  # not reachable through the type filter; it would surface as the count check below
            continue
        line, head = seal({**record, "kind": "record"}, head)
        sink.write(line)
        written += 1
    if written != count:
        raise LogError(f"audit export wrote {written} records but counted {count}; the file is incomplete")
    return ChainSummary(records=count, first_seq=first_seq, last_seq=last_seq, head=head)


async def _scan(log: EventLog, filters: Mapping[str, Any]) -> tuple[int, int | None, int | None]:
    count, first_seq, last_seq = 0, None, None
    async for rows in log.read_rows(**filters):
        if first_seq is None:
            first_seq = rows[0][0]
        count += len(rows)
        last_seq = rows[-1][0]
    return count, first_seq, last_seq


async def export_to_file(
    log: EventLog,
    path: Path,
    *,
    pii_scrub: bool,
    now: float,
    since: float | None = None,
    until: float | None = None,
) -> ChainSummary:
    """Export into `path` atomically: a temporary file beside it, fsynced, renamed over it when complete."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            summary = await export_audit(log, fh, pii_scrub=pii_scrub, now=now, since=since, until=until)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return summary


# -- verify --------------------------------------------------------------------------------------------------


def verify_file(path: Path) -> ChainSummary:
    """Verify an export file; raises AuditChainBroken naming the first bad line."""
    with path.open("rb") as fh:
        return verify_lines(fh)


def verify_lines(lines: Iterable[bytes]) -> ChainSummary:
    """Verify an export given as lines (with or without their newlines), streaming: one line in memory."""
    chain = _Chain()
    n = 0
    for n, raw in enumerate(lines, start=1):
        chain.check(n, _parse(n, raw))
    return chain.finish(next_line=n + 1)


def _parse(n: int, raw: bytes) -> dict[str, Any]:
    text = raw.rstrip(b"\r\n")
    if not text.strip():
        raise AuditChainBroken(n, "an empty line")
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise AuditChainBroken(n, "not JSON") from None
    if not isinstance(obj, dict):
        raise AuditChainBroken(n, "not a JSON object")
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Chain:
    """The state of a verification between lines: the header, the previous hash and seq, records seen."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.prev = GENESIS
        self.records = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None

    def check(self, n: int, obj: dict[str, Any]) -> None:
        self._shape(n, obj)
        if line_hash(obj) != obj["hash"]:
            raise AuditChainBroken(n, "content does not match its hash: the line was edited")
        if obj["prev"] != self.prev:
            if n == 1:
                raise AuditChainBroken(n, "the header does not start a chain (its prev is not the genesis)")
            detail = f"does not follow line {n - 1}: a line was dropped, inserted or reordered"
            raise AuditChainBroken(n, detail)
        self.prev = obj["hash"]
        if n == 1:
            self.header = obj
        else:
            self._record(n, obj)

    def _shape(self, n: int, obj: dict[str, Any]) -> None:
        if n == 1:
            if obj.get("kind") != "header" or obj.get("format") != FORMAT:
                raise AuditChainBroken(n, f"not a {FORMAT} export: the first line must be its header")
            if obj.get("version") != VERSION:
                version = obj.get("version")
                raise AuditChainBroken(n, f"unsupported {FORMAT} version {version!r} (this reads {VERSION})")
            required = HEADER_KEYS
        elif obj.get("kind") != "record":
            raise AuditChainBroken(n, f"expected an audit record, found kind {obj.get('kind')!r}")
        else:
            required = RECORD_KEYS
        missing = sorted(required - obj.keys())
        if missing:
            raise AuditChainBroken(n, f"missing keys: {', '.join(missing)}")
        if n == 1 and not (_is_int(obj["count"]) and obj["count"] >= 0):
            raise AuditChainBroken(n, f"count is not a record count: {obj['count']!r}")
        if n > 1 and not _is_int(obj["seq"]):
            raise AuditChainBroken(n, f"seq is not an integer: {obj['seq']!r}")

    def _record(self, n: int, obj: dict[str, Any]) -> None:
        assert self.header is not None  # line 1 is the header or check() raised
        seq = obj["seq"]
        if self.last_seq is not None and seq <= self.last_seq:
            raise AuditChainBroken(n, f"seq {seq} does not come after seq {self.last_seq}: out of order")
        if self.records == self.header["count"]:
            raise AuditChainBroken(n, f"a record beyond the header's count of {self.header['count']}")
        self.records += 1
        self.first_seq = seq if self.first_seq is None else self.first_seq
        self.last_seq = seq

    def finish(self, *, next_line: int) -> ChainSummary:
        if self.header is None:
            raise AuditChainBroken(1, "the file is empty: no header")
        count = self.header["count"]
        if self.records < count:
            raise AuditChainBroken(
                next_line,
                f"missing: the header promises {count} records but the file ends after {self.records}: "
                "lines were dropped from the end",
            )
        first, last = self.header["first_seq"], self.header["last_seq"]
        if (first, last) != (self.first_seq, self.last_seq):
            raise AuditChainBroken(
                1, f"the header's seq range {first}..{last} does not match the records' "
                f"{self.first_seq}..{self.last_seq}"
            )
        return ChainSummary(self.records, self.first_seq, self.last_seq, head=self.prev)

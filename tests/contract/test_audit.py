"""The audit chain over the backend's log: the export holds exactly the log's audit-relevant events, verifies, and
names the first line that was edited, dropped, reordered or cut off; `blazar audit` does the same end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from blazar.clock import FakeClock
from blazar.errors import AuditChainBroken
from blazar.events.log import EventLog
from blazar.events.system import SnapshotTaken
from blazar.queries.audit import audit_types, export_to_file, line_hash, verify_file, verify_lines
from tests.conftest import Cli
from tests.contract.backends import Backend
from tests.contract.workload import aliased, received

EXIT_CHAIN_BROKEN = AuditChainBroken.exit_code


async def _seed(log: EventLog) -> list[int]:
    """Audit-relevant events among request events (which the export leaves out); returns the audit seqs."""
    audited: list[int] = []
    for i in range(6):
        ev = received("t", i)
        await log.append(ev, actor="gateway", trace_id=ev.trace_id)
        (rec,) = await log.append(aliased("qwen", i), actor="cli:alice" if i % 2 else "key:ops")
        audited.append(rec.seq)
    (rec,) = await log.append(SnapshotTaken(path="/s/1", seq_last=12, event_count=12, db_sha256="b" * 64),
                              actor="daemon")
    return [*audited, rec.seq]


def _tamper_edit(lines: list[bytes]) -> tuple[list[bytes], int]:
    obj = orjson.loads(lines[3])
    obj["details"]["alias"] = "someone-else"  # the hash is left as it was
    return [*lines[:3], orjson.dumps(obj) + b"\n", *lines[4:]], 4


def _tamper_rehash_without_chain(lines: list[bytes]) -> tuple[list[bytes], int]:
    # An editor who recomputes the edited line's own hash still breaks the link to the line after it.
    obj = orjson.loads(lines[3])
    obj["outcome"] = "refused"
    obj["hash"] = line_hash(obj)
    return [*lines[:3], orjson.dumps(obj) + b"\n", *lines[4:]], 5


TAMPERS: dict[str, Callable[[list[bytes]], tuple[list[bytes], int]]] = {
    "edited record": _tamper_edit,
    "edited and rehashed record": _tamper_rehash_without_chain,
    "edited header": lambda ls: ([ls[0].replace(b'"count":7', b'"count":6'), *ls[1:]], 1),
    "dropped record": lambda ls: ([*ls[:2], *ls[3:]], 3),
    "reordered records": lambda ls: ([*ls[:2], ls[3], ls[2], *ls[4:]], 3),
    "inserted copy": lambda ls: ([*ls[:3], ls[2], *ls[3:]], 4),
    "cut-off tail": lambda ls: (ls[:-1], len(ls)),
}


@pytest.fixture
async def export(event_log: EventLog, clock: FakeClock, tmp_path: Path) -> tuple[Path, list[int]]:
    seqs = await _seed(event_log)
    path = tmp_path / "audit.jsonl"
    summary = await export_to_file(event_log, path, pii_scrub=True, now=clock.now())
    assert (summary.records, summary.first_seq, summary.last_seq) == (len(seqs), seqs[0], seqs[-1])
    return path, seqs


async def test_the_export_holds_the_logs_audit_events_and_verifies(
    event_log: EventLog, export: tuple[Path, list[int]]
) -> None:
    path, seqs = export
    header, *records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["seq"] for r in records] == seqs == [r.seq async for r in event_log.read(types=audit_types())]
    assert [r["action"] for r in records] == ["model.aliased"] * 6 + [SnapshotTaken.TYPE]
    assert (header["count"], header["first_seq"], header["last_seq"]) == (7, seqs[0], seqs[-1])
    assert b"cli:alice" not in path.read_bytes() and records[0]["actor"] == "key:ops"  # user names scrubbed
    summary = verify_file(path)
    assert (summary.records, summary.first_seq, summary.last_seq) == (7, seqs[0], seqs[-1])
    assert summary.head == records[-1]["hash"]


@pytest.mark.parametrize("tamper", list(TAMPERS.values()), ids=list(TAMPERS))
async def test_a_tampered_export_is_detected_at_the_first_bad_line(
    export: tuple[Path, list[int]], tamper: Callable[[list[bytes]], tuple[list[bytes], int]]
) -> None:
    lines = export[0].read_bytes().splitlines(keepends=True)
    tampered, first_bad = tamper(lines)
    assert tampered != lines
    with pytest.raises(AuditChainBroken) as info:
        verify_lines(tampered)
    assert info.value.line == first_bad, info.value.message


def test_blazar_audit_export_verifies_and_audit_verify_names_a_tampered_line(backend: Backend, tmp_path: Path) -> None:
    async def seed() -> list[int]:
        log = await backend.open()
        try:
            return await _seed(log)
        finally:
            await log.close()

    seqs = asyncio.run(seed())
    cli = Cli(backend.paths.data_dir)
    cli.env.update(backend.env)
    out = tmp_path / "cli-audit.jsonl"
    cli("audit", "export", "--out", str(out))
    ok = verify_file(out)
    assert (ok.records, ok.first_seq, ok.last_seq) == (len(seqs), seqs[0], seqs[-1])

    tampered, first_bad = _tamper_edit(out.read_bytes().splitlines(keepends=True))
    bad = tmp_path / "tampered.jsonl"
    bad.write_bytes(b"".join(tampered))
    res = cli("audit", "verify", str(bad), "--json", check=False)
    assert res.code == EXIT_CHAIN_BROKEN
    report = res.json()
    assert (report["ok"], report["line"]) == (False, first_bad) and "edited" in report["error"]

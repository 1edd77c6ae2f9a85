"""The audit export and its hash chain: what a line holds, what it never holds, and what verify catches."""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from blazar.clock import FakeClock
from blazar.context import Blazar
from blazar.errors import AuditChainBroken
from blazar.events import Event, register
from blazar.events.system import ConfigChanged, SnapshotTaken
from blazar.operations.config import set_value
from blazar.projections.audit import scrub_actor
from blazar.queries.audit import (
    GENESIS,
    export_audit,
    export_to_file,
    line_hash,
    seal,
    verify_file,
    verify_lines,
)

PROMPT = "Summarise the secret merger plan for Project Nightjar"
COMPLETION = "The merger with Acme closes on Friday"


@register
class _RequestCompleted(Event):
    """A request event with content: only its audit_details may reach the export."""

    TYPE: ClassVar[str] = "test.request_completed"
    AUDIT: ClassVar[bool] = True
    CONTROL: ClassVar[bool] = False

    model: str
    prompt: str
    completion: str
    tokens_out: int

    def audit_details(self) -> dict[str, Any]:
        return {"model": self.model, "tokens_out": self.tokens_out}


@register
class _Heartbeat(Event):
    """Not audit-relevant: never exported, and leaves a gap in the exported seqs."""

    TYPE: ClassVar[str] = "test.heartbeat_noted"


CHANGES = [("telemetry.log_level", "info"), ("log.checkpoint_every", "500"), ("log.group_commit_ms", "10"),
           ("telemetry.log_level", "error"), ("log.checkpoint_every", "600")]


async def _seed(app: Blazar, clock: FakeClock) -> list[float]:
    """Five config.changed events, ten seconds apart (seq 1..5); returns their timestamps."""
    stamps = []
    for key, value in CHANGES:
        clock.advance(10)
        rec = await set_value(app, key, value)
        assert rec is not None
        stamps.append(rec.ts)
    return stamps


async def _export(app: Blazar, *, pii_scrub: bool = True, **window: float) -> list[bytes]:
    buf = io.BytesIO()
    await export_audit(app.log, buf, pii_scrub=pii_scrub, now=app.clock.now(), **window)
    return buf.getvalue().splitlines(keepends=True)


def _broken(lines: list[bytes]) -> AuditChainBroken:
    with pytest.raises(AuditChainBroken) as info:
        verify_lines(lines)
    return info.value


def _objs(lines: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in lines]


# -- the export ----------------------------------------------------------------------------------------------


async def test_clean_export_verifies_and_chains_every_line(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    header, *records = _objs(lines)
    assert header["kind"] == "header" and header["format"] == "blazar-audit" and header["version"] == 1
    assert (header["count"], header["first_seq"], header["last_seq"]) == (5, 1, 5)
    assert header["prev"] == GENESIS and header["pii_scrub"] is True
    assert header["since"] is None and header["until"] is None
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5]
    assert {r["kind"] for r in records} == {"record"} and {r["action"] for r in records} == {"config.changed"}
    assert records[0]["details"] == {"key": "telemetry.log_level", "old": None, "new": "info", "source": "cli"}
    objs = [header, *records]
    for before, after in itertools.pairwise(objs):
        assert after["prev"] == before["hash"]
    for obj, line in zip(objs, lines, strict=True):
        assert obj["hash"] == line_hash(obj)
        assert line == orjson.dumps(obj, option=orjson.OPT_SORT_KEYS) + b"\n"  # canonical: sorted, compact

    summary = verify_lines(lines)
    assert (summary.records, summary.first_seq, summary.last_seq) == (5, 1, 5)
    assert summary.head == records[-1]["hash"]


def test_line_hash_covers_prev_but_not_hash() -> None:
    line, digest = seal({"kind": "record", "seq": 1}, GENESIS)
    obj = orjson.loads(line)
    assert obj["hash"] == digest == line_hash({**obj, "hash": "anything"})
    assert line_hash({**obj, "prev": "1" * 64}) != digest


async def test_export_holds_only_audit_events_and_tolerates_seq_gaps(app: Blazar, clock: FakeClock) -> None:
    await app.log.append(_Heartbeat(), actor="daemon")
    await _seed(app, clock)
    await app.log.append(_Heartbeat(), actor="daemon")
    await app.log.append(
        SnapshotTaken(path="/s/x.db", seq_last=7, event_count=7, db_sha256="ab"), actor="daemon"
    )
    lines = await _export(app)
    header, *records = _objs(lines)
    assert [r["seq"] for r in records] == [2, 3, 4, 5, 6, 8]
    assert records[-1]["action"] == "snapshot.taken" and records[-1]["subject"] == "snapshot"
    assert b"heartbeat" not in b"".join(lines)
    assert verify_lines(lines).records == 6 and (header["first_seq"], header["last_seq"]) == (2, 8)


async def test_since_and_until_select_a_window(app: Blazar, clock: FakeClock) -> None:
    stamps = await _seed(app, clock)
    lines = await _export(app, since=stamps[1], until=stamps[3])
    header, *records = _objs(lines)
    assert [r["seq"] for r in records] == [2, 3, 4]
    assert header["since"] == "2023-11-14T22:13:40.000000Z"
    assert header["until"] == "2023-11-14T22:14:00.000000Z"
    assert verify_lines(lines).records == 3


async def test_an_export_with_no_records_still_verifies(app: Blazar, clock: FakeClock) -> None:
    assert verify_lines(await _export(app)).records == 0  # an empty log
    await _seed(app, clock)
    lines = await _export(app, since=clock.now() + 60)
    (header,) = _objs(lines)
    assert (header["count"], header["first_seq"], header["last_seq"]) == (0, None, None)
    summary = verify_lines(lines)
    assert (summary.records, summary.first_seq, summary.head) == (0, None, header["hash"])


async def test_prompt_and_completion_text_never_reach_the_export(app: Blazar) -> None:
    event = _RequestCompleted(model="qwen3-8b", prompt=PROMPT, completion=COMPLETION, tokens_out=42)
    await app.log.append(event, actor="key:team-a", trace_id="t-1")
    lines = await _export(app)
    blob = b"".join(lines)
    assert PROMPT.encode() not in blob and COMPLETION.encode() not in blob and b"Nightjar" not in blob
    (record,) = _objs(lines)[1:]
    assert record["details"] == {"model": "qwen3-8b", "tokens_out": 42}
    assert record["action"] == "test.request_completed" and record["trace_id"] == "t-1"
    assert verify_lines(lines).records == 1


@pytest.mark.parametrize("scrub", [True, False])
async def test_pii_scrub_pseudonymises_actor_user_names(app: Blazar, scrub: bool) -> None:
    await app.log.append(ConfigChanged(key="log_level", new="debug"), actor="cli:alice")
    lines = await _export(app, pii_scrub=scrub)
    header, record = _objs(lines)
    assert header["pii_scrub"] is scrub
    assert record["actor"] == (scrub_actor("cli:alice") if scrub else "cli:alice")
    assert (b"alice" in b"".join(lines)) is not scrub
    assert verify_lines(lines).records == 1


async def test_export_to_file_is_atomic_and_verifies(app: Blazar, clock: FakeClock, tmp_path: Path) -> None:
    await _seed(app, clock)
    target = tmp_path / "out" / "audit.jsonl"
    target.parent.mkdir()
    target.write_text("an older export\n")
    written = await export_to_file(app.log, target, pii_scrub=True, now=clock.now())
    assert [p.name for p in target.parent.iterdir()] == ["audit.jsonl"]  # the temporary file is gone
    assert verify_file(target) == written


# -- verify catches tampering --------------------------------------------------------------------------------


async def test_verify_names_an_edited_line(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    edited = lines[3].replace(b'"actor":"test:pytest"', b'"actor":"test:someone-else"')
    assert edited != lines[3]
    lines[3] = edited
    exc = _broken(lines)
    assert exc.line == 4 and "edited" in exc.message
    assert exc.message.startswith("line 4: ")


async def test_verify_names_the_line_after_an_edit_whose_hash_was_recomputed(
    app: Blazar, clock: FakeClock
) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    obj = orjson.loads(lines[2])
    obj["actor"] = "cli:mallory"
    body = {k: v for k, v in obj.items() if k not in ("hash", "prev")}
    lines[2], _ = seal(body, obj["prev"])
    exc = _broken(lines)
    assert exc.line == 4 and "does not follow line 3" in exc.message


async def test_verify_names_the_line_after_a_deleted_one(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    del lines[2]  # the record on line 3
    exc = _broken(lines)
    assert exc.line == 3 and "does not follow line 2" in exc.message and "dropped" in exc.message


async def test_verify_names_the_first_of_two_swapped_lines(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    lines[3], lines[4] = lines[4], lines[3]  # lines 4 and 5
    exc = _broken(lines)
    assert exc.line == 4 and "reordered" in exc.message


async def test_verify_catches_a_dropped_last_line_by_the_header_count(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = (await _export(app))[:-1]
    exc = _broken(lines)
    assert exc.line == 6 and "promises 5 records" in exc.message and "ends after 4" in exc.message


async def test_verify_catches_an_appended_line_beyond_the_count(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    last = orjson.loads(lines[-1])
    extra, _ = seal({k: v for k, v in last.items() if k not in ("hash", "prev")} | {"seq": 99}, last["hash"])
    exc = _broken([*lines, extra])
    assert exc.line == 7 and "beyond the header's count of 5" in exc.message


async def test_verify_names_line_1_when_the_header_is_edited(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    lines[0] = lines[0].replace(b'"count":5', b'"count":4')
    exc = _broken(lines)
    assert exc.line == 1 and "edited" in exc.message


async def test_verify_refuses_a_file_without_its_header(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    exc = _broken((await _export(app))[1:])
    assert exc.line == 1 and "header" in exc.message


@pytest.mark.parametrize(
    ("lines", "line", "words"),
    [
        ([], 1, "empty"),
        ([b"not json at all\n"], 1, "not JSON"),
        ([b"[1, 2]\n"], 1, "not a JSON object"),
        ([b'{"kind": "header", "format": "blazar-audit", "version": 2}\n'], 1, "unsupported"),
        ([b'{"kind": "header", "format": "blazar-audit", "version": 1}\n'], 1, "missing keys"),
    ],
)
def test_verify_refuses_what_is_not_an_export(lines: list[bytes], line: int, words: str) -> None:
    exc = _broken(lines)
    assert exc.line == line and words in exc.message


async def test_verify_names_a_blank_or_garbled_line_in_the_middle(app: Blazar, clock: FakeClock) -> None:
    await _seed(app, clock)
    lines = await _export(app)
    assert _broken([*lines[:2], b"\n", *lines[2:]]).line == 3
    lines[4] = lines[4][:40] + b"\n"
    exc = _broken(lines)
    assert exc.line == 5 and "not JSON" in exc.message


def test_pii_scrub_covers_the_daemon_user_and_keeps_key_names() -> None:
    assert scrub_actor("daemon:root").startswith("daemon:u-")
    assert scrub_actor("daemon:root").removeprefix("daemon:") == scrub_actor("cli:root").removeprefix("cli:")
    assert "root" not in scrub_actor("daemon:root")
    assert scrub_actor("key:ci-bot") == "key:ci-bot"
    assert scrub_actor("system") == "system"

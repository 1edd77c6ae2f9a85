"""`blazar audit export|verify` end to end through the real `blazar` command: files, exit codes, messages."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from blazar.projections.audit import scrub_actor
from tests.conftest import Cli

EXIT_CHAIN_BROKEN = 5


def _changes(cli: Cli) -> None:
    """Four config.changed events: seq 1..4, so an export has a header and four records (lines 2..5)."""
    cli("config", "set", "telemetry.log_level", "info")
    cli("config", "set", "log.checkpoint_every", "500")
    cli("config", "set", "telemetry.log_level", "error")
    cli("config", "set", "log.group_commit_ms", "20")


def _export_file(cli: Cli, path: Path) -> list[str]:
    cli("audit", "export", "--out", str(path))
    return path.read_text().splitlines(keepends=True)


def _verify_fails(cli: Cli, path: Path, lines: list[str]) -> str:
    path.write_text("".join(lines))
    res = cli("audit", "verify", str(path), check=False)
    assert res.code == EXIT_CHAIN_BROKEN, res.stderr
    assert res.stdout == ""
    return res.stderr


def test_export_to_a_file_or_stdout_then_verify(cli: Cli, tmp_path: Path) -> None:
    _changes(cli)
    target = tmp_path / "audit.jsonl"
    res = cli("audit", "export", "--out", str(target))
    assert res.stdout == ""
    assert f"wrote {target}: 4 records, seq 1..4, chain head" in res.stderr
    header, *records = [json.loads(line) for line in target.read_text().splitlines()]
    assert header["kind"] == "header" and header["count"] == 4
    assert [r["seq"] for r in records] == [1, 2, 3, 4] and records[1]["details"]["new"] == 500
    head = records[-1]["hash"]
    assert head in res.stderr

    ok = cli("audit", "verify", str(target))
    assert ok.stdout.strip() == f"ok: 4 records, seq 1..4, chain head {head}"
    as_json = cli("audit", "verify", str(target), "--json").json()
    assert as_json == {"ok": True, "records": 4, "first_seq": 1, "last_seq": 4, "head": head}

    # Without --out the export goes to stdout, and says nothing on stderr.
    res = cli("audit", "export")
    assert res.stderr == ""
    lines = res.json_lines()
    assert lines[0]["kind"] == "header" and [r["seq"] for r in lines[1:]] == [1, 2, 3, 4]
    saved = tmp_path / "stdout.jsonl"
    saved.write_text(res.stdout)
    assert cli("audit", "verify", str(saved)).stdout.startswith("ok: 4 records, seq 1..4")


def test_verify_names_an_edited_a_deleted_a_swapped_and_a_missing_line(cli: Cli, tmp_path: Path) -> None:
    _changes(cli)
    lines = _export_file(cli, tmp_path / "clean.jsonl")
    assert len(lines) == 5

    edited = list(lines)
    edited[2] = edited[2].replace('"new":500', '"new":5000')
    assert edited[2] != lines[2]
    path = tmp_path / "edited.jsonl"
    msg = _verify_fails(cli, path, edited)
    assert f"error: {path}: line 3: content does not match its hash: the line was edited" in msg

    path = tmp_path / "deleted.jsonl"
    msg = _verify_fails(cli, path, lines[:2] + lines[3:])
    assert f"{path}: line 3: does not follow line 2: a line was dropped, inserted or reordered" in msg

    swapped = list(lines)
    swapped[2], swapped[3] = swapped[3], swapped[2]
    path = tmp_path / "swapped.jsonl"
    msg = _verify_fails(cli, path, swapped)
    assert f"{path}: line 3: does not follow line 2" in msg

    path = tmp_path / "cut.jsonl"
    msg = _verify_fails(cli, path, lines[:-1])
    assert f"{path}: line 5: missing: the header promises 4 records but the file ends after 3" in msg

    header_edited = [lines[0].replace('"count":4', '"count":3'), *lines[1:]]
    path = tmp_path / "header.jsonl"
    msg = _verify_fails(cli, path, header_edited)
    assert f"{path}: line 1: content does not match its hash" in msg

    res = cli("audit", "verify", str(path), "--json", check=False)
    assert res.code == EXIT_CHAIN_BROKEN
    assert res.json() == {"ok": False, "file": str(path), "line": 1,
                          "error": "line 1: content does not match its hash: the line was edited"}


def test_pii_scrub_follows_the_config_setting(cli: Cli) -> None:
    cli.env["USER"] = "alice"
    cli("config", "set", "telemetry.log_level", "debug")
    scrubbed = cli("audit", "export")
    assert "alice" not in scrubbed.stdout
    header, record = scrubbed.json_lines()
    assert header["pii_scrub"] is True and record["actor"] == scrub_actor("cli:alice")

    cli("config", "set", "telemetry.pii_scrub", "false")
    header, *records = cli("audit", "export").json_lines()
    assert header["pii_scrub"] is False
    assert [(r["actor"], r["details"]["key"]) for r in records] == [("cli:alice", "telemetry.log_level"),
                                                                   ("cli:alice", "telemetry.pii_scrub")]


def test_since_and_until_select_a_window(cli: Cli, tmp_path: Path) -> None:
    _changes(cli)
    records = cli("audit", "export").json_lines()[1:]
    # Each event came from its own process, so midpoints between their times separate them exactly.
    stamps = [datetime.fromisoformat(r["ts"].replace("Z", "+00:00")).timestamp() for r in records]
    since, until = str((stamps[0] + stamps[1]) / 2), str((stamps[2] + stamps[3]) / 2)
    window = cli("audit", "export", "--since", since, "--until", until).json_lines()
    assert [r["seq"] for r in window[1:]] == [2, 3] and window[0]["count"] == 2
    assert window[0]["since"] is not None and window[0]["until"] is not None
    assert len(cli("audit", "export", "--since", "1h").json_lines()) == 5

    empty = tmp_path / "empty.jsonl"
    cli("audit", "export", "--until", "2000-01-01", "--out", str(empty))
    (header,) = [json.loads(line) for line in empty.read_text().splitlines()]
    assert header["count"] == 0
    assert cli("audit", "verify", str(empty)).stdout.startswith("ok: 0 records, chain head ")

    bad = cli("audit", "export", "--since", "yesterday-ish", check=False)
    assert bad.code == 2 and "not a time" in bad.stderr


def test_audit_help_and_a_missing_file(cli: Cli, tmp_path: Path) -> None:
    top = cli("audit", "--help").stdout
    assert "export" in top and "verify" in top
    export_help = cli("audit", "export", "--help").stdout
    assert "--since" in export_help and "--until" in export_help and "--out" in export_help
    assert "first bad line" in cli("audit", "verify", "--help").stdout
    res = cli("audit", "verify", str(tmp_path / "nope.jsonl"), check=False)
    assert res.code == 2 and "does not exist" in res.stderr

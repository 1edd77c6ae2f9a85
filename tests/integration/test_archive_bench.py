"""bench/archive.py keeps working: a quick run builds a year-shaped log, archives it with the default policy and
reports every measure, with the archived log smaller and `why` finding the same old traces (timings not judged)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]


def test_the_archive_benchmark_runs_end_to_end_on_a_small_log(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "archive.py"), "--events", "12000", "--out", str(out),
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "why of an old trace, cold" in proc.stdout and "warm" in proc.stdout and "after VACUUM" in proc.stdout
    report = orjson.loads(out.read_bytes())
    r = report["results"]
    assert report["events"] == 12_000 and r["build"]["events"] == 12_000
    before, after = r["never_archived"], r["archived"]
    assert before["size"]["live_events"] == 12_000
    # About 11/12 of the year leaves (request events only); the group-commit batch of the first pass stays live.
    assert 10_000 < r["archive"]["events"] < 11_500 and r["archive"]["segments"] >= 1
    assert after["size"]["live_events"] == 12_000 + 1_000 - r["archive"]["events"] + r["archive"]["segments"]
    assert after["size"]["used_bytes"] < before["size"]["used_bytes"]
    assert r["archive"]["archive_dir_bytes"] > r["archive"]["segment_data_bytes"] > 0
    # The full replay reads the archive too: every event, live or archived, is folded.
    assert before["replay"]["events"] == 13_000
    assert after["replay"]["events"] == 14_000 + r["archive"]["segments"]
    assert before["why"]["traces"] == after["why"]["traces"] == 20
    assert after["startup"]["folded_at_start"] == 0
    assert r["vacuum"]["file_bytes"] < after["size"]["file_bytes"]
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # the log was built and removed in --dir

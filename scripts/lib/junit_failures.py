"""Every test that failed or errored in any of the given JUnit XML files (one per run), with the runs it failed in;
exit 1 when there is one, or when a run wrote no report (it crashed before the end). scripts/flake-hunt prints it."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def failures(report: Path) -> list[str]:
    root = ET.parse(report).getroot()
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return failed


def main(paths: list[str]) -> int:
    failed_in: dict[str, list[int]] = defaultdict(list)
    missing = []
    for run, path in enumerate(sorted(paths, key=lambda p: int(Path(p).stem.rsplit("-", 1)[-1])), start=1):
        if not Path(path).is_file():
            missing.append(run)
            continue
        for test in failures(Path(path)):
            failed_in[test].append(run)
    for run in missing:
        print(f"run {run}: no report (pytest did not finish; see its log)")
    for test, runs in sorted(failed_in.items()):
        print(f"FLAKY or FAILING  {test}  (failed in run{'s' if len(runs) > 1 else ''} {', '.join(map(str, runs))}"
              f" of {len(paths)})")
    if not failed_in and not missing:
        print(f"clean: no test failed in {len(paths)} run(s)")
    return 1 if failed_in or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The slowest tests and files of a pytest run, from its JUnit XML (`pytest --junitxml=FILE`): how
docs/19.TESTING.md's tables are made. A test's time is its setup, call and teardown (pytest's junit `time`), so a
module's shared daemon is counted in the test that started it.

    python scripts/lib/durations.py run.xml [--tests 30] [--files 15] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def read(path: str) -> list[tuple[str, str, float, str]]:
    """(file, test, seconds, outcome) for every test case."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname") or ""
        # classname is the dotted module path, then the class if any: tests.integration.test_x[.TestY]
        parts = classname.split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        file = "/".join(parts[:module + 1]) + ".py"
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        rows.append((file, case.get("name") or "", float(case.get("time") or 0), outcome))
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit")
    ap.add_argument("--tests", type=int, default=30)
    ap.add_argument("--files", type=int, default=15)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    rows = read(args.junit)
    total = sum(r[2] for r in rows)
    per_file: dict[str, list[float]] = defaultdict(list)
    for file, _, secs, _ in rows:
        per_file[file].append(secs)
    tiers: dict[str, float] = defaultdict(float)
    for file, times in per_file.items():
        tiers[file.split("/")[1] if file.count("/") >= 2 else file] += sum(times)
    sep = " | " if args.markdown else "  "
    print(f"{len(rows)} tests, {total:.0f} s in all; by tier: "
          + ", ".join(f"{t} {s:.0f} s" for t, s in sorted(tiers.items(), key=lambda x: -x[1])))
    print(f"\nThe {args.tests} slowest tests")
    if args.markdown:
        print("\n| s | test |\n|---:|---|")
    for file, name, secs, outcome in sorted(rows, key=lambda r: -r[2])[:args.tests]:
        line = f"{secs:6.1f}{sep}{file}::{name}" + ("" if outcome == "passed" else f" ({outcome})")
        print(f"| {line} |" if args.markdown else line)
    print(f"\nThe {args.files} slowest files")
    if args.markdown:
        print("\n| s | tests | file |\n|---:|---:|---|")
    for file, times in sorted(per_file.items(), key=lambda kv: -sum(kv[1]))[:args.files]:
        line = f"{sum(times):6.1f}{sep}{len(times):4d}{sep}{file}"
        print(f"| {line} |" if args.markdown else line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

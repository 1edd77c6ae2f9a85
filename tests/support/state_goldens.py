"""The state goldens: each projection's state schema (what its checkpoints hold), one file per projection and version
in tests/fixtures/projections/. A state whose shape changes without a new `version` would meet checkpoints it cannot
load; the golden for that version no longer matches and tests/unit/projections/test_state_goldens.py says so.

`python -m tests.support.state_goldens` checks; `--write` writes the current versions' goldens (after a version bump)
and removes those of versions no longer current (their checkpoints are dropped at start, nothing reads them).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from blazar.projections import all_projections
from blazar.projections.codec import codec_for

GOLDENS = Path(__file__).resolve().parents[1] / "fixtures" / "projections"


def shape(schema: Any) -> Any:
    """The schema less its words (titles, docstrings): a reworded docstring is not a new shape."""
    if isinstance(schema, dict):
        return {k: shape(v) for k, v in schema.items() if k not in ("title", "description")}
    if isinstance(schema, list):
        return [shape(v) for v in schema]
    return schema


def current() -> dict[str, dict[str, Any]]:
    """File name -> schema, for every projection's current version."""
    return {f"{p.name}.v{p.version}.json": shape(codec_for(p.state_type).schema()) for p in all_projections()}


def render(schema: dict[str, Any]) -> bytes:
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def problems() -> list[str]:
    want = current()
    found = {p.name for p in GOLDENS.glob("*.json")}
    out = [f"{name}: no golden (a new projection or version: scripts/state-goldens --write)"
           for name in sorted(want.keys() - found)]
    out += [f"{name}: no projection has this version now (scripts/state-goldens --write removes it)"
            for name in sorted(found - want.keys())]
    out += [f"{name}: the state's shape changed without a new version (bump the projection's `version`, then "
            "scripts/state-goldens --write)"
            for name in sorted(want.keys() & found) if (GOLDENS / name).read_bytes() != render(want[name])]
    return out


def write() -> None:
    GOLDENS.mkdir(parents=True, exist_ok=True)
    want = current()
    for stale in set(p.name for p in GOLDENS.glob("*.json")) - want.keys():
        (GOLDENS / stale).unlink()
    for name, schema in want.items():
        (GOLDENS / name).write_bytes(render(schema))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    found = problems()
    print("\n".join(found) or "state goldens: all current")
    sys.exit(1 if found else 0)

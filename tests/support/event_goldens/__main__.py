"""`scripts/event-goldens`: check (the default) or write (--write) the golden event files and the event table of
docs/3.DATA_MODEL.md from the event types.

--write rewrites the table and writes the current version's golden of every event type that has none or whose
change is compatible; it never touches an older version's golden, and refuses an incompatible change (saying what to
do instead) unless --force, which is for a type no log holds yet (added on this branch, never released).
"""

from __future__ import annotations

import argparse
import sys

from tests.support.event_goldens.files import (
    decode_problem,
    drift,
    fresh,
    golden_path,
    missing,
    recorded,
    registered,
    rel,
    strays,
)
from tests.support.event_goldens.table import DOC, doc_problem, undocumented, write_doc


def problems() -> list[str]:
    out = missing() + strays()
    out += [p for g in recorded() if (p := decode_problem(g)) is not None]
    out += [d.message for cls in registered() if (d := drift(cls)) is not None]
    out += undocumented()
    if (doc := doc_problem()) is not None:
        out.append(doc)
    return out


def write(force: bool) -> int:
    refused = 0
    for cls in registered():
        new, path = fresh(cls), golden_path(cls.TYPE, cls.V)
        if path.exists() and path.read_bytes() == new.render():
            continue
        d = drift(cls)
        if d is not None and not d.compatible and not force:
            print(f"refused: {d.message}\n", file=sys.stderr)
            refused += 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        path.write_bytes(new.render())
        print(f"{'rewrote' if existed else 'wrote'} {rel(path)}")
    if not refused and write_doc():  # the table shows the code: not while a change of it stands refused
        print(f"rewrote the event table of {rel(DOC)}")
    left = problems()
    for p in left:
        print(p, file=sys.stderr)
    return 1 if refused or left else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/event-goldens", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the goldens that are missing or changed compatibly")
    parser.add_argument("--force", action="store_true", help="with --write: record an incompatible change too")
    args = parser.parse_args(argv)
    if args.force and not args.write:
        parser.error("--force goes with --write")
    if args.write:
        return write(args.force)
    found = problems()
    for p in found:
        print(p, file=sys.stderr)
    if not found:
        print(f"{len(recorded())} goldens and the event table of {rel(DOC)}, every one current")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

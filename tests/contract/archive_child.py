"""An archive run in a child process that dies without warning: the crash tests' victim.

Run as `python -m tests.contract.archive_child LOCATION ARCHIVE CUTOFF SEGMENT_EVENTS [--kill-at STEP]
[--nth K] [--block-events B]`. The child opens the log at LOCATION (archive directory ARCHIVE), prints `ready`, and
runs `archive(cutoff=CUTOFF)`. With `--kill-at`, it SIGKILLs itself the K-th time (1-based) the archiver reaches STEP
("select", "write", "verify", "commit", "committed"): no close, no cleanup, as a power cut or the OOM killer would.
Without it, it runs to the end (or until the parent kills it) and prints the run as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

import orjson

from blazar.events import segment
from blazar.operations.archive import archive
from tests.contract.backends import open_log

STEPS = ("select", "write", "verify", "commit", "committed")


async def _child(args: argparse.Namespace) -> None:
    segment.BLOCK_EVENTS = args.block_events
    log = await open_log(args.location, archive=Path(args.archive))
    seen = 0

    def hook(name: str) -> None:
        nonlocal seen
        if name == args.kill_at:
            seen += 1
            if seen == args.nth:
                os.kill(os.getpid(), signal.SIGKILL)

    print("ready", flush=True)
    run = await archive(log, cutoff=args.cutoff, now=args.cutoff + 1, segment_events=args.segment_events, step=hook)
    print(orjson.dumps(run.to_json()).decode(), flush=True)
    await log.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("location")
    parser.add_argument("archive")
    parser.add_argument("cutoff", type=float)
    parser.add_argument("segment_events", type=int)
    parser.add_argument("--kill-at", choices=STEPS, default=None)
    parser.add_argument("--nth", type=int, default=1)
    parser.add_argument("--block-events", type=int, default=segment.BLOCK_EVENTS)
    asyncio.run(_child(parser.parse_args(argv)))


if __name__ == "__main__":
    main()

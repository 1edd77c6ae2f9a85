"""What the gap-free append costs on PostgreSQL: durable one-event appends through `PgEventLog.commit_pending` (one
transaction: the advisory lock, MAX(seq), the insert, the NOTIFY), against the same transaction without the lock,
on an empty database of the given URL. The numbers are in BENCHMARK.md ("The log on PostgreSQL").

Run: `.venv/bin/python bench/pg_lock.py postgresql+asyncpg://USER@HOST:PORT/EMPTY_DB [--events 2000]`
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from blazar.events import log_pg
from blazar.events.location import PostgresUrl
from blazar.events.log_pg import PgEventLog
from blazar.events.system import ConfigChanged


async def run(url: str, n: int) -> dict[str, Any]:
    log = await PgEventLog.open(PostgresUrl.parse(url))
    out: dict[str, Any] = {}
    try:
        for label, lock in (("with the advisory lock", True), ("without it", False), ("with it again", True)):
            log_pg.APPEND_LOCK_ENABLED = lock
            t0 = time.perf_counter()
            for i in range(n):
                await log.append(ConfigChanged(key="log_level", old=None, new=str(i), source="cli"), actor="bench")
            dt = time.perf_counter() - t0
            out[label] = {"events_per_s": round(n / dt), "ms_per_append": round(dt / n * 1000, 3)}
    finally:
        log_pg.APPEND_LOCK_ENABLED = True
        await log.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--events", type=int, default=2000)
    args = ap.parse_args()
    for label, r in asyncio.run(run(args.url, args.events)).items():
        print(f"{label:24} {r['events_per_s']:6} appends/s  {r['ms_per_append']:.3f} ms each")


if __name__ == "__main__":
    main()

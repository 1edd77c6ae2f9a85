"""What the read contract seeds and expects, shared by the suites that read the same history after an archive or
ask doctor about it: nine events over 80 s from T0 (the contract clock's start), and each read filter with the seqs
it selects."""

from __future__ import annotations

from typing import Any

from blazar.clock import FakeClock
from blazar.events.base import Recorded
from blazar.events.log import EventLog
from blazar.events.models import ModelAliased
from blazar.events.requests import RequestReceived
from blazar.events.system import SnapshotTaken
from tests.contract.workload import aliased, received

T0 = 1_700_000_000.0


async def seed(log: EventLog, clock: FakeClock) -> list[Recorded]:
    """Nine events over 80 s: three models, two traces, one snapshot.taken."""
    out: list[Recorded] = []
    out += await log.append([aliased("qwen", 0), aliased("llama", 1)], actor="cli:alice")  # 1, 2 at T0
    clock.advance(10)
    out += await log.append(received("t1", 0), actor="gateway", trace_id="t1-0000")  # 3 at T0+10
    out += await log.append(received("t1", 1), actor="gateway", trace_id="t1-0000", cause=3)  # 4
    clock.advance(10)
    out += await log.append(aliased("qwen", 2), actor="cli:bob", trace_id="t1-0000")  # 5 at T0+20
    clock.advance(20)
    snap = SnapshotTaken(path="/s/1", seq_last=5, event_count=5, db_sha256="0" * 64)
    out += await log.append(snap, actor="daemon")  # 6 at T0+40
    clock.advance(20)
    out += await log.append(received("t2", 0), actor="gateway", trace_id="t2-0000")  # 7 at T0+60
    clock.advance(20)
    out += await log.append([aliased("gemma", 3), aliased("qwen", 4)], actor="cli:alice")  # 8, 9 at T0+80
    return out


async def seqs(log: EventLog, **filters: Any) -> list[int]:
    return [rec.seq async for rec in log.read(**filters)]


CASES: list[tuple[str, dict[str, Any], list[int]]] = [
    ("everything", {}, [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    ("after is exclusive", {"after": 4}, [5, 6, 7, 8, 9]),
    ("upto is inclusive", {"upto": 3}, [1, 2, 3]),
    ("a range", {"after": 2, "upto": 5}, [3, 4, 5]),
    ("an empty range", {"after": 5, "upto": 5}, []),
    ("past the end", {"after": 9}, []),
    ("one type", {"types": [ModelAliased.TYPE]}, [1, 2, 5, 8, 9]),
    ("two types", {"types": [RequestReceived.TYPE, SnapshotTaken.TYPE]}, [3, 4, 6, 7]),
    ("an unknown type", {"types": ["never.happened"]}, []),
    ("a stream", {"stream": "model:qwen"}, [1, 5, 9]),
    ("a trace stream", {"stream": "trace:t1-0001"}, [4]),
    ("a trace id", {"trace_id": "t1-0000"}, [3, 4, 5]),  # the envelope's trace id, across streams and types
    ("an unknown trace id", {"trace_id": "nope"}, []),
    ("since is inclusive", {"since": T0 + 20}, [5, 6, 7, 8, 9]),
    ("until is inclusive", {"until": T0 + 10}, [1, 2, 3, 4]),
    ("a time window", {"since": T0 + 5, "until": T0 + 45}, [3, 4, 5, 6]),
    ("a limit", {"limit": 4}, [1, 2, 3, 4]),
    ("a limit after a seq", {"after": 6, "limit": 2}, [7, 8]),
    ("a limit of zero", {"limit": 0}, []),
    ("type and stream", {"types": [ModelAliased.TYPE], "stream": "model:qwen", "after": 1}, [5, 9]),
    ("trace, type and range", {"trace_id": "t1-0000", "types": [RequestReceived.TYPE], "upto": 3}, [3]),
]
